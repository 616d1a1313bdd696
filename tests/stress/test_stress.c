/* test_stress.c — 8 threads hammer one allocator (both policies, torch also
 * with expandable segments): each allocates on its own stream and on a
 * shared one, hands blocks to other threads through a mutex-protected queue
 * (so blocks are freed by threads that did not allocate them), records
 * blocks on other threads' streams, completes events, and runs gm_check and
 * gm_get_stats concurrently. A global interval set of live pointers catches
 * two threads being handed overlapping memory. At the end every invariant of
 * workload.h must hold with allocation.current == the live count, and
 * freeing everything + empty_cache must return every byte to the device.
 *
 * GM_STRESS_OPS=<ops per thread> (default 12000), GM_SEED=<seed> to vary. */
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

#include "gm_test.h"
#include "workload.h"

enum { NTHREADS = 8, LOCAL_MAX = 48, QUEUE_MAX = 512, SHARED_STREAM = 100 };

typedef struct shared {
    gm_allocator *a;
    gm_backend *be;
    int ops;
    uint64_t seed;
    pthread_mutex_t lock; /* guards live, queue, err */
    wl_model live;        /* every block handed out and not yet given to gm_free */
    wl_block queue[QUEUE_MAX];
    int qn;
    atomic_int failed;
    char err[1024];
    atomic_long nops;
} shared;

typedef struct worker {
    shared *sh;
    int id;
    wl_rng r;
    wl_mix mix;
    wl_block local[LOCAL_MAX];
    int nlocal;
} worker;

static void failf(shared *sh, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(shared *sh, const char *fmt, ...) {
    pthread_mutex_lock(&sh->lock);
    if (!atomic_load(&sh->failed)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sh->err, sizeof sh->err, fmt, ap);
        va_end(ap);
        atomic_store(&sh->failed, 1);
    }
    pthread_mutex_unlock(&sh->lock);
}

static gm_stream own_stream(int id) { return (gm_stream)(id + 1); }

/* A block leaves the interval set before gm_free, so a concurrent malloc
 * that gets the same address is never mistaken for an overlap. */
static void release(worker *w, wl_block b) {
    shared *sh = w->sh;
    pthread_mutex_lock(&sh->lock);
    long i = wl_model_find(&sh->live, b.ptr);
    if (i >= 0) wl_model_remove_at(&sh->live, (size_t)i, NULL);
    pthread_mutex_unlock(&sh->lock);
    if (i < 0) {
        failf(sh, "thread %d: block 0x%" PRIx64 " vanished from the live set", w->id, b.ptr);
        return;
    }
    int rc = gm_free(sh->a, b.ptr);
    if (rc != GM_OK)
        failf(sh, "thread %d: free(0x%" PRIx64 ") = %s", w->id, b.ptr, gm_status_name(rc));
}

static void do_malloc(worker *w) {
    shared *sh = w->sh;
    uint64_t size = wl_size(&w->r, &w->mix);
    gm_stream s = wl_chance(&w->r, 0.7) ? own_stream(w->id) : SHARED_STREAM;
    gm_devptr p = 0;
    int rc = gm_malloc(sh->a, 0, size, s, &p);
    if (rc != GM_OK) {
        failf(sh, "thread %d: malloc(%" PRIu64 ") = %s", w->id, size, gm_status_name(rc));
        return;
    }
    char err[256];
    pthread_mutex_lock(&sh->lock);
    int bad = wl_model_add(&sh->live, p, size, s, err, sizeof err);
    bool handoff = !bad && sh->qn < QUEUE_MAX && wl_chance(&w->r, 0.35);
    if (handoff) sh->queue[sh->qn++] = (wl_block){p, size, s, 0};
    pthread_mutex_unlock(&sh->lock);
    if (bad) {
        failf(sh, "thread %d: %s", w->id, err);
        return;
    }
    if (handoff) return;
    if (w->nlocal == LOCAL_MAX) {
        int k = (int)wl_below(&w->r, LOCAL_MAX);
        release(w, w->local[k]);
        w->local[k] = w->local[--w->nlocal];
    }
    w->local[w->nlocal++] = (wl_block){p, size, s, 0};
}

static void free_local(worker *w) {
    if (w->nlocal == 0) return;
    int k = (int)wl_below(&w->r, (uint64_t)w->nlocal);
    wl_block b = w->local[k];
    w->local[k] = w->local[--w->nlocal];
    release(w, b);
}

/* Free a block some other thread (probably) allocated. */
static void free_queued(worker *w) {
    shared *sh = w->sh;
    wl_block b = {0};
    pthread_mutex_lock(&sh->lock);
    bool have = sh->qn > 0;
    if (have) {
        int k = (int)wl_below(&w->r, (uint64_t)sh->qn);
        b = sh->queue[k];
        sh->queue[k] = sh->queue[--sh->qn];
    }
    pthread_mutex_unlock(&sh->lock);
    if (have) release(w, b);
}

static void record_other(worker *w) {
    if (w->nlocal == 0) return;
    wl_block *b = &w->local[wl_below(&w->r, (uint64_t)w->nlocal)];
    gm_stream s = wl_chance(&w->r, 0.8) ? own_stream((int)wl_below(&w->r, NTHREADS)) : SHARED_STREAM;
    int rc = gm_record_stream(w->sh->a, b->ptr, s);
    if (rc != GM_OK)
        failf(w->sh, "thread %d: record_stream(0x%" PRIx64 ", %" PRIu64 ") = %s", w->id, b->ptr, s,
              gm_status_name(rc));
}

