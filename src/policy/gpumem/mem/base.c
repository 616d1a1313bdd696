/* base.c — the bottom floor of the `gpumem` policy (base.h): block structs,
 * recycled so that a warm malloc/free never calls malloc, and waiting for an
 * arena's stream. */
#include "base.h"

#include <stdlib.h>
#include <string.h>

#define GP_SLAB_BLOCKS 256

gp_block *gm__gp_block_new(gp_state *st) {
    if (!st->pool) {
        if (st->nslabs == st->slabs_cap) {
            size_t cap = st->slabs_cap ? st->slabs_cap * 2 : 16;
            void **n = realloc(st->slabs, cap * sizeof *n);
            if (!n) return NULL;
            st->slabs = n;
            st->slabs_cap = cap;
        }
        gp_block *s = calloc(GP_SLAB_BLOCKS, sizeof *s);
        if (!s) return NULL;
        st->slabs[st->nslabs++] = s;
        for (int i = 0; i < GP_SLAB_BLOCKS; i++) {
            s[i].fnext = st->pool;
            st->pool = &s[i];
        }
    }
    gp_block *b = st->pool;
    st->pool = b->fnext;
    /* zeroed by six 16-byte stores: `*b = (gp_block){0}` became a rep stos,
     * whose start-up cost is paid on every block cut (bench/RESULTS.md, "the
     * pointer map, a block's zeroing") */
    typedef uint64_t zv __attribute__((vector_size(16), may_alias, aligned(8)));
    _Static_assert(sizeof *b % sizeof(zv) == 0, "gp_block: a whole number of 16-byte stores");
    zv *w = (zv *)b;
#pragma GCC unroll 16
    for (unsigned i = 0; i < sizeof *b / sizeof(zv); i++) w[i] = (zv){0};
    return b;
}

void gm__gp_block_put(gp_state *st, gp_block *b) {
    b->fnext = st->pool;
    st->pool = b;
}

/* Wait for the work queued so far on the arena's stream: after this, memory
 * freed in the arena may be unmapped or handed to another stream. */
int gm__gp_sync_arena(gp_state *st, gp_arena *a) {
    if (!a->dirty) return GM_OK;
    gm_event ev;
    int rc = gm__be_event_record(st->d, a->stream, &ev);
    if (rc) return rc;
    rc = gm__be_event_sync(st->d, ev);
    (void)gm__be_cleanup_event_destroy(st->d, ev);
    if (rc) return rc;
    a->dirty = false;
    a->syncs++;
    st->d->stats.num_stream_waits++;
    return GM_OK;
}

