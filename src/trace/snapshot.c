/* snapshot.c — reads a PyTorch memory snapshot (torch.cuda.memory._snapshot(),
 * pickled, maybe gzip) into a gm_trace: device_traces become the event array,
 * frames become interned stacks, segments and allocator_settings are kept.
 *
 * Keys and action names are short strings, which the pickle reader interns,
 * so the per-event work is pointer comparisons against small caches: a
 * million events convert in tens of milliseconds. */
#include "trace.h"

#include "util/idmap.h"
#include "internal.h"
#include "pickle.h"

#include <stdlib.h>
#include <string.h>

enum { F_ACTION, F_ADDR, F_SIZE, F_STREAM, F_TIME, F_FRAMES, F_OTHER };

/* pointer -> small id caches (values are interned, so pointers repeat) */
typedef struct pcache {
    gm__pval key[16];
    int val[16];
    int n;
} pcache;

static int pc_get(pcache *c, gm__pval k) {
    for (int i = 0; i < c->n; i++)
        if (c->key[i] == k) return c->val[i];
    return -1;
}
static void pc_put(pcache *c, gm__pval k, int v) {
    if (c->n < 16) {
        c->key[c->n] = k;
        c->val[c->n++] = v;
    }
}

#define SCACHE 4096
typedef struct reader {
    gm__trace_builder *b;
    pcache keys, actions;
    gm__pval skey[SCACHE]; /* str pval -> string id */
    uint32_t sval[SCACHE];
    gm__pval last_frames;
    uint32_t last_stack;
    /* frames list (pval) -> stack id + 1: a pickle can point a million
     * events at a few big frame lists through its memo, and each list is
     * read once, so the work stays linear in the input */
    gm__idmap stacks;
    uint32_t *fbuf;
    size_t fcap;
    uint64_t skipped;
    uint64_t input, steps0; /* pickle bytes; gm__work_steps at the start */
} reader;

/* A pickle's memo lets one dict stand for many events or frames, and dict
 * lookups scan: a dict of K keys named N times costs N x K from ~2N + K
 * bytes. Real snapshots scan each entry a few times; past this many steps
 * per pickle byte the file is refused instead of taking hours. */
#define STEPS_PER_BYTE 64
#define STEPS_FREE ((uint64_t)1 << 20)

static int budget(const reader *r) {
    uint64_t used = gm__work_steps - r->steps0;
    if (used <= STEPS_FREE + STEPS_PER_BYTE * r->input) return GM_OK;
    return gm__set_error(GM_EFORMAT, "snapshot structure costs more than %d steps per byte to read (%llu "
                         "steps for %llu bytes: dicts with many keys shared by many events or frames); "
                         "not a torch.cuda.memory snapshot", STEPS_PER_BYTE, (unsigned long long)used,
                         (unsigned long long)r->input);
}

static int field_of(reader *r, gm__pval k) {
    int f = pc_get(&r->keys, k);
    if (f >= 0) return f;
    static const char *names[] = {"action", "addr", "size", "stream", "time_us", "frames"};
    const char *s = gm__pv_str(k, NULL);
    f = F_OTHER;
    for (int i = 0; s && i < F_OTHER; i++)
        if (!strcmp(s, names[i])) f = i;
    pc_put(&r->keys, k, f);
    return f;
}

static int action_of(reader *r, gm__pval v) {
    int a = pc_get(&r->actions, v);
    if (a >= 0) return a;
    const char *s = gm__pv_str(v, NULL);
    a = GM_TA_COUNT;
    for (int i = 0; s && i < GM_TA_COUNT; i++)
        if (!strcmp(s, gm_trace_action_name(i))) a = i;
    pc_put(&r->actions, v, a);
    return a;
}

static int string_id(reader *r, gm__pval v, uint32_t *id) {
    size_t n;
    const char *s = gm__pv_str(v, &n);
    if (!s) {
        s = "?";
        n = 1;
    }
    size_t h = (size_t)((v >> 3) * 0x9E3779B97F4A7C15ull >> 52) & (SCACHE - 1);
    if (r->skey[h] == v && v) {
        *id = r->sval[h];
        return GM_OK;
    }
    int rc = gm__tb_string(r->b, s, n, id);
    if (!rc && v) {
        r->skey[h] = v;
        r->sval[h] = *id;
    }
    return rc;
}

