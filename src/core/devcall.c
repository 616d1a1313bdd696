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
#include "util/idmap.h"

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
static int be_malloc(gm__device *d, uint64_t size, gm_devptr *out) {
    GM__BE_CALL_THEN(d, MALLOC, (d->stats.num_device_alloc++,
                                 gm__segment_note(d->index, GM_SEGMENT_ALLOC, *out, size)),
                     malloc, size, out);
}
static int be_free(gm__device *d, gm_devptr ptr, uint64_t size) {
    GM__BE_CALL_THEN(d, FREE, (d->stats.num_device_free++,
                               gm__segment_note(d->index, GM_SEGMENT_FREE, ptr, size)),
                     free, ptr);
}
static int be_phys_create(gm__device *d, uint64_t size, gm_physmem *out) {
    GM__BE_CALL_STAT(d, PHYS_CREATE, num_phys_create, phys_create, size, out);
}
static int be_phys_release(gm__device *d, gm_physmem h) {
    GM__BE_CALL_STAT(d, PHYS_RELEASE, num_phys_release, phys_release, h);
}
static int be_map(gm__device *d, gm_devptr va, uint64_t size, gm_physmem h) {
    GM__BE_CALL_THEN(d, MAP, (d->stats.num_map++, gm__segment_note(d->index, GM_SEGMENT_MAP, va, size)),
                     map, va, size, h);
}
static int be_unmap(gm__device *d, gm_devptr va, uint64_t size) {
    GM__BE_CALL_THEN(d, UNMAP, (d->stats.num_unmap++, gm__segment_note(d->index, GM_SEGMENT_UNMAP, va, size)),
                     unmap, va, size);
}

/* ---- a private pool's view: another allocator's segments, tracked handles
 * A pool served by another allocator (gm_pool_options.seg_alloc) gets its
 * segments from it and has no VMM. A tracked view (every private pool's)
 * gives its policy handle ids of its own, (generation << 32 | slot + 1),
 * and keeps the backend's handle, size and mapping of each: a sleeping
 * pool's handles are released while the policy still holds the ids, and
 * wake creates new ones behind the same ids at the same addresses. */
typedef struct gm__ph {
    gm_physmem real; /* the backend's handle (none while asleep) */
    uint64_t size;
    gm_devptr va;    /* where it is mapped, 0: not mapped */
    uint32_t gen;
    bool used;
} gm__ph;

struct gm__phys_track {
    gm__ph *v;
    uint32_t n, cap;
    uint32_t *free_idx;
    uint32_t nfree;
    gm__idmap at;      /* mapping address -> slot */
    uint64_t bytes;    /* physical bytes behind live handles */
    uint64_t plain;    /* plain (malloc) segments live */
    bool asleep;
};

int gm__track_create(gm__device *view) {
    view->track = calloc(1, sizeof *view->track);
    return view->track ? GM_OK : GM_ENOHOSTMEM;
}

void gm__track_destroy(gm__device *view) {
    struct gm__phys_track *t = view->track;
    if (!t) return;
    free(t->v);
    free(t->free_idx);
    gm__idmap_free(&t->at);
    free(t);
    view->track = NULL;
}

void gm__track_usage(const gm__device *view, uint64_t *phys_bytes, uint64_t *plain_segments) {
    const struct gm__phys_track *t = view->track;
    *phys_bytes = t ? t->bytes : 0;
    *plain_segments = t ? t->plain : 0;
}

bool gm__track_asleep(const gm__device *view) { return view->track && view->track->asleep; }

static gm__ph *ph_get(struct gm__phys_track *t, gm_physmem id, uint32_t *idx) {
    uint64_t i = id & 0xffffffffu;
    if (!i || i > t->n) return NULL;
    gm__ph *e = &t->v[i - 1];
    if (!e->used || e->gen != (uint32_t)(id >> 32)) return NULL;
    if (idx) *idx = (uint32_t)(i - 1);
    return e;
}

static int ph_slot(struct gm__phys_track *t, uint32_t *out) {
    if (t->nfree) {
        *out = t->free_idx[--t->nfree];
        return GM_OK;
    }
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 64;
        gm__ph *v = realloc(t->v, cap * sizeof *v);
        if (!v) return GM_ENOHOSTMEM;
        t->v = v;
        uint32_t *f = realloc(t->free_idx, cap * sizeof *f);
        if (!f) return GM_ENOHOSTMEM;
        t->free_idx = f;
        memset(&t->v[t->cap], 0, (cap - t->cap) * sizeof *t->v);
        t->cap = cap;
    }
    *out = t->n++;
    return GM_OK;
}

static void ph_unmapped(struct gm__phys_track *t, gm__ph *e) {
    size_t j = gm__idmap_find(&t->at, e->va);
    if (t->at.cap && t->at.id[j] != GM__IDMAP_EMPTY) gm__idmap_del(&t->at, j);
    e->va = 0;
}

