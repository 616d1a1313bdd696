/* table.h — the backend table's inside (table.c), for the core's device
 * calls (src/core/devcall.c) and the backends that need their state back
 * from the public handle (sim.c). The backend table is the one door between
 * the core and a backend (docs/architecture.md). */
#ifndef GPUMEM_BACKEND_TABLE_H
#define GPUMEM_BACKEND_TABLE_H

#include "gpumem/backend.h"
#include "gpumem/gpumem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

struct gm_backend {
    gm_backend_ops ops; /* copy, zero-extended to our sizeof */
    void *ctx;
    _Atomic uint64_t calls[GM_MAX_DEVICES][GM_BCALL_COUNT];
    _Atomic uint64_t ns[GM_MAX_DEVICES][GM_BCALL_COUNT]; /* time inside the op */
    /* fault injection: a single armed fault, checked with one relaxed load
     * on the fast path and resolved under fault_lock */
    atomic_bool fault_armed;
    pthread_mutex_t fault_lock;
    int fault_kind;
    uint64_t fault_remaining;
    int fault_status;
    bool fault_persistent; /* keep failing from the nth call on until disarmed */
    /* cleanup calls that failed twice: the object is dropped (left to the
     * backend) and counted here, per device and kind */
    _Atomic uint64_t dropped[GM_MAX_DEVICES][GM_BCALL_COUNT];
};

/* Count a call of kind on device dev; the injected failure status, or
 * GM_OK to go on and call the op. */
int gm__bt_enter(gm_backend *b, int dev, int kind);
/* Add the time since t0 (gm__bt_now_ns) to kind's total on device dev. */
void gm__bt_spent(gm_backend *b, int dev, int kind, uint64_t t0);
/* A cleanup call of kind that failed twice: its object is left to the
 * backend, counted in gm_backend_dropped_count. */
void gm__bt_drop(gm_backend *b, int dev, int kind);
/* The backend's own state (and ops) from the public handle. */
void *gm__backend_ctx(gm_backend *b, const gm_backend_ops **ops);

static inline uint64_t gm__bt_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

#endif /* GPUMEM_BACKEND_TABLE_H */
