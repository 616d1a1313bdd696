/* check.h — the `torch` policy's self-check and segment walk (check.c):
 * the ops table's check and walk_segments. Above the expandable segments. */
#ifndef GPUMEM_POLICY_TORCH_CHECK_H
#define GPUMEM_POLICY_TORCH_CHECK_H

#include "expandable.h"

int tp_check(void *state, char *err, size_t errlen);
int tp_walk_segments(void *state, gm__segment_cb cb, void *arg);

#endif /* GPUMEM_POLICY_TORCH_CHECK_H */
