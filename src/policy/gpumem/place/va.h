/* va.h — where a block goes in an arena with VMM (va.c): the free-range
 * index of an arena, best-fit placement, returning cached small blocks to
 * it, parking (gpumem_plan:on). Above plain placement (plain.h); the arenas
 * (arena.h) build on it. */
#ifndef GPUMEM_POLICY_GPUMEM_VA_H
#define GPUMEM_POLICY_GPUMEM_VA_H

#include "plain.h"

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

#endif /* GPUMEM_POLICY_GPUMEM_VA_H */
