/* table.c — the backend table: a gm_backend is a backend's ops (sim.c,
 * cuda.c, or a caller's own) with per-device, per-kind call counters, call
 * times and fault injection. The core reaches a backend only through it:
 * src/core/devcall.c's gm__be_* wrappers count each call here
 * (gm__bt_enter / gm__bt_spent / gm__bt_drop) and call the op. */
#include "backend/table.h"
#include "util/util.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *gm_bcall_name(int kind) {
    static const char *const names[] = {
#define GM__BCALL_NAME(n) #n,
        GM_BCALL_LIST(GM__BCALL_NAME)
#undef GM__BCALL_NAME
    };
    if (kind == GM_BCALL_ANY) return "ANY";
    if (kind < 0 || kind >= GM_BCALL_COUNT) return "UNKNOWN";
    return names[kind];
}

int gm_backend_create(gm_backend **out, const gm_backend_ops *ops, void *ctx) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!out || !ops) return gm__set_error(GM_EINVAL, "gm_backend_create: NULL argument");
    /* a table must at least reach its name; later fields may be missing */
    if (ops->version < 1 || ops->size < offsetof(gm_backend_ops, destroy))
        return gm__set_error(GM_EINVAL, "gm_backend_create: bad ops version %u / size %u",
                                 ops->version, ops->size);
    gm_backend *b = calloc(1, sizeof *b);
    if (!b) return GM_ENOHOSTMEM;
    /* Copy only the fields the caller's table has: later fields stay NULL. */
    size_t n = ops->size < sizeof b->ops ? ops->size : sizeof b->ops;
    memcpy(&b->ops, ops, n);
    b->ctx = ctx;
    pthread_mutex_init(&b->fault_lock, NULL);
    *out = b;
    return GM_OK;
}

void gm_backend_destroy(gm_backend *b) {
    if (!b) return;
    if (b->ops.destroy) b->ops.destroy(b->ctx);
    pthread_mutex_destroy(&b->fault_lock);
    free(b);
}

const char *gm_backend_name(const gm_backend *b) {
    return b && b->ops.name ? b->ops.name : "unknown";
}

int gm_backend_device_count(gm_backend *b, int *count) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!b || !count) return GM_EINVAL;
    if (!b->ops.device_count) return GM_ENOTSUP;
    return b->ops.device_count(b->ctx, count);
}

/* One per-device, per-kind counter of a backend's array (calls or ns), or
 * their sum over kinds. */
static uint64_t counter(_Atomic uint64_t (*const arr)[GM_BCALL_COUNT], int dev, int kind) {
    if (dev < 0 || dev >= GM_MAX_DEVICES) return 0;
    if (kind == GM_BCALL_ANY) {
        uint64_t sum = 0;
        for (int k = 0; k < GM_BCALL_COUNT; k++) sum += atomic_load_explicit(&arr[dev][k], memory_order_relaxed);
        return sum;
    }
    if (kind < 0 || kind >= GM_BCALL_COUNT) return 0;
    return atomic_load_explicit(&arr[dev][kind], memory_order_relaxed);
}

uint64_t gm_backend_call_count(const gm_backend *b, int dev, int kind) {
    return b ? counter(((gm_backend *)b)->calls, dev, kind) : 0;
}

uint64_t gm_backend_call_ns(const gm_backend *b, int dev, int kind) {
    return b ? counter(((gm_backend *)b)->ns, dev, kind) : 0;
}

void gm__bt_spent(gm_backend *b, int dev, int kind, uint64_t t0) {
    if (dev >= 0 && dev < GM_MAX_DEVICES)
        atomic_fetch_add_explicit(&b->ns[dev][kind], gm__bt_now_ns() - t0, memory_order_relaxed);
}

uint64_t gm_backend_dropped_count(const gm_backend *b, int dev, int kind) {
    return b ? counter(((gm_backend *)b)->dropped, dev, kind) : 0;
}

int gm_backend_inject_fault(gm_backend *b, int kind, uint64_t nth, int status) {
    return gm_backend_inject_fault_ex(b, kind, nth, status, 0);
}

int gm_backend_inject_fault_ex(gm_backend *b, int kind, uint64_t nth, int status, unsigned flags) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!b) return GM_EINVAL;
    if (flags & ~(unsigned)GM_FAULT_PERSISTENT)
        return gm__set_error(GM_EINVAL, "gm_backend_inject_fault_ex: unknown flags 0x%x", flags);
    if (kind != GM_BCALL_ANY && (kind < 0 || kind >= GM_BCALL_COUNT))
        return gm__set_error(GM_EINVAL, "gm_backend_inject_fault: unknown call kind %d", kind);
    if (nth > 0 && status >= 0)
        return gm__set_error(GM_EINVAL, "gm_backend_inject_fault: status %d is not an error", status);
    pthread_mutex_lock(&b->fault_lock);
    b->fault_kind = kind;
    b->fault_remaining = nth;
    b->fault_status = status;
    b->fault_persistent = (flags & GM_FAULT_PERSISTENT) != 0;
    atomic_store(&b->fault_armed, nth > 0);
    pthread_mutex_unlock(&b->fault_lock);
    return GM_OK;
}

int gm__bt_enter(gm_backend *b, int dev, int kind) {
    if (dev >= 0 && dev < GM_MAX_DEVICES)
        atomic_fetch_add_explicit(&b->calls[dev][kind], 1, memory_order_relaxed);
    if (!atomic_load_explicit(&b->fault_armed, memory_order_relaxed)) return GM_OK;
    int rc = GM_OK;
    pthread_mutex_lock(&b->fault_lock);
    if (b->fault_remaining > 0 && (b->fault_kind == GM_BCALL_ANY || b->fault_kind == kind)) {
        if (b->fault_persistent && b->fault_remaining == 1) {
            rc = b->fault_status; /* from here on, every call of the kind fails */
        } else if (--b->fault_remaining == 0) {
            rc = b->fault_status;
            atomic_store(&b->fault_armed, false);
        }
    }
    pthread_mutex_unlock(&b->fault_lock);
    return rc;
}

void gm__bt_drop(gm_backend *b, int dev, int kind) {
    if (dev >= 0 && dev < GM_MAX_DEVICES) atomic_fetch_add_explicit(&b->dropped[dev][kind], 1, memory_order_relaxed);
}

void *gm__backend_ctx(gm_backend *b, const gm_backend_ops **ops) {
    if (ops) *ops = &b->ops;
    return b->ctx;
}
