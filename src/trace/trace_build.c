/* trace_build.c — builds a gm_trace from pieces: interned strings, frames
 * and stacks (so a million events with the same Python stack cost one stack),
 * the event array and the final segments. Both readers (PyTorch snapshot and
 * .gmt) use it, so a trace looks the same whichever file it came from. */
#include "trace.h"

#include "util/idmap.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

const char *gm__trace_action_name(int action) {
    static const char *names[] = {
#define GM__TA_NAME(n, s) s,
        GM_TRACE_ACTIONS(GM__TA_NAME)
#undef GM__TA_NAME
    };
    return action >= 0 && action < GM_TA_COUNT ? names[action] : "?";
}

/* The interning tables: content hash -> id (idmap.h). Different contents
 * can share a hash, so probing asks eq whether the id's content is key's. */
typedef bool (*eq_fn)(const void *ctx, uint32_t id, const void *key);
#define HT_FIRST_CAP 256

/* Find key; if absent, *slot is where to insert. Returns id or UINT32_MAX. */
static uint32_t ht_find(const gm__idmap *h, uint64_t hash, eq_fn eq, const void *ctx, const void *key,
                        size_t *slot) {
    size_t j = gm__idmap_home(h, hash);
    for (; h->id[j] != GM__IDMAP_EMPTY; j = gm__idmap_next(h, j))
        if (h->key[j] == hash && eq(ctx, h->id[j], key)) return h->id[j];
    *slot = j;
    return UINT32_MAX;
}

/* keyed (idmap.h): a file cannot pick contents that share a hash */
static uint64_t hash_mem(const void *p, size_t n) { return gm__hash_bytes(p, n); }

/* Grow a vector of `elem`-sized items to hold one more, within the
 * builder's share of GM_LIMIT_TRACE_MEMORY (*mem: bytes held so far). A
 * .gmt of regular events compresses by orders of magnitude, so the file's
 * size does not bound the trace; this does. */
static int vec_reserve(uint64_t *mem, void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return GM_OK;
    size_t ncap = *cap ? *cap * 2 : 64;
    if (*mem + (uint64_t)(ncap - *cap) * elem > GM_LIMIT_TRACE_MEMORY)
        return gm__set_error(GM_ENOHOSTMEM, "the trace needs more than %llu bytes of host memory "
                             "(GM_LIMIT_TRACE_MEMORY); record a shorter snapshot",
                             (unsigned long long)GM_LIMIT_TRACE_MEMORY);
    *mem += (uint64_t)(ncap - *cap) * elem;
    void *na = realloc(*arr, ncap * elem);
    if (!na) return gm__set_error(GM_ENOHOSTMEM, "out of host memory building a trace");
    *arr = na;
    *cap = ncap;
    return GM_OK;
}

/* Stacks met again (every event of a snapshot brings a frames list of its
 * own, most of them a stack seen before): a direct-mapped cache, checked by
 * content, in front of the keyed table. A file can make it miss, never
 * search it: one compare a stack, then the table as before. */
#define STACK_CACHE 256
static size_t stack_slot(const uint32_t *f, uint32_t n) {
    uint64_t h = n;
    for (uint32_t i = 0; i < n; i++) h = (h ^ f[i]) * 0x100000001B3ull;
    return (size_t)(h ^ (h >> 29) ^ (h >> 47)) & (STACK_CACHE - 1);
}

struct gm__trace_builder {
    gm_trace *t;
    size_t ev_cap, str_cap, fr_cap, sf_cap, so_cap, seg_cap, nstack_frames;
    uint32_t stack_cache[STACK_CACHE]; /* 1 + a stack's index, by stack_slot() of its frames; 0: none */
    uint64_t mem; /* bytes of the vectors and strings */
    gm__idmap strs, frames, stacks;
    /* events per device, and whether a device came after a higher one,
     * counted as events come (a pass less over 10 M of them at the end) */
    size_t per_dev[256];
    bool unsorted;
};

gm__trace_builder *gm__tb_new(void) {
    gm__trace_builder *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->t = calloc(1, sizeof *b->t);
    if (!b->t || gm__idmap_reserve(&b->strs, HT_FIRST_CAP) || gm__idmap_reserve(&b->frames, HT_FIRST_CAP) ||
        gm__idmap_reserve(&b->stacks, HT_FIRST_CAP)) {
        gm__tb_discard(b);
        return NULL;
    }
    return b;
}

void gm__tb_discard(gm__trace_builder *b) {
    if (!b) return;
    gm__trace_free(b->t);
    gm__idmap_free(&b->strs);
    gm__idmap_free(&b->frames);
    gm__idmap_free(&b->stacks);
    free(b);
}

typedef struct skey { const char *s; size_t n; } skey;
static bool str_eq(const void *ctx, uint32_t id, const void *key) {
    const gm_trace *t = ctx;
    const skey *k = key;
    return strlen(t->strings[id]) == k->n && memcmp(t->strings[id], k->s, k->n) == 0;
}

