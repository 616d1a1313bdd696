/* pickle_value.c — the accessors of pickle.h: what a loaded gm__pval is
 * (type, int, float, bool, str/bytes, containers, dict lookup). Pure reads
 * of the representation in pickle_value.h; every accessor answers 0/NULL/
 * false for a value of another type, so callers check shapes, never crash. */
#include "pickle_value.h"

#include "util/idmap.h"

#include <string.h>

gm__ptype gm__pv_type(gm__pval v) { return pv_type(v); }

const char *gm__pv_type_name(gm__pval v) {
    static const char *names[] = {"absent", "None", "bool", "int", "int", "float", "str",
                                  "bytes", "list", "tuple", "dict", "set", "object", "converted object"};
    return names[gm__pv_type(v)];
}

bool gm__pv_int(gm__pval v, int64_t *out) {
    if (PV_TAG(v) == TAG_INT) {
        *out = (int64_t)v >> 3;
        return true;
    }
    if (v == PV_TRUE || v == PV_FALSE) {
        *out = v == PV_TRUE;
        return true;
    }
    if (PV_TAG(v) == TAG_PTR && v && PO(v)->type == GM__PT_INT) {
        *out = PO(v)->u.i;
        return true;
    }
    return false;
}

bool gm__pv_float(gm__pval v, double *out) {
    int64_t i;
    if (gm__pv_int(v, &i)) {
        *out = (double)i;
        return true;
    }
    if (gm__pv_type(v) != GM__PT_FLOAT) return false;
    *out = PO(v)->u.f;
    return true;
}

bool gm__pv_bool(gm__pval v, bool *out) {
    if (v != PV_TRUE && v != PV_FALSE) return false;
    *out = v == PV_TRUE;
    return true;
}

static const char *pv_chars(gm__pval v, gm__ptype t, size_t *len) {
    if (gm__pv_type(v) != t) return NULL;
    if (len) *len = (size_t)PO(v)->len;
    return PO(v)->u.s;
}
const char *gm__pv_str(gm__pval v, size_t *len) { return pv_chars(v, GM__PT_STR, len); }
const char *gm__pv_bytes(gm__pval v, size_t *len) { return pv_chars(v, GM__PT_BYTES, len); }

const char *gm__pv_opaque_name(gm__pval v) {
    return gm__pv_type(v) == GM__PT_OPAQUE ? PO(v)->u.name : NULL;
}

size_t gm__pv_len(gm__pval v) {
    switch (gm__pv_type(v)) {
    case GM__PT_STR: case GM__PT_BYTES: case GM__PT_LIST: case GM__PT_TUPLE:
    case GM__PT_DICT: case GM__PT_SET:
        return (size_t)PO(v)->len;
    default: return 0;
    }
}

gm__pval gm__pv_item(gm__pval v, size_t i) {
    gm__ptype t = gm__pv_type(v);
    if ((t != GM__PT_LIST && t != GM__PT_TUPLE && t != GM__PT_SET) || i >= PO(v)->len) return 0;
    return PO(v)->u.items[i];
}

const gm__pval *gm__pv_dict_items(gm__pval v, size_t *n) {
    *n = 0;
    if (pv_type(v) != GM__PT_DICT) return NULL;
    *n = (size_t)PO(v)->len;
    return PO(v)->u.items;
}

gm__pval gm__pv_dict_key(gm__pval v, size_t i) {
    if (gm__pv_type(v) != GM__PT_DICT || i >= PO(v)->len) return 0;
    return PO(v)->u.items[2 * i];
}

gm__pval gm__pv_dict_val(gm__pval v, size_t i) {
    if (gm__pv_type(v) != GM__PT_DICT || i >= PO(v)->len) return 0;
    return PO(v)->u.items[2 * i + 1];
}

gm__pval gm__pv_dict_get(gm__pval v, const char *key) {
    if (gm__pv_type(v) != GM__PT_DICT) return 0;
    size_t kl = strlen(key);
    for (size_t i = PO(v)->len; i-- > 0;) {
        gm__work_steps++;
        gm__pval k = PO(v)->u.items[2 * i];
        size_t n;
        const char *s = gm__pv_str(k, &n);
        if (s && n == kl && memcmp(s, key, n) == 0) return PO(v)->u.items[2 * i + 1];
    }
    return 0;
}

uint64_t gm__pv_tag(gm__pval v) {
    if (PV_TAG(v) == TAG_CONV) return v >> 3;
    return pv_is_cont(gm__pv_type(v)) ? PC(v)->tag : 0;
}

bool gm__pv_set_tag(gm__pval v, uint64_t tag) {
    if (!tag || tag >> 60 || !pv_is_cont(gm__pv_type(v))) return false;
    PC(v)->tag = tag;
    return true;
}
