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

#endif /* GPUMEM_POLICY_GPUMEM_PLAN_LAYOUT_H */
