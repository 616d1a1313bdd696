/* chunks.h — the `gpumem` policy's physical chunks (chunks.c): which
 * chunks are mapped where, live counts, mapping what a placement needs,
 * releasing what no block uses. Above base.h; below placement (plain.h, va.h). */
#ifndef GPUMEM_POLICY_GPUMEM_CHUNKS_H
#define GPUMEM_POLICY_GPUMEM_CHUNKS_H

#include "base.h"

/* The wrappers below are inline because every large malloc or free calls
 * them and, at the default (slack inf, memory held under GP_AUTO_PERMILLE
 * of the device), they return at once: a call into another file for that
 * showed in a warm pass's instruction count (the warm path after this
 * change: bench/RESULTS.md, "the device lock", the run at 1ca0f25). */
void gm__gp_touch(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes, int dir);
int gm__gp_ensure_mapped(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes);
int gm__gp_release_unused(gp_state *st);
/* The same, keeping the idle chunks keep(arg, chunk) says to keep. */
int gm__gp_release_unused_but(gp_state *st, bool (*keep)(void *, const gp_chunk *), void *arg);
void gm__gp_release_all(gp_state *st);
/* The chunk and live-count modes that follow from st->slack (at creation). */
void gm__gp_slack_modes(gp_state *st);
/* gpumem_slack:auto: the warm-up is over (a plan served a step, or none
 * came): from now on idle chunks stay mapped, as at gpumem_slack:inf. */
void gm__gp_loosen(gp_state *st);
/* gpumem_slack:auto: the reserve budget in bytes now (0 under other settings) */
uint64_t gm__gp_budget_bytes(const gp_state *st);
void gm__gp_live_drop_now(gp_state *st);
int gm__gp_split_partial_at(gp_state *st, gp_arena *a, const gp_block *r, gm_devptr p, uint64_t bytes);

/* Live counts of the chunks under a block that starts or stops being used
 * (nothing while they are stale: st->lazy). */
static inline void gm__gp_touch_inc(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes) {
    if (!st->lazy) gm__gp_touch(st, a, p, bytes, 1);
}
static inline void gm__gp_touch_dec(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes) {
    if (!st->lazy) gm__gp_touch(st, a, p, bytes, -1);
}
/* Let the live counts go stale again where slack inf allows it. */
static inline void gm__gp_live_drop(gp_state *st) {
    if (st->lazy_ok && !st->lazy) gm__gp_live_drop_now(st);
}
/* Cut idle multi-granule chunks the placement [p, p+bytes) in free range r
 * would use in part (gpumem_chunks:auto, once tight): 1 if one was cut, 0,
 * or an error. */
static inline int gm__gp_split_partial(gp_state *st, gp_arena *a, const gp_block *r, gm_devptr p,
                                       uint64_t bytes) {
    if (!st->autoc || !st->nmulti || !gm__gp_tight(st)) return 0;
    return gm__gp_split_partial_at(st, a, r, p, bytes);
}

#endif /* GPUMEM_POLICY_GPUMEM_CHUNKS_H */