static int stack_of(reader *r, gm__pval frames, uint32_t *id1) {
    if (frames == r->last_frames && frames) {
        *id1 = r->last_stack;
        return GM_OK;
    }
    if (gm__idmap_reserve(&r->stacks, 256)) return GM_ENOHOSTMEM;
    size_t slot = gm__idmap_find(&r->stacks, frames);
    if (frames && r->stacks.id[slot] != GM__IDMAP_EMPTY) {
        *id1 = r->stacks.id[slot];
        r->last_frames = frames;
        r->last_stack = *id1;
        return GM_OK;
    }
    size_t n = gm__pv_len(frames);
    if (n > GM_LIMIT_STACK_DEPTH) n = GM_LIMIT_STACK_DEPTH;
    if (n > r->fcap) {
        uint32_t *nb = realloc(r->fbuf, n * sizeof *nb);
        if (!nb) return GM_ENOHOSTMEM;
        r->fbuf = nb;
        r->fcap = n;
    }
    for (size_t i = 0; i < n; i++) {
        gm__pval f = gm__pv_item(frames, i);
        uint32_t name, file;
        int64_t line = 0;
        gm__pv_int(gm__pv_dict_get(f, "line"), &line);
        int rc = string_id(r, gm__pv_dict_get(f, "name"), &name);
        if (!rc) rc = string_id(r, gm__pv_dict_get(f, "filename"), &file);
        if (!rc) rc = gm__tb_frame(r->b, name, file, (int32_t)line, &r->fbuf[i]);
        if (rc) return rc;
    }
    int rc = budget(r);
    if (!rc) rc = gm__tb_stack(r->b, r->fbuf, (uint32_t)n, id1);
    if (!rc) {
        r->last_frames = frames;
        r->last_stack = *id1;
        /* ids are < 2^32 - 1 (GM__IDMAP_EMPTY is never a stack id) */
        if (frames && *id1 != GM__IDMAP_EMPTY) gm__idmap_set(&r->stacks, slot, frames, *id1);
    }
    return rc;
}

static int read_event(reader *r, gm__pval d, int device) {
    gm_trace_event e = {0};
    e.device = (uint8_t)device;
    int action = GM_TA_COUNT;
    bool have_size = false;
    size_t n = gm__pv_len(d);
    gm__work_steps += n;
    int brc = budget(r);
    if (brc) return brc;
    for (size_t i = 0; i < n; i++) {
        gm__pval v = gm__pv_dict_val(d, i);
        int64_t x = 0;
        switch (field_of(r, gm__pv_dict_key(d, i))) {
        case F_ACTION: action = action_of(r, v); break;
        case F_ADDR: if (gm__pv_int(v, &x)) e.addr = (uint64_t)x; break;
        case F_SIZE: if ((have_size = gm__pv_int(v, &x))) e.size = (uint64_t)x; break;
        case F_STREAM: if (gm__pv_int(v, &x)) e.stream = (uint64_t)x; break;
        case F_TIME: if (gm__pv_int(v, &x)) e.time_us = x; break;
        case F_FRAMES: {
            int rc = stack_of(r, v, &e.stack);
            if (rc) return rc;
            break;
        }
        default: break;
        }
    }
    if (action == GM_TA_COUNT || (action == GM_TA_ALLOC && !have_size)) {
        r->skipped++;
        return GM_OK;
    }
    e.action = (uint8_t)action;
    return gm__tb_event(r->b, &e);
}

static uint64_t dict_u64(gm__pval d, const char *key) {
    int64_t x = 0;
    gm__pv_int(gm__pv_dict_get(d, key), &x);
    return (uint64_t)x;
}

static int read_segments(reader *r, gm__pval segs) {
    for (size_t i = 0; i < gm__pv_len(segs); i++) {
        gm__pval s = gm__pv_item(segs, i);
        if (gm__pv_type(s) != GM__PT_DICT) continue;
        gm_trace_segment g = {0};
        g.device = (uint8_t)dict_u64(s, "device");
        g.address = dict_u64(s, "address");
        g.total_size = dict_u64(s, "total_size");
        g.allocated_size = dict_u64(s, "allocated_size");
        g.requested_size = dict_u64(s, "requested_size");
        g.stream = dict_u64(s, "stream");
        g.nblocks = (uint32_t)gm__pv_len(gm__pv_dict_get(s, "blocks"));
        const char *type = gm__pv_str(gm__pv_dict_get(s, "segment_type"), NULL);
        g.large = !type || strcmp(type, "small") != 0;
        bool ex = false;
        gm__pv_bool(gm__pv_dict_get(s, "is_expandable"), &ex);
        g.expandable = ex;
        gm__pval pid = gm__pv_dict_get(s, "segment_pool_id"); /* a tuple of two ints */
        for (size_t k = 0; k < 2 && gm__pv_len(pid) == 2; k++) {
            int64_t x = 0;
            if (gm__pv_int(gm__pv_item(pid, k), &x)) g.pool_id[k] = (uint64_t)x;
        }
        int rc = budget(r);
        if (!rc) rc = gm__tb_segment(r->b, &g);
        if (rc) return rc;
    }
    return GM_OK;
}

