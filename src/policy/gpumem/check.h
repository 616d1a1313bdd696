/* check.h — the `gpumem` policy's self-check, segment walk and pointer
 * ownership (check.c): the ops table's check, walk_segments and owns. Above
 * the plan (the check includes the plan's). */
#ifndef GPUMEM_POLICY_GPUMEM_CHECK_H
#define GPUMEM_POLICY_GPUMEM_CHECK_H

#include "plan/plan.h"

int gm__gp_check(void *state, char *err, size_t errlen);
int gm__gp_walk(void *state, gm__segment_cb cb, void *arg);
bool gm__gp_owns(void *state, gm_devptr p);

#endif /* GPUMEM_POLICY_GPUMEM_CHECK_H */
