/* plan/layout_check.h — a layout judged (layout_check.c), for layout.c:
 * sound or not, and its lower bounds in debug builds. */
#ifndef GPUMEM_POLICY_GPUMEM_PLAN_LAYOUT_CHECK_H
#define GPUMEM_POLICY_GPUMEM_PLAN_LAYOUT_CHECK_H

#include "plan_internal.h"

/* Intervals of one space (where: B's own arena 0, or the obstacles' arena:
 * A, or B's pinned chunks 1) that meet in time are apart in address; those
 * in the obstacles' arena are apart from each obstacle they meet; all below
 * limit (units). T2: two periods. O(m^2 + m no). */
bool gm__gp_layout_sound(const pl_item *it, uint64_t m, const pl_item *obs, uint64_t no, bool mode_b, uint64_t limit,
                         int64_t T2);

#ifdef GP_PLAN_DEBUG
/* Lower bounds on the granules (gu units each, ng in the arena) layout A
 * touches, printed (PLOG); T: the period. */
void gm__gp_layout_lower_bound(const pl_item *it, uint64_t m, const pl_item *obs, uint64_t no, uint64_t gu, uint64_t ng,
                               int64_t T);
#endif

#endif /* GPUMEM_POLICY_GPUMEM_PLAN_LAYOUT_CHECK_H */
