/* test_soak.c — a bounded soak of the allocator on the sim backend: 16
 * threads x 4 streams each on one allocator, random sizes (small, medium,
 * large, now and then more than the device has, rarely near 2^64), frees of blocks other
 * threads allocated, record_stream on other threads' streams, empty_cache,
 * event completion and out-of-memory at random points, for each policy
 * (torch, torch with expandable segments, gpumem). Throughout: every block
 * handed out must overlap no live block (a shared interval model, so no
 * allocation is ever handed out twice), every error is GM_ENOMEM, and
 * gm_check passes; at the end everything freed and the cache emptied leave
 * nothing reserved, and destroy leaves the sim holding nothing.
 *
 * GPUMEM_SOAK_SECONDS (default 10) is the wall time for all policies
 * together; GPUMEM_SOAK_SEED replays a seed. The checks never depend on
 * timing: a slower machine runs fewer operations, not different ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workload.h"

enum { THREADS = 16, STREAMS = 4, SLOTS = 512 };

typedef struct soak {
    gm_allocator *a;
    gm_backend *be;
    double deadline; /* CLOCK_MONOTONIC seconds */
    uint64_t seed;
    pthread_mutex_t lock; /* the model and the slots */
    wl_model m;
    gm_devptr slot[SLOTS];
    atomic_int bad;
    char why[512];
    atomic_uint_fast64_t ops, ooms, checks, empties;
} soak;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void soak_fail(soak *s, const char *fmt, ...) {
    pthread_mutex_lock(&s->lock);
    if (!atomic_fetch_add(&s->bad, 1)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->why, sizeof s->why, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&s->lock);
}

typedef struct targ {
    soak *s;
    int tid;
} targ;

static void *worker(void *p) {
    targ *ta = p;
    soak *s = ta->s;
    wl_rng rng;
    wl_seed(&rng, s->seed * 131 + (uint64_t)ta->tid);
    wl_mix mix;
    wl_mix_init(&mix, &rng, 6, 3, 1, 256 * WL_MIB);
    char err[512];
    while (!atomic_load(&s->bad) && now_s() < s->deadline) {
        for (int burst = 0; burst < 64; burst++) {
            atomic_fetch_add(&s->ops, 1);
            unsigned what = (unsigned)wl_below(&rng, 1000);
            int k = (int)wl_below(&rng, SLOTS);
            gm_stream stream = (gm_stream)(ta->tid * STREAMS + (int)wl_below(&rng, STREAMS));
            if (what < 480) { /* malloc; 1 in 50 asks for more than the device has */
                uint64_t size = wl_chance(&rng, 0.02) ? wl_range(&rng, 3 * WL_GIB, 64 * WL_GIB)
                                                      : wl_size(&rng, &mix);
                if (wl_chance(&rng, 0.002)) size = UINT64_MAX - wl_below(&rng, 4 * WL_MIB); /* must not wrap */
                gm_devptr ptr = 0;
                int rc = gm_malloc(s->a, 0, size, stream, &ptr);
                if (rc == GM_ENOMEM) {
                    atomic_fetch_add(&s->ooms, 1);
                    continue;
                }
                if (rc != GM_OK) {
                    soak_fail(s, "gm_malloc(%" PRIu64 ") = %s: %s", size, gm_status_name(rc),
                              gm_last_error_detail());
                    break;
                }
                pthread_mutex_lock(&s->lock);
                /* handed out twice = overlaps a live block */
                int bad = wl_model_add(&s->m, ptr, size, stream, err, sizeof err);
                gm_devptr old = bad ? 0 : s->slot[k];
                if (!bad) s->slot[k] = ptr;
                if (old) {
                    long i = wl_model_find(&s->m, old);
                    if (i >= 0) wl_model_remove_at(&s->m, (size_t)i, NULL);
                }
                pthread_mutex_unlock(&s->lock);
                if (bad) {
                    soak_fail(s, "gm_malloc returned a block overlapping a live one: %s", err);
                    break;
                }
                /* the slot's previous block (maybe another thread's) is freed here */
                if (old && (rc = gm_free(s->a, old)) != GM_OK)
                    soak_fail(s, "gm_free = %s", gm_status_name(rc));
            } else if (what < 900) { /* free any thread's block, maybe used on another stream */
                pthread_mutex_lock(&s->lock);
                gm_devptr ptr = s->slot[k];
                s->slot[k] = 0;
                if (ptr) {
                    long i = wl_model_find(&s->m, ptr);
                    if (i >= 0) wl_model_remove_at(&s->m, (size_t)i, NULL);
                }
                pthread_mutex_unlock(&s->lock);
                if (!ptr) continue;
                int rc = GM_OK;
                if (wl_chance(&rng, 0.3))
                    rc = gm_record_stream(s->a, ptr, (gm_stream)wl_below(&rng, THREADS * STREAMS));
                if (rc == GM_OK) rc = gm_free(s->a, ptr);
                if (rc != GM_OK) soak_fail(s, "record_stream/free = %s", gm_status_name(rc));
            } else if (what < 960) {
                int rc = gm_sim_complete_events(s->be, 0, wl_chance(&rng, 0.5) ? UINT64_MAX : stream);
                if (rc != GM_OK) soak_fail(s, "gm_sim_complete_events = %s", gm_status_name(rc));
            } else if (what < 985) {
                atomic_fetch_add(&s->empties, 1);
                int rc = gm_empty_cache(s->a, 0);
                if (rc != GM_OK) soak_fail(s, "gm_empty_cache = %s", gm_status_name(rc));
            } else {
                atomic_fetch_add(&s->checks, 1);
                if (gm_check(s->a, 0, err, sizeof err) != GM_OK) soak_fail(s, "gm_check: %s", err);
            }
        }
    }
    return NULL;
}