int gm__tb_string(gm__trace_builder *b, const char *s, size_t n, uint32_t *id) {
    gm_trace *t = b->t;
    if (memchr(s, '\0', n)) n = strlen(s); /* strings are C strings: cut at NUL */
    if (gm__idmap_reserve(&b->strs, HT_FIRST_CAP)) return GM_ENOHOSTMEM;
    skey k = {s, n};
    uint64_t h = hash_mem(s, n);
    size_t slot;
    uint32_t found = ht_find(&b->strs, h, str_eq, t, &k, &slot);
    if (found != UINT32_MAX) {
        *id = found;
        return GM_OK;
    }
    if (vec_reserve(&b->mem, (void **)&t->strings, &b->str_cap, t->nstrings, sizeof *t->strings))
        return GM_ENOHOSTMEM;
    if (b->mem + n + 1 > GM_LIMIT_TRACE_MEMORY)
        return gm__set_error(GM_ENOHOSTMEM, "the trace's strings need more than %llu bytes of host memory "
                             "(GM_LIMIT_TRACE_MEMORY)", (unsigned long long)GM_LIMIT_TRACE_MEMORY);
    b->mem += n + 1;
    char *c = malloc(n + 1);
    if (!c) return GM_ENOHOSTMEM;
    memcpy(c, s, n);
    c[n] = '\0';
    t->strings[t->nstrings] = c;
    gm__idmap_set(&b->strs, slot, h, t->nstrings);
    *id = t->nstrings++;
    return GM_OK;
}

static bool frame_eq(const void *ctx, uint32_t id, const void *key) {
    const gm_trace_frame *a = &((const gm_trace *)ctx)->frames[id], *k = key;
    return a->name == k->name && a->filename == k->filename && a->line == k->line;
}

int gm__tb_frame(gm__trace_builder *b, uint32_t name, uint32_t file, int32_t line, uint32_t *id) {
    gm_trace *t = b->t;
    if (name >= t->nstrings || file >= t->nstrings)
        return gm__set_error(GM_EFORMAT, "frame names string %u of %u", name > file ? name : file,
                             t->nstrings);
    if (gm__idmap_reserve(&b->frames, HT_FIRST_CAP)) return GM_ENOHOSTMEM;
    gm_trace_frame k = {name, file, line};
    uint64_t h = hash_mem(&k, sizeof k);
    size_t slot;
    uint32_t found = ht_find(&b->frames, h, frame_eq, t, &k, &slot);
    if (found != UINT32_MAX) {
        *id = found;
        return GM_OK;
    }
    if (vec_reserve(&b->mem, (void **)&t->frames, &b->fr_cap, t->nframes, sizeof *t->frames))
        return GM_ENOHOSTMEM;
    t->frames[t->nframes] = k;
    gm__idmap_set(&b->frames, slot, h, t->nframes);
    *id = t->nframes++;
    return GM_OK;
}

typedef struct stkey { const uint32_t *f; uint32_t n; } stkey;
static bool stack_eq(const void *ctx, uint32_t id, const void *key) {
    const gm_trace *t = ctx;
    const stkey *k = key;
    uint32_t n = t->stack_off[id + 1] - t->stack_off[id];
    return n == k->n && memcmp(t->stack_frames + t->stack_off[id], k->f, n * sizeof *k->f) == 0;
}

int gm__tb_stack(gm__trace_builder *b, const uint32_t *frames, uint32_t n, uint32_t *id1) {
    gm_trace *t = b->t;
    if (n == 0) {
        *id1 = 0;
        return GM_OK;
    }
    for (uint32_t i = 0; i < n; i++)
        if (frames[i] >= t->nframes)
            return gm__set_error(GM_EFORMAT, "stack names frame %u of %u", frames[i], t->nframes);
    if (gm__idmap_reserve(&b->stacks, HT_FIRST_CAP)) return GM_ENOHOSTMEM;
    if (!t->stack_off) {
        if (vec_reserve(&b->mem, (void **)&t->stack_off, &b->so_cap, 0, sizeof *t->stack_off))
            return GM_ENOHOSTMEM;
        t->stack_off[0] = 0;
    }
    stkey k = {frames, n};
    size_t cslot = stack_slot(frames, n);
    uint32_t cached = b->stack_cache[cslot];
    if (cached && stack_eq(t, cached - 1, &k)) {
        *id1 = cached;
        return GM_OK;
    }
    uint64_t h = hash_mem(frames, n * sizeof *frames);
    size_t slot;
    uint32_t found = ht_find(&b->stacks, h, stack_eq, t, &k, &slot);
    if (found != UINT32_MAX) {
        *id1 = b->stack_cache[cslot] = found + 1;
        return GM_OK;
    }
    if (b->nstack_frames + n > UINT32_MAX) return gm__set_error(GM_EFORMAT, "too many stack frames");
    while (b->sf_cap < b->nstack_frames + n)
        if (vec_reserve(&b->mem, (void **)&t->stack_frames, &b->sf_cap, b->sf_cap, sizeof *t->stack_frames))
            return GM_ENOHOSTMEM;
    if (vec_reserve(&b->mem, (void **)&t->stack_off, &b->so_cap, t->nstacks + 1, sizeof *t->stack_off))
        return GM_ENOHOSTMEM;
    memcpy(t->stack_frames + b->nstack_frames, frames, n * sizeof *frames);
    b->nstack_frames += n;
    t->stack_off[t->nstacks + 1] = (uint32_t)b->nstack_frames;
    gm__idmap_set(&b->stacks, slot, h, t->nstacks);
    *id1 = b->stack_cache[cslot] = ++t->nstacks;
    return GM_OK;
}

