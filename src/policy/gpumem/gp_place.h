/* gp_place.h — where a block goes in the `gpumem` policy: plain.c (no VMM:
 * one device allocation per block), va.c (the free-range index of an arena,
 * best-fit placement, and returning cached small blocks to it) and arena.c
 * (the per-stream arenas). Above the chunks (gp_chunks.h); the plan and the
 * ops build on it. */
#ifndef GPUMEM_POLICY_GPUMEM_PLACE_H
#define GPUMEM_POLICY_GPUMEM_PLACE_H

#include "gp_chunks.h"

/* plain.c */
int gm__gp_plain_malloc(gp_state *st, gp_arena *a, uint64_t units, gp_block **out);
void gm__gp_plain_free(gp_state *st, gp_block *b);

/* va.c */
int gm__gp_arena_init_va(gp_state *st, gp_arena *a);
int gm__gp_va_place(gp_state *st, gp_arena *a, uint64_t units, gp_block **out);
void gm__gp_va_free(gp_state *st, gp_arena *a, gp_block *b);
/* gpumem_plan:on: [p, p+units) as a used block if it lies inside one free
 * range (mapping what it needs): 1 and *out, 0 when it is not free (or
 * memory ran out: the usual placement decides), 2 when it would need
 * mapping and !map_ok, or an error. Needs the arena's free-range index
 * (gm__gp_va_index). */
int gm__gp_va_place_at(gp_state *st, gp_arena *a, gm_devptr p, uint64_t units, bool map_ok, gp_block **out);
/* Build (on) or drop the arena's free-range index; GM_ENOHOSTMEM leaves none. */
int gm__gp_va_index(gp_arena *a, bool on);
void gm__gp_bin_insert(gp_arena *a, gp_block *b);
void gm__gp_bin_remove(gp_arena *a, gp_block *b);
unsigned gm__gp_bin_of(uint64_t units);
/* Return every cached small block to its arena. Returns how many. */
int gm__gp_flush_quick(gp_state *st);
/* The same for the size classes no malloc took from since the last flush. */
int gm__gp_flush_stale(gp_state *st);
/* gpumem_plan:on: used block b of arena a parked for plan position
 * slot - 1 (GP_PARKED, off the free ranges); back to used (release false)
 * or into the free ranges (true). */
void gm__gp_park(gp_state *st, gp_arena *a, gp_block *b, uint32_t slot);
void gm__gp_unpark(gp_state *st, gp_arena *a, gp_block *b, bool release);
/* Parked block b of arena a taken as the used block of `bytes` at its
 * address: cut down, or grown over the free range above it; false (b left
 * parked) when it cannot be. */
bool gm__gp_unpark_to(gp_state *st, gp_arena *a, gp_block *b, uint64_t bytes);
/* Every parked block into the free ranges (before memory is given back).
 * Returns how many. */
int gm__gp_unpark_all(gp_state *st);

/* A block no longer used or cached, back to where it was placed. */
static inline void gm__gp_block_release(gp_state *st, gp_arena *a, gp_block *b) {
    if (st->vmm) gm__gp_va_free(st, a, b);
    else gm__gp_plain_free(st, b);
}

/* arena.c */
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

#endif /* GPUMEM_POLICY_GPUMEM_PLACE_H */
