/* plan/plan.h — the interface of gpumem_plan (src/policy/gpumem/plan/), the
 * sub-module of the `gpumem` policy that learns a repeating step and serves
 * it at planned addresses (st->plan is NULL unless gpumem_plan:on). Above
 * the arenas (arena.h); the check and the ops call it. */
#ifndef GPUMEM_POLICY_GPUMEM_PLAN_H
#define GPUMEM_POLICY_GPUMEM_PLAN_H

#include "layout.h" /* the tests' knobs */

int gm__gp_plan_create(gp_state *st);
void gm__gp_plan_destroy(gp_state *st);
/* Before the usual placement: 1 and *out when the allocation was served
 * at its planned address, 0 when the caller places it, or an error. */
int gm__gp_plan_malloc(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out);
/* After the usual placement served it. */
void gm__gp_plan_placed(gp_state *st, gp_block *b);
/* Every free: true when the plan parked the block for its next planned
 * use (it stays out of the free ranges), else it goes back to its arena
 * as usual. */
bool gm__gp_plan_free(gp_state *st, gp_block *b);
/* A step boundary marked by the program (gm_step_mark). */
void gm__gp_plan_step(gp_state *st);
/* plan_check.c */
uint64_t gm__gp_plan_served(const gp_state *st); /* allocations served from a plan so far */
uint64_t gm__gp_plan_claimed(const gp_state *st); /* of those, served from a parked block (park.c) */
/* The planner's work budget (layout.h): steps its loops spent so far,
 * layouts it refused or cut short, and the operations (allocations +
 * frees) the plan has seen, which the budget grows with. */
uint64_t gm__gp_plan_work(const gp_state *st);
uint64_t gm__gp_plan_starved(const gp_state *st);
uint64_t gm__gp_plan_ops(const gp_state *st);
/* The active plan's layout: 'A' (around the live blocks), 'B' (own arena), 0 none. */
int gm__gp_plan_layout(const gp_state *st);
int gm__gp_plan_check(gp_state *st, char *err, size_t errlen);

#endif /* GPUMEM_POLICY_GPUMEM_PLAN_H */