static int read_root(reader *r, gm__pval root) {
    if (gm__pv_type(root) != GM__PT_DICT)
        return gm__set_error(GM_EFORMAT, "not a PyTorch memory snapshot: the pickle holds a %s, "
                                         "not a dict", gm__pv_type_name(root));
    gm__pval traces = gm__pv_dict_get(root, "device_traces");
    gm__pval segs = gm__pv_dict_get(root, "segments");
    if (!traces && !segs)
        return gm__set_error(GM_EFORMAT, "not a PyTorch memory snapshot: no 'device_traces' or "
                                         "'segments' key");
    if (traces && gm__pv_type(traces) != GM__PT_LIST)
        return gm__set_error(GM_EFORMAT, "snapshot 'device_traces' is a %s, not a list",
                             gm__pv_type_name(traces));
    size_t nd = gm__pv_len(traces);
    if (nd > 256) return gm__set_error(GM_EFORMAT, "snapshot has %zu devices (max 256)", nd);
    uint64_t entries = 0;
    for (size_t d = 0; d < nd; d++) {
        gm__pval evs = gm__pv_item(traces, d);
        if (gm__pv_type(evs) != GM__PT_LIST)
            return gm__set_error(GM_EFORMAT, "snapshot 'device_traces'[%zu] is a %s, not a list of "
                                 "events", d, gm__pv_type_name(evs));
        size_t n = gm__pv_len(evs);
        entries += n;
        for (size_t i = 0; i < n; i++) {
            gm__pval e = gm__pv_item(evs, i);
            if (gm__pv_type(e) != GM__PT_DICT) {
                r->skipped++;
                continue;
            }
            int rc = read_event(r, e, (int)d);
            if (rc) return rc;
        }
    }
    /* entries but not one event (e.g. objects a REDUCE built): not a trace
     * of this allocator, and replaying "0 events" would hide that */
    if (entries && r->skipped == entries)
        return gm__set_error(GM_EFORMAT, "snapshot 'device_traces' holds %llu entries and none is an "
                             "allocator event (a dict with a known 'action'); the file is not a "
                             "torch.cuda.memory._snapshot() or was altered",
                             (unsigned long long)entries);
    if (segs && gm__pv_type(segs) != GM__PT_LIST)
        return gm__set_error(GM_EFORMAT, "snapshot 'segments' is a %s, not a list",
                             gm__pv_type_name(segs));
    int rc = read_segments(r, segs);
    if (rc) return rc;
    gm__pval settings = gm__pv_dict_get(root, "allocator_settings");
    if (gm__pv_type(settings) == GM__PT_DICT) {
        const char *conf = gm__pv_str(gm__pv_dict_get(settings, "PYTORCH_CUDA_ALLOC_CONF"), NULL);
        rc = gm__tb_conf(r->b, conf ? conf : "");
    }
    return rc;
}

static int from_pickle(int rc, gm__pickle *p, gm_trace **out) {
    if (rc) return rc;
    reader *r = calloc(1, sizeof *r);
    if (!r || !(r->b = gm__tb_new())) {
        free(r);
        gm__pickle_free(p);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory reading a snapshot");
    }
    r->input = gm__pickle_input_bytes(p);
    r->steps0 = gm__work_steps;
    rc = read_root(r, gm__pickle_root(p));
    gm__pickle_free(p);
    uint64_t skipped = r->skipped;
    if (rc) gm__tb_discard(r->b);
    else rc = gm__tb_finish(r->b, "pytorch-snapshot", out);
    if (!rc) (*out)->skipped = skipped;
    free(r->fbuf);
    gm__idmap_free(&r->stacks);
    free(r);
    return rc;
}

int gm_trace_from_snapshot(const void *data, size_t len, gm_trace **out) {
    *out = NULL;
    gm__pickle *p = NULL;
    int rc = gm__pickle_load(data, len, NULL, &p);
    return from_pickle(rc, p, out);
}

int gm__trace_from_snapshot_stream(FILE *in, const void *head, size_t len, gm_trace **out) {
    *out = NULL;
    gm__pickle *p = NULL;
    int rc = gm__pickle_load_stream(in, head, len, NULL, &p);
    return from_pickle(rc, p, out);
}