static int track_phys_create(gm__device *d, uint64_t size, gm_physmem *out) {
    struct gm__phys_track *t = d->track;
    uint32_t i;
    if (ph_slot(t, &i) != GM_OK) return GM_ENOHOSTMEM;
    gm_physmem real;
    int rc = be_phys_create(d, size, &real);
    if (rc != GM_OK) {
        t->free_idx[t->nfree++] = i;
        return rc;
    }
    gm__ph *e = &t->v[i];
    uint32_t gen = e->gen + 1 ? e->gen + 1 : 1;
    *e = (gm__ph){.real = real, .size = size, .gen = gen, .used = true};
    t->bytes += size;
    *out = ((uint64_t)gen << 32) | (i + 1);
    return GM_OK;
}

static int track_phys_release(gm__device *d, gm_physmem h) {
    struct gm__phys_track *t = d->track;
    uint32_t i;
    gm__ph *e = ph_get(t, h, &i);
    if (!e || e->va) return GM_EINVAL; /* unknown, or still mapped (as the driver says) */
    /* asleep: its memory is already given back */
    int rc = t->asleep ? GM_OK : be_phys_release(d, e->real);
    if (rc != GM_OK) return rc;
    e->used = false;
    t->bytes -= e->size;
    t->free_idx[t->nfree++] = i;
    return GM_OK;
}

static int track_map(gm__device *d, gm_devptr va, uint64_t size, gm_physmem h) {
    struct gm__phys_track *t = d->track;
    uint32_t i;
    gm__ph *e = ph_get(t, h, &i);
    if (!e || e->va || e->size != size) return GM_EINVAL;
    if (t->asleep) return GM_ESTATE; /* mempool.c calls no placement while asleep */
    if (gm__idmap_reserve(&t->at, 64) != GM_OK) return GM_ENOHOSTMEM;
    int rc = be_map(d, va, size, e->real);
    if (rc != GM_OK) return rc;
    gm__idmap_set(&t->at, gm__idmap_find(&t->at, va), va, i);
    e->va = va;
    return GM_OK;
}

/* [va, va + size) covers whole mappings (as the driver requires). */
static int track_unmap(gm__device *d, gm_devptr va, uint64_t size) {
    struct gm__phys_track *t = d->track;
    if (!t->asleep) {
        int rc = be_unmap(d, va, size);
        if (rc != GM_OK) return rc;
    }
    for (uint64_t off = 0; off < size && t->at.cap;) {
        size_t j = gm__idmap_find(&t->at, va + off);
        if (t->at.id[j] == GM__IDMAP_EMPTY) break; /* not a mapping start: the backend judged it */
        gm__ph *e = &t->v[t->at.id[j]];
        off += e->size;
        ph_unmapped(t, e);
    }
    return GM_OK;
}

/* Cleanup of a backend handle behind a tracked view (the cleanup wrappers
 * would go through the tracker): tried twice, then left to the backend. */
static void raw_cleanup(gm__device *d, gm__ph *e, bool unmap) {
    if (unmap && be_unmap(d, e->va, e->size) != GM_OK && be_unmap(d, e->va, e->size) != GM_OK)
        gm__bt_drop(d->backend, d->index, GM_BCALL_UNMAP);
    if (be_phys_release(d, e->real) != GM_OK && be_phys_release(d, e->real) != GM_OK)
        gm__bt_drop(d->backend, d->index, GM_BCALL_PHYS_RELEASE);
}

int gm__track_sleep(gm__device *d, uint64_t *released) {
    struct gm__phys_track *t = d->track;
    *released = 0;
    if (!t || t->asleep) return GM_OK;
    uint32_t i = 0;
    int rc = GM_OK;
    for (; i < t->n && rc == GM_OK; i++)
        if (t->v[i].used && t->v[i].va) rc = be_unmap(d, t->v[i].va, t->v[i].size);
    if (rc != GM_OK) { /* map back what was unmapped: nothing changed */
        for (uint32_t k = 0; k + 1 < i; k++)
            if (t->v[k].used && t->v[k].va && be_map(d, t->v[k].va, t->v[k].size, t->v[k].real) != GM_OK)
                gm__bt_drop(d->backend, d->index, GM_BCALL_MAP);
        return rc;
    }
    for (i = 0; i < t->n; i++) {
        if (!t->v[i].used) continue;
        raw_cleanup(d, &t->v[i], false); /* a release that fails twice is left to the backend (counted) */
        *released += t->v[i].size;
    }
    t->asleep = true;
    return GM_OK;
}

