/* arena.h — the `gpumem` policy's per-stream arenas (arena.c). Above
 * placement (va.h); the plan and the ops build on it. */
#ifndef GPUMEM_POLICY_GPUMEM_ARENA_H
#define GPUMEM_POLICY_GPUMEM_ARENA_H

#include "va.h"

int gm__gp_arena_new(gp_state *st, gm_stream stream, int pool, gp_arena **out);
void gm__gp_arena_free(gp_state *st, gp_arena *a);
/* A new arena of the stream and pool that only the plan places in. */
int gm__gp_arena_new_plan(gp_state *st, gm_stream stream, int pool, gp_arena **out);

/* The arena of (stream, pool), made on first use. Inline: every malloc
 * asks, and most programs use one stream (st->last). */
static inline int gm__gp_arena_of(gp_state *st, gm_stream stream, int pool, gp_arena **out) {
    gp_arena *l = st->last[pool];
    if (l && l->stream == stream) {
        *out = l;
        return GM_OK;
    }
    for (uint32_t i = 0; i < st->narenas; i++) {
        if (st->arenas[i]->stream == stream && st->arenas[i]->pool == pool && !st->arenas[i]->plan_only) {
            *out = st->last[pool] = st->arenas[i];
            return GM_OK;
        }
    }
    int rc = gm__gp_arena_new(st, stream, pool, out);
    if (rc == GM_OK) st->last[pool] = *out;
    return rc;
}

#endif /* GPUMEM_POLICY_GPUMEM_ARENA_H */
