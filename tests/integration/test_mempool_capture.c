/* test_mempool_capture.c — what a capture into a private pool (issue 28,
 * src/core/mempool.c) may not do, on the sim backend, for both policies: no
 * free, unmap, release or event synchronisation between gm_pool_begin and
 * gm_pool_end, whatever the device's own pools are doing (a warm-up, the
 * gpumem policy's plan switching, settling or ending its warm-up, an out of
 * memory retry); a failed capture (no gm_pool_end) leaves empty_cache
 * working; events of a block freed during a capture are recorded after it.
 * The pools themselves: test_mempool.c. */
#include "mempool_test.h"

/* device calls that free, unmap or wait */
static uint64_t releasing_calls(gm_backend *b) {
    static const int kinds[] = {GM_BCALL_FREE, GM_BCALL_UNMAP, GM_BCALL_PHYS_RELEASE, GM_BCALL_VA_RELEASE,
                                GM_BCALL_EVENT_SYNC, GM_BCALL_EVENT_QUERY};
    uint64_t n = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) n += gm_backend_call_count(b, 0, kinds[i]);
    return n;
}

static void test_capture_frees_nothing(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, true, &b, &a);
    gm_devptr keep[8], x, r;
    /* the device's cache holds memory, and a block waits for another stream */
    for (int i = 0; i < 8; i++) OK(gm_malloc(a, 0, (size_t)(i + 1) * 3 * MIB, 0, &keep[i]));
    for (int i = 0; i < 8; i += 2) OK(gm_free(a, keep[i]));
    OK(gm_malloc(a, 0, 1 * MIB, 0, &r));
    OK(gm_record_stream(a, r, 5));
    OK(gm_free(a, r));
    uint64_t before = releasing_calls(b);
    OK(gm_pool_begin(a, 0, 4, 4));
    for (int i = 0; i < 20; i++) {
        OK(gm_malloc_pool(a, 0, (size_t)(i % 5 + 1) * 7 * MIB, 0, 4, 4, &x));
        OK(gm_free(a, x));
        OK(gm_malloc(a, 0, (size_t)(i % 3 + 1) * 5 * MIB, 1, &x));
        OK(gm_free(a, x));
        OK(gm_step_mark(a, 0)); /* an optimizer step being recorded: no plan switch, no sync */
    }
    /* empty_cache during a capture releases nothing and succeeds, as torch's */
    OK(gm_empty_cache(a, 0));
    OK(gm_pool_empty_cache(a, 0, 4, 4));
    if (getenv("GM_TEST_VERBOSE"))
        for (int k = 0; k < GM_BCALL_COUNT; k++) fprintf(stderr, "kind %d: %llu\n", k, (unsigned long long)gm_backend_call_count(b, 0, k));
    assert_int_equal(releasing_calls(b), before);
    OK(gm_pool_end(a, 0, 4, 4));
    OK(gm_pool_release(a, 0, 4, 4));
    gm_test_check(a);
    OK(gm_sim_complete_events(b, 0, UINT64_MAX));
    OK(gm_empty_cache(a, 0));
    for (int i = 1; i < 8; i += 2) OK(gm_free(a, keep[i]));
    gm_test_check(a);
    gm_test_destroy(b, a);
}


/* The forbidden kinds made during captures on device 0 by whose pools (0:
 * the device's own, 1: private pools), as gm_pool_capture_calls counts them. */
static uint64_t capture_forbidden(gm_allocator *a, int who) {
    uint64_t c[GM_BCALL_COUNT];
    assert_int_equal(gm_pool_capture_calls(a, 0, who, c, GM_BCALL_COUNT), GM_BCALL_COUNT);
    return c[GM_BCALL_FREE] + c[GM_BCALL_UNMAP] + c[GM_BCALL_PHYS_RELEASE] + c[GM_BCALL_VA_RELEASE] +
           c[GM_BCALL_EVENT_SYNC] + c[GM_BCALL_EVENT_QUERY];
}

/* The GPU run's shape (issue 28, first H200 run): the default settings (the
 * gpumem policy warming up at slack 0 with its plan), a few warm-up steps
 * in the device's pools on a side stream, a tensor made before the capture
 * and freed during it, the capture's allocations in its pool, an
 * empty_cache and a step mark inside. No policy instance of the device may
 * free, unmap or wait between begin and end; what the device's own pools
 * would give back goes after the capture. */
