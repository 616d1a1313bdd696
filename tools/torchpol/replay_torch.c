/* replay_torch.c — dev harness for the torch policy (not part of the build):
 * replays a text trace from dump_trace.py through gm__policy_torch on a
 * stub backend defined here, and prints the peaks, so the policy can be
 * checked against baselines.json before the real `gpumem replay` exists.
 *
 * Build (from the repository root):
 *   gcc -std=gnu11 -O2 -Iinclude -Isrc/core tools/torchpol/replay_torch.c \
 *       src/core/policy_torch*.c -o /tmp/replay_torch
 * Run: replay_torch TRACE.txt [--conf default|expandable|msplit128]
 *                             [--addr low|high|trace] [--repeat N] [--check]
 */
#include "policy_torch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- stub backend ------------------------------------------------------- */

static uint64_t g_capacity = 141 * GM__GIB, g_used;
static int g_addr_mode; /* 0 low, 1 high, 2 trace, 3 hint+low, 4 hint+high */
static char *g_hint_used;
static gm_devptr *g_trace_segs;
static uint64_t *g_trace_seg_sizes;
static size_t g_ntrace_segs, g_next_trace_seg;
typedef struct { gm_devptr a; uint64_t n; } range;
static range g_ranges[65536];
static size_t g_nranges;
static gm_devptr g_va_next = (gm_devptr)1 << 46;
#define ARENA_LO ((gm_devptr)1 << 44)
#define ARENA_HI (ARENA_LO + 256 * GM__GIB)

int gm__set_error(int status, const char *fmt, ...) { (void)fmt; return status; }
void gm__clear_error(void) {}
int gm__device_process_events(gm__device *d, bool s) { (void)d; (void)s; return 0; }

static void range_add(gm_devptr a, uint64_t n) {
    size_t i = 0;
    while (i < g_nranges && g_ranges[i].a < a) i++;
    memmove(&g_ranges[i + 1], &g_ranges[i], (g_nranges - i) * sizeof(range));
    g_ranges[i] = (range){a, n};
    g_nranges++;
}

