/* test_policy_gpumem.c — unit tests of the `gpumem` policy on the sim
 * backend: placement, no overlaps under random alloc/free (gm_check after
 * every step), moving idle granules instead of creating memory, OOM ->
 * reclaim -> retry, per-stream reuse, empty_cache, the fallback for a
 * backend without VMM, gpumem_chunks:run's and :auto's cold start, :auto
 * cutting an idle chunk that a placement would use in part, and the segment
 * walk's shape (one segment per run of mapped memory, as torch's snapshot
 * under expandable_segments). Moving idle memory under the reserve budget
 * has its own file: test_policy_gpumem_moves.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpumem/backend.h"
#include "gpumem/gpumem.h"
#include "gm_test.h"

#define MIB ((uint64_t)1 << 20)

typedef struct env {
    gm_backend *be;
    gm_allocator *al;
} env;

static void setup_env_conf(env *e, uint64_t capacity, bool manual_events, const char *conf) {
    gm_sim_options o;
    gm_sim_options_init(&o);
    o.capacity = capacity;
    o.events_manual = manual_events;
    assert_int_equal(gm_sim_create(&e->be, &o), GM_OK);
    gm_config cfg;
    gm_config_init(&cfg);
    char err[128];
    assert_int_equal(gm_config_parse(&cfg, conf, err, sizeof err), GM_OK);
    assert_int_equal(gm_allocator_create(&e->al, e->be, &cfg), GM_OK);
}

/* the policy with its default gpumem_slack */
static void setup_env(env *e, uint64_t capacity, bool manual_events) {
    setup_env_conf(e, capacity, manual_events, "policy:gpumem");
}

static void teardown_env(env *e) {
    gm_allocator_destroy(e->al);
    gm_backend_destroy(e->be);
}

static void check_ok(gm_allocator *al) {
    char err[512] = "";
    int rc = gm_check(al, 0, err, sizeof err);
    if (rc != GM_OK) fail_msg("gm_check: %s", err);
}

static gm_stats stats(gm_allocator *al) {
    gm_stats s = {.size = sizeof s};
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    assert_int_equal(gm_get_stats(al, 0, &s), GM_OK);
    return s;
}

static gm_devptr alloc(gm_allocator *al, uint64_t size, gm_stream stream) {
    return gm_test_alloc(al, size, stream);
}

/* Free p and allocate `size` again, a repeated step: it must make no
 * physical memory call. Returns the new block. */
static gm_devptr again_without_calls(gm_allocator *al, gm_devptr p, uint64_t size) {
    gm_stats before = stats(al);
    assert_int_equal(gm_free(al, p), GM_OK);
    gm_devptr q = alloc(al, size, 0);
    gm_stats after = stats(al);
    assert_int_equal(after.num_map, before.num_map);
    assert_int_equal(after.num_unmap, before.num_unmap);
    assert_int_equal(after.num_phys_create, before.num_phys_create);
    assert_int_equal(after.num_phys_release, before.num_phys_release);
    return q;
}

/* Blocks are 512-byte aligned, packed, and a freed block's place is reused
 * by the next request of the same size on the same stream. */
static void test_placement(void **state) {
    (void)state;
    env e;
    setup_env(&e, 1024 * MIB, false);
    gm_devptr a = alloc(e.al, 3 * MIB, 0);
    gm_devptr b = alloc(e.al, 5 * MIB + 1, 0);
    gm_devptr c = alloc(e.al, 700, 0);
    assert_true(a % 512 == 0 && b % 512 == 0 && c % 512 == 0);
    assert_true(b >= a + 3 * MIB || a >= b + 5 * MIB + 512);
    gm_stats s = stats(e.al);
    /* 8 MiB + 512 of large blocks touch 5 granules, the small one 1 more */
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 12 * MIB);
    assert_int_equal(s.active[GM_POOL_LARGE].current, 2);
    assert_int_equal(s.active[GM_POOL_SMALL].current, 1);
    check_ok(e.al);
    assert_int_equal(gm_free(e.al, b), GM_OK);
    assert_int_equal(gm_free(e.al, c), GM_OK);
    int64_t maps = stats(e.al).num_map;
    assert_int_equal(alloc(e.al, 5 * MIB + 1, 0), b);
    assert_int_equal(alloc(e.al, 700, 0), c);
    assert_int_equal(stats(e.al).num_map, maps); /* reuse made no device call */
    check_ok(e.al);
    teardown_env(&e);
}

