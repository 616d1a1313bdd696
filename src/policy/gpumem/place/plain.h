/* plain.h — placement without VMM in the `gpumem` policy (plain.c): one
 * device allocation per block. Above the chunks (chunks.h); va.h builds on
 * it. */
#ifndef GPUMEM_POLICY_GPUMEM_PLAIN_H
#define GPUMEM_POLICY_GPUMEM_PLAIN_H

#include "../mem/chunks.h"

int gm__gp_plain_malloc(gp_state *st, gp_arena *a, uint64_t units, gp_block **out);
void gm__gp_plain_free(gp_state *st, gp_block *b);

#endif /* GPUMEM_POLICY_GPUMEM_PLAIN_H */
