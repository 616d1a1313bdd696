/* test_policy_torch_cudalike.c — the torch policy on a backend that hands
 * out addresses the way cuMemAlloc does (2 MiB-aligned, in no particular
 * order: random, descending, or packed so that segments touch), with
 * streams that are pointer values and events that complete at random, as
 * GPU work does: random workloads (OOM/release/retry on a small device,
 * record_stream, empty_cache, expandable segments, gc with a fraction) and
 * the shared traces, with gm_check after every step and no two live
 * allocations overlapping. The sim's ascending addresses hid nothing here,
 * but the H200 runs differed from the sim only in addresses and streams.
 *
 * Longer hunts: GM_TORCH_STRESS_SEEDS, _STEPS, _SEED0 (random workloads),
 * GM_TORCH_STRESS_FULL=1 and _EVERY (traces: every address mode and config,
 * gm_check every N events). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"
#include "workload.h"

#include "trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB GM_TEST_MIB
#define GIB GM_TEST_GIB

static gm_allocator *g_a;
static gm_backend *g_b;

static void done(void) {
    gm_test_destroy(g_b, g_a);
    g_a = NULL;
    g_b = NULL;
}

#define S() gm_test_stats(g_a)

/* ---- the backend ---------------------------------------------------------
 * VMM with 2 MiB granularity; capacity counts plain allocations and
 * physical pages; each query of a pending event completes it with
 * probability done_pct. */

enum { CL_RANDOM, CL_DESCENDING, CL_PACKED };

typedef struct cl_range {
    uint64_t start, size;
} cl_range;

typedef struct cl_ctx {
    uint64_t cap, used, rng, next_desc;
    int mode;
    cl_range *live; /* plain allocations and VA reservations */
    size_t nlive, caplive;
    uint8_t *ev; /* 0 free, 1 pending, 2 done */
    size_t nev;
    unsigned done_pct; /* chance that a query finds a pending event done */
} cl_ctx;

