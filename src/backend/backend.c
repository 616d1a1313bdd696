/* backend.c — the one place where the core reaches a device backend.
 *
 * Every gm__be_* wrapper (1) counts the call per device and kind (atomics, so
 * replay and tests can read counts from any thread), (2) applies fault
 * injection, and (3) calls the backend op (a NULL op is GM_ENOTSUP). The
 * wrappers also keep d->stats' device-call counters (num_device_alloc, ...);
 * the caller holds the device lock for those. Counters in d->stats count
 * successful calls only (torch counts a cudaMalloc once it has succeeded);
 * gm_backend_call_count counts every attempt. */
#include "history.h"
#include "internal.h"
#include "trace/trace.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
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

static inline uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Add the time since t0 to kind's total on device dev. */
static void spent(gm_backend *b, int dev, int kind, uint64_t t0) {
    if (dev >= 0 && dev < GM_MAX_DEVICES)
        atomic_fetch_add_explicit(&b->ns[dev][kind], now_ns() - t0, memory_order_relaxed);
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

/* Count the call; return the injected failure status, or GM_OK to go on. */
static int enter(gm_backend *b, int dev, int kind) {
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

/* Count the call as `kind` (which may inject a failure), then call the
 * backend's op on d's device; on success run `on_ok` (a statement). */
#define GM__BE_CALL_THEN(d, kind, on_ok, op, ...)                              \
    do {                                                                       \
        gm_backend *b_ = (d)->backend;                                         \
        int rc_ = enter(b_, (d)->index, GM_BCALL_##kind);                      \
        if (rc_ != GM_OK) return rc_;                                          \
        if (!b_->ops.op) return GM_ENOTSUP;                                    \
        uint64_t t0_ = now_ns();                                               \
        rc_ = b_->ops.op(b_->ctx, (d)->index, __VA_ARGS__);                    \
        spent(b_, (d)->index, GM_BCALL_##kind, t0_);                           \
        if (rc_ == GM_OK) on_ok;                                               \
        return rc_;                                                            \
    } while (0)

#define GM__BE_CALL(d, kind, op, ...) GM__BE_CALL_THEN(d, kind, (void)0, op, __VA_ARGS__)
/* Like GM__BE_CALL, bumping a d->stats counter when the call succeeds. */
#define GM__BE_CALL_STAT(d, kind, stat, op, ...) GM__BE_CALL_THEN(d, kind, (d)->stats.stat++, op, __VA_ARGS__)

int gm__be_mem_info(gm__device *d, uint64_t *free_bytes, uint64_t *total_bytes) {
    GM__BE_CALL(d, MEM_INFO, mem_info, free_bytes, total_bytes);
}
/* segment calls also feed the allocation history and the segment observer
 * (core/history.h) */
int gm__be_malloc(gm__device *d, uint64_t size, gm_devptr *out) {
    GM__BE_CALL_THEN(d, MALLOC, (d->stats.num_device_alloc++,
                                 gm__segment_note(d->index, GM_SEGMENT_ALLOC, *out, size)),
                     malloc, size, out);
}
int gm__be_free(gm__device *d, gm_devptr ptr, uint64_t size) {
    GM__BE_CALL_THEN(d, FREE, (d->stats.num_device_free++,
                               gm__segment_note(d->index, GM_SEGMENT_FREE, ptr, size)),
                     free, ptr);
}
int gm__be_granularity(gm__device *d, uint64_t *bytes) {
    /* not a counted kind: asked once per device, never fails by injection */
    gm_backend *b = d->backend;
    if (!b->ops.granularity) return GM_ENOTSUP;
    return b->ops.granularity(b->ctx, d->index, bytes);
}
int gm__be_va_reserve(gm__device *d, uint64_t size, gm_devptr *out) {
    GM__BE_CALL_STAT(d, VA_RESERVE, num_va_reserve, va_reserve, size, out);
}
int gm__be_va_release(gm__device *d, gm_devptr va, uint64_t size) {
    GM__BE_CALL_STAT(d, VA_RELEASE, num_va_release, va_release, va, size);
}
int gm__be_phys_create(gm__device *d, uint64_t size, gm_physmem *out) {
    GM__BE_CALL_STAT(d, PHYS_CREATE, num_phys_create, phys_create, size, out);
}
int gm__be_phys_release(gm__device *d, gm_physmem h) {
    GM__BE_CALL_STAT(d, PHYS_RELEASE, num_phys_release, phys_release, h);
}
int gm__be_map(gm__device *d, gm_devptr va, uint64_t size, gm_physmem h) {
    GM__BE_CALL_THEN(d, MAP, (d->stats.num_map++, gm__segment_note(d->index, GM_SEGMENT_MAP, va, size)),
                     map, va, size, h);
}
int gm__be_unmap(gm__device *d, gm_devptr va, uint64_t size) {
    GM__BE_CALL_THEN(d, UNMAP, (d->stats.num_unmap++, gm__segment_note(d->index, GM_SEGMENT_UNMAP, va, size)),
                     unmap, va, size);
}
int gm__be_event_record(gm__device *d, gm_stream stream, gm_event *out) {
    GM__BE_CALL(d, EVENT_RECORD, event_record, stream, out);
}
int gm__be_event_query(gm__device *d, gm_event ev, bool *done) {
    GM__BE_CALL(d, EVENT_QUERY, event_query, ev, done);
}
int gm__be_event_sync(gm__device *d, gm_event ev) {
    GM__BE_CALL(d, EVENT_SYNC, event_sync, ev);
}
int gm__be_event_destroy(gm__device *d, gm_event ev) {
    GM__BE_CALL(d, EVENT_DESTROY, event_destroy, ev);
}

/* ---- cleanup calls ----------------------------------------------------------
 * Calls that give something back on paths that cannot report a failure (or
 * must not stop at one: destroy, rollback, an event already complete). Each
 * is tried twice, so a passing fault does not leak; when both tries fail the
 * object is left to the backend and counted (gm_backend_dropped_count). */
static void drop(gm__device *d, int kind) {
    if (d->index >= 0 && d->index < GM_MAX_DEVICES)
        atomic_fetch_add_explicit(&d->backend->dropped[d->index][kind], 1, memory_order_relaxed);
}

#define GM__BE_CLEANUP(d, kind, call)                                          \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ < 0) rc_ = (call);                                             \
        if (rc_ < 0) drop((d), GM_BCALL_##kind);                               \
        return rc_;                                                            \
    } while (0)

int gm__be_cleanup_free(gm__device *d, gm_devptr ptr, uint64_t size) {
    GM__BE_CLEANUP(d, FREE, gm__be_free(d, ptr, size));
}
int gm__be_cleanup_va_release(gm__device *d, gm_devptr va, uint64_t size) {
    GM__BE_CLEANUP(d, VA_RELEASE, gm__be_va_release(d, va, size));
}
int gm__be_cleanup_phys_release(gm__device *d, gm_physmem h) {
    GM__BE_CLEANUP(d, PHYS_RELEASE, gm__be_phys_release(d, h));
}
int gm__be_cleanup_unmap(gm__device *d, gm_devptr va, uint64_t size) {
    GM__BE_CLEANUP(d, UNMAP, gm__be_unmap(d, va, size));
}
int gm__be_cleanup_event_destroy(gm__device *d, gm_event ev) {
    GM__BE_CLEANUP(d, EVENT_DESTROY, gm__be_event_destroy(d, ev));
}

/* For backends that need their own state back from the public handle
 * (gm_sim_complete_events). Declared where it is used. */
void *gm__backend_ctx(gm_backend *b, const gm_backend_ops **ops);
void *gm__backend_ctx(gm_backend *b, const gm_backend_ops **ops) {
    if (ops) *ops = &b->ops;
    return b->ctx;
}