/* A stats snapshot taken while others run must still be self-consistent. */
static void snapshot_check(worker *w) {
    gm_stats s = {.size = sizeof s};
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    int rc = gm_get_stats(w->sh->a, 0, &s);
    if (rc != GM_OK) {
        failf(w->sh, "gm_get_stats = %s", gm_status_name(rc));
        return;
    }
    for (int p = 0; p < GM_POOL_COUNT; p++) {
        if (s.reserved_bytes[p].current < s.allocated_bytes[p].current ||
            s.allocated_bytes[p].current < s.requested_bytes[p].current ||
            s.allocated_bytes[p].current > s.allocated_bytes[p].peak)
            failf(w->sh,
                  "snapshot pool %d: reserved %" PRId64 " allocated %" PRId64 " (peak %" PRId64
                  ") requested %" PRId64,
                  p, s.reserved_bytes[p].current, s.allocated_bytes[p].current,
                  s.allocated_bytes[p].peak, s.requested_bytes[p].current);
    }
}

/* The policy's full recount, racing with the other threads' operations. */
static void concurrent_check(worker *w) {
    char err[512] = "";
    int rc = gm_check(w->sh->a, 0, err, sizeof err);
    if (rc != GM_OK) failf(w->sh, "concurrent gm_check = %s: %s", gm_status_name(rc), err);
}

static void *worker_main(void *arg) {
    worker *w = arg;
    shared *sh = w->sh;
    for (int i = 0; i < sh->ops && !atomic_load(&sh->failed); i++) {
        double u = wl_unit(&w->r);
        if ((u -= 0.42) < 0) do_malloc(w);
        else if ((u -= 0.22) < 0) free_local(w);
        else if ((u -= 0.18) < 0) free_queued(w);
        else if ((u -= 0.10) < 0) record_other(w);
        else if ((u -= 0.05) < 0) {
            gm_stream s = wl_chance(&w->r, 0.2) ? UINT64_MAX : own_stream(w->id);
            int rc = gm_sim_complete_events(sh->be, 0, s);
            if (rc != GM_OK) failf(sh, "gm_sim_complete_events = %s", gm_status_name(rc));
        } else if ((u -= 0.02) < 0) snapshot_check(w);
        else if ((u -= 0.002) < 0) concurrent_check(w);
        else if ((u -= 0.002) < 0) {
            int rc = gm_empty_cache(sh->a, 0);
            if (rc != GM_OK) failf(sh, "gm_empty_cache = %s", gm_status_name(rc));
        } else free_local(w);
        atomic_fetch_add_explicit(&sh->nops, 1, memory_order_relaxed);
    }
    return NULL;
}

static void stress(const char *conf) {
    shared sh;
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.lock, NULL);
    wl_model_init(&sh.live);
    sh.ops = (int)wl_env_u64("GM_STRESS_OPS", 12000);
    sh.seed = wl_env_u64("GM_SEED", 42);
    sh.live.torch_pools = strstr(conf, "policy:torch") != NULL;

    /* the sim's default device, events completed by the workers; conf names the policy */
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, conf, 0, true, &sh.be, &sh.a), GM_OK);

    worker ws[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        memset(&ws[i], 0, sizeof ws[i]);
        ws[i].sh = &sh;
        ws[i].id = i;
        wl_seed(&ws[i].r, sh.seed * 131 + (uint64_t)i);
        wl_mix_init(&ws[i].mix, &ws[i].r, 0.8, 0.18, 0.02, 64 * WL_MIB);
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &ws[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    if (atomic_load(&sh.failed)) fail_msg("%s seed %" PRIu64 ": %s", conf, sh.seed, sh.err);

    /* quiescent: the model is exact again */
    char err[1024];
    if (wl_check(sh.a, &sh.live, WL_CHECK_SEGMENTS | WL_CHECK_SIM_USED, err, sizeof err))
        fail_msg("%s seed %" PRIu64 " after %ld ops, %zu live: %s", conf, sh.seed,
                 atomic_load(&sh.nops), sh.live.n, err);
    print_message("%s: %ld ops, %zu blocks live at the end\n", conf, atomic_load(&sh.nops),
                  sh.live.n);
    if (wl_free_all(sh.a, &sh.live, err, sizeof err)) fail_msg("%s: %s", conf, err);
    assert_int_equal(gm_empty_cache(sh.a, 0), GM_OK);
    if (wl_check(sh.a, &sh.live, WL_CHECK_ALL, err, sizeof err)) fail_msg("%s drained: %s", conf, err);
    gm_stats s = {.size = sizeof s};
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    assert_int_equal(gm_get_stats(sh.a, 0, &s), GM_OK);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 0);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(s.allocation[GM_POOL_ALL].allocated, s.allocation[GM_POOL_ALL].freed);

    gm_allocator_destroy(sh.a);
    gm_backend_destroy(sh.be);
    wl_model_free(&sh.live);
    pthread_mutex_destroy(&sh.lock);
}

static void stress_torch(void **state) { stress("policy:torch"); }
static void stress_torch_expandable(void **state) { stress("policy:torch,expandable_segments:True"); }
static void stress_gpumem(void **state) { stress("policy:gpumem"); }
static void stress_gpumem_plan(void **state) { stress("policy:gpumem,gpumem_plan:on"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stress_torch),
        cmocka_unit_test(stress_torch_expandable),
        cmocka_unit_test(stress_gpumem),
        cmocka_unit_test(stress_gpumem_plan),
    };
    /* GM_TEST_FILTER (e.g. "*gpumem*"): tests/support/test_filter.c */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