/* Random alloc/free over two streams with the full check after every step. */
static void test_random_no_overlap(void **state) {
    (void)state;
    env e;
    setup_env(&e, 512 * MIB, false);
    enum { N = 64 };
    gm_devptr live[N] = {0};
    uint64_t size[N] = {0};
    srand(12345);
    for (int step = 0; step < 3000; step++) {
        int k = rand() % N;
        if (live[k]) {
            assert_int_equal(gm_free(e.al, live[k]), GM_OK);
            live[k] = 0;
        } else {
            uint64_t sz = (rand() % 4 == 0) ? (uint64_t)(rand() % (12 * MIB)) + 1
                                            : (uint64_t)(rand() % (64 * 1024)) + 1;
            int rc = gm_malloc(e.al, 0, sz, (gm_stream)(k & 1), &live[k]);
            if (rc == GM_ENOMEM) live[k] = 0;
            else assert_int_equal(rc, GM_OK);
            size[k] = sz;
        }
        check_ok(e.al);
        for (int i = 0; i < N; i++) /* the harness's own overlap check */
            for (int j = i + 1; j < N && live[i]; j++)
                if (live[j]) assert_true(live[i] + size[i] <= live[j] || live[j] + size[j] <= live[i]);
    }
    for (int i = 0; i < N; i++)
        if (live[i]) assert_int_equal(gm_free(e.al, live[i]), GM_OK);
    assert_int_equal(gm_empty_cache(e.al, 0), GM_OK);
    assert_int_equal(stats(e.al).reserved_bytes[GM_POOL_ALL].current, 0);
    check_ok(e.al);
    teardown_env(&e);
}

/* With gpumem_slack:0 a placement that needs unmapped granules takes idle
 * mapped ones (unmap + map) before creating memory: physical memory = peak
 * granules live. */
static void test_granule_stealing(void **state) {
    (void)state;
    env e;
    setup_env_conf(&e, 1024 * MIB, false, "policy:gpumem,gpumem_slack:0");
    gm_devptr a = alloc(e.al, 20 * MIB, 0); /* granules 0-9 */
    gm_devptr c = alloc(e.al, 20 * MIB, 0); /* granules 10-19 */
    assert_int_equal(gm_free(e.al, a), GM_OK); /* 10 idle granules stay mapped */
    gm_stats s0 = stats(e.al);
    assert_int_equal(s0.reserved_bytes[GM_POOL_ALL].current, 40 * MIB);
    gm_devptr d = alloc(e.al, 30 * MIB, 0); /* does not fit in a's hole */
    gm_stats s1 = stats(e.al);
    assert_true(d >= c + 20 * MIB);
    assert_int_equal(s1.num_unmap - s0.num_unmap, 10);          /* a's granules moved */
    assert_int_equal(s1.num_phys_create - s0.num_phys_create, 5); /* only the rest is new */
    assert_int_equal(s1.reserved_bytes[GM_POOL_ALL].current, 50 * MIB);
    check_ok(e.al);
    /* the same step again makes no device call */
    gm_devptr d2 = again_without_calls(e.al, d, 30 * MIB);
    assert_int_equal(d2, d);
    assert_int_equal(gm_free(e.al, d2), GM_OK);
    assert_int_equal(gm_free(e.al, c), GM_OK);
    check_ok(e.al);
    teardown_env(&e);
}

/* With gpumem_slack:inf (the default) idle memory stays where it is and new
 * memory is created, unless the device is full: then idle granules move. */