static void soak_run(const char *conf, double seconds, uint64_t seed) {
    soak *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->seed = seed;
    pthread_mutex_init(&s->lock, NULL);
    wl_model_init(&s->m);
    gm_sim_options o;
    gm_sim_options_init(&o);
    o.capacity = 2 * WL_GIB;
    o.events_manual = true;
    assert_int_equal(gm_sim_create(&s->be, &o), GM_OK);
    gm_config cfg;
    gm_config_init(&cfg);
    assert_int_equal(gm_config_parse(&cfg, conf, NULL, 0), GM_OK);
    assert_int_equal(gm_allocator_create(&s->a, s->be, &cfg), GM_OK);
    s->deadline = now_s() + seconds;
    pthread_t t[THREADS];
    targ args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (targ){s, i};
        assert_int_equal(pthread_create(&t[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    if (atomic_load(&s->bad))
        fail_msg("soak %s seed %" PRIu64 " (GPUMEM_SOAK_SEED to replay): %s", conf, seed, s->why);
    char err[512];
    if (gm_check(s->a, 0, err, sizeof err) != GM_OK) fail_msg("soak %s: gm_check: %s", conf, err);
    /* the model and the allocator agree on what is live, and on the OOMs */
    s->m.ooms = (int64_t)s->ooms;
    if (wl_check(s->a, &s->m, WL_CHECK_SEGMENTS | WL_CHECK_SIM_USED, err, sizeof err))
        fail_msg("soak %s: %s", conf, err);
    for (int k = 0; k < SLOTS; k++)
        if (s->slot[k]) assert_int_equal(gm_free(s->a, s->slot[k]), GM_OK);
    assert_int_equal(gm_sim_complete_events(s->be, 0, UINT64_MAX), GM_OK);
    assert_int_equal(gm_empty_cache(s->a, 0), GM_OK);
    gm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    assert_int_equal(gm_get_stats(s->a, 0, &st), GM_OK);
    assert_int_equal(st.allocation[GM_POOL_ALL].current, 0);
    assert_int_equal(st.reserved_bytes[GM_POOL_ALL].current, 0);
    gm_allocator_destroy(s->a);
    gm_sim_live l;
    memset(&l, 0, sizeof l);
    l.size = sizeof l;
    assert_int_equal(gm_sim_live_objects(s->be, 0, &l), GM_OK);
    assert_int_equal(l.allocations + l.reservations + l.phys + l.mapped_pages + l.events, 0);
    assert_int_equal(l.used_bytes, 0);
    print_message("soak %-40s %6.1f s: %" PRIu64 " ops, %" PRIu64 " OOMs, %" PRIu64
                  " empty_cache, %" PRIu64 " gm_check, peak reserved %" PRId64 " MiB\n",
                  conf, seconds, (uint64_t)s->ops, (uint64_t)s->ooms, (uint64_t)s->empties,
                  (uint64_t)s->checks, st.reserved_bytes[GM_POOL_ALL].peak >> 20);
    /* the soak reached the interesting paths */
    assert_true(s->ops > 1000);
    gm_backend_destroy(s->be);
    wl_model_free(&s->m);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const char *const CONFS[] = {"policy:torch", "policy:torch,expandable_segments:True",
                                    "policy:gpumem"};
#define NCONFS (sizeof CONFS / sizeof *CONFS)

static void soak_all(void **state) {
    (void)state;
    double total = (double)wl_env_u64("GPUMEM_SOAK_SECONDS", 10);
    uint64_t seed = wl_env_u64("GPUMEM_SOAK_SEED", (uint64_t)time(NULL));
    print_message("soak: %.0f s over %zu policies, seed %" PRIu64 "\n", total, NCONFS, seed);
    for (size_t i = 0; i < NCONFS; i++) soak_run(CONFS[i], total / NCONFS, seed + i);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(soak_all)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
