/* plain.c — the gpumem policy on a backend without virtual
 * memory management (no VMM): each block is its own device allocation, in
 * plain lists, with the same statistics. The production path when the driver
 * or the device lacks VMM; the VMM path is va.c. */
#include "plain.h"

int gm__gp_plain_malloc(gp_state *st, gp_arena *a, uint64_t units, gp_block **out) {
    uint64_t bytes = units << GP_ALIGN_SHIFT;
    int pool = units <= GP_SMALL_UNITS ? GM_POOL_SMALL : GM_POOL_LARGE;
    if (pool == GM_POOL_LARGE) bytes = (bytes + 2 * GM__MIB - 1) & ~(2 * GM__MIB - 1);
    gm__device *d = st->d;
    if (d->fraction_set && st->held_bytes + gm__device_others_reserved(d) + bytes > d->allowed_memory_maximum)
        return GM_ENOMEM;
    gp_block *b = gm__gp_block_new(st);
    if (!b) return GM_ENOHOSTMEM;
    int rc = gm__be_malloc(d, bytes, &b->h.ptr);
    if (rc) {
        gm__gp_block_put(st, b);
        return rc;
    }
    b->h.size = bytes;
    b->h.stream = a->stream;
    b->h.pool = (uint8_t)pool;
    b->state = GP_USED;
    b->arena = (uint16_t)a->index;
    b->next = st->plain;
    if (st->plain) st->plain->prev = b;
    st->plain = b;
    st->held_bytes += bytes;
    gm__stat_pool_add(d->stats.reserved_bytes, pool, (int64_t)bytes);
    gm__stat_pool_add(d->stats.segment, pool, 1);
    *out = b;
    return GM_OK;
}

void gm__gp_plain_free(gp_state *st, gp_block *b) {
    if (b->prev) b->prev->next = b->next;
    else st->plain = b->next;
    if (b->next) b->next->prev = b->prev;
    (void)gm__be_cleanup_free(st->d, b->h.ptr, b->h.size); /* a free cannot fail back to the caller */
    st->held_bytes -= b->h.size;
    gm__stat_pool_add(st->d->stats.reserved_bytes, b->h.pool, -(int64_t)b->h.size);
    gm__stat_pool_add(st->d->stats.segment, b->h.pool, -1);
    gm__gp_block_put(st, b);
}