static void test_slack_inf_moves_only_under_pressure(void **state) {
    (void)state;
    for (int full = 0; full < 2; full++) {
        env e;
        setup_env_conf(&e, full ? 60 * MIB : 1024 * MIB, false, "policy:gpumem,gpumem_slack:inf");
        gm_devptr a = alloc(e.al, 20 * MIB, 0);
        gm_devptr c = alloc(e.al, 20 * MIB, 0);
        assert_int_equal(gm_free(e.al, a), GM_OK);
        gm_stats s0 = stats(e.al);
        gm_devptr d = alloc(e.al, 30 * MIB, 0); /* does not fit in a's hole */
        gm_stats s1 = stats(e.al);
        assert_true(d >= c + 20 * MIB);
        if (full) { /* 70 MiB would not fit in 60: the device fills up, then a's granules move */
            assert_int_equal(s1.num_phys_create - s0.num_phys_create, 10);
            assert_int_equal(s1.num_unmap - s0.num_unmap, 5);
            assert_int_equal(s1.reserved_bytes[GM_POOL_ALL].current, 60 * MIB);
        } else {
            assert_int_equal(s1.num_unmap - s0.num_unmap, 0);
            assert_int_equal(s1.num_phys_create - s0.num_phys_create, 15);
            assert_int_equal(s1.reserved_bytes[GM_POOL_ALL].current, 70 * MIB);
        }
        check_ok(e.al);
        /* a's hole is reused without a call; the step again makes none */
        if (!full) { /* (the full device has no room for it) */
            gm_devptr a2 = alloc(e.al, 20 * MIB, 0);
            assert_int_equal(a2, a);
            assert_int_equal(gm_free(e.al, a2), GM_OK);
        }
        gm_devptr d2 = again_without_calls(e.al, d, 30 * MIB);
        assert_int_equal(d2, d);
        assert_int_equal(gm_free(e.al, d2), GM_OK);
        assert_int_equal(gm_free(e.al, c), GM_OK);
        check_ok(e.al);
        teardown_env(&e);
    }
}

/* gpumem_chunks:run (slack inf): a cold workload gets one chunk per run of
 * unmapped granules, so far fewer creates and maps than granule chunks, the
 * same peak reserved on a roomy device, and a warm repeat makes no call. */
static uint64_t cold_workload(gm_allocator *al) {
    static const uint64_t sizes[] = {300 * MIB, 7 * MIB, 120 * MIB, 1 * MIB, 64 * MIB, 33 * MIB, 200 * MIB, 5 * MIB};
    enum { N = sizeof sizes / sizeof *sizes };
    gm_devptr p[N];
    for (int i = 0; i < N; i++) p[i] = alloc(al, sizes[i], 0);
    for (int i = 0; i < N; i += 2) assert_int_equal(gm_free(al, p[i]), GM_OK);
    gm_devptr q = alloc(al, 250 * MIB, 0); /* reuses the freed 300 MiB hole */
    check_ok(al);
    assert_int_equal(gm_free(al, q), GM_OK);
    for (int i = 1; i < N; i += 2) assert_int_equal(gm_free(al, p[i]), GM_OK);
    return stats(al).reserved_bytes[GM_POOL_ALL].peak;
}

static void test_chunks_run_cold_start(void **state) {
    (void)state;
    static const char *const conf[3] = {"policy:gpumem,gpumem_slack:inf,gpumem_chunks:granule",
                                        "policy:gpumem,gpumem_slack:inf,gpumem_chunks:run",
                                        "policy:gpumem,gpumem_slack:inf"}; /* auto, the default */
    gm_stats cold[3], warm[3];
    uint64_t peak[3];
    for (int run = 0; run < 3; run++) {
        env e;
        /* roomy: auto's chunks are at most 1/1024 of the free memory (64 MiB here) */
        setup_env_conf(&e, 64 * 1024 * MIB, false, conf[run]);
        peak[run] = cold_workload(e.al);
        cold[run] = stats(e.al);
        cold_workload(e.al);
        warm[run] = stats(e.al);
        check_ok(e.al);
        teardown_env(&e);
    }
    /* granule mode: one create + one map per 2 MiB granule touched */
    assert_true(cold[0].num_phys_create >= 300);
    for (int run = 1; run < 3; run++) {
        assert_true(cold[run].num_phys_create * 10 <= cold[0].num_phys_create);
        assert_true(cold[run].num_map * 10 <= cold[0].num_map);
        assert_true(cold[run].num_phys_create > 0);
        assert_int_equal(cold[run].num_phys_release, 0);
        assert_int_equal(peak[run], peak[0]);
    }
    for (int run = 0; run < 3; run++) { /* warm: no device call */
        assert_int_equal(warm[run].num_phys_create, cold[run].num_phys_create);
        assert_int_equal(warm[run].num_map, cold[run].num_map);
        assert_int_equal(warm[run].num_unmap, cold[run].num_unmap);
    }
    /* run is ignored below slack inf: granule chunks, as by default */
    uint64_t creates[2];
    for (int run = 0; run < 2; run++) {
        env e;
        setup_env_conf(&e, 4096 * MIB, false,
                       run ? "policy:gpumem,gpumem_slack:0.05,gpumem_chunks:run" : "policy:gpumem,gpumem_slack:0.05");
        cold_workload(e.al);
        creates[run] = stats(e.al).num_phys_create;
        teardown_env(&e);
    }
    assert_true(creates[0] >= 300);
    assert_int_equal(creates[1], creates[0]);
}

