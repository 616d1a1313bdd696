/* arena.c — the `gpumem` policy's arenas: per stream and pool, a virtual
 * range (va.c) where blocks are placed; the plan may have one of its own.
 * The lookup every malloc makes is gm__gp_arena_of, inline in arena.h. */
#include "arena.h"

#include <stdlib.h>

void gm__gp_arena_free(gp_state *st, gp_arena *a) {
    if (!a) return;
    if (st->vmm && a->gran) (void)gm__be_cleanup_va_release(st->d, a->base, a->va_size);
    free(a->gran);
    free(a->mapped);
    free(a->fidx);
    free(a);
}

int gm__gp_arena_new(gp_state *st, gm_stream stream, int pool, gp_arena **out) {
    if (st->narenas == st->arenas_cap) {
        uint32_t cap = st->arenas_cap ? st->arenas_cap * 2 : 4;
        if (cap > UINT16_MAX) return GM_ENOHOSTMEM;
        gp_arena **n = realloc(st->arenas, cap * sizeof *n);
        if (!n) return GM_ENOHOSTMEM;
        st->arenas = n;
        st->arenas_cap = cap;
    }
    gp_arena *a = calloc(1, sizeof *a);
    if (!a) return GM_ENOHOSTMEM;
    a->stream = stream;
    a->pool = (uint8_t)pool;
    a->index = (int32_t)st->narenas;
    if (st->vmm) {
        int rc = gm__gp_arena_init_va(st, a);
        if (rc) {
            free(a);
            return rc;
        }
    }
    st->arenas[st->narenas++] = a;
    *out = a;
    return GM_OK;
}

int gm__gp_arena_new_plan(gp_state *st, gm_stream stream, int pool, gp_arena **out) {
    int rc = gm__gp_arena_new(st, stream, pool, out);
    if (rc == GM_OK) (*out)->plan_only = true;
    return rc;
}
