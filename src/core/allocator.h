/* allocator.h — the allocator front end's own inline code (allocator.c),
 * shared with the private pools' entry points (pools.c), which sit above
 * it: a device by index, its publication, a block handed out and a block
 * freed. Inline, as every malloc and free runs them. */
#ifndef GPUMEM_CORE_ALLOCATOR_H
#define GPUMEM_CORE_ALLOCATOR_H

#include "frontend.h"
#include "history.h"
#include "mempool.h"

/* ---- devices --------------------------------------------------------------- */

static inline gm__device *dev_peek(gm_allocator *a, int i) {
    return __atomic_load_n(&a->devices[i], __ATOMIC_ACQUIRE);
}

/* The stats of d to the sink, if one is set (device lock held). */
static inline void publish(gm__device *d) {
    gm__sink *s = gm__sink_get(d->alloc);
    if (s) s->ops->update(s, d->index, &d->stats);
}

/* The device, created on first use (allocator.c). */
int gm__get_device_slow(gm_allocator *a, int device, gm__device **out);

/* Inline: every malloc asks, and the device almost always exists. */
static inline int get_device(gm_allocator *a, int device, gm__device **out) {
    if ((unsigned)device < (unsigned)a->ndevices) {
        gm__device *d = dev_peek(a, device);
        if (d) {
            *out = d;
            return GM_OK;
        }
    }
    return gm__get_device_slow(a, device, out);
}


/* ---- malloc / free ---------------------------------------------------------- */

/* Request-level stats of one malloc / one free (inc/dec: no sign branches). */
static inline void account_alloc(gm__device *d, const gm__block_hdr *b) {
    gm_stats *s = &d->stats;
    gm__stat_block_inc(s->allocation, s->allocated_bytes, b->pool, b->size);
    gm__stat_pool_inc(s->requested_bytes, b->pool, (int64_t)b->requested);
    if (b->size >= d->cfg->max_split_size) gm__stat_inc(&s->oversize_allocations, 1);
}

static inline void account_free(gm__device *d, const gm__block_hdr *b) {
    gm_stats *s = &d->stats;
    gm__stat_block_dec(s->allocation, s->allocated_bytes, b->pool, b->size);
    gm__stat_pool_dec(s->requested_bytes, b->pool, (int64_t)b->requested);
    if (b->size >= d->cfg->max_split_size) gm__stat_dec(&s->oversize_allocations, 1);
}

/* A placed block handed out (lock held; the pointer map has room). */
static inline void hand_out(gm__device *d, gm__block_hdr *b, size_t size, gm_stream stream, uint16_t mpool) {
    gm__fe_dev *fe = d->fe;
    b->live = 1;
    b->category = 0;
    b->mpool = mpool;
    b->requested = size;
    b->uses = NULL;
    gm__ptrmap_insert(&fe->map, b);
    account_alloc(d, b);
    gm__history_note(d->index, GM_TA_ALLOC, b->ptr, size, stream);
    if (b->ptr < atomic_load_explicit(&fe->lo, memory_order_relaxed))
        atomic_store_explicit(&fe->lo, b->ptr, memory_order_release);
    if (b->ptr + b->size > atomic_load_explicit(&fe->hi, memory_order_relaxed))
        atomic_store_explicit(&fe->hi, b->ptr + b->size, memory_order_release);
}

/* The caller frees live block b (pointer-map slot `slot`; lock held). */
static inline int free_block(gm__device *d, gm__block_hdr *b, uint64_t slot) {
    gm__fe_dev *fe = d->fe;
    struct gm__stream_uses *u = b->uses;
    bool wait = u && u->n; /* used on other streams: events first */
    if (wait) {
        /* record first: if that fails the block stays live and unchanged */
        int rc = d->capturing ? gm__events_defer(d, b) : gm__events_record(d, b);
        if (rc != GM_OK) return gm__set_error(rc, "gm_free: recording a stream event failed: %s", gm_strerror(rc));
    }
    gm__ptrmap_remove_at(&fe->map, slot);
    b->live = 0;
    account_free(d, b); /* request-level stats drop at free time, like torch */
    gm__history_note_free(d->index, b->ptr, b->requested, b->stream, !wait);
    if (!wait) {
        if (u) gm__uses_free(b);
        gm__policy_free(d, b);
    }
    return GM_OK;
}


#endif /* GPUMEM_CORE_ALLOCATOR_H */
