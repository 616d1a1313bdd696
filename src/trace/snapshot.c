/* snapshot.c — reads a PyTorch memory snapshot (torch.cuda.memory._snapshot(),
 * pickled, maybe gzip) into a gm_trace: device_traces become the event array,
 * frames become interned stacks, segments and allocator_settings are kept.
 *
 * Keys and action names are short strings, which the pickle reader interns,
 * so the per-event work is pointer comparisons against small caches: a
 * million events convert in tens of milliseconds.
 *
 * Streamed: the lists of device_traces are claimed as the pickle reader
 * meets them (pickle.h's sink) and their events converted a batch at a time,
 * after which the reader releases the batch's dicts; a 10 M-event snapshot
 * never stands as a tree (bench/RESULTS.md, "reading 10 M-event and >1 GB
 * snapshots"). What was converted
 * is tagged (kind in the low 2 bits): an event dict with its event, a frames
 * list with its stack, a frame dict with its frame, so a memo reference to
 * one, released or not, costs nothing more. At the end the snapshot's own
 * structure must hold each streamed list where it was claimed; a list that
 * was not streamed (a pickle built another way) is read from the tree. */
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

enum { K_DEVICE_LIST, K_EVENT, K_STACK, K_FRAME }; /* tag kinds */
#define TAG(kind, payload) (((uint64_t)(payload) << 2) | (kind))
#define MAX_DEVICES 256