/* gpumem_chunks:auto once memory held passes 15% of the device: a block's
 * interior gets chunks, and an idle chunk that a placement would use in part
 * is cut into chunks over the same granules first (one release, three
 * creates, memory unchanged), so no chunk pins granules no block uses;
 * `run` pins it instead (no call). The cut chunks are then reused whole. */
static void test_chunks_auto_cuts_partial_reuse(void **state) {
    (void)state;
    for (int run = 0; run < 2; run++) {
        env e;
        setup_env_conf(&e, 16 * 1024 * MIB, false,
                       run ? "policy:gpumem,gpumem_slack:inf,gpumem_chunks:run"
                           : "policy:gpumem,gpumem_slack:inf,gpumem_chunks:auto");
        gm_devptr f = alloc(e.al, 2600 * MIB, 0); /* held 2600 MiB > 15% of 16 GiB */
        gm_devptr b = alloc(e.al, 100 * MIB, 0);  /* granule-aligned after f: all interior */
        assert_int_equal(b, f + 2600 * MIB);
        assert_int_equal(gm_free(e.al, b), GM_OK);
        gm_stats s1 = stats(e.al);
        gm_devptr q = alloc(e.al, 5 * MIB, 0); /* over b's first chunk, in part */
        assert_int_equal(q, b);
        gm_stats s2 = stats(e.al);
        check_ok(e.al);
        assert_int_equal(s2.reserved_bytes[GM_POOL_ALL].current, s1.reserved_bytes[GM_POOL_ALL].current);
        if (run) {
            assert_int_equal(s2.num_phys_release, s1.num_phys_release);
            assert_int_equal(s2.num_map, s1.num_map);
        } else {
            /* [0, 2) q's interior, [2, 3) its edge, the rest of the chunk */
            assert_int_equal(s2.num_phys_release, s1.num_phys_release + 1);
            assert_int_equal(s2.num_unmap, s1.num_unmap + 1);
            assert_int_equal(s2.num_phys_create, s1.num_phys_create + 3);
            assert_int_equal(s2.num_map, s1.num_map + 3);
        }
        q = again_without_calls(e.al, q, 5 * MIB);
        assert_int_equal(gm_free(e.al, q), GM_OK);
        assert_int_equal(gm_free(e.al, f), GM_OK);
        check_ok(e.al);
        teardown_env(&e);
    }
}

/* A block whose free waits for another stream's event is reclaimed by the
 * OOM path (sync, free, retry); a request that cannot fit fails cleanly and
 * the allocator keeps working. */
static void test_oom_reclaim_retry(void **state) {
    (void)state;
    env e;
    setup_env(&e, 64 * MIB, true);
    gm_devptr x = alloc(e.al, 60 * MIB, 0);
    assert_int_equal(gm_record_stream(e.al, x, 7), GM_OK);
    assert_int_equal(gm_free(e.al, x), GM_OK); /* pending on stream 7's event */
    gm_devptr y = alloc(e.al, 60 * MIB, 0);     /* needs the retry */
    gm_stats s = stats(e.al);
    assert_int_equal(s.num_alloc_retries, 1);
    assert_true(s.reserved_bytes[GM_POOL_ALL].peak <= (int64_t)(64 * MIB));
    check_ok(e.al);
    gm_devptr z = 0;
    assert_int_equal(gm_malloc(e.al, 0, 100 * MIB, 0, &z), GM_ENOMEM);
    check_ok(e.al);
    assert_int_equal(gm_free(e.al, y), GM_OK);
    /* memory of another stream's arena moves over once it is idle */
    gm_devptr w = alloc(e.al, 60 * MIB, 3);
    assert_true(stats(e.al).reserved_bytes[GM_POOL_ALL].current <= (int64_t)(64 * MIB));
    assert_int_equal(gm_free(e.al, w), GM_OK);
    check_ok(e.al);
    teardown_env(&e);
}

/* An allocation that cannot fit holds nothing afterwards: the chunks the
 * failed placement created on its way are given back, so the device is as
 * free as before the attempt (a batch-size search that catches the OOM, or
 * another process, can use it). Found on the H200: a 2x-device request left
 * the whole device reserved. */
