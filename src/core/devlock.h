/* devlock.h — the device lock: what every gm_malloc / gm_free takes once.
 *
 * A test-and-set lock whose unlock is a plain release store, with a waiting
 * side that spins briefly, then yields, then sleeps in short steps
 * (devlock.c). Why not pthread_mutex_t: its unlock is an atomic exchange (it
 * must look for sleepers), and a locked instruction drains the store buffer
 * that a malloc or free has just filled with stats and list updates. On the
 * H200 hosts (Xeon) that exchange plus the call into libc was a visible share
 * of a warm operation: pthread, an inline futex mutex (exchange on unlock) and
 * this lock, paired against torch's native allocator with
 * tests/gpu/variants_paired.sh, are in bench/RESULTS.md ("the device lock",
 * 2026-11-30). No lock at all (the single-threaded bench) was within noise of
 * this one, so the exchange left on acquire costs nothing worth a cleverer
 * scheme.
 *
 * The price is paid only under contention: a waiter never sleeps on a
 * futex (a plain-store unlock cannot know whether to wake one), so when the
 * holder is inside a long device call it re-polls at most every
 * GM__DEVLOCK_SLEEP_NS. PyTorch calls the allocator from the main thread and
 * the autograd thread, which rarely overlap, and holds are short outside
 * device calls (one warm operation: bench/RESULTS.md). Mutual exclusion rests on the atomic exchange alone; every
 * waiter keeps retrying, so one is always admitted once the holder leaves. */
#ifndef GM_DEVLOCK_H
#define GM_DEVLOCK_H

#include <stdbool.h>

typedef struct gm__devlock {
    int held; /* 0 or 1 */
} gm__devlock;

void gm__devlock_wait(gm__devlock *l); /* the contended path (devlock.c) */

static inline void gm__devlock_init(gm__devlock *l) { __atomic_store_n(&l->held, 0, __ATOMIC_RELAXED); }

static inline bool gm__devlock_try(gm__devlock *l) {
    return __atomic_exchange_n(&l->held, 1, __ATOMIC_ACQUIRE) == 0;
}

static inline void gm__devlock_lock(gm__devlock *l) {
    if (!gm__devlock_try(l)) gm__devlock_wait(l);
}

static inline void gm__devlock_unlock(gm__devlock *l) { __atomic_store_n(&l->held, 0, __ATOMIC_RELEASE); }

#endif
