/* gpumem.h — the `gpumem` policy's one interface (src/policy/gpumem/): its
 * ops table, which the policy table (src/policy/table.c) names and the
 * allocator calls through. Everything else in this folder is private to it;
 * base.h says how its files stack. */
#ifndef GPUMEM_POLICY_GPUMEM_H
#define GPUMEM_POLICY_GPUMEM_H

#include "internal.h"

extern const gm__policy_ops gm__policy_gpumem;

#endif /* GPUMEM_POLICY_GPUMEM_H */