static void test_failed_alloc_holds_nothing(void **state) {
    (void)state;
    const char *confs[] = {"policy:gpumem", "policy:gpumem,gpumem_chunks:granule", "policy:gpumem,gpumem_slack:0"};
    for (unsigned k = 0; k < sizeof confs / sizeof *confs; k++) {
        env e;
        setup_env_conf(&e, 256 * MIB, false, confs[k]);
        gm_devptr live = alloc(e.al, 40 * MIB, 0);
        int64_t held = stats(e.al).reserved_bytes[GM_POOL_ALL].current;
        uint64_t sizes[] = {2 * 256 * MIB, 300 * MIB, 250 * MIB};
        for (unsigned i = 0; i < 3; i++) {
            gm_devptr p = 0;
            assert_int_equal(gm_malloc(e.al, 0, sizes[i], 0, &p), GM_ENOMEM);
            check_ok(e.al);
            gm_stats s = stats(e.al);
            if (s.reserved_bytes[GM_POOL_ALL].current > held)
                fail_msg("%s: after a failed %llu MiB request %lld MiB reserved, %lld before", confs[k],
                         (unsigned long long)(sizes[i] / MIB), (long long)(s.reserved_bytes[GM_POOL_ALL].current / MIB),
                         (long long)(held / MIB));
        }
        gm_devptr q = alloc(e.al, 200 * MIB, 0); /* what is left is still there */
        assert_int_equal(gm_free(e.al, q), GM_OK);
        assert_int_equal(gm_free(e.al, live), GM_OK);
        check_ok(e.al);
        teardown_env(&e);
    }
}

/* Freed blocks are reused at once on their stream, never on another one. */
static void test_stream_reuse(void **state) {
    (void)state;
    env e;
    setup_env(&e, 1024 * MIB, false);
    uint64_t sizes[] = {1000, 256 * 1024, 4 * MIB, 33 * MIB};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        gm_devptr a = alloc(e.al, sizes[i], 1);
        assert_int_equal(gm_free(e.al, a), GM_OK);
        gm_devptr b = alloc(e.al, sizes[i], 2);
        assert_true(b + sizes[i] <= a || a + sizes[i] <= b); /* not a's memory */
        gm_devptr c = alloc(e.al, sizes[i], 1);
        assert_int_equal(c, a); /* same stream: at once */
        assert_int_equal(gm_free(e.al, b), GM_OK);
        assert_int_equal(gm_free(e.al, c), GM_OK);
        check_ok(e.al);
    }
    teardown_env(&e);
}

static int count_seg(const gm_segment_info *s, void *arg) {
    uint64_t *m = arg;
    m[0]++;
    m[1] += s->mapped_size;
    m[2] += s->allocated_size;
    return 0;
}

/* empty_cache gives back everything not in use; segments show what is left. */
static void test_empty_cache(void **state) {
    (void)state;
    env e;
    setup_env(&e, 1024 * MIB, false);
    gm_devptr keep = alloc(e.al, 3 * MIB, 0);
    gm_devptr p[8];
    for (int i = 0; i < 8; i++) p[i] = alloc(e.al, (uint64_t)(i + 1) * 700 * 1024, (gm_stream)(i % 2));
    for (int i = 0; i < 8; i++) assert_int_equal(gm_free(e.al, p[i]), GM_OK);
    assert_int_equal(gm_empty_cache(e.al, 0), GM_OK);
    gm_stats s = stats(e.al);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 4 * MIB); /* keep's 2 granules */
    uint64_t freeb, total;
    assert_int_equal(gm_mem_get_info(e.al, 0, &freeb, &total), GM_OK);
    assert_int_equal(total - freeb, 4 * MIB);
    uint64_t m[3] = {0};
    assert_int_equal(gm_walk_segments(e.al, 0, count_seg, m), GM_OK);
    assert_int_equal(m[1], 4 * MIB);
    assert_int_equal(m[2], 3 * MIB);
    check_ok(e.al);
    assert_int_equal(gm_free(e.al, keep), GM_OK);
    assert_int_equal(gm_empty_cache(e.al, 0), GM_OK);
    assert_int_equal(stats(e.al).reserved_bytes[GM_POOL_ALL].current, 0);
    check_ok(e.al);
    teardown_env(&e);
}

/* ---- the segment walk: torch's expandable-segment shape ----------------- */