static void test_capture_after_warmup(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, true, &b, &a);
    gm_devptr w[6], before, x[4], y;
    for (int step = 0; step < 4; step++) { /* torch's recipe: warm up on a side stream */
        for (int i = 0; i < 6; i++) OK(gm_malloc(a, 0, (size_t)(i + 1) * (step + 2) * MIB, 3, &w[i]));
        OK(gm_record_stream(a, w[0], 0));
        for (int i = 0; i < 6; i++) OK(gm_free(a, w[i]));
        OK(gm_step_mark(a, 0));
    }
    OK(gm_malloc(a, 0, 6 * MIB, 0, &before));
    OK(gm_malloc(a, 0, 9 * MIB, 0, &y));
    OK(gm_record_stream(a, y, 3));
    OK(gm_free(a, y)); /* waits for stream 3: an event outstanding at the capture */
    uint64_t dev0 = releasing_calls(b);
    assert_int_equal(capture_forbidden(a, 0), 0);
    assert_int_equal(capture_forbidden(a, 1), 0);
    OK(gm_pool_begin(a, 0, 11, 0));
    OK(gm_free(a, before)); /* made before the capture, freed in it: back to the device's pools */
    for (int i = 0; i < 4; i++) OK(gm_malloc_pool(a, 0, (size_t)(i + 1) * 5 * MIB, 0, 11, 0, &x[i]));
    OK(gm_free(a, x[1]));
    OK(gm_malloc_pool(a, 0, 2 * MIB, 0, 11, 0, &x[1]));
    OK(gm_malloc(a, 0, 40 * MIB, 0, &y)); /* another thread's allocation in the device's pools */
    OK(gm_free(a, y));
    OK(gm_empty_cache(a, 0));
    OK(gm_step_mark(a, 0));
    if (getenv("GM_TEST_VERBOSE"))
        for (int k = 0; k < GM_BCALL_COUNT; k++) {
            uint64_t c0[GM_BCALL_COUNT], c1[GM_BCALL_COUNT];
            gm_pool_capture_calls(a, 0, 0, c0, GM_BCALL_COUNT);
            gm_pool_capture_calls(a, 0, 1, c1, GM_BCALL_COUNT);
            fprintf(stderr, "%s: own %llu, pools %llu\n", gm_bcall_name(k), (unsigned long long)c0[k],
                    (unsigned long long)c1[k]);
        }
    assert_int_equal(capture_forbidden(a, 0), 0);
    assert_int_equal(capture_forbidden(a, 1), 0);
    assert_int_equal(releasing_calls(b), dev0);
    OK(gm_pool_end(a, 0, 11, 0));
    gm_test_check(a);
    /* after the capture: the device gives back what it held */
    OK(gm_sim_complete_events(b, 0, UINT64_MAX));
    OK(gm_empty_cache(a, 0));
    assert_true(releasing_calls(b) > dev0);
    assert_int_equal(capture_forbidden(a, 0), 0); /* counted during captures only */
    for (int i = 0; i < 4; i++) OK(gm_free(a, x[i]));
    OK(gm_pool_release(a, 0, 11, 0));
    gm_test_check(a);
    gm_test_destroy(b, a);
}

/* The gpumem policy's plan acts on allocations, not only on step marks: its
 * tight warm-up ends after PL_WARM = 16384 allocations (keeping what it
 * mapped), a plan starts (a switch syncs and gives back) at the first
 * allocation of a step, and settles at the end of a served one.
 * Allocations in the device's own pools during a capture (another
 * stream's, the shim's filter not claiming them) must not sync or give back
 * then: a switch or a settle waits for an allocation after the capture. */
static void plan_steps(gm_allocator *a, int n, bool mark) {
    static const int mib[] = {3, 5, 1, 9, 2, 7, 4, 6, 8, 3, 2, 5, 12, 1, 6, 4};
    gm_devptr p[16];
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < 16; i++) { /* each block lives two allocations */
            OK(gm_malloc(a, 0, (size_t)mib[i] * MIB + 100 * KIB, 0, &p[i]));
            if (i >= 2) OK(gm_free(a, p[i - 2]));
        }
        OK(gm_free(a, p[14]));
        OK(gm_free(a, p[15]));
        if (mark) OK(gm_step_mark(a, 0));
    }
}

