/* plan/foresee.c — elastic plans: a step that begins longer than any
 * before is laid out before it runs, each position at a size foreseen from
 * the sizes it had at other lengths.
 *
 * Why: a step that grows past its slots used to be placed best fit in the
 * plan's arena, tight, and laid out again at its end. Best fit over the
 * last layout's memory leaves the step's largest blocks (a language model's
 * logits, at the end of the forward pass) no mapped range that fits: each
 * lands on the arena's top and maps its whole size, by moving idle granules
 * (unmap + map each): two device calls per granule in each such step, and
 * on bert_varlen more over the run than expandable segments make
 * (bench/RESULTS.md, "growing steps laid out from a forecast", before and
 * after).
 *
 * How: the step's first allocation already tells that it is longer (its
 * input ids: a block whose size scales with the length). Its units against
 * the largest the position had (x over X) measure how much longer. Each
 * position k then grows by (x / X)^e_k, e_k the exponent its own sizes
 * followed between a shorter step of the history and the longest (0: a
 * weight's gradient, 1: an activation, 2: attention scores), so the layout
 * made now (plan.c, foresee()) hosts the step as the usual plan would. The
 * units are rounded up (512 bytes), so the ratio is taken at its upper
 * bound, x / (X - 1): the forecast errs large, by about 1 / X. A block
 * larger than its forecast grows the step as before, and the step is laid
 * out again at its end from the sizes it really had (pl->tmax keeps the
 * largest sizes seen before the forecast); else the forecast's sizes
 * stand (laid out again always, bert_varlen made more device calls for the
 * same peak: bench/RESULTS.md, "growing steps laid out from a forecast",
 * tried and not kept). A forecast counts as a step that grew:
 * after PL_GROW_RUN in a row, elastic plans are given up (plan.c). */
#include "plan_internal.h"

#include <math.h>

/* The step's length against the longest before, at its upper bound. */
static double length_ratio(const gp_plan *pl) {
    double X = (double)(pl->fX > 1 ? pl->fX - 1 : 1);
    return (double)pl->fx / X;
}

/* The reference's units in the shorter of the last two steps (from w0 and
 * w1), and which of the two it was (*older). */
static uint64_t shorter(const gp_plan *pl, uint64_t w0, uint64_t w1, bool *older) {
    uint64_t x0 = rec(pl, w0 + pl->fref)->units, x1 = rec(pl, w1 + pl->fref)->units;
    *older = x0 < x1;
    return *older ? x0 : x1;
}

bool gm__gp_plan_foresee_ok(const gp_plan *pl, uint64_t w0, uint64_t w1) {
    bool older;
    uint64_t x = shorter(pl, w0, w1, &older);
    /* the exponents need a step at least 2% shorter than the longest; a
     * step more than twice as long is no forecast's to guess */
    return (double)pl->fX >= (double)x * 1.02 && pl->fx <= 2 * pl->fX;
}

uint64_t gm__gp_plan_foresee_units(const gp_plan *pl, uint64_t u, const pl_rec *r0, const pl_rec *r1, uint64_t w0,
                                   uint64_t w1) {
    /* e = log(u / y) / log(X / x): the position's units y in the shorter
     * step, u and X (the reference's) at the longest */
    bool older;
    uint64_t x = shorter(pl, w0, w1, &older), y = older ? r0->units : r1->units;
    double e = 1.0; /* the shorter step allocated otherwise here: as an activation */
    if (y > 0 && x > 0 && (!older || r0->sig == r1->sig)) {
        e = log((double)u / (double)y) / log((double)pl->fX / (double)x);
        e = e < 0.0 ? 0.0 : e > 2.0 ? 2.0 : e;
    }
    double f = ceil((double)u * pow(length_ratio(pl), e));
    return f > (double)u && f < 1e18 ? (uint64_t)f : u;
}

/* Bounded by what everything would hold if every block grew as attention
 * scores do (the exponents are at most 2). */
uint64_t gm__gp_plan_foresee_bound(const gp_plan *pl, uint64_t most) {
    double r = length_ratio(pl), b = (double)most * r * r;
    return b < 1e18 ? (uint64_t)b : UINT64_MAX;
}