int gm__be_malloc(gm__device *d, uint64_t size, gm_devptr *out) {
    (void)d;
    if (g_used + size > g_capacity) return GM_ENOMEM;
    uint64_t n = (size + 2 * GM__MIB - 1) & ~(2 * GM__MIB - 1);
    gm_devptr a = 0;
    if (g_addr_mode >= 3) { /* first unused trace address of this size that is free */
        for (size_t k = 0; k < g_ntrace_segs; k++) {
            if (g_hint_used[k] || g_trace_seg_sizes[k] != size) continue;
            gm_devptr h = g_trace_segs[k];
            int clash = 0;
            for (size_t i = 0; i < g_nranges && !clash; i++)
                clash = h < g_ranges[i].a + g_ranges[i].n && g_ranges[i].a < h + n;
            if (clash) continue;
            g_hint_used[k] = 1;
            range_add(h, n);
            g_used += size;
            *out = h;
            return 0;
        }
    }
    if (g_addr_mode == 2 && g_next_trace_seg < g_ntrace_segs &&
        g_trace_seg_sizes[g_next_trace_seg] == size) {
        a = g_trace_segs[g_next_trace_seg++];
    } else if (g_addr_mode == 1 || g_addr_mode == 4) { /* highest gap */
        gm_devptr hi = ARENA_HI;
        for (size_t i = g_nranges; i-- > 0;) {
            if (g_ranges[i].a >= hi) continue;
            if (hi - (g_ranges[i].a + g_ranges[i].n) >= n) break;
            hi = g_ranges[i].a;
        }
        a = hi - n;
    } else {
        gm_devptr lo = ARENA_LO;
        for (size_t i = 0; i < g_nranges; i++) {
            if (g_ranges[i].a + g_ranges[i].n <= lo) continue;
            if (g_ranges[i].a - lo >= n) break;
            lo = g_ranges[i].a + g_ranges[i].n;
        }
        a = lo;
    }
    range_add(a, n);
    g_used += size;
    *out = a;
    return 0;
}
int gm__be_free(gm__device *d, gm_devptr ptr) {
    (void)d;
    for (size_t i = 0; i < g_nranges; i++)
        if (g_ranges[i].a == ptr) {
            g_used -= g_ranges[i].n;
            memmove(&g_ranges[i], &g_ranges[i + 1], (g_nranges - i - 1) * sizeof(range));
            g_nranges--;
            return 0;
        }
    return GM_EINVAL;
}
int gm__be_mem_info(gm__device *d, uint64_t *f, uint64_t *t) { (void)d; *f = g_capacity - g_used; *t = g_capacity; return 0; }
int gm__be_granularity(gm__device *d, uint64_t *b) { (void)d; *b = 2 * GM__MIB; return 0; }
int gm__be_va_reserve(gm__device *d, uint64_t size, gm_devptr *out) { (void)d; *out = g_va_next; g_va_next += size + 2 * GM__MIB; return 0; }
int gm__be_va_release(gm__device *d, gm_devptr va, uint64_t size) { (void)d; (void)va; (void)size; return 0; }
int gm__be_phys_create(gm__device *d, uint64_t size, gm_physmem *out) {
    (void)d;
    if (g_used + size > g_capacity) return GM_ENOMEM;
    g_used += size;
    *out = size;
    return 0;
}
int gm__be_phys_release(gm__device *d, gm_physmem h) { (void)d; g_used -= h; return 0; }
int gm__be_map(gm__device *d, gm_devptr va, uint64_t size, gm_physmem h) { (void)d; (void)va; (void)size; (void)h; return 0; }
int gm__be_unmap(gm__device *d, gm_devptr va, uint64_t size) { (void)d; (void)va; (void)size; return 0; }
int gm__be_event_record(gm__device *d, gm_stream s, gm_event *out) { (void)d; (void)s; *out = 1; return 0; }
int gm__be_event_query(gm__device *d, gm_event ev, bool *done) { (void)d; (void)ev; *done = true; return 0; }
int gm__be_event_sync(gm__device *d, gm_event ev) { (void)d; (void)ev; return 0; }
int gm__be_event_destroy(gm__device *d, gm_event ev) { (void)d; (void)ev; return 0; }

/* ---- trace -------------------------------------------------------------- */

typedef struct { char op; uint64_t addr, size, stream; } ev;

static ev *load(const char *path, size_t *n) {
    FILE *f = fopen(path, "r");
    if (!f) { perror(path); exit(1); }
    size_t cap = 1 << 16, k = 0;
    ev *v = malloc(cap * sizeof(ev));
    char line[256];
    while (fgets(line, sizeof line, f)) {
        ev e = {0};
        e.op = line[0];
        if (e.op == 'f') sscanf(line + 2, "%lu %lu", &e.addr, &e.stream);
        else sscanf(line + 2, "%lu %lu %lu", &e.addr, &e.size, &e.stream);
        if (k == cap) v = realloc(v, (cap *= 2) * sizeof(ev));
        v[k++] = e;
    }
    fclose(f);
    *n = k;
    return v;
}

/* open-addressing map trace addr -> block */
typedef struct { uint64_t key; gm__block_hdr *b; } slot;
static slot *g_map;
static uint64_t g_mask;
static uint64_t hash(uint64_t x) { x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; return x; }
static void map_put(uint64_t k, gm__block_hdr *b) {
    uint64_t i = hash(k) & g_mask;
    while (g_map[i].key && g_map[i].key != k) i = (i + 1) & g_mask;
    g_map[i].key = k;
    g_map[i].b = b;
}
static gm__block_hdr *map_take(uint64_t k) {
    uint64_t i = hash(k) & g_mask;
    while (g_map[i].key != k) { if (!g_map[i].key) return NULL; i = (i + 1) & g_mask; }
    gm__block_hdr *b = g_map[i].b;
    /* backward-shift delete */
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & g_mask;
        if (!g_map[j].key) break;
        uint64_t h = hash(g_map[j].key) & g_mask;
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            g_map[i] = g_map[j];
            i = j;
        }
    }
    g_map[i].key = 0;
    return b;
}

