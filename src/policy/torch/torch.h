/* torch.h — the `torch` policy's one interface (src/policy/torch/): its ops
 * table, which the policy table (src/policy/table.c) names and the allocator
 * calls through. Everything else in this folder is private to it; tree.h says
 * how its files stack. */
#ifndef GPUMEM_POLICY_TORCH_H
#define GPUMEM_POLICY_TORCH_H

#include "internal.h"

extern const gm__policy_ops gm__policy_torch;

#endif /* GPUMEM_POLICY_TORCH_H */