int gm__track_wake(gm__device *d) {
    struct gm__phys_track *t = d->track;
    if (!t || !t->asleep) return GM_OK;
    int rc = GM_OK;
    uint32_t i = 0;
    for (; i < t->n && rc == GM_OK; i++) {
        gm__ph *e = &t->v[i];
        if (!e->used) continue;
        rc = be_phys_create(d, e->size, &e->real);
        if (rc == GM_OK && e->va && (rc = be_map(d, e->va, e->size, e->real)) != GM_OK)
            raw_cleanup(d, e, false); /* created, not mapped */
    }
    if (rc == GM_OK) {
        t->asleep = false;
        return GM_OK;
    }
    for (uint32_t k = 0; k + 1 < i; k++) { /* give back what this wake made */
        if (t->v[k].used) raw_cleanup(d, &t->v[k], t->v[k].va != 0);
    }
    return rc;
}

/* ---- the wrappers ----------------------------------------------------------- */

int gm__be_malloc(gm__device *d, uint64_t size, gm_devptr *out) {
    const gm_pool_options *o = d->popt;
    int rc;
    if (__builtin_expect(o && o->seg_alloc, 0)) { /* another allocator's segment */
        gm__capture_note(d, GM_BCALL_MALLOC);
        rc = o->seg_alloc(o->seg_ctx, d->index, size, 0, out);
        if (rc == GM_OK) {
            d->stats.num_device_alloc++;
            gm__segment_note(d->index, GM_SEGMENT_ALLOC, *out, size);
        } else if (rc > 0) {
            rc = GM_ENOMEM;
        }
    } else {
        rc = be_malloc(d, size, out);
    }
    if (rc == GM_OK && d->track) d->track->plain++;
    return rc;
}
int gm__be_free(gm__device *d, gm_devptr ptr, uint64_t size) {
    const gm_pool_options *o = d->popt;
    int rc = GM_OK;
    if (__builtin_expect(o && o->seg_free, 0)) {
        gm__capture_note(d, GM_BCALL_FREE);
        o->seg_free(o->seg_ctx, d->index, ptr, size);
        d->stats.num_device_free++;
        gm__segment_note(d->index, GM_SEGMENT_FREE, ptr, size);
    } else {
        rc = be_free(d, ptr, size);
    }
    if (rc == GM_OK && d->track) d->track->plain--;
    return rc;
}
int gm__be_granularity(gm__device *d, uint64_t *bytes) {
    /* not a counted kind: asked once per device, never fails by injection */
    gm_backend *b = d->backend;
    /* a pool of another allocator's memory, or of one allocation per block */
    if (d->popt && (d->popt->seg_alloc || d->popt->no_split)) return GM_ENOTSUP;
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
    return __builtin_expect(d->track != NULL, 0) ? track_phys_create(d, size, out) : be_phys_create(d, size, out);
}
int gm__be_phys_release(gm__device *d, gm_physmem h) {
    return __builtin_expect(d->track != NULL, 0) ? track_phys_release(d, h) : be_phys_release(d, h);
}
int gm__be_map(gm__device *d, gm_devptr va, uint64_t size, gm_physmem h) {
    return __builtin_expect(d->track != NULL, 0) ? track_map(d, va, size, h) : be_map(d, va, size, h);
}
int gm__be_unmap(gm__device *d, gm_devptr va, uint64_t size) {
    return __builtin_expect(d->track != NULL, 0) ? track_unmap(d, va, size) : be_unmap(d, va, size);
}
int gm__be_copy_to_host(gm__device *d, void *dst, gm_devptr src, uint64_t size) {
    gm_backend *b = d->backend;
    return b->ops.copy_to_host ? b->ops.copy_to_host(b->ctx, d->index, dst, src, size) : GM_ENOTSUP;
}
int gm__be_copy_to_device(gm__device *d, gm_devptr dst, const void *src, uint64_t size) {
    gm_backend *b = d->backend;
    return b->ops.copy_to_device ? b->ops.copy_to_device(b->ctx, d->index, dst, src, size) : GM_ENOTSUP;
}
int gm__be_host_alloc(gm__device *d, uint64_t size, void **out) {
    GM__BE_CALL(d, HOST_ALLOC, host_alloc, size, out);
}
int gm__be_host_free(gm__device *d, void *ptr) {
    gm_backend *b = d->backend;
    return b->ops.host_free ? b->ops.host_free(b->ctx, d->index, ptr) : GM_ENOTSUP;
}
/* copy_many where the backend has it, else one synchronous copy at a time */
int gm__be_copy_many(gm__device *d, bool to_device, const gm_backend_copy *v, size_t n) {
    gm_backend *b = d->backend;
    int rc = b->ops.copy_many ? b->ops.copy_many(b->ctx, d->index, to_device, v, n) : GM_ENOTSUP;
    if (rc != GM_ENOTSUP) return rc;
    rc = GM_OK;
    for (size_t i = 0; i < n && rc == GM_OK; i++)
        rc = to_device ? gm__be_copy_to_device(d, v[i].dev, v[i].host, v[i].size)
                       : gm__be_copy_to_host(d, v[i].host, v[i].dev, v[i].size);
    return rc;
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