int main(int argc, char **argv) {
    const char *conf = "default";
    int repeat = 1, check = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--conf")) conf = argv[++i];
        else if (!strcmp(argv[i], "--addr")) {
            const char *m = argv[++i];
            g_addr_mode = !strcmp(m, "high") ? 1 : !strcmp(m, "trace") ? 2 : !strcmp(m, "hintlow") ? 3 : !strcmp(m, "hinthigh") ? 4 : 0;
        } else if (!strcmp(argv[i], "--repeat")) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check")) check = 1;
    }
    size_t n;
    ev *v = load(argv[1], &n);
    g_trace_segs = calloc(n, sizeof(gm_devptr));
    g_trace_seg_sizes = calloc(n, sizeof(uint64_t));
    for (size_t i = 0; i < n; i++)
        if (v[i].op == 's') {
            g_trace_seg_sizes[g_ntrace_segs] = v[i].size;
            g_trace_segs[g_ntrace_segs++] = v[i].addr;
        }
    g_hint_used = calloc(n, 1);
    g_mask = (1 << 16) - 1;
    g_map = calloc(g_mask + 1, sizeof(slot));
    gm_config cfg = {0};
    cfg.max_split_size = UINT64_MAX;
    cfg.max_non_split_rounding = 20 * GM__MIB;
    if (!strcmp(conf, "expandable")) cfg.expandable_segments = true;
    if (!strcmp(conf, "msplit128")) { cfg.max_split_size = 128 * GM__MIB; cfg.garbage_collection_threshold = 0.6; }
    double t_total = 0;
    uint64_t nops = 0;
    for (int r = 0; r < repeat; r++) {
        gm__device d = {0};
        d.cfg = &cfg;
        d.total_memory = 143771 * GM__MIB;
        d.memory_fraction = 1.0;
        g_next_trace_seg = 0;
        memset(g_hint_used, 0, n);
        void *st;
        gm__policy_torch.create(&d, &st);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        nops = 0;
        for (size_t i = 0; i < n; i++) {
            ev *e = &v[i];
            if (e->op == 'a') {
                gm__block_hdr *b;
                int rc = gm__policy_torch.malloc(st, e->size, e->stream, &b);
                if (rc) { printf("malloc failed at %zu rc %d\n", i, rc); return 1; }
                b->requested = e->size;
                b->live = 1;
                gm__stat_pool_add(d.stats.allocated_bytes, b->pool, (int64_t)b->size);
                gm__stat_pool_add(d.stats.requested_bytes, b->pool, (int64_t)b->requested);
                map_put(e->addr, b);
                nops++;
            } else if (e->op == 'f') {
                gm__block_hdr *b = map_take(e->addr);
                if (!b) { printf("unknown free at %zu\n", i); return 1; }
                b->live = 0;
                gm__stat_pool_add(d.stats.allocated_bytes, b->pool, -(int64_t)b->size);
                gm__stat_pool_add(d.stats.requested_bytes, b->pool, -(int64_t)b->requested);
                gm__policy_torch.free(st, b);
                nops++;
            } else continue;
            if (check) {
                char err[256];
                if (gm__policy_torch.check(st, err, sizeof err)) { printf("check failed at %zu: %s\n", i, err); return 1; }
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        t_total += (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
        if (r == repeat - 1) {
            char err[256];
            int crc = gm__policy_torch.check(st, err, sizeof err);
            printf("peak_requested %lld peak_allocated %lld peak_reserved %lld segments %lld "
                   "retries %lld check %s\n",
                   (long long)d.stats.requested_bytes[0].peak, (long long)d.stats.allocated_bytes[0].peak,
                   (long long)d.stats.reserved_bytes[0].peak, (long long)d.stats.segment[0].allocated,
                   (long long)d.stats.num_alloc_retries, crc ? err : "ok");
        }
        /* drop what is left */
        for (uint64_t i = 0; i <= g_mask; i++) g_map[i].key = 0;
        gm__policy_torch.destroy(st);
        g_nranges = 0;
        g_used = 0;
    }
    printf("ops %llu, %.1f M ops/s\n", (unsigned long long)nops, nops * repeat / t_total / 1e6);
    return 0;
}
