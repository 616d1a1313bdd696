/* snapshot_write.c — writes a gm_trace as a PyTorch memory snapshot: the
 * dict torch.cuda.memory._snapshot() returns (segments, device_traces with
 * action / addr / size / stream / time_us / frames, allocator_settings),
 * pickled with protocol 4 (only dicts, lists, str, int, bool), gzip'd when
 * the path ends in ".gz". PyTorch's memory_viz and gpumem's own reader load
 * it. Each distinct frames list is written once and referenced through the
 * pickle memo afterwards, as Python's pickler does for shared objects. */
#include "report.h"

#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct pw {
    uint8_t *b;
    size_t n, cap;
    bool oom;
    uint32_t memo; /* MEMOIZE ops so far */
} pw;

static void put(pw *w, const void *p, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 1 << 16;
        while (nc < w->n + n) nc *= 2;
        uint8_t *nb = realloc(w->b, nc);
        if (!nb) {
            w->oom = true;
            return;
        }
        w->b = nb;
        w->cap = nc;
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void op(pw *w, uint8_t c) { put(w, &c, 1); }

static void pstr(pw *w, const char *s) {
    size_t n = strlen(s);
    if (n < 256) {
        uint8_t h[2] = {0x8c, (uint8_t)n}; /* SHORT_BINUNICODE */
        put(w, h, 2);
    } else {
        uint8_t h[5] = {'X', (uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
        put(w, h, 5);
    }
    put(w, s, n);
}

/* LONG1: little-endian two's complement, as few bytes as the value needs */
static void pint(pw *w, int64_t v, bool is_unsigned, uint64_t u) {
    if (!is_unsigned && v >= INT32_MIN && v <= INT32_MAX) {
        uint32_t x = (uint32_t)(int32_t)v;
        uint8_t h[5] = {'J', (uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24)};
        put(w, h, 5);
        return;
    }
    uint8_t bytes[9];
    int n = 0;
    if (is_unsigned) {
        for (n = 0; n < 8; n++) bytes[n] = (uint8_t)(u >> (8 * n));
        bytes[8] = 0;
        n = 9;
        while (n > 1 && bytes[n - 1] == 0 && !(bytes[n - 2] & 0x80)) n--;
    } else {
        for (n = 0; n < 8; n++) bytes[n] = (uint8_t)((uint64_t)v >> (8 * n));
        n = 8;
        while (n > 1 && ((bytes[n - 1] == 0 && !(bytes[n - 2] & 0x80)) ||
                         (bytes[n - 1] == 0xff && (bytes[n - 2] & 0x80))))
            n--;
    }
    uint8_t h[2] = {0x8a, (uint8_t)n};
    put(w, h, 2);
    put(w, bytes, (size_t)n);
}
static void pi64(pw *w, int64_t v) { pint(w, v, false, 0); }
static void pu64(pw *w, uint64_t v) {
    if (v <= INT32_MAX) pint(w, (int64_t)v, false, 0);
    else pint(w, 0, true, v);
}

static void kstr(pw *w, const char *k, const char *v) { pstr(w, k); pstr(w, v); }
static void ku64(pw *w, const char *k, uint64_t v) { pstr(w, k); pu64(w, v); }

static void frames_list(pw *w, const gm_trace *t, uint32_t stack, uint32_t *memo_of) {
    if (!stack) {
        op(w, ']');
        return;
    }
    uint32_t s = stack - 1;
    if (memo_of[s] != UINT32_MAX) {
        uint32_t m = memo_of[s];
        if (m < 256) {
            uint8_t h[2] = {'h', (uint8_t)m};
            put(w, h, 2);
        } else {
            uint8_t h[5] = {'j', (uint8_t)m, (uint8_t)(m >> 8), (uint8_t)(m >> 16), (uint8_t)(m >> 24)};
            put(w, h, 5);
        }
        return;
    }
    op(w, ']');
    op(w, 0x94); /* MEMOIZE */
    memo_of[s] = w->memo++;
    op(w, '(');
    for (uint32_t k = t->stack_off[s]; k < t->stack_off[s + 1]; k++) {
        const gm_trace_frame *f = &t->frames[t->stack_frames[k]];
        op(w, '}');
        op(w, '(');
        kstr(w, "name", t->strings[f->name]);
        kstr(w, "filename", t->strings[f->filename]);
        pstr(w, "line");
        pi64(w, f->line);
        op(w, 'u');
    }
    op(w, 'e');
}

static int encode(const gm_trace *t, pw *w) {
    uint32_t *memo_of = malloc((t->nstacks ? t->nstacks : 1) * sizeof *memo_of);
    if (!memo_of) return GM_ENOHOSTMEM;
    memset(memo_of, 0xff, (t->nstacks ? t->nstacks : 1) * sizeof *memo_of);
    uint8_t proto[2] = {0x80, 4};
    put(w, proto, 2);
    op(w, '}');
    op(w, '(');
    pstr(w, "segments");
    op(w, ']');
    op(w, '(');
    for (size_t i = 0; i < t->nsegments; i++) {
        const gm_trace_segment *s = &t->segments[i];
        op(w, '}');
        op(w, '(');
        ku64(w, "device", s->device);
        ku64(w, "address", s->address);
        ku64(w, "total_size", s->total_size);
        ku64(w, "allocated_size", s->allocated_size);
        ku64(w, "requested_size", s->requested_size);
        ku64(w, "stream", s->stream);
        kstr(w, "segment_type", s->large ? "large" : "small");
        pstr(w, "is_expandable");
        op(w, s->expandable ? 0x88 : 0x89);
        pstr(w, "segment_pool_id");
        pu64(w, s->pool_id[0]);
        pu64(w, s->pool_id[1]);
        op(w, 0x86); /* TUPLE2, as torch writes the pool id */
        pstr(w, "blocks");
        op(w, ']');
        op(w, 'u');
    }
    op(w, 'e');
    pstr(w, "device_traces");
    op(w, ']');
    op(w, '(');
    for (int d = 0; d < t->ndevices; d++) {
        op(w, ']');
        op(w, '(');
        for (size_t i = t->dev_off[d]; i < t->dev_off[d + 1]; i++) {
            const gm_trace_event *e = &t->events[i];
            op(w, '}');
            op(w, '(');
            kstr(w, "action", gm__trace_action_name(e->action));
            ku64(w, "addr", e->addr);
            ku64(w, "size", e->size);
            ku64(w, "stream", e->stream);
            pstr(w, "time_us");
            pi64(w, e->time_us);
            pstr(w, "frames");
            frames_list(w, t, e->stack, memo_of);
            op(w, 'u');
            if (w->oom) break;
        }
        op(w, 'e');
    }
    op(w, 'e');
    if (t->has_settings) {
        pstr(w, "allocator_settings");
        op(w, '}');
        op(w, '(');
        kstr(w, "PYTORCH_CUDA_ALLOC_CONF", t->alloc_conf ? t->alloc_conf : "");
        op(w, 'u');
    }
    op(w, 'u');
    op(w, '.');
    free(memo_of);
    return w->oom ? GM_ENOHOSTMEM : GM_OK;
}

int gm__trace_encode_snapshot(const gm_trace *t, uint8_t **out, size_t *len) {
    pw w = {0};
    int rc = encode(t, &w);
    if (rc) {
        free(w.b);
        return gm__set_error(rc, "out of host memory writing a snapshot");
    }
    *out = w.b;
    *len = w.n;
    return GM_OK;
}

int gm__trace_write_snapshot(const gm_trace *t, const char *path) {
    uint8_t *buf = NULL;
    size_t n = 0;
    int rc = gm__trace_encode_snapshot(t, &buf, &n);
    if (rc) return rc;
    size_t pl = strlen(path);
    rc = gm__write_file(path, buf, n, pl > 3 && !strcmp(path + pl - 3, ".gz"));
    free(buf);
    return rc;
}
