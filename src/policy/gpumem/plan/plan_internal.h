/* plan/plan_internal.h — what the two halves of gpumem_plan share (private
 * to src/policy/gpumem/plan/): the plan's state, its history of allocations
 * and the intervals the layout places. plan.c learns the step and serves it;
 * layout.c, below it, lays one step out. */
#ifndef GPUMEM_POLICY_GPUMEM_PLAN_INTERNAL_H
#define GPUMEM_POLICY_GPUMEM_PLAN_INTERNAL_H

#include "../place/arena.h"

#include <stdio.h>

/* -DGP_PLAN_DEBUG prints the plans and layouts made */
#ifdef GP_PLAN_DEBUG
#define PLOG(...) fprintf(stderr, "plan: " __VA_ARGS__)
#else
#define PLOG(...) ((void)0)
#endif

#define PL_HIST (1u << 15) /* allocations remembered */

enum { PL_NONE, PL_PENDING, PL_ACTIVE };

typedef struct pl_rec {
    uint64_t units;
    gm_stream stream;
    int64_t birth, death; /* operation numbers; death -1 while alive */
    uint64_t live;        /* units live just before this allocation */
} pl_rec;

typedef struct pl_item {
    uint64_t units, off; /* off: units from the arena's base */
    int64_t b, e;        /* operations since the step began; e may pass the step (circular) */
    uint32_t k;          /* position in the step; PL_OBST: an obstacle */
    uint32_t where;      /* layout B: 1 in a pinned chunk of the obstacles' arena */
    uint64_t tm;         /* the 64ths of the period it is alive in (intervals.h: time_mask) */
} pl_item;
#define PL_OBST UINT32_MAX

typedef struct gp_plan {
    pl_rec *hist;
    uint64_t n;   /* allocations so far */
    int64_t op;   /* operations (allocations + frees) so far */
    uint64_t live; /* units live */
    struct pl_slot { uint64_t key, pos; } *tab; /* window hash -> allocation number + 1 */
    uint64_t wh;  /* rolling hash of the last PL_W allocations */
    uint64_t cand, run;
    int state;
    uint64_t P, start; /* step length; allocation number where serving starts */
    uint64_t *tunits, *off;
    gm_stream *tstream;
    uint8_t *planned;
    uint8_t *inmain; /* layout B: served from the obstacles' arena (ma), not the plan's own */
    int64_t *pend; /* phase end per position (0: not an interval) */
    uint64_t cap;  /* of the per-position arrays */
    gm_stream pstream;
    gp_arena *ra; /* where planned blocks go: the stream's arena (A) or the plan's own (B) */
    gp_arena *ma; /* the stream's arena */
    uint64_t cur, dev_step;
    bool settled;
    bool rebase; /* layout B: in the plan's own arena (pa); idle memory given back at the start */
    uint64_t top_units; /* the layout's extent */
    uint64_t *fp, fp_words; /* layout A: granules of the stream's arena the plan uses */
    gp_arena *pa; /* the plan's own arena of pstream, once made (reused by later plans) */
    uint32_t tries;
    bool marked;       /* gm_step_mark was called: marks, not the detector, make plans */
    uint64_t mark[3];  /* allocation numbers at the last three marks */
    uint64_t nmarks;
    pl_item *items;
    uint64_t served, claimed; /* claimed: served from a parked block */
    /* parking (plan.c, park): per position, 1 + the position that takes
     * its very range next (0: none; layout.c, park_chains), the block
     * parked for it, and the position that parked it */
    uint32_t *park_to, *park_src;
    gp_block **parked;
    /* the work budget (layout.h): steps spent so far; after a layout cut
     * short, what the next must wait for (twice what that one spent);
     * layouts refused or cut short */
    uint64_t work, wait, starved;
} gp_plan;

static inline pl_rec *rec(const gp_plan *pl, uint64_t i) { return &pl->hist[i & (PL_HIST - 1)]; }

/* The arena position c is served from. */
static inline gp_arena *gm__gp_plan_arena(const gp_plan *pl, uint64_t c) {
    return pl->rebase && !pl->inmain[c] ? pl->ra : pl->ma;
}

/* park.c: each planned position's next user of its range when that one
 * starts there too (pl->park_to; the layout's m intervals over a period
 * of 2T operations); a freed planned block parked for it (true) or not;
 * the block parked for position c at `at`, taken at `units`, or NULL;
 * every parked block back into the free ranges (the plan drops). */
void gm__gp_plan_park_chains(gp_plan *pl, uint64_t m, int64_t T);
bool gm__gp_plan_park(gp_state *st, gp_plan *pl, gp_block *b);
gp_block *gm__gp_plan_claim(gp_state *st, gp_plan *pl, gp_arena *a, uint64_t c, gm_devptr at, uint64_t units);
void gm__gp_plan_unpark_all(gp_state *st, gp_plan *pl);

#endif
