/* intervals.h — the geometry layout.c places with: a step's intervals in
 * time (a period of T operations, seen as a circle) and in address (units
 * from an arena's base), what is in the way of one of them, and the
 * address-ordered lists the layouts keep. Inline: the scan (cit_next) is
 * most of a layout's instructions. */
#ifndef GM_PLAN_INTERVALS_H
#define GM_PLAN_INTERVALS_H

#include "plan_internal.h"

#include <string.h>

static inline int cmp_off(const void *x, const void *y) {
    const pl_item *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off;
}

/* Do two intervals of a period of T operations overlap in time? Both
 * repeat every period, and each is shorter than a period. */
static inline bool overlap(const pl_item *x, const pl_item *y, int64_t T) {
    for (int64_t s = -T; s <= T; s += T)
        if (x->b < y->e + s && y->b + s < x->e) return true;
    return false;
}

/* The 64ths of a period of T operations that interval [b, e) touches, the
 * period seen as a circle: two intervals that overlap in time (overlap())
 * share a bit, so the layouts' scans (cit_next) skip most of what is not in
 * the way with one AND (the scans were most of a layout's instructions:
 * cit_next in bench/RESULTS.md, "warm allocator ops of the default"). */
static inline uint64_t time_mask(int64_t b, int64_t e, int64_t T) {
    if (T <= 0 || e - b >= T) return ~(uint64_t)0;
    if (e <= b) return 0;
    int64_t sb = ((b % T) + T) % T, se = (((e - 1) % T) + T) % T;
    unsigned i = (unsigned)((__int128)sb * 64 / T), j = (unsigned)((__int128)se * 64 / T);
    uint64_t upto_j = j == 63 ? ~(uint64_t)0 : ((uint64_t)1 << (j + 1)) - 1, from_i = ~(((uint64_t)1 << i) - 1);
    return i <= j ? upto_j & from_i : upto_j | from_i; /* wraps past the period's end */
}

/* Does an obstacle (there from the plan's start until o->e, not repeating)
 * overlap interval x of the first planned step? */
static inline bool blocks(const pl_item *o, const pl_item *x) { return x->b < o->e; }

/* What is in the way of interval `it`, in address order: the placed
 * intervals of one space (indices sorted by offset) that overlap it in time,
 * merged with the obstacles (sorted by offset) that do, if use_obs. */
typedef struct cit {
    const pl_item *items;
    const uint32_t *s;
    uint64_t ns, i;
    const pl_item *obs;
    uint64_t no, j;
    bool use_obs;
    const pl_item *it;
    int64_t period;
} cit;

static inline const pl_item *cit_next(cit *c) {
    for (;;) {
        const pl_item *a = c->i < c->ns ? &c->items[c->s[c->i]] : NULL;
        const pl_item *b = c->use_obs && c->j < c->no ? &c->obs[c->j] : NULL;
        if (!a && !b) return NULL;
        if (a && (!b || a->off <= b->off)) {
            c->i++;
            if ((a->tm & c->it->tm) && overlap(a, c->it, c->period)) return a;
        } else {
            c->j++;
            if (blocks(b, c->it)) return b;
        }
    }
}

/* Insert item index k into s (sorted by the items' offsets). */
static inline void sorted_insert(const pl_item *items, uint32_t *s, uint64_t *ns, uint32_t k) {
    uint64_t lo = 0, hi = *ns, off = items[k].off;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (items[s[mid]].off < off) lo = mid + 1;
        else hi = mid;
    }
    memmove(&s[lo + 1], &s[lo], (*ns - lo) * sizeof *s);
    s[lo] = k;
    (*ns)++;
}

/* Set the bit of every granule (gu units each, ng in all) that
 * [off, off + units) touches. */
static inline void mark_granules(uint64_t *bits, uint64_t off, uint64_t units, uint64_t gu, uint64_t ng) {
    for (uint64_t g = off / gu; g <= (off + units - 1) / gu && g < ng; g++) bits[g / 64] |= (uint64_t)1 << (g % 64);
}

#endif
