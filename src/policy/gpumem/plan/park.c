/* plan/park.c — parking, the plan's warm path: a planned block freed
 * where the next position to use its range starts too stays where it is,
 * a block parked for that position (GP_PARKED, off the free ranges: va.c,
 * gm__gp_park), and that position takes it, cut down or grown in place
 * (gm__gp_unpark_to). A step that follows its plan then costs two list
 * links and at most one move of a free range's end per planned block,
 * not a search of the address index, a cut and a merge
 * (bench/RESULTS.md, "parking"). plan.c parks and claims; layout.c makes
 * the chains when it adopts a layout. */
#include "plan_internal.h"

#include <stdlib.h>
#include <string.h>

#ifndef GP_PARK
#define GP_PARK 1 /* 0: no parking (the A/B of bench/RESULTS.md, "parking") */
#endif

/* The chains: each planned position's next user of its range, when that
 * one starts at the same address (the same arena): of the intervals laid
 * out starting in the range, the first born after this one dies
 * (circularly, over the two steps). The block freed there then waits for
 * it, parked, and is cut down or grown to its size when it comes
 * (gm__gp_unpark_to). Starting elsewhere in the range, it would have to
 * be cut at both ends, and that measured slower than placing it
 * (bench/RESULTS.md, "parking"). Only intervals starting inside the range
 * are looked at (at most PL_PARK_SCAN): one starting below it that comes
 * first is caught when it is placed (gm__gp_va_place_at puts the parked
 * block back) and the plan drops that link (claim). Without memory for
 * the sort, no chains: every block is freed as before. */
#define PL_PARK_SCAN 256
typedef struct pl_slotkey {
    uint64_t off, units;
    int64_t b, e;
    uint32_t k, where;
} pl_slotkey;

/* Operations from interval i's death to interval j's birth, circularly
 * over the period of 2T (j may be i itself, two steps on). */
static inline int64_t gap(const pl_slotkey *i, const pl_slotkey *j, int64_t T) {
    return ((j->b - i->e) % (2 * T) + 2 * T) % (2 * T);
}

static int cmp_slotkey(const void *x, const void *y) {
    const pl_slotkey *a = x, *b = y;
    if (a->where != b->where) return a->where < b->where ? -1 : 1;
    if (a->off != b->off) return a->off < b->off ? -1 : 1;
    return (a->k > b->k) - (a->k < b->k);
}

void gm__gp_plan_park_chains(gp_plan *pl, uint64_t m, int64_t T) {
    memset(pl->park_to, 0, 2 * pl->P * sizeof *pl->park_to);
    pl_slotkey *v = malloc((m ? m : 1) * sizeof *v);
    if (!v) return;
    uint64_t n = 0;
    for (uint64_t i = 0; i < m; i++) {
        const pl_item *it = &pl->items[i];
        if (pl->planned[it->k]) v[n++] = (pl_slotkey){pl->off[it->k], it->units, it->b, it->e, it->k, pl->inmain[it->k]};
    }
    qsort(v, n, sizeof *v, cmp_slotkey);
    for (uint64_t i = 0; i < n; i++) {
        int64_t best = INT64_MAX;
        uint64_t bj = i;
        for (uint64_t j = i, seen = 0; j < n && seen < PL_PARK_SCAN && v[j].where == v[i].where &&
                                       v[j].off < v[i].off + v[i].units; j++, seen++) {
            int64_t d = gap(&v[i], &v[j], T);
            if (d < best) best = d, bj = j;
        }
        /* the same start (a lower index of the same offset is a start too) */
        for (uint64_t j = i; j-- > 0 && v[j].where == v[i].where && v[j].off == v[i].off;) {
            int64_t d = gap(&v[i], &v[j], T);
            if (d < best) best = d, bj = j;
        }
        if (v[bj].off == v[i].off) pl->park_to[v[i].k] = v[bj].k + 1;
    }
    free(v);
}

/* Freed planned block b parked for the next position to use its range,
 * when that one starts there (park_to) and b is where this plan put it;
 * a block parked for that position before and never taken goes back. */
bool gm__gp_plan_park(gp_state *st, gp_plan *pl, gp_block *b) {
    uint64_t c = b->slot - 1u;
    if (!GP_PARK || c >= 2 * pl->P || !pl->park_to[c]) return false;
    gp_arena *a = gm__gp_plan_arena(pl, c);
    if (st->arenas[b->arena] != a || b->h.ptr != a->base + (pl->off[c] << GP_ALIGN_SHIFT)) return false; /* an earlier plan's */
    uint64_t d = pl->park_to[c] - 1u;
    gp_block *o = pl->parked[d];
    if (o && o->state == GP_PARKED && o->slot == d + 1) gm__gp_unpark(st, st->arenas[o->arena], o, true); /* never taken */
    gm__gp_park(st, a, b, (uint32_t)d + 1);
    pl->parked[d] = b;
    pl->park_src[d] = (uint32_t)c;
    return true;
}

/* The block parked for position c at `at`, taken at the units asked for
 * (cut down or grown in place: gm__gp_unpark_to); else put back into the
 * free ranges. A block no longer parked was put back before c came (a
 * placement found it in the way): the link that parked it is dropped. The
 * pointer may be stale; block structs live as long as the policy (base.c),
 * and a recycled one fails the checks. */
gp_block *gm__gp_plan_claim(gp_state *st, gp_plan *pl, gp_arena *a, uint64_t c, gm_devptr at, uint64_t units) {
    gp_block *b = pl->parked[c];
    pl->parked[c] = NULL;
    if (b->state != GP_PARKED || b->slot != c + 1 || b->h.ptr != at || st->arenas[b->arena] != a) {
        pl->park_to[pl->park_src[c]] = 0;
        return NULL;
    }
    if (gm__gp_unpark_to(st, a, b, units << GP_ALIGN_SHIFT)) return b;
    gm__gp_unpark(st, a, b, true);
    return NULL;
}

void gm__gp_plan_unpark_all(gp_state *st, gp_plan *pl) {
    gm__gp_unpark_all(st);
    if (pl->P) memset(pl->parked, 0, 2 * pl->P * sizeof *pl->parked);
}
