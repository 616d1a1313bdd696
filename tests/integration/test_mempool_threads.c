/* test_mempool_threads.c — private pools made and dropped from several
 * threads at once (CUDA graphs captured on one thread while another
 * allocates; torch.cuda.MemPool objects made on worker threads), under
 * both policies. Each thread creates a pool, allocates in it, takes and
 * frees a checkpoint, and releases it (the pool goes), while the others do
 * the same and allocate on the device's own pools: every call succeeds and
 * the invariants hold at the end. Its point is the TSan stage (.ci/run):
 * a pool's view of the device was a copy of the whole device struct, lock
 * word included, read while other threads spun on that lock in
 * gm__devlock_try (issue 43, item 6). */
#include "mempool_test.h"

#include <pthread.h>

enum { NTHREADS = 4, ROUNDS = 300 };

typedef struct worker {
    gm_allocator *a;
    int index;
    int failed;
    char err[256];
} worker;

#define W_OK(w, call)                                                                                  \
    do {                                                                                               \
        int rc_ = (call);                                                                              \
        if (rc_ != GM_OK && !(w)->failed) {                                                            \
            (w)->failed = 1;                                                                           \
            snprintf((w)->err, sizeof (w)->err, "%s: %s %s", #call, gm_status_name(rc_), gm_last_error_detail()); \
        }                                                                                              \
    } while (0)

static void *work(void *arg) {
    worker *w = arg;
    for (int r = 0; r < ROUNDS && !w->failed; r++) {
        uint64_t id0 = (uint64_t)w->index + 1, id1 = (uint64_t)r + 1;
        gm_devptr p = 0, q = 0;
        gm_pool_checkpoint *c = NULL;
        W_OK(w, gm_pool_retain(w->a, 0, id0, id1)); /* a new pool: its view of the device is made */
        W_OK(w, gm_malloc_pool(w->a, 0, 64 * KIB, 0, id0, id1, &p));
        W_OK(w, gm_pool_checkpoint_take(w->a, 0, id0, id1, &c));
        W_OK(w, gm_malloc(w->a, 0, 32 * KIB, 0, &q));
        W_OK(w, gm_free(w->a, p));
        gm_pool_checkpoint_free(w->a, c);
        W_OK(w, gm_pool_release(w->a, 0, id0, id1)); /* the last use: the pool goes */
        W_OK(w, gm_free(w->a, q));
    }
    return NULL;
}

static void pools_from_threads(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    pthread_t t[NTHREADS];
    worker w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (worker){.a = a, .index = i};
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < NTHREADS; i++)
        if (w[i].failed) fail_msg("thread %d: %s", i, w[i].err);
    for (int i = 0; i < NTHREADS; i++)
        for (uint64_t r = 1; r <= ROUNDS; r++) /* every pool went with its last use */
            assert_int_equal(gm_pool_use_count(a, 0, (uint64_t)i + 1, r, &(int){0}), GM_EINVAL);
    gm_test_check(a);
    OK(gm_empty_cache(a, 0));
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    gm_test_destroy(b, a);
}

int main(void) {
    const struct CMUnitTest torch[] = {cmocka_unit_test_prestate(pools_from_threads, &k_torch)};
    const struct CMUnitTest gpumem[] = {cmocka_unit_test_prestate(pools_from_threads, &k_gpumem)};
    return mempool_run(0, torch, gpumem, 1);
}