static uint64_t cl_rand(cl_ctx *c) { /* splitmix64 */
    uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static bool cl_overlaps(const cl_ctx *c, uint64_t p, uint64_t n) {
    for (size_t i = 0; i < c->nlive; i++)
        if (p < c->live[i].start + c->live[i].size && c->live[i].start < p + n) return true;
    return false;
}

/* a 2 MiB-aligned free range of n bytes, placed by mode */
static uint64_t cl_place(cl_ctx *c, uint64_t n) {
    n = (n + 2 * MIB - 1) & ~(2 * MIB - 1);
    for (int tries = 0; tries < 100000; tries++) {
        uint64_t p;
        if (c->mode == CL_DESCENDING) {
            c->next_desc -= n + 2 * MIB * (cl_rand(c) % 3);
            p = c->next_desc;
        } else {
            /* packed: a window of a few times the capacity, so segments
             * touch (VA reservations, larger than the device, go wide) */
            bool packed = c->mode == CL_PACKED && n <= c->cap;
            uint64_t slots = packed ? (4 * c->cap) / (2 * MIB) + 64 : (1ull << 22);
            p = 0x7f1234400000ull + 2 * MIB * (cl_rand(c) % slots);
        }
        if (!cl_overlaps(c, p, n)) {
            if (c->nlive == c->caplive) {
                c->caplive = c->caplive ? 2 * c->caplive : 64;
                c->live = realloc(c->live, c->caplive * sizeof *c->live);
                assert_non_null(c->live);
            }
            c->live[c->nlive++] = (cl_range){p, n};
            return p;
        }
    }
    fail_msg("cuda-like backend: no free address range");
    return 0;
}

static int cl_unplace(cl_ctx *c, uint64_t p) {
    for (size_t i = 0; i < c->nlive; i++)
        if (c->live[i].start == p) {
            c->live[i] = c->live[--c->nlive];
            return GM_OK;
        }
    return GM_EINVAL;
}

static void cl_destroy(void *ctx) {
    cl_ctx *c = ctx;
    free(c->live);
    free(c->ev);
    free(c);
}
static int cl_count(void *ctx, int *n) { (void)ctx; *n = 1; return GM_OK; }
static int cl_mem_info(void *ctx, int dev, uint64_t *fr, uint64_t *tot) {
    cl_ctx *c = ctx;
    (void)dev;
    *fr = c->cap - c->used;
    *tot = c->cap;
    return GM_OK;
}
static int cl_malloc(void *ctx, int dev, uint64_t n, gm_devptr *out) {
    cl_ctx *c = ctx;
    (void)dev;
    uint64_t r = (n + 2 * MIB - 1) & ~(2 * MIB - 1);
    if (c->used + r > c->cap) return GM_ENOMEM;
    c->used += r;
    *out = cl_place(c, n);
    return GM_OK;
}
static int cl_free(void *ctx, int dev, gm_devptr p) {
    cl_ctx *c = ctx;
    (void)dev;
    for (size_t i = 0; i < c->nlive; i++)
        if (c->live[i].start == p) c->used -= c->live[i].size;
    return cl_unplace(c, p);
}
static int cl_gran(void *ctx, int dev, uint64_t *g) { (void)ctx, (void)dev; *g = 2 * MIB; return GM_OK; }
static int cl_va_reserve(void *ctx, int dev, uint64_t n, gm_devptr *out) {
    (void)dev;
    *out = cl_place(ctx, n);
    return GM_OK;
}
static int cl_va_release(void *ctx, int dev, gm_devptr va, uint64_t n) {
    (void)dev, (void)n;
    return cl_unplace(ctx, va);
}
static int cl_phys_create(void *ctx, int dev, uint64_t n, gm_physmem *out) {
    cl_ctx *c = ctx;
    (void)dev;
    if (c->used + n > c->cap) return GM_ENOMEM;
    c->used += n;
    *out = n; /* the handle is its size: enough to account */
    return GM_OK;
}
static int cl_phys_release(void *ctx, int dev, gm_physmem h) {
    cl_ctx *c = ctx;
    (void)dev;
    c->used -= h;
    return GM_OK;
}
static int cl_map(void *ctx, int dev, gm_devptr va, uint64_t n, gm_physmem h) {
    (void)ctx, (void)dev, (void)va, (void)n, (void)h;
    return GM_OK;
}
static int cl_unmap(void *ctx, int dev, gm_devptr va, uint64_t n) {
    (void)ctx, (void)dev, (void)va, (void)n;
    return GM_OK;
}
static int cl_ev_record(void *ctx, int dev, gm_stream s, gm_event *out) {
    cl_ctx *c = ctx;
    (void)dev, (void)s;
    size_t i = 0;
    while (i < c->nev && c->ev[i]) i++;
    if (i == c->nev) {
        c->ev = realloc(c->ev, ++c->nev);
        assert_non_null(c->ev);
    }
    c->ev[i] = 1;
    *out = 0x5000 + i;
    return GM_OK;
}
static int cl_ev_query(void *ctx, int dev, gm_event e, bool *done) {
    cl_ctx *c = ctx;
    (void)dev;
    if (c->ev[e - 0x5000] == 1 && cl_rand(c) % 100 < c->done_pct) c->ev[e - 0x5000] = 2;
    *done = c->ev[e - 0x5000] == 2;
    return GM_OK;
}
static int cl_ev_sync(void *ctx, int dev, gm_event e) {
    cl_ctx *c = ctx;
    (void)dev;
    c->ev[e - 0x5000] = 2;
    return GM_OK;
}
static int cl_ev_destroy(void *ctx, int dev, gm_event e) {
    cl_ctx *c = ctx;
    (void)dev;
    c->ev[e - 0x5000] = 0;
    return GM_OK;
}

static const gm_backend_ops cl_ops = {
    .version = GM_BACKEND_VERSION, .size = sizeof(gm_backend_ops), .name = "cuda-like",
    .destroy = cl_destroy, .device_count = cl_count, .mem_info = cl_mem_info,
    .malloc = cl_malloc, .free = cl_free, .granularity = cl_gran,
    .va_reserve = cl_va_reserve, .va_release = cl_va_release,
    .phys_create = cl_phys_create, .phys_release = cl_phys_release,
    .map = cl_map, .unmap = cl_unmap, .event_record = cl_ev_record,
    .event_query = cl_ev_query, .event_sync = cl_ev_sync, .event_destroy = cl_ev_destroy,
};

static void cl_make(const char *conf, uint64_t cap, int mode, uint64_t seed) {
    cl_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->cap = cap;
    c->mode = mode;
    c->rng = seed;
    c->next_desc = 0x7ffff0000000ull;
    c->done_pct = 30;
    assert_int_equal(gm_backend_create(&g_b, &cl_ops, c), GM_OK);
    gm_config cfg;
    char err[256];
    gm_config_init(&cfg);
    if (conf && gm_config_parse(&cfg, conf, err, sizeof err) != GM_OK) fail_msg("%s: %s", conf, err);
    cfg.policy = GM_POLICY_TORCH;
    if (gm_allocator_create(&g_a, g_b, &cfg) != GM_OK) fail_msg("allocator: %s", gm_last_error_detail());
}

/* the check, with what was running in the message */
static void cl_check(const char *what, uint64_t seed, long step) {
    char err[512];
    if (gm_check(g_a, 0, err, sizeof err) != GM_OK)
        fail_msg("%s seed %llu step %ld: %s", what, (unsigned long long)seed, step, err);
}

typedef struct cl_live {
    gm_devptr p;
    uint64_t n;
} cl_live;

/* no two live allocations overlap */
static void cl_no_overlap(const cl_live *v, size_t n, gm_devptr p, uint64_t sz) {
    for (size_t i = 0; i < n; i++)
        if (p < v[i].p + v[i].n && v[i].p < p + sz)
            fail_msg("0x%llx+%llu overlaps live 0x%llx+%llu", (unsigned long long)p,
                     (unsigned long long)sz, (unsigned long long)v[i].p, (unsigned long long)v[i].n);
}

static const gm_stream cl_streams[] = {0, 0x55d0c0ffee00ull, 0x55d0c0ffef80ull, 0x7f12dead0010ull};

/* A random workload: mallocs of 1 B .. big, frees, record_stream on other
 * streams, empty_cache; OOMs are expected when cap is small. */
static void cl_run(const char *conf, uint64_t cap, int mode, uint64_t seed, long steps, uint64_t big) {
    cl_make(conf, cap, mode, seed);
    cl_ctx *c = NULL;
    uint64_t r = seed * 0x9e3779b97f4a7c15ull + 1;
    cl_live v[512];
    size_t n = 0;
    char what[160];
    snprintf(what, sizeof what, "[%s cap %llu MiB mode %d]", conf ? conf : "", (unsigned long long)(cap / MIB), mode);
    (void)c;
    for (long step = 0; step < steps; step++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        unsigned op = (unsigned)(r >> 33) % 100;
        uint64_t x = r >> 11;
        if (op < 55 && n < 512) {
            unsigned kind = (unsigned)(x % 10);
            uint64_t sz = kind < 6 ? 1 + x % (1 * MIB) : kind < 9 ? 1 + x % (20 * MIB) : 1 + x % big;
            gm_stream s = cl_streams[(x >> 40) % 4];
            gm_devptr p = 0;
            int rc = gm_malloc(g_a, 0, sz, s, &p);
            if (rc == GM_OK) {
                cl_no_overlap(v, n, p, sz);
                v[n++] = (cl_live){p, sz};
            } else if (rc != GM_ENOMEM) {
                fail_msg("%s seed %llu step %ld: malloc %s", what, (unsigned long long)seed, step, gm_status_name(rc));
            }
        } else if (op < 93 && n) {
            size_t i = (size_t)(x % n);
            assert_int_equal(gm_free(g_a, v[i].p), GM_OK);
            v[i] = v[--n];
        } else if (op < 98 && n) {
            assert_int_equal(gm_record_stream(g_a, v[x % n].p, cl_streams[(x >> 20) % 4]), GM_OK);
        } else if (op < 99) {
            assert_int_equal(gm_empty_cache(g_a, 0), GM_OK);
        }
        cl_check(what, seed, step);
    }
    while (n) assert_int_equal(gm_free(g_a, v[--n].p), GM_OK);
    assert_int_equal(gm_empty_cache(g_a, 0), GM_OK);
    cl_check(what, seed, steps);
    gm_stats s = S();
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    done();
}

static const char *const cl_confs[] = {
    NULL, "max_split_size_mb:64", "expandable_segments:True",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
    "roundup_power2_divisions:4,max_non_split_rounding_mb:64",
};

static void test_cuda_like_random(void **state) {
    (void)state;
    /* longer hunts: GM_TORCH_STRESS_SEEDS=50 GM_TORCH_STRESS_STEPS=3000 */
    uint64_t seeds = wl_env_u64("GM_TORCH_STRESS_SEEDS", 1);
    long steps = (long)wl_env_u64("GM_TORCH_STRESS_STEPS", 300);
    uint64_t seed0 = wl_env_u64("GM_TORCH_STRESS_SEED0", 1);
    for (size_t k = 0; k < sizeof cl_confs / sizeof *cl_confs; k++)
        for (int mode = 0; mode < 3; mode++)
            for (uint64_t seed = seed0; seed < seed0 + seeds; seed++) {
                cl_run(cl_confs[k], 512 * MIB, mode, seed, steps, 96 * MIB); /* OOM, release, retry */
                cl_run(cl_confs[k], 8 * GIB, mode, seed + 1000000, steps, 400 * MIB);
            }
}

/* tests/gpu's test_many_live_tensors_keep_their_data, on CUDA-like addresses */
static void test_cuda_like_many_live(void **state) {
    (void)state;
    for (int mode = 0; mode < 3; mode++) {
        cl_make(NULL, 80 * GIB, mode, 7 + (uint64_t)mode);
        uint64_t r = 7;
        cl_live v[300];
        for (int i = 0; i < 300; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t n = ((1 + (r >> 20) % (3 * MIB)) / 4 + 1) * 4;
            assert_int_equal(gm_malloc(g_a, 0, n, 0x55d0c0ffee00ull, &v[i].p), GM_OK);
            v[i].n = n;
            for (int j = 0; j < i; j++)
                if (v[j].n) cl_no_overlap(&v[j], 1, v[i].p, n);
            if (i % 3 == 2) {
                assert_int_equal(gm_free(g_a, v[i - 1].p), GM_OK);
                v[i - 1].n = 0;
            }
            cl_check("many live", (uint64_t)mode, i);
        }
        for (int i = 0; i < 300; i++)
            if (v[i].n) assert_int_equal(gm_free(g_a, v[i].p), GM_OK);
        cl_check("many live", (uint64_t)mode, 300);
        done();
    }
}

/* ---- the shared traces, replayed on CUDA-like addresses ---------------- */

typedef struct cl_addrmap {
    uint64_t *k, *v;
    size_t mask;
} cl_addrmap;

static size_t cl_slot(const cl_addrmap *m, uint64_t k) {
    size_t i = (size_t)((k >> 9) * 0x9e3779b97f4a7c15ull) & m->mask;
    while (m->k[i] && m->k[i] != k) i = (i + 1) & m->mask;
    return i;
}

static void cl_replay(const char *path, const char *conf, int mode, int every) {
    gm_trace *t = NULL;
    if (gm__trace_load_file(path, &t) != GM_OK) fail_msg("%s: %s", path, gm_last_error_detail());
    cl_make(conf, 141 * GIB, mode, 99);
    size_t lo = t->dev_off[0], hi = t->dev_off[1];
    cl_addrmap m = {calloc(1 << 20, 8), calloc(1 << 20, 8), (1 << 20) - 1};
    assert_non_null(m.k);
    assert_non_null(m.v);
    char what[1400];
    snprintf(what, sizeof what, "%s [%s mode %d]", path, conf ? conf : "", mode);
    for (size_t i = lo; i < hi; i++) {
        const gm_trace_event *e = &t->events[i];
        if (e->action == GM_TA_ALLOC && e->addr) {
            size_t s = cl_slot(&m, e->addr);
            if (m.k[s]) continue; /* a trace double alloc: skip it */
            gm_devptr p = 0;
            int rc = gm_malloc(g_a, 0, e->size, e->stream, &p);
            if (rc != GM_OK) fail_msg("%s event %zu: malloc %s", what, i - lo, gm_status_name(rc));
            m.k[s] = e->addr;
            m.v[s] = p;
        } else if (e->action == GM_TA_FREE_COMPLETED && e->addr) {
            size_t s = cl_slot(&m, e->addr);
            if (!m.k[s]) continue;
            assert_int_equal(gm_free(g_a, m.v[s]), GM_OK);
            /* backward-shift delete */
            size_t hole = s;
            for (size_t j = (s + 1) & m.mask; m.k[j]; j = (j + 1) & m.mask) {
                size_t home = (size_t)((m.k[j] >> 9) * 0x9e3779b97f4a7c15ull) & m.mask;
                if (((j - home) & m.mask) >= ((j - hole) & m.mask)) {
                    m.k[hole] = m.k[j];
                    m.v[hole] = m.v[j];
                    hole = j;
                }
            }
            m.k[hole] = 0;
        } else {
            continue;
        }
        if ((long)(i - lo) % every == 0) cl_check(what, 0, (long)(i - lo));
    }
    cl_check(what, 0, (long)(hi - lo));
    for (size_t s = 0; s <= m.mask; s++)
        if (m.k[s]) assert_int_equal(gm_free(g_a, m.v[s]), GM_OK);
    assert_int_equal(gm_empty_cache(g_a, 0), GM_OK);
    cl_check(what, 0, -1);
    free(m.k);
    free(m.v);
    done();
    gm__trace_free(t);
}

static void test_cuda_like_traces(void **state) {
    (void)state;
    const char *shared = getenv("GPUMEM_SHARED");
    static const char *const names[] = {"bert_base_varseq_fp16", "gpt2_small_adamw_bf16",
                                        "gpt2_generate_kvcache", "resnet50_sgd_amp"};
    char path[1024];
    snprintf(path, sizeof path, "%s/traces/%s.pickle.gz", shared ? shared : "", names[0]);
    FILE *f = shared ? fopen(path, "rb") : NULL;
    if (!f) {
        print_message("skipped: no shared traces (GPUMEM_SHARED unset or no %s)\n", path);
        skip();
    }
    fclose(f);
    /* everything: GM_TORCH_STRESS_FULL=1 (every address mode and config, check
     * every GM_TORCH_STRESS_EVERY events) */
    bool full = wl_env_u64("GM_TORCH_STRESS_FULL", 0) != 0;
    int every = (int)wl_env_u64("GM_TORCH_STRESS_EVERY", full ? 500 : 5000);
    static const char *const confs[] = {NULL, "expandable_segments:True", "max_split_size_mb:128"};
    for (int k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "%s/traces/%s.pickle.gz", shared, names[k]);
        for (int mode = 0; mode < 3; mode++)
            for (int c = 0; c < 3; c++)
                if (full || (mode == k % 3 && c == (k + mode) % 3)) cl_replay(path, confs[c], mode, every);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_like_many_live),
        cmocka_unit_test(test_cuda_like_random),
        cmocka_unit_test(test_cuda_like_traces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