int gm__tb_event(gm__trace_builder *b, const gm_trace_event *e) {
    gm_trace *t = b->t;
    if (e->stack > t->nstacks)
        return gm__set_error(GM_EFORMAT, "event names stack %u of %u", e->stack, t->nstacks);
    if (e->action >= GM_TA_COUNT) return gm__set_error(GM_EFORMAT, "bad event action %u", e->action);
    if (t->nevents >= GM_LIMIT_TRACE_EVENTS)
        return gm__set_error(GM_EFORMAT, "trace has more than %llu events (GM_LIMIT_TRACE_EVENTS); "
                             "split it (e.g. record shorter snapshots)",
                             (unsigned long long)GM_LIMIT_TRACE_EVENTS);
    if (vec_reserve(&b->mem, (void **)&t->events, &b->ev_cap, t->nevents, sizeof *t->events))
        return GM_ENOHOSTMEM;
    if (t->nevents && e->device < t->events[t->nevents - 1].device) b->unsorted = true;
    t->events[t->nevents++] = *e;
    b->per_dev[e->device]++;
    if (e->device + 1 > t->ndevices) t->ndevices = e->device + 1;
    return GM_OK;
}

size_t gm__tb_nevents(const gm__trace_builder *b) { return b->t->nevents; }

int gm__tb_event_copy(gm__trace_builder *b, size_t i, int device) {
    if (i >= b->t->nevents) return gm__set_error(GM_EFORMAT, "event %zu of %zu", i, b->t->nevents);
    gm_trace_event e = b->t->events[i];
    e.device = (uint8_t)device;
    return gm__tb_event(b, &e);
}

int gm__tb_segment(gm__trace_builder *b, const gm_trace_segment *s) {
    gm_trace *t = b->t;
    if (vec_reserve(&b->mem, (void **)&t->segments, &b->seg_cap, t->nsegments, sizeof *t->segments))
        return GM_ENOHOSTMEM;
    t->segments[t->nsegments++] = *s;
    return GM_OK;
}

int gm__tb_conf(gm__trace_builder *b, const char *conf) {
    free(b->t->alloc_conf);
    b->t->alloc_conf = conf ? strdup(conf) : NULL;
    b->t->has_settings = true;
    return conf && !b->t->alloc_conf ? GM_ENOHOSTMEM : GM_OK;
}

int gm__tb_finish(gm__trace_builder *b, const char *format, gm_trace **out) {
    gm_trace *t = b->t;
    *out = NULL;
    int nd = t->ndevices ? t->ndevices : 1;
    t->dev_off = calloc((size_t)nd + 1, sizeof *t->dev_off);
    if (!t->dev_off) {
        gm__tb_discard(b);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory building a trace");
    }
    for (int d = 0; d < nd; d++) t->dev_off[d + 1] = t->dev_off[d] + b->per_dev[d];
    if (b->unsorted) { /* stable counting sort by device */
        gm_trace_event *s = malloc(t->nevents * sizeof *s);
        size_t *pos = malloc((size_t)nd * sizeof *pos);
        if (!s || !pos) {
            free(s);
            free(pos);
            gm__tb_discard(b);
            return gm__set_error(GM_ENOHOSTMEM, "out of host memory building a trace");
        }
        memcpy(pos, t->dev_off, (size_t)nd * sizeof *pos);
        for (size_t i = 0; i < t->nevents; i++) s[pos[t->events[i].device]++] = t->events[i];
        free(t->events);
        free(pos);
        t->events = s;
    }
    t->ndevices = nd;
    t->format = format;
    if (!t->stack_off) t->nstacks = 0;
    *out = t;
    b->t = NULL;
    gm__tb_discard(b);
    return GM_OK;
}

void gm__trace_free(gm_trace *t) {
    if (!t) return;
    for (uint32_t i = 0; i < t->nstrings; i++) free(t->strings[i]);
    free(t->strings);
    free(t->events);
    free(t->dev_off);
    free(t->frames);
    free(t->stack_frames);
    free(t->stack_off);
    free(t->segments);
    free(t->alloc_conf);
    free(t);
}