static void test_capture_plan_paths(void **state) {
    gm_backend *b;
    gm_allocator *a;
    gm_devptr x;
    /* the warm-up's end falls inside a capture */
    make(state, true, &b, &a);
    uint64_t rng = 88172645463325252ull; /* sizes with no period: the detector makes no plan */
    gm_devptr y = 0;
    for (int i = 0; i < 16384 - 20; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        OK(gm_malloc(a, 0, (size_t)(rng % (12 * MIB)) + 1, 0, &x));
        if (y) OK(gm_free(a, y));
        y = x;
    }
    OK(gm_free(a, y));
    uint64_t ra = releasing_calls(b);
    OK(gm_pool_begin(a, 0, 13, 0));
    for (int i = 0; i < 60; i++) {
        OK(gm_malloc(a, 0, (size_t)(i % 9 + 1) * MIB, 0, &x));
        OK(gm_free(a, x));
    }
    assert_int_equal(capture_forbidden(a, 0) + capture_forbidden(a, 1), 0);
    OK(gm_pool_end(a, 0, 13, 0));
    assert_int_equal(releasing_calls(b), ra);
    plan_steps(a, 2, false);
    /* the warm-up ended inside the capture and gave nothing back, then or after */
    assert_int_equal(gm_backend_call_count(b, 0, GM_BCALL_PHYS_RELEASE), 0);
    gm_test_check(a);
    OK(gm_pool_release(a, 0, 13, 0));
    gm_test_destroy(b, a);
    /* a plan is pending (steps alike, marked) when a capture begins; the
     * steps go on inside it */
    if (getenv("GM_TEST_VERBOSE")) fprintf(stderr, "phase B\n");
    gm__gp_plan_force = 'B'; /* a switch to layout B syncs and gives idle memory back */
    make(state, true, &b, &a);
    OK(gm_malloc(a, 0, 200 * MIB, 0, &x)); /* weights */
    plan_steps(a, 3, true); /* three marks alike: the plan starts at the next step's first allocation */
    uint64_t r0 = releasing_calls(b);
    if (getenv("GM_TEST_VERBOSE")) fprintf(stderr, "capture\n");
    OK(gm_pool_begin(a, 0, 14, 0));
    plan_steps(a, 6, true);
    assert_int_equal(capture_forbidden(a, 0) + capture_forbidden(a, 1), 0);
    assert_int_equal(releasing_calls(b), r0);
    OK(gm_pool_end(a, 0, 14, 0));
    plan_steps(a, 6, true);
    gm_test_check(a);
    OK(gm_free(a, x));
    OK(gm_pool_release(a, 0, 14, 0));
    gm_test_destroy(b, a);
    gm__gp_plan_force = 0;
}

/* Out of memory in a capture, with oversize blocks cached in the pool
 * (max_split_size_mb) and garbage collection on: torch frees cached blocks
 * there, which would invalidate the capture; gpumem frees nothing and the
 * allocation fails (or is served without a free). */
static void test_capture_oom_frees_nothing(void **state) {
    gm_backend *b;
    gm_allocator *a;
    bool torch = kind_of(state) == GM_POLICY_TORCH; /* the settings are torch's */
    int rc = gm_test_make(kind_of(state), torch ? "max_split_size_mb:20,garbage_collection_threshold:0.5" : NULL,
                          128 * MIB, true, &b, &a);
    if (rc != GM_OK) fail_msg("gm_test_make: %s %s", gm_status_name(rc), gm_last_error_detail());
    OK(gm_set_memory_fraction(a, 0, 1.0));
    gm_devptr p[3], x = 0;
    OK(gm_pool_begin(a, 0, 15, 0));
    for (int i = 0; i < 3; i++) OK(gm_malloc_pool(a, 0, 24 * MIB, 0, 15, 0, &p[i]));
    for (int i = 0; i < 3; i++) OK(gm_free(a, p[i]));
    uint64_t r0 = releasing_calls(b);
    rc = gm_malloc_pool(a, 0, 64 * MIB, 0, 15, 0, &x);
    assert_true(rc == GM_OK || rc == GM_ENOMEM);
    assert_int_equal(releasing_calls(b), r0);
    assert_int_equal(capture_forbidden(a, 0) + capture_forbidden(a, 1), 0);
    if (x) OK(gm_free(a, x));
    OK(gm_pool_end(a, 0, 15, 0));
    gm_test_check(a);
    OK(gm_pool_release(a, 0, 15, 0));
    gm_test_check(a);
    gm_test_destroy(b, a);
}

/* A capture that failed: torch never calls endAllocateToPool after a failed
 * cudaStreamEndCapture, so the device stays capturing. empty_cache (the
 * test's next torch.cuda.empty_cache()) and a pool's empty_cache (a
 * MemPool's destructor) succeed and free nothing; gm_pool_capture_calls
 * rejects bad arguments. */
