/* devlock.c — the contended path of the device lock (devlock.h): spin on a
 * plain load while the holder is likely still in a short critical section,
 * then give the CPU away (the holder may be waiting for it), then sleep in
 * short steps while it is inside a long device call. */
#include "devlock.h"

#include <sched.h>
#include <time.h>

#define GM__DEVLOCK_SPINS 256      /* polls with a pause between them (~10 us) */
#define GM__DEVLOCK_YIELDS 64      /* then polls after sched_yield */
#define GM__DEVLOCK_SLEEP_NS 20000 /* then polls every 20 us */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline bool looks_free(gm__devlock *l) { return __atomic_load_n(&l->held, __ATOMIC_RELAXED) == 0; }

void gm__devlock_wait(gm__devlock *l) {
    for (unsigned n = 0;; n++) {
        if (looks_free(l) && gm__devlock_try(l)) return;
        if (n < GM__DEVLOCK_SPINS) {
            cpu_relax();
        } else if (n < GM__DEVLOCK_SPINS + GM__DEVLOCK_YIELDS) {
            sched_yield();
        } else {
            struct timespec ts = {0, GM__DEVLOCK_SLEEP_NS};
            nanosleep(&ts, NULL);
        }
    }
}
