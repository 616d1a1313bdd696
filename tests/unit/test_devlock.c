/* test_devlock.c — the device lock (src/core/devlock.h) excludes: threads
 * add to a plain (non-atomic) counter under it, split into a read, a pause
 * and a write so that two threads inside at once would lose updates; some
 * holders sleep inside so that waiters go through the yield and sleep steps
 * of the contended path too. The count must come out exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <time.h>

#include "devlock.h"

enum { NTHREADS = 6, ROUNDS = 20000, SLOW_EVERY = 2000 };

typedef struct shared {
    gm__devlock lock;
    volatile uint64_t counter; /* guarded by lock */
    volatile int inside;       /* guarded by lock: threads inside right now */
    volatile int max_inside;
} shared;

static void *worker(void *arg) {
    shared *sh = arg;
    for (int i = 0; i < ROUNDS; i++) {
        gm__devlock_lock(&sh->lock);
        int in = sh->inside + 1;
        sh->inside = in;
        if (in > sh->max_inside) sh->max_inside = in;
        uint64_t v = sh->counter;
        if (i % SLOW_EVERY == 0) {
            struct timespec ts = {0, 200000}; /* a long hold, like a device call */
            nanosleep(&ts, NULL);
        } else {
            for (volatile int k = 0; k < 8; k++) {
            }
        }
        sh->counter = v + 1;
        sh->inside = in - 1;
        gm__devlock_unlock(&sh->lock);
    }
    return NULL;
}

static void test_lock_excludes(void **state) {
    (void)state;
    shared sh;
    gm__devlock_init(&sh.lock);
    sh.counter = 0;
    sh.inside = sh.max_inside = 0;
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, &sh), 0);
    for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(sh.max_inside, 1);
    assert_int_equal(sh.counter, (uint64_t)NTHREADS * ROUNDS);
}

static void test_try_lock(void **state) {
    (void)state;
    gm__devlock l;
    gm__devlock_init(&l);
    assert_true(gm__devlock_try(&l));
    assert_false(gm__devlock_try(&l)); /* held: a second taker must not get it */
    gm__devlock_unlock(&l);
    assert_true(gm__devlock_try(&l));
    gm__devlock_unlock(&l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_try_lock),
        cmocka_unit_test(test_lock_excludes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