static void test_failed_capture(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, true, &b, &a);
    gm_devptr p, q;
    OK(gm_malloc(a, 0, 8 * MIB, 0, &p));
    OK(gm_free(a, p));
    OK(gm_pool_retain(a, 0, 0, 5)); /* a MemPool */
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 0, 5, &q));
    OK(gm_free(a, q));
    OK(gm_pool_begin(a, 0, 12, 0)); /* its end never comes */
    OK(gm_malloc_pool(a, 0, 4 * MIB, 0, 12, 0, &q));
    uint64_t r0 = releasing_calls(b);
    OK(gm_empty_cache(a, 0));
    OK(gm_empty_cache(a, -1));
    OK(gm_pool_release(a, 0, 0, 5)); /* ~MemPool: release, then its pool's empty_cache */
    OK(gm_pool_empty_cache(a, -1, 0, 5));
    OK(gm_pool_empty_cache(a, 0, 0, 5));
    assert_int_equal(releasing_calls(b), r0);
    assert_int_equal(capture_forbidden(a, 0) + capture_forbidden(a, 1), 0);
    gm_test_check(a);
    uint64_t c[GM_BCALL_COUNT];
    assert_int_equal(gm_pool_capture_calls(NULL, 0, 0, c, GM_BCALL_COUNT), GM_EINVAL);
    assert_int_equal(gm_pool_capture_calls(a, 0, 2, c, GM_BCALL_COUNT), GM_EINVAL);
    assert_int_equal(gm_pool_capture_calls(a, 0, 0, NULL, 1), GM_EINVAL);
    assert_true(gm_pool_capture_calls(a, 99, 0, c, GM_BCALL_COUNT) < 0);
    OK(gm_free(a, q));
    gm_test_destroy(b, a); /* the pools go with the allocator */
}

/* A block used on another stream and freed during a capture records no
 * event then (torch defers them too); its events come after the capture,
 * and the pool reuses it once they completed. */
static void test_deferred_events(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, true, &b, &a);
    gm_devptr p, q, x;
    OK(gm_pool_begin(a, 0, 2, 9));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 2, 9, &p));
    OK(gm_record_stream(a, p, 9));
    uint64_t rec0 = gm_backend_call_count(b, 0, GM_BCALL_EVENT_RECORD);
    OK(gm_free(a, p));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 2, 9, &q));
    assert_true(q != p); /* still in use on stream 9 */
    assert_int_equal(gm_backend_call_count(b, 0, GM_BCALL_EVENT_RECORD), rec0);
    gm_test_check(a);
    OK(gm_pool_end(a, 0, 2, 9));
    OK(gm_malloc(a, 0, 512, 0, &x)); /* the pending list is processed: the event is recorded */
    assert_int_equal(gm_backend_call_count(b, 0, GM_BCALL_EVENT_RECORD), rec0 + 1);
    OK(gm_sim_complete_events(b, 0, UINT64_MAX));
    OK(gm_free(a, x));
    OK(gm_malloc(a, 0, 512, 0, &x)); /* events are processed outside captures, as torch does */
    OK(gm_free(a, x));
    OK(gm_pool_begin(a, 0, 2, 9));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 2, 9, &x));
    assert_true(x == p); /* back in its pool */
    OK(gm_pool_end(a, 0, 2, 9));
    gm_test_check(a);
    OK(gm_free(a, x));
    OK(gm_free(a, q));
    OK(gm_pool_release(a, 0, 2, 9));
    OK(gm_pool_release(a, 0, 2, 9));
    gm_test_check(a);
    gm_test_destroy(b, a);
}

#define TESTS(k)                                                                                          \
    {                                                                                                     \
        cmocka_unit_test_prestate(test_capture_frees_nothing, &k),                                        \
        cmocka_unit_test_prestate(test_deferred_events, &k),                                              \
        cmocka_unit_test_prestate(test_capture_after_warmup, &k),                                         \
        cmocka_unit_test_prestate(test_failed_capture, &k),                                               \
        cmocka_unit_test_prestate(test_capture_plan_paths, &k),                                           \
        cmocka_unit_test_prestate(test_capture_oom_frees_nothing, &k),                                    \
    }

/* GM_TEST_POLICY=torch or gpumem runs one policy only */
int main(void) {
    const struct CMUnitTest torch[] = TESTS(k_torch);
    const struct CMUnitTest gpumem[] = TESTS(k_gpumem);
    return mempool_run(0, torch, gpumem, sizeof torch / sizeof torch[0]);
}