typedef struct seg_set {
    gm_segment_info v[256];
    int n;
    gm_block_info b[256];
    int nb;
} seg_set;

static int keep_seg(const gm_segment_info *s, void *arg) {
    seg_set *x = arg;
    assert_true(x->n < 256);
    x->v[x->n++] = *s;
    return 0;
}

static int keep_block(const gm_block_info *b, void *arg) {
    seg_set *x = arg;
    assert_true(x->nb < 256);
    x->b[x->nb++] = *b;
    return 0;
}

/* Segments as torch reports expandable segments: one per run of mapped
 * memory, adding up to reserved_bytes (all pools and each pool), each live
 * block inside exactly one, none larger than what is mapped. Returns how
 * many there are. */
static int check_segment_runs(gm_allocator *al) {
    seg_set x = {.n = 0};
    assert_int_equal(gm_walk_segments(al, 0, keep_seg, &x), GM_OK);
    assert_int_equal(gm_walk_blocks(al, 0, keep_block, &x), GM_OK);
    gm_stats s = stats(al);
    uint64_t sum[GM_POOL_COUNT] = {0};
    for (int i = 0; i < x.n; i++) {
        const gm_segment_info *g = &x.v[i];
        assert_true(g->expandable);
        assert_true(g->total_size > 0);
        assert_int_equal(g->total_size, g->mapped_size);
        assert_true(g->allocated_size <= g->total_size);
        assert_true(g->total_size <= (uint64_t)s.reserved_bytes[GM_POOL_ALL].current);
        sum[GM_POOL_ALL] += g->total_size;
        sum[g->pool] += g->total_size;
        for (int j = 0; j < i; j++) /* disjoint, and maximal: two runs never touch */
            assert_true(x.v[j].address + x.v[j].total_size < g->address ||
                        g->address + g->total_size < x.v[j].address);
    }
    for (int p = 0; p < GM_POOL_COUNT; p++) assert_int_equal(sum[p], s.reserved_bytes[p].current);
    for (int k = 0; k < x.nb; k++) {
        int in = 0;
        for (int i = 0; i < x.n; i++)
            in += x.b[k].address >= x.v[i].address &&
                  x.b[k].address + x.b[k].size <= x.v[i].address + x.v[i].total_size;
        assert_int_equal(in, 1);
    }
    return x.n;
}

static void test_segments_are_mapped_runs(void **state) {
    (void)state;
    env e;
    setup_env(&e, 1024 * MIB, false);
    assert_int_equal(check_segment_runs(e.al), 0);
    /* big blocks packed back to back on stream 0, another arena (stream 1) */
    gm_devptr big[6], small[6], other = alloc(e.al, 5 * MIB, 1);
    for (int i = 0; i < 6; i++) {
        big[i] = alloc(e.al, (uint64_t)(i + 3) * MIB + 4096, 0);
        small[i] = alloc(e.al, (uint64_t)(i + 1) * 100 * 1024, 0);
    }
    assert_int_equal(check_segment_runs(e.al), 3); /* one run per arena in use */
    /* free every other big block: with the cache emptied, the granules only
     * they touched go back and stream 0's large arena falls apart into runs */
    for (int i = 0; i < 6; i += 2) {
        assert_int_equal(gm_free(e.al, big[i]), GM_OK);
        assert_int_equal(gm_free(e.al, small[i]), GM_OK);
    }
    check_segment_runs(e.al);
    gm_stats before = stats(e.al);
    assert_int_equal(gm_empty_cache(e.al, 0), GM_OK);
    assert_true(stats(e.al).reserved_bytes[GM_POOL_ALL].current < before.reserved_bytes[GM_POOL_ALL].current);
    assert_true(check_segment_runs(e.al) >= 5);
    check_ok(e.al);
    for (int i = 1; i < 6; i += 2) {
        assert_int_equal(gm_free(e.al, big[i]), GM_OK);
        assert_int_equal(gm_free(e.al, small[i]), GM_OK);
    }
    assert_int_equal(gm_free(e.al, other), GM_OK);
    assert_int_equal(gm_empty_cache(e.al, 0), GM_OK);
    assert_int_equal(check_segment_runs(e.al), 0);
    /* a pointer into memory given back is still known to be ours */
    assert_int_equal(gm_free(e.al, big[0]), GM_EDOUBLEFREE);
    check_ok(e.al);
    teardown_env(&e);
}

/* ---- a backend without VMM: plain allocations from a bump pointer ------- */

