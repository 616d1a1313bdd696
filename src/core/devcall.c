/* devcall.c — the core's device calls: every gm__be_* wrapper (1) counts
 * the call per device and kind and applies fault injection (the backend
 * table, src/backend/table.c), (2) calls the backend op (a NULL op is
 * GM_ENOTSUP), and (3) keeps d->stats' device-call counters
 * (num_device_alloc, ...; the caller holds the device lock) and feeds the
 * allocation history and the segment observer. Counters in d->stats count
 * successful calls only (torch counts a cudaMalloc once it has succeeded);
 * gm_backend_call_count counts every attempt. */
#include "backend/table.h"
#include "history.h"
#include "internal.h"

/* Count the call as `kind` (which may inject a failure), then call the
 * backend's op on d's device; on success run `on_ok` (a statement). */
#define GM__BE_CALL_THEN(d, kind, on_ok, op, ...)                              \
    do {                                                                       \
        gm_backend *b_ = (d)->backend;                                         \
        gm__capture_note((d), GM_BCALL_##kind);                                \
        int rc_ = gm__bt_enter(b_, (d)->index, GM_BCALL_##kind);                      \
        if (rc_ != GM_OK) return rc_;                                          \
        if (!b_->ops.op) return GM_ENOTSUP;                                    \
        uint64_t t0_ = gm__bt_now_ns();                                        \
        rc_ = b_->ops.op(b_->ctx, (d)->index, __VA_ARGS__);                    \
        gm__bt_spent(b_, (d)->index, GM_BCALL_##kind, t0_);                    \
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
#define GM__BE_CLEANUP(d, kind, call)                                          \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ < 0) rc_ = (call);                                             \
        if (rc_ < 0) gm__bt_drop((d)->backend, (d)->index, GM_BCALL_##kind);  \
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
