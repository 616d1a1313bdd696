/* plan/layout_check.c — a layout judged (layout_check.h): is it sound (the
 * tests' check of every layout tried), and how far can it be from the best
 * (lower bounds, printed by GP_PLAN_DEBUG builds). Geometry only: the
 * intervals and obstacles as layout.c placed them. */
#include "layout_check.h"
#include "intervals.h"

#include <stdlib.h>

#ifdef GP_PLAN_DEBUG
/* How far can a layout be from the best? Lower bounds on the granules
 * layout A touches (each is counted): the obstacles' own granules; the most
 * units live at once in the first step (obstacles until they die, the
 * intervals without wrap: those wrapping in are the last steps' blocks,
 * obstacles already); the same once settled (permanent obstacles, the
 * intervals circular). Live memory only grows at a birth, so the births
 * are the moments to look at. O(m (m + no)). Not a bound: obstacles'
 * granules live plus the intervals (intervals may share those granules). */
void gm__gp_layout_lower_bound(const pl_item *it, uint64_t m, const pl_item *obs, uint64_t no, uint64_t gu, uint64_t ng, int64_t T) {
    uint64_t nw = (ng + 63) / 64, uo = 0, first = 0, steady = 0, pu = 0;
    uint64_t *bits = calloc(nw, sizeof *bits);
    if (!bits) return;
    for (uint64_t j = 0; j < no; j++) {
        mark_granules(bits, obs[j].off, obs[j].units, gu, ng);
        if (obs[j].e == INT64_MAX) pu += obs[j].units;
    }
    for (uint64_t w = 0; w < nw; w++) uo += (uint64_t)__builtin_popcountll(bits[w]);
    for (uint64_t x = 0; x < m; x++) {
        int64_t t = it[x].b;
        uint64_t ou = 0, iu = 0, iuc = 0;
        for (uint64_t j = 0; j < no; j++)
            if (t < obs[j].e) ou += obs[j].units;
        for (uint64_t i = 0; i < m; i++) {
            if (it[i].b <= t && t < it[i].e) iu += it[i].units;
            for (int64_t s = -2 * T; s <= 2 * T; s += 2 * T)
                if (it[i].b + s <= t && t < it[i].e + s) {
                    iuc += it[i].units;
                    break;
                }
        }
        if ((ou + iu + gu - 1) / gu > first) first = (ou + iu + gu - 1) / gu;
        if ((pu + iuc + gu - 1) / gu > steady) steady = (pu + iuc + gu - 1) / gu;
    }
    PLOG("lower bounds (granules): obstacles' own %llu; most live in the first step %llu; settled %llu (m %llu, obstacles %llu)\n",
         (unsigned long long)uo, (unsigned long long)first, (unsigned long long)steady, (unsigned long long)m, (unsigned long long)no);
    free(bits);
}
#endif

/* Tests (gm__gp_plan_verify): is one try's layout sound? Intervals of one
 * space (where: B's own arena 0, or the obstacles' arena: A, or B's pinned
 * chunks 1) that meet in time are apart in address; those in the
 * obstacles' arena are apart from each obstacle they meet; all below
 * limit. O(m^2 + m no). */
bool gm__gp_layout_sound(const pl_item *it, uint64_t m, const pl_item *obs, uint64_t no, bool mode_b, uint64_t limit, int64_t T2) {
    for (uint64_t i = 0; i < m; i++) {
        const pl_item *x = &it[i];
        if (x->off == UINT64_MAX) continue;
        if (x->off + x->units > limit) return false;
        for (uint64_t j = i + 1; j < m; j++) {
            const pl_item *y = &it[j];
            if (y->off == UINT64_MAX || x->where != y->where) continue;
            if (x->off < y->off + y->units && y->off < x->off + x->units && overlap(x, y, T2)) return false;
        }
        if (mode_b && !x->where) continue;
        for (uint64_t j = 0; j < no; j++)
            if (x->off < obs[j].off + obs[j].units && obs[j].off < x->off + x->units && blocks(&obs[j], x)) return false;
    }
    return true;
}
