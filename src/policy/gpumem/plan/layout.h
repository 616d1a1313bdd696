/* plan/layout.h — laying one step of gpumem_plan out (layout.c), below the
 * plan that serves it (plan.c). */
#ifndef GPUMEM_POLICY_GPUMEM_PLAN_LAYOUT_H
#define GPUMEM_POLICY_GPUMEM_PLAN_LAYOUT_H

#include "plan_internal.h"

/* Lay out the step [start - 2P, start - P) for the steps from pl->start on,
 * around the blocks live in arena a now (layout.c):
 * pl->off, planned, inmain, rebase, fp and top_units. GM_ENOMEM: no layout
 * holds less than the arena maps now. */
int gm__gp_plan_solve(gp_state *st, gp_plan *pl, gp_arena *a);

/* Tests (defined in layout.c): 0 the cheaper layout (default), 'A' or 'B'
 * that one whenever it fits. */
extern int gm__gp_plan_force;
/* Tests: when gm__gp_plan_verify is set, every layout the solver tries (each
 * order, fit and round) is checked: no two intervals that meet in time share
 * an address, none meets an obstacle it overlaps, none passes the arena's
 * end. Counts of layouts checked and found wrong. */
extern int gm__gp_plan_verify;
extern uint64_t gm__gp_plan_verified, gm__gp_plan_wrong;

/* The planner's work budget: its loops over intervals,
 * obstacles, granules and the history count their steps (pl->work); a
 * layout starts only while the run's count is under PL_WORK_PER_OP per
 * operation seen (allocations and frees) plus a base, and a layout that
 * would pass it stops there (its best variant complete stays, or there is
 * no plan). Past the budget the plan degrades: no layout, the usual
 * placement serves, until twice what the cut one spent is allowed (the
 * operations since pay for it); so a run that would lay out again and
 * again around many live blocks never stalls a step on it. The base is
 * four times the largest layout without obstacles (2 PL_MAXP intervals,
 * one order each for A and B: m^2 / 2 scan steps each, 2.7e8 in all);
 * the shipped traces need well under it (how much of it each needs:
 * bench/RESULTS.md, "planner work budget"). gm__gp_plan_work_base is the
 * base (PL_WORK_BASE; tests lower it, to reach the budget in a short run). */
#define PL_WORK_PER_OP 256u
#define PL_WORK_BASE ((uint64_t)1 << 30)
extern uint64_t gm__gp_plan_work_base;

/* The most work the run may have spent by now. */
static inline uint64_t pl_work_allowed(const gp_plan *pl) {
    return gm__gp_plan_work_base + PL_WORK_PER_OP * (uint64_t)pl->op;
}

#endif /* GPUMEM_POLICY_GPUMEM_PLAN_LAYOUT_H */