typedef struct plain_be {
    uint64_t capacity, used, next;
    uint64_t sizes[4096];
    gm_devptr addrs[4096];
    int n;
} plain_be;

static int pb_count(void *ctx, int *n) { (void)ctx; *n = 1; return GM_OK; }
static int pb_info(void *ctx, int dev, uint64_t *f, uint64_t *t) {
    plain_be *b = ctx;
    (void)dev;
    *f = b->capacity - b->used;
    *t = b->capacity;
    return GM_OK;
}
static int pb_malloc(void *ctx, int dev, uint64_t size, gm_devptr *out) {
    plain_be *b = ctx;
    (void)dev;
    if (b->used + size > b->capacity || b->n == 4096) return GM_ENOMEM;
    b->addrs[b->n] = b->next;
    b->sizes[b->n++] = size;
    *out = b->next;
    b->next += (size + MIB - 1) / MIB * MIB;
    b->used += size;
    return GM_OK;
}
static int pb_free(void *ctx, int dev, gm_devptr p) {
    plain_be *b = ctx;
    (void)dev;
    for (int i = 0; i < b->n; i++) {
        if (b->addrs[i] != p) continue;
        b->used -= b->sizes[i];
        b->addrs[i] = b->addrs[--b->n];
        b->sizes[i] = b->sizes[b->n];
        return GM_OK;
    }
    return GM_EINVAL;
}
static int pb_rec(void *ctx, int dev, gm_stream s, gm_event *out) { (void)ctx, (void)dev, (void)s; *out = 1; return GM_OK; }
static int pb_query(void *ctx, int dev, gm_event ev, bool *done) { (void)ctx, (void)dev, (void)ev; *done = true; return GM_OK; }
static int pb_ev(void *ctx, int dev, gm_event ev) { (void)ctx, (void)dev, (void)ev; return GM_OK; }
static void pb_destroy(void *ctx) { free(ctx); }

static void test_fallback_without_vmm(void **state) {
    (void)state;
    gm_backend_ops ops = {
        .version = GM_BACKEND_VERSION, .size = sizeof ops, .name = "plain",
        .destroy = pb_destroy, .device_count = pb_count, .mem_info = pb_info,
        .malloc = pb_malloc, .free = pb_free, .event_record = pb_rec,
        .event_query = pb_query, .event_sync = pb_ev, .event_destroy = pb_ev,
    };
    plain_be *ctx = calloc(1, sizeof *ctx);
    ctx->capacity = 256 * MIB;
    ctx->next = 1 << 30;
    env e;
    assert_int_equal(gm_backend_create(&e.be, &ops, ctx), GM_OK);
    gm_config cfg;
    gm_config_init(&cfg);
    assert_int_equal(gm_config_parse(&cfg, "policy:gpumem", NULL, 0), GM_OK);
    assert_int_equal(gm_allocator_create(&e.al, e.be, &cfg), GM_OK);
    gm_devptr a = alloc(e.al, 1000, 0);
    gm_devptr b = alloc(e.al, 5 * MIB, 0);
    check_ok(e.al);
    assert_int_equal(gm_free(e.al, a), GM_OK);
    assert_int_equal(alloc(e.al, 1000, 0), a); /* small: cached by size class */
    gm_devptr big = 0;
    assert_int_equal(gm_malloc(e.al, 0, 300 * MIB, 0, &big), GM_ENOMEM);
    check_ok(e.al);
    assert_int_equal(gm_free(e.al, a), GM_OK);
    assert_int_equal(gm_free(e.al, b), GM_OK);
    assert_int_equal(gm_empty_cache(e.al, 0), GM_OK);
    assert_int_equal(stats(e.al).reserved_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(ctx->used, 0);
    check_ok(e.al);
    teardown_env(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_random_no_overlap),
        cmocka_unit_test(test_granule_stealing),
        cmocka_unit_test(test_slack_inf_moves_only_under_pressure),
        cmocka_unit_test(test_oom_reclaim_retry),
        cmocka_unit_test(test_stream_reuse),
        cmocka_unit_test(test_empty_cache),
        cmocka_unit_test(test_segments_are_mapped_runs),
        cmocka_unit_test(test_fallback_without_vmm),
        cmocka_unit_test(test_failed_alloc_holds_nothing),
        cmocka_unit_test(test_chunks_run_cold_start),
        cmocka_unit_test(test_chunks_auto_cuts_partial_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
