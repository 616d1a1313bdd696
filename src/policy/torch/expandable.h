/* expandable.h — expandable segments of the `torch` policy
 * (expandable.c): reserved virtual ranges mapped page by page, as torch's
 * ExpandableSegment. Above tree.h; torch.c calls it. */
#ifndef GPUMEM_POLICY_TORCH_EXPANDABLE_H
#define GPUMEM_POLICY_TORCH_EXPANDABLE_H

#include "tree.h"

/* alloc_block's expandable branch: NULL with *err = GM_OK on OOM */
tp_block *tp_try_allocate_expandable_block(tp_state *st, gm_stream stream, tp_pool *p,
                                           uint64_t size, int *err);
int tp_unmap_block(tp_state *st, tp_block *b);
int tp_release_expandable_segment(tp_state *st, tp_block *b); /* GM_OK, or the backend error (segment kept) */
/* destroy: unmap everything and free the VA range */
void tp_expandable_destroy(tp_state *st, tp_seg *s);

#endif /* GPUMEM_POLICY_TORCH_EXPANDABLE_H */