#define SCACHE 4096
#define KPOS 16
typedef struct reader {
    gm__trace_builder *b;
    pcache keys, actions;
    gm__pval kpos[KPOS];   /* the last event's keys in its order (a snapshot's events share it) */
    int fpos[KPOS];        /* and their fields */
    gm__pval skey[SCACHE]; /* str pval -> string id */
    uint32_t sval[SCACHE];
    uint32_t *fbuf;
    size_t fcap;
    uint64_t entries, skipped;
    uint64_t input, steps0; /* pickle bytes; gm__work_steps at the start */
    gm__pval streamed[MAX_DEVICES]; /* the list claimed for device d */
    bool placed[MAX_DEVICES];       /* found at device_traces[d] in the end */
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

/* (the caches hold str values only: containers are released and reused) */
static int field_of(reader *r, gm__pval k) {
    int f = pc_get(&r->keys, k);
    if (f >= 0) return f;
    static const char *names[] = {"action", "addr", "size", "stream", "time_us", "frames"};
    const char *s = gm__pv_str(k, NULL);
    if (!s) return F_OTHER;
    f = F_OTHER;
    for (int i = 0; i < F_OTHER; i++)
        if (!strcmp(s, names[i])) f = i;
    pc_put(&r->keys, k, f);
    return f;
}

static int action_of(reader *r, gm__pval v) {
    int a = pc_get(&r->actions, v);
    if (a >= 0) return a;
    const char *s = gm__pv_str(v, NULL);
    if (!s) return GM_TA_COUNT;
    a = GM_TA_COUNT;
    for (int i = 0; i < GM_TA_COUNT; i++)
        if (!strcmp(s, gm__trace_action_name(i))) a = i;
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
    if (!rc && gm__pv_type(v) == GM__PT_STR) {
        r->skey[h] = v;
        r->sval[h] = *id;
    }
    return rc;
}

/* A value converted (tagged) as `kind` earlier: *id its payload. A value
 * released after its conversion as another kind is refused: only a pickle
 * built by hand uses one object so. */
static int converted(gm__pval v, int kind, const char *as, uint64_t *id, bool *hit) {
    uint64_t tag = gm__pv_tag(v);
    *hit = tag && (int)(tag & 3) == kind;
    if (*hit) *id = tag >> 2;
    if (!*hit && gm__pv_type(v) == GM__PT_CONVERTED)
        return gm__set_error(GM_EFORMAT, "snapshot uses one object as %s and as something else (a "
                                         "hand-built pickle?); not a torch.cuda.memory snapshot", as);
    return GM_OK;
}

static int frame_of(reader *r, gm__pval f, uint32_t *id) {
    uint64_t x = 0;
    bool hit;
    int rc = converted(f, K_FRAME, "a frame", &x, &hit);
    if (rc || hit) {
        *id = (uint32_t)x;
        return rc;
    }
    uint32_t name, file;
    int64_t line = 0;
    gm__pv_int(gm__pv_dict_get(f, "line"), &line);
    rc = string_id(r, gm__pv_dict_get(f, "name"), &name);
    if (!rc) rc = string_id(r, gm__pv_dict_get(f, "filename"), &file);
    if (!rc) rc = gm__tb_frame(r->b, name, file, (int32_t)line, id);
    if (!rc && !gm__pv_tag(f)) gm__pv_set_tag(f, TAG(K_FRAME, *id));
    return rc;
}

static int stack_of(reader *r, gm__pval frames, uint32_t *id1) {
    uint64_t x = 0;
    bool hit;
    int crc = converted(frames, K_STACK, "frames", &x, &hit);
    if (crc || hit) {
        *id1 = (uint32_t)x;
        return crc;
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
        int rc = frame_of(r, gm__pv_item(frames, i), &r->fbuf[i]);
        if (rc) return rc;
    }
    int rc = budget(r);
    if (!rc) rc = gm__tb_stack(r->b, r->fbuf, (uint32_t)n, id1);
    /* read once: a pickle can point a million events at a few big frame
     * lists through its memo, and the work stays linear in the input */
    if (!rc && !gm__pv_tag(frames)) gm__pv_set_tag(frames, TAG(K_STACK, *id1));
    return rc;
}

static int read_event(reader *r, gm__pval d, int device) {
    gm_trace_event e = {0};
    e.device = (uint8_t)device;
    int action = GM_TA_COUNT;
    bool have_size = false;
    size_t n;
    const gm__pval *kv = gm__pv_dict_items(d, &n);
    gm__work_steps += n;
    int brc = budget(r);
    if (brc) return brc;
    for (size_t i = 0; i < n; i++) {
        gm__pval v = kv[2 * i + 1];
        int64_t x = 0;
        /* one compare a key while the keys come in the last event's order
         * (scanning the cache for each was a tenth of converting an event) */
        int f;
        if (i < KPOS && r->kpos[i] == kv[2 * i]) {
            f = r->fpos[i];
        } else {
            f = field_of(r, kv[2 * i]);
            if (i < KPOS && gm__pv_str(kv[2 * i], NULL)) { /* strs only, as the caches */
                r->kpos[i] = kv[2 * i];
                r->fpos[i] = f;
            }
        }
        switch (f) {
        case F_ACTION: action = action_of(r, v); break;
        case F_ADDR: if (gm__pv_int_fast(v, &x)) e.addr = (uint64_t)x; break;
        case F_SIZE: if ((have_size = gm__pv_int_fast(v, &x))) e.size = (uint64_t)x; break;
        case F_STREAM: if (gm__pv_int_fast(v, &x)) e.stream = (uint64_t)x; break;
        case F_TIME: if (gm__pv_int_fast(v, &x)) e.time_us = x; break;
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

/* One entry of device_traces[device]: an event, or skipped. */
static int read_entry(reader *r, gm__pval v, int device) {
    r->entries++;
    uint64_t x = 0;
    bool hit;
    converted(v, K_EVENT, "an event", &x, &hit);
    if (hit && x) return gm__tb_event_copy(r->b, (size_t)x - 1, device); /* named again */
    if (hit || gm__pv_type(v) != GM__PT_DICT) {
        r->skipped++;
        if (!gm__pv_tag(v)) gm__pv_set_tag(v, TAG(K_EVENT, 0));
        return GM_OK;
    }
    size_t n0 = gm__tb_nevents(r->b);
    int rc = read_event(r, v, device);
    if (!rc && !gm__pv_tag(v)) gm__pv_set_tag(v, TAG(K_EVENT, gm__tb_nevents(r->b) > n0 ? n0 + 1 : 0));
    return rc;
}

/* ---- streaming (pickle.h's sink) ------------------------------------------- */

static int sink_claim(void *ctx, gm__pickle *p, gm__pval list, gm__pval outer, gm__pval key, size_t index,
                      bool *take) {
    (void)p;
    (void)outer;
    reader *r = ctx;
    const char *k = gm__pv_str(key, NULL);
    *take = k && !strcmp(k, "device_traces") && index < MAX_DEVICES && !r->streamed[index] &&
            !gm__pv_tag(list) && gm__pv_set_tag(list, TAG(K_DEVICE_LIST, index + 1));
    if (*take) r->streamed[index] = list;
    return GM_OK;
}

static int sink_items(void *ctx, gm__pickle *p, gm__pval list, const gm__pval *items, size_t n) {
    reader *r = ctx;
    int device = (int)(gm__pv_tag(list) >> 2) - 1;
    r->input = gm__pickle_input_bytes(p);
    for (size_t i = 0; i < n; i++) {
        int rc = read_entry(r, items[i], device);
        if (rc) return rc;
    }
    return GM_OK;
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
    if (nd > MAX_DEVICES) return gm__set_error(GM_EFORMAT, "snapshot has %zu devices (max %d)", nd, MAX_DEVICES);
    for (size_t d = 0; d < nd; d++) {
        gm__pval evs = gm__pv_item(traces, d);
        if (gm__pv_type(evs) != GM__PT_LIST)
            return gm__set_error(GM_EFORMAT, "snapshot 'device_traces'[%zu] is a %s, not a list of "
                                 "events", d, gm__pv_type_name(evs));
        uint64_t tag = gm__pv_tag(evs);
        if (tag && (tag & 3) == K_DEVICE_LIST) { /* read as it came */
            if (evs != r->streamed[d] || r->placed[d])
                return gm__set_error(GM_EFORMAT, "snapshot 'device_traces'[%zu] is the list of device %llu's "
                                     "events, or a repeat (a hand-built pickle?); not a torch.cuda.memory "
                                     "snapshot", d, (unsigned long long)(tag >> 2) - 1);
            r->placed[d] = true;
            continue;
        }
        for (size_t i = 0; i < gm__pv_len(evs); i++) {
            int rc = read_entry(r, gm__pv_item(evs, i), (int)d);
            if (rc) return rc;
        }
    }
    for (size_t d = 0; d < MAX_DEVICES; d++)
        if (r->streamed[d] && !r->placed[d])
            return gm__set_error(GM_EFORMAT, "snapshot 'device_traces' was built in an unusual way: the "
                                 "events read as device %zu's are not at device_traces[%zu] (a hand-built "
                                 "pickle?); not a torch.cuda.memory snapshot", d, d);
    /* entries but not one event (e.g. objects a REDUCE built): not a trace
     * of this allocator, and replaying "0 events" would hide that */
    if (r->entries && r->skipped == r->entries)
        return gm__set_error(GM_EFORMAT, "snapshot 'device_traces' holds %llu entries and none is an "
                             "allocator event (a dict with a known 'action'); the file is not a "
                             "torch.cuda.memory._snapshot() or was altered",
                             (unsigned long long)r->entries);
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

int gm__trace_from_snapshot_stream(FILE *in, const void *head, size_t len, gm_trace **out) {
    *out = NULL;
    reader *r = calloc(1, sizeof *r);
    if (!r || !(r->b = gm__tb_new())) {
        free(r);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory reading a snapshot");
    }
    r->steps0 = gm__work_steps;
    const gm__pickle_sink sink = {r, sink_claim, sink_items};
    gm__pickle *p = NULL;
    int rc = gm__pickle_load_sink(in, head, len, NULL, &sink, &p);
    if (!rc) {
        r->input = gm__pickle_input_bytes(p);
        rc = read_root(r, gm__pickle_root(p));
    }
    gm__pickle_free(p);
    uint64_t skipped = r->skipped;
    if (rc) gm__tb_discard(r->b);
    else rc = gm__tb_finish(r->b, "pytorch-snapshot", out);
    if (!rc) (*out)->skipped = skipped;
    free(r->fbuf);
    free(r);
    return rc;
}

int gm__trace_from_snapshot(const void *data, size_t len, gm_trace **out) {
    return gm__trace_from_snapshot_stream(NULL, data, len, out);
}
