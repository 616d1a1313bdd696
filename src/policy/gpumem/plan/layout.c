/* layout.c — gpumem_plan's offline half: one step's
 * large blocks, as (size, lifetime) intervals over two steps, placed
 * greedily at addresses of an arena so that no two overlap in time; the
 * obstacles are the blocks live when the plan starts. Two layouts (around
 * the obstacles, or in an arena of the plan's own) in several orders (and,
 * around the obstacles, shakes: the big intervals at random places); the
 * one touching the fewest granules is kept. The two steps' copies of a
 * position are intervals of their own, so even and odd steps may place
 * a position apart. plan/plan.c says when
 * a layout is made and how it is served; intervals.h holds the geometry
 * (overlap in time, the scan of what is in the way). */
#include "layout.h"
#include "intervals.h"
#include "layout_check.h"

#include <stdlib.h>
#include <string.h>
#ifdef GP_PLAN_DEBUG
#include <time.h>
#endif

/* Tests (layout.h): force a layout, verify every layout tried, the work budget's base. */
int gm__gp_plan_force;
int gm__gp_plan_verify;
uint64_t gm__gp_plan_verified, gm__gp_plan_wrong;
uint64_t gm__gp_plan_work_base = PL_WORK_BASE;

/* ---- the plan: greedy placement of one step's intervals -------------------- */

/* The greedy's orders (gm__gp_plan_solve tries them, keeps the best): 0 largest
 * first, 1 longest-lived first, 2 largest size x lifetime first, 3 born
 * first, 4 most contended first (the most memory live, obstacles included,
 * at some moment of its life: those set the peak, so they go in first; the
 * "greedy by breadth" of static planners), 5 most contended, then born
 * first; ties: larger, longer, earlier, position. */
#define PL_ORDERS_MAXM 8192 /* intervals above which only the first order is tried */
static _Thread_local int pl_order; /* for cmp_item (qsort has no argument for it); per thread: devices lay out plans under their own locks */
static _Thread_local const uint64_t *pl_cont; /* orders 4, 5: contention per position */
static _Thread_local const uint32_t *pl_boost; /* improvement rounds: times a position set the top (more: earlier) */
/* Layout A's variants, (order, fit: 0 first, 1 best): every order first
 * fit, then best fit for the three that won on the traces measured (best
 * fit of orders 0-2 never did); then PL_ROUNDS improvement rounds. Each
 * run is O(m^2), and so is the contention orders 4 and 5 need: above
 * PL_ROUNDS_MAXM intervals, orders 0-3 first fit only (eight runs with
 * B's, as the first solver did), above PL_ORDERS_MAXM the first. The
 * layout's one-time cost: bench/gpumem_policy_tradeoff.md, "Planned steps". */
static const unsigned char pl_avar[][2] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0}, {3, 1}, {4, 1}, {5, 1}};
#define PL_AVARS (sizeof pl_avar / sizeof pl_avar[0])
#define PL_ROUNDS 7 /* improvement rounds of layout A: the best variant again, the intervals that set the last top first */
#define PL_ROUNDS_MAXM 2048
/* Shakes of layout A (after the rounds): the contention order again, its
 * big intervals (at least a quarter of the largest, at most PL_SHAKE_BIG)
 * placed first, each at a random place where it fits next to an interval
 * or obstacle placed already (one of its edges); only when a big interval
 * lives longer than a step. Why: the plan covers two
 * steps and the two copies of a position are placed apart, but a greedy
 * puts both copies of a big short block at the same address, so the slot
 * of a block living longer than a step (its two copies overlap) stands
 * empty at each step's peak; only an asymmetric layout of the few big
 * blocks fills it, and no order finds one (measured on gpt2_small_adamw's
 * layout problem, dumped with GP_PLAN_DUMP, and what the shakes cost:
 * bench/gpumem_policy_tradeoff.md, "Planned steps"). The generator is
 * seeded per plan: a layout is reproducible. */
#define PL_SHAKES 48
#define PL_SHAKE_V0 4 /* pl_avar's (4, 0): contention, first fit */
#define PL_SHAKE_V1 7 /* (4, 1): contention, best fit */
#define PL_SHAKE_BIG 16
#define PL_SHAKE_TRIES 50 /* random places tried before the variant's own fit */

static int cmp_item(const void *x, const void *y) {
    const pl_item *a = x, *b = y;
    int64_t la = a->e - a->b, lb = b->e - b->b;
    if (pl_boost && pl_boost[a->k] != pl_boost[b->k]) return pl_boost[a->k] > pl_boost[b->k] ? -1 : 1;
    if (pl_order >= 4 && pl_cont[a->k] != pl_cont[b->k]) return pl_cont[a->k] > pl_cont[b->k] ? -1 : 1;
    if (pl_order == 1 && la != lb) return la > lb ? -1 : 1;
    if (pl_order == 2) {
        double xa = (double)a->units * (double)la, xb = (double)b->units * (double)lb;
        if (xa != xb) return xa > xb ? -1 : 1;
    }
    if ((pl_order == 3 || pl_order == 5) && a->b != b->b) return a->b < b->b ? -1 : 1;
    if (a->units != b->units) return a->units > b->units ? -1 : 1;
    if (la != lb) return la > lb ? -1 : 1;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b;
}

/* Contention of each interval (cont[k], k its position): the most units
 * live at a birth within its life (live memory only grows at births), over
 * a period of 2T, the intervals repeating and the obstacles there from the
 * start until they die. O(m^2) at worst: only when m <= PL_ROUNDS_MAXM. */
static int contention(const pl_item *it, uint64_t m, const pl_item *obs, uint64_t no, int64_t T2, uint64_t *cont) {
    int64_t *tm = malloc((m + 1) * sizeof *tm);
    uint64_t *live = calloc(m + 1, sizeof *live);
    if (!tm || !live) {
        free(tm), free(live);
        return GM_ENOHOSTMEM;
    }
    for (uint64_t i = 0; i < m; i++) tm[i] = ((it[i].b % T2) + T2) % T2;
    qsort(tm, m, sizeof *tm, cmp_i64);
    uint64_t nt = 0;
    for (uint64_t i = 0; i < m; i++)
        if (!nt || tm[nt - 1] != tm[i]) tm[nt++] = tm[i];
    for (uint64_t x = 0; x < nt; x++) {
        uint64_t v = 0;
        for (uint64_t i = 0; i < m; i++)
            for (int64_t s = -T2; s <= T2; s += T2)
                if (it[i].b + s <= tm[x] && tm[x] < it[i].e + s) {
                    v += it[i].units;
                    break;
                }
        for (uint64_t j = 0; j < no; j++)
            if (tm[x] < obs[j].e) v += obs[j].units;
        live[x] = v;
    }
    for (uint64_t i = 0; i < m; i++) {
        uint64_t c = 0;
        for (uint64_t x = 0; x < nt; x++)
            for (int64_t s = -T2; s <= T2; s += T2)
                if (it[i].b + s <= tm[x] && tm[x] < it[i].e + s) {
                    if (live[x] > c) c = live[x];
                    break;
                }
        cont[it[i].k] = c;
    }
    free(tm), free(live);
    return GM_OK;
}

static int grow(gp_plan *pl, uint64_t P) {
    if (P <= pl->cap) return GM_OK;
    /* every array is tried; one that grew stays grown, and cap moves only
     * once all have */
    int failed = !gm__realloc_array(&pl->tunits, P, sizeof *pl->tunits);
    failed += !gm__realloc_array(&pl->off, P, sizeof *pl->off);
    failed += !gm__realloc_array(&pl->tstream, P, sizeof *pl->tstream);
    failed += !gm__realloc_array(&pl->planned, P, sizeof *pl->planned);
    failed += !gm__realloc_array(&pl->inmain, P, sizeof *pl->inmain);
    failed += !gm__realloc_array(&pl->pend, P, sizeof *pl->pend);
    failed += !gm__realloc_array(&pl->items, P, sizeof *pl->items);
    failed += !gm__realloc_array(&pl->park_to, P, sizeof *pl->park_to);
    failed += !gm__realloc_array(&pl->park_src, P, sizeof *pl->park_src);
    failed += !gm__realloc_array(&pl->parked, P, sizeof *pl->parked);
    if (failed) return GM_ENOHOSTMEM;
    pl->cap = P;
    return GM_OK;
}

static uint64_t xorshift(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A shake's place for interval `it`: a random one where it touches an edge
 * of an interval placed already (any, in time or not) or of an obstacle,
 * and overlaps nothing in its way; UINT64_MAX if PL_SHAKE_TRIES tries found
 * none (the variant's fit places it then). */
static uint64_t shake_place(const pl_item *items, const uint32_t *s, uint64_t ns, const pl_item *obs, uint64_t no,
                            const pl_item *it, int64_t period, uint64_t limit, uint64_t *rng, uint64_t *work) {
    uint64_t nc = 4 * (ns + no) + 1;
    for (int t = 0; t < PL_SHAKE_TRIES; t++) {
        uint64_t r = xorshift(rng) % nc, pos;
        if (r == 4 * (ns + no)) {
            pos = 0;
        } else {
            const pl_item *x = r / 4 < ns ? &items[s[r / 4]] : &obs[r / 4 - ns];
            switch (r % 4) { /* after it, before it, aligned at its start, at its end */
            case 0: pos = x->off + x->units; break;
            case 1: pos = x->off >= it->units ? x->off - it->units : UINT64_MAX; break;
            case 2: pos = x->off; break;
            default: pos = x->off + x->units >= it->units ? x->off + x->units - it->units : UINT64_MAX; break;
            }
        }
        if (pos == UINT64_MAX || pos + it->units > limit) continue;
        cit ci = {items, s, ns, 0, obs, no, 0, true, it, period};
        bool ok = true;
        for (const pl_item *cf = cit_next(&ci); cf && cf->off < pos + it->units; cf = cit_next(&ci))
            if (pos < cf->off + cf->units) {
                ok = false;
                break;
            }
        *work += ci.i + ci.j + 1;
        if (ok) return pos;
    }
    return UINT64_MAX;
}

/* One solve: the problem (intervals of the step, obstacles) and the working
 * arrays, all freed by gm__gp_plan_solve (NULL until made). */
typedef struct pl_solve {
    gp_state *st;
    gp_plan *pl;
    gp_arena *a;
    uint64_t P;
    int64_t T;                /* operations in the last step */
    uint64_t m, unplanned;    /* intervals; large blocks of the stream left to the usual placement */
    pl_item *all, *obs;       /* obs: the blocks live now (obstacles), after the intervals' room */
    uint64_t no;
    uint64_t limit, gu, ng, nw; /* arena end, granule, granules and their bitmap words (units) */
    uint64_t *pin, *bits;     /* granules the permanent obstacles pin; scratch */
    pl_item *pe;              /* runs of pinned granules (B places there first) */
    uint64_t npe, pin_all;    /* runs; granules of every obstacle's chunks */
    uint64_t *offa, *cont;    /* A's best offsets by position; contention by position */
    uint32_t *sorted[2], *boost, *big;
    uint64_t cost[2], top[2]; /* best layout of A (0) and B (1): granules, top */
    uint64_t rng;
    uint64_t work, allow;     /* steps spent, and the most this solve may spend (layout.h) */
    bool over;                /* it passed that: no more variants; the best one complete stays */
} pl_solve;

/* w more steps, if the allowance has room for them (else the solve is
 * over it: false, and they are not taken). */
static bool spend(pl_solve *s, uint64_t w) {
    if (s->work > s->allow || w > s->allow - s->work) { /* work passes allow by one placement's scan at most (place_all) */
        s->over = true;
        return false;
    }
    s->work += w;
    return true;
}

/* The step's intervals from both recorded steps: an interval spans the
 * block's lifetimes in either (so the plan holds if later steps behave like
 * one of them), and a position whose lifetimes disagree on crossing the
 * boundary is left to the usual placement. A block may live up to two
 * steps, so the plan covers two steps (2P positions, period 2T): each
 * position twice. */
static int solve_intervals(pl_solve *s) {
    gp_plan *pl = s->pl;
    uint64_t P = s->P, w0 = pl->start - 2 * P, w1 = pl->start - P;
    int rc = grow(pl, 2 * P);
    if (rc) return rc;
    int64_t t0 = rec(pl, w0)->birth, t1 = rec(pl, w1)->birth, T0 = t1 - t0, T = pl->op - t1;
    uint64_t m = 0, unplanned = 0;
    for (uint64_t k = 0; k < P; k++) {
        const pl_rec *r0 = rec(pl, w0 + k), *r1 = rec(pl, w1 + k);
        uint64_t u = r1->units;
        pl->tunits[k] = pl->tunits[k + P] = u;
        pl->tstream[k] = pl->tstream[k + P] = r1->stream;
        pl->planned[k] = pl->planned[k + P] = 0;
        pl->inmain[k] = pl->inmain[k + P] = 0;
        pl->off[k] = pl->off[k + P] = UINT64_MAX;
        pl->pend[k] = 0;
        if (u <= GP_SMALL_UNITS || r1->stream != pl->pstream) continue;
        unplanned++; /* until it is an interval */
        if (r0->units != r1->units || r0->stream != r1->stream || r0->death < 0)
            continue;
        int64_t b0 = r0->birth - t0, b1 = r1->birth - t1, e0 = r0->death - t0, e;
        if (e0 >= T0) e0 += (e0 / T0) * (T - T0); /* on the last step's scale */
        if (r1->death < 0) { /* alive now: it crosses the boundary, as it must have before */
            if (e0 < T) continue;
            e = e0;
        } else {
            e = r1->death - t1;
            if ((e0 >= T) != (e >= T)) continue;
            if (e0 > e) e = e0;
        }
        int64_t b = b0 < b1 ? b0 : b1;
        if (e - b >= 2 * T) continue; /* alive for two steps: the usual placement */
        pl->pend[k] = e;
        unplanned--;
        pl->items[m++] = (pl_item){u, 0, b, e, (uint32_t)k, 0, time_mask(b, e, 2 * T)};
        pl->items[m++] = (pl_item){u, 0, b + T, e + T, (uint32_t)(k + P), 0, time_mask(b + T, e + T, 2 * T)};
    }
    s->T = T;
    s->m = m;
    s->unplanned = unplanned;
    return GM_OK;
}

/* The obstacles: the blocks used in arena a now; blocks of the last two
 * steps are gone at their expected death. */
static int solve_obstacles(pl_solve *s) {
    gp_plan *pl = s->pl;
    uint64_t P = s->P, w0 = pl->start - 2 * P, nobs = 0, nb = 0;
    for (const gp_block *b = s->a->head; b; b = b->next, nb++) {
        if (!spend(s, 1)) return GM_ENOMEM;
        nobs += b->state == GP_USED;
    }
    if (!spend(s, nb + 16 * nobs)) return GM_ENOMEM; /* the other walk, and the obstacles' sort */
    s->all = malloc((s->m + nobs + 1) * sizeof *s->all);
    if (!s->all) return GM_ENOHOSTMEM;
    s->obs = s->all + s->m;
    for (const gp_block *b = s->a->head; b; b = b->next) {
        if (b->state != GP_USED) continue;
        pl_item o = {b->h.size >> GP_ALIGN_SHIFT, (b->h.ptr - s->a->base) >> GP_ALIGN_SHIFT, 0, INT64_MAX, PL_OBST, 0, ~(uint64_t)0};
        if (b->serial >= w0 && b->serial < pl->start) {
            uint64_t k = (b->serial - w0) % P, back = 2 - (b->serial - w0) / P; /* steps ago */
            int64_t e = pl->pend[k] - (int64_t)back * s->T;
            if (pl->pend[k] && e > 0 && pl->tunits[k] == o.units) o.e = e;
        }
        s->obs[s->no++] = o;
    }
    return GM_OK;
}

#ifdef GP_PLAN_DEBUG
static void solve_debug_problem(const pl_solve *s) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gm__gp_layout_lower_bound(s->pl->items, s->m, s->obs, s->no, s->gu, s->a->ngran, s->T);
    const char *dump = getenv("GP_PLAN_DUMP"); /* the problem, for experiments offline */
    FILE *f = dump ? fopen(dump, "w") : NULL;
    if (f) {
        fprintf(f, "T2 %lld gu %llu limit %llu\n", (long long)(2 * s->T), (unsigned long long)s->gu, (unsigned long long)s->limit);
        for (uint64_t i = 0; i < s->m; i++) fprintf(f, "I %llu %lld %lld %u\n", (unsigned long long)s->pl->items[i].units, (long long)s->pl->items[i].b, (long long)s->pl->items[i].e, s->pl->items[i].k);
        for (uint64_t j = 0; j < s->no; j++) fprintf(f, "O %llu %llu %lld\n", (unsigned long long)s->obs[j].units, (unsigned long long)s->obs[j].off, (long long)s->obs[j].e);
        fclose(f);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    PLOG("lower bound took %.1f ms (debug only, inside the layout's time)\n", (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}

static void solve_debug_result(const pl_solve *s) {
    uint64_t osum = 0, otop = 0, mx = 0;
    const pl_item *items = s->pl->items;
    for (uint64_t j = 0; j < s->no; j++) {
        if (s->obs[j].e == INT64_MAX) osum += s->obs[j].units;
        if (s->obs[j].off + s->obs[j].units > otop) otop = s->obs[j].off + s->obs[j].units;
    }
    for (uint64_t i = 0; i < s->m; i++) {
        uint64_t l = 0;
        for (uint64_t j = 0; j < s->m; j++)
            if (overlap(&(pl_item){0, 0, items[i].b, items[i].b + 1, 0, 0, 0}, &items[j], 2 * s->T)) l += items[j].units;
        if (l > mx) mx = l;
    }
    PLOG("obstacles: permanent %.1f MiB, top %.1f MiB; intervals max live %.1f MiB\n", osum / 2048.0, otop / 2048.0, mx / 2048.0);
}
#endif

/* B also uses the memory the permanent obstacles pin: the free parts of
 * their chunks (whole chunks stay mapped while a block lives in them), for
 * blocks that fit there, in the obstacles' arena. pass 0: chunks of every
 * obstacle (held until the last steps' blocks die: B's first step needs
 * them and its own arena at once; counted in pin_all); pass 1: of the
 * permanent ones (held for good: pin). Then pin's runs, in units (pe). */
static int solve_pins(pl_solve *s) {
    uint64_t nw = s->nw, ng = s->ng, gu = s->gu;
    s->pin = calloc(nw, sizeof *s->pin);
    s->bits = calloc(nw, sizeof *s->bits);
    s->pe = malloc((s->no + 1) * sizeof *s->pe);
    if (!s->pin || !s->bits || !s->pe) return GM_ENOHOSTMEM;
    uint64_t *pin = s->pin;
    for (int pass = 0; pass < 2; pass++) {
        memset(pin, 0, nw * sizeof *pin);
        for (uint64_t j = 0; j < s->no; j++) {
            const pl_item *o = &s->obs[j];
            if (pass && o->e != INT64_MAX) continue;
            uint64_t w = 1;
            for (uint64_t g = o->off / gu; g <= (o->off + o->units - 1) / gu && g < ng; g++, w++) {
                if (s->a->gran[g] < 0) continue;
                const gp_chunk *ch = &s->st->chunks[s->a->gran[g]];
                for (uint64_t h = (uint64_t)ch->g0; h < (uint64_t)ch->g0 + ch->n && h < ng; h++, w++)
                    pin[h / 64] |= (uint64_t)1 << (h % 64);
            }
            if (!spend(s, w)) return GM_ENOMEM;
        }
        for (uint64_t w = 0; !pass && w < nw; w++) s->pin_all += (uint64_t)__builtin_popcountll(pin[w]);
    }
    if (!spend(s, 2 * nw + (s->unplanned ? 0 : ng))) return GM_ENOMEM;
    /* the usual placement prefers mapped free ranges, so blocks left to it
     * would take those parts first: only when every large block of the
     * step is planned */
    for (uint64_t g = 0; !s->unplanned && g < ng && s->npe < s->no + 1; g++) {
        if (!(pin[g / 64] >> (g % 64) & 1)) {
            if (!pin[g / 64]) g |= 63;
            continue;
        }
        pl_item *last = s->npe ? &s->pe[s->npe - 1] : NULL;
        if (last && last->off + last->units == g * gu) last->units += gu;
        else s->pe[s->npe++] = (pl_item){gu, g * gu, 0, 0, 0, 0, 0};
    }
    return GM_OK;
}

/* The shakes' big intervals (boost-like: placed first): the largest, few
 * sizes; none unless a big block lives longer than a step (its two copies
 * overlap): elsewhere the shakes found nothing better on the traces
 * measured and only cost time (bench/gpumem_policy_tradeoff.md, "The layout
 * solver, third pass"). */
static void solve_pick_big(pl_solve *s) {
    const pl_item *items = s->pl->items;
    uint64_t m = s->m, umax = 0, nb = 0, nlong = 0;
    uint32_t *big = s->big;
    for (uint64_t i = 0; i < m; i++)
        if (items[i].units > umax) umax = items[i].units;
    for (uint64_t u = umax; u >= umax / 4 && u && nb < PL_SHAKE_BIG; u--) { /* largest first, few sizes: cheap */
        uint64_t nxt = 0;
        for (uint64_t i = 0; i < m && nb < PL_SHAKE_BIG; i++) {
            if (items[i].units == u) big[items[i].k] = 1, nb++, nlong += items[i].e - items[i].b > s->T;
            else if (items[i].units < u && items[i].units > nxt) nxt = items[i].units;
        }
        u = nxt + 1;
    }
    if (nb < 2 || !nlong) free(s->big), s->big = NULL;
}

/* The working arrays of the layouts: A's best offsets, the placed
 * intervals by address (per space), the contention order and the rounds'
 * boosts (short steps only), the shakes' big intervals. */
static int solve_arrays(pl_solve *s) {
    uint64_t P = s->P, m = s->m;
    s->offa = malloc(2 * P * sizeof *s->offa);
    s->sorted[0] = malloc((m + 1) * sizeof(uint32_t));
    s->sorted[1] = malloc((m + 1) * sizeof(uint32_t));
    if (!s->offa || !s->sorted[0] || !s->sorted[1]) return GM_ENOHOSTMEM;
    /* contention's loops: at most m times (6m + no); the big ones: 16m */
    if (!spend(s, m <= PL_ROUNDS_MAXM ? m * (6 * m + s->no) + 16 * m : 0)) return GM_ENOMEM;
    if (m <= PL_ROUNDS_MAXM) {
        s->cont = malloc(2 * P * sizeof *s->cont);
        s->boost = calloc(2 * P, sizeof *s->boost);
        if (!s->cont || !s->boost || contention(s->pl->items, m, s->obs, s->no, 2 * s->T, s->cont))
            return GM_ENOHOSTMEM;
    }
    s->big = m <= PL_ROUNDS_MAXM ? calloc(2 * P, sizeof *s->big) : NULL;
    if (s->big) solve_pick_big(s);
    return GM_OK;
}

/* Layout B: item i in a pinned chunk's free part, the gaps between what is
 * in the way there; UINT64_MAX if none fits. */
static uint64_t place_pinned(pl_solve *s, const pl_item *it, uint64_t ns1) {
    cit ci = {s->pl->items, s->sorted[1], ns1, 0, s->obs, s->no, 0, true, it, 2 * s->T};
    uint64_t cov = 0, x = 0, pos = UINT64_MAX, ny = 0;
    for (const pl_item *cf = cit_next(&ci);; cf = cit_next(&ci)) {
        uint64_t gs = cov, ge = cf ? cf->off : UINT64_MAX;
        if (cf && cf->off + cf->units > cov) cov = cf->off + cf->units;
        if (ge > gs) {
            while (x < s->npe && s->pe[x].off + s->pe[x].units <= gs) x++;
            for (uint64_t y = x; y < s->npe && s->pe[y].off < ge; y++, ny++) {
                uint64_t s0 = gs > s->pe[y].off ? gs : s->pe[y].off, e0 = s->pe[y].off + s->pe[y].units;
                if (e0 > ge) e0 = ge;
                if (e0 - s0 >= it->units) {
                    pos = s0;
                    break;
                }
            }
        }
        if (pos != UINT64_MAX || !cf || x >= s->npe) break;
    }
    s->work += ci.i + ci.j + x + ny + 1;
    return pos;
}

/* Where item it goes in the layout's own space: a shake's random place,
 * first fit or best fit; UINT64_MAX if nowhere. */
static uint64_t place_fit(pl_solve *s, const pl_item *it, uint64_t ns0, int mode, int fit, bool shake) {
    cit ci = {s->pl->items, s->sorted[0], ns0, 0, s->obs, s->no, 0, !mode, it, 2 * s->T}; /* B: its own arena, no obstacles */
    uint64_t pos;
    if (shake && s->big[it->k] &&
        (pos = shake_place(s->pl->items, s->sorted[0], ns0, s->obs, s->no, it, 2 * s->T, s->limit, &s->rng, &s->work)) != UINT64_MAX)
        return pos; /* placed at random, next to something */
    if (!fit) { /* first fit */
        pos = 0;
        for (const pl_item *cf = cit_next(&ci); cf; cf = cit_next(&ci)) {
            if (cf->off >= pos + it->units) break;
            if (cf->off + cf->units > pos) pos = cf->off + cf->units;
        }
        s->work += ci.i + ci.j + 1;
        return pos;
    }
    /* best fit: the smallest gap it fits in, the lowest of those */
    uint64_t cov = 0, best = UINT64_MAX;
    pos = UINT64_MAX;
    for (const pl_item *cf = cit_next(&ci);; cf = cit_next(&ci)) {
        uint64_t ge = cf ? cf->off : s->limit;
        if (ge > cov && ge - cov >= it->units && ge - cov < best) best = ge - cov, pos = cov;
        if (!cf) break;
        if (cf->off + cf->units > cov) cov = cf->off + cf->units;
    }
    s->work += ci.i + ci.j + 1;
    return pos;
}

/* Place every interval in the current order; returns the layout's top
 * (s->over: it stopped at the budget, and is not a layout). */
static uint64_t place_all(pl_solve *s, int mode, int fit, bool shake) {
    pl_item *items = s->pl->items;
    uint64_t tp = 0, ns[2] = {0, 0};
    for (uint64_t i = 0; i < s->m; i++) {
        items[i].where = 0;
        items[i].off = UINT64_MAX;
    }
    for (uint64_t i = 0; i < s->m; i++) {
        pl_item *it = &items[i];
        uint64_t pos;
        if (!spend(s, 0)) return 0;
        if (mode && s->npe && (pos = place_pinned(s, it, ns[1])) != UINT64_MAX) {
            it->off = pos;
            it->where = 1;
            sorted_insert(items, s->sorted[1], &ns[1], (uint32_t)i);
            continue;
        }
        pos = place_fit(s, it, ns[0], mode, fit, shake);
        if (pos == UINT64_MAX || pos + it->units > s->limit) continue;
        it->off = pos;
        sorted_insert(items, s->sorted[0], &ns[0], (uint32_t)i);
        if (pos + it->units > tp) tp = pos + it->units;
    }
    return tp;
}

/* The granules a layout touches (*c): the obstacles' chunks (whole) and
 * the layout's (B: in its own arena, apart; its blocks in pinned chunks
 * are free). false when the layout cannot be used (see below). */
static bool layout_cost(pl_solve *s, int mode, int ord, int fit, uint64_t *c) {
    const gp_state *st = s->st;
    uint64_t nw = s->nw, m = s->m, *bits = s->bits;
    *c = 0;
    memcpy(bits, s->pin, nw * sizeof *bits);
    if (mode) {
        for (uint64_t w = 0; w < nw; w++) *c += (uint64_t)__builtin_popcountll(bits[w]);
        memset(bits, 0, nw * sizeof *bits);
    }
    for (uint64_t j = 0; j < m + s->no; j++) {
        const pl_item *x = j < m ? &s->pl->items[j] : &s->obs[j - m];
        if (x->off == UINT64_MAX || (j < m && x->where)) continue;
        if (mode && j >= m) continue; /* counted in pin */
        mark_granules(bits, x->off, x->units, s->gu, s->ng);
    }
    for (uint64_t w = 0; w < nw; w++) *c += (uint64_t)__builtin_popcountll(bits[w]);
    if (mode == 0) {
        /* A maps nothing before it settled: a slot in a granule not
         * mapped now goes to the usual placement in the first step,
         * which lands on later slots if it cannot map more (measured:
         * gpt2_small_train_bf16 at 1.01x capacity, a tighter A than
         * before fell apart every step: bench/gpumem_policy_tradeoff.md,
         * "Planned steps"). So A's new granules must fit under the
         * device's limit. */
        uint64_t newg = 0;
        for (uint64_t g = 0; g < s->ng; g++)
            if ((bits[g / 64] >> (g % 64) & 1) && s->a->gran[g] < 0) newg++;
        if (st->held_bytes + newg * st->gran > gm__gp_device_limit(st)) {
            PLOG("layout A (order %d fit %d): %llu granules not mapped, more than the device has left\n", ord, fit, (unsigned long long)newg);
            return false;
        }
        return true;
    }
    /* B's first step holds every obstacle's chunks and its own arena
     * (mapped at once): that must stay within the peak held so far, so
     * the plan never raises the whole run's peak */
    uint64_t pinned = 0;
    for (uint64_t w = 0; w < nw; w++) pinned += (uint64_t)__builtin_popcountll(s->pin[w]);
    uint64_t first = st->held_bytes - s->a->mapped_bytes + (s->pin_all + *c - pinned) * st->gran;
    if (first > (uint64_t)st->d->stats.reserved_bytes[GM_POOL_ALL].peak) {
        PLOG("layout B (order %d fit %d): first step would hold %.1f MiB, the peak so far %.1f MiB\n", ord, fit, first / 1048576.0,
             st->d->stats.reserved_bytes[GM_POOL_ALL].peak / 1048576.0);
        return false;
    }
    return true;
}

/* Two layouts: A, around the obstacles in their arena (fills the holes
 * between them, over memory mapped already); B, the step alone, in an
 * arena of its own (so blocks left to the usual placement never land in
 * the plan's slots; measured: in one arena they did, on gpt2_small_adamw,
 * and the plan fell apart: bench/gpumem_policy_tradeoff.md, "Planned
 * steps"), the holes' memory given back. The one touching fewer granules
 * wins: that is the memory it holds (a tie goes to A, which gives nothing
 * back). Each in several orders, the best kept (one when the step is
 * long: each is O(m^2)). A: each order first fit, then best fit; B (rarely
 * within the peak: its first step holds two arenas) the first four, first
 * fit; then (A) a few rounds of improvement: the best variant again, the
 * intervals that set the last round's top moved to the front (they go
 * where the earlier ones left room; those find room elsewhere); then the
 * shakes. */
static void solve_layouts(pl_solve *s) {
    gp_plan *pl = s->pl;
    uint64_t m = s->m, P = s->P;
    for (uint64_t k = 0; k < 2 * P; k++) s->offa[k] = UINT64_MAX;
    for (int mode = 1; mode >= 0; mode--) {
        int bestv = 0, nav = m > PL_ORDERS_MAXM ? 1 : m > PL_ROUNDS_MAXM ? 4 : (int)PL_AVARS;
        int nround = nav + (m > PL_ROUNDS_MAXM ? 0 : PL_ROUNDS);
        int nrun = mode ? (m > PL_ORDERS_MAXM ? 1 : 4) : nround + (m > PL_ROUNDS_MAXM || !s->big ? 0 : PL_SHAKES);
        for (int v = 0; v < nrun; v++) {
            bool round = !mode && v >= nav, shake = !mode && v >= nround;
            /* shakes: the contention order, first and best fit in turn
             * (both reached the best layout measured; the best variant's
             * own order did not: bench/gpumem_policy_tradeoff.md, "The
             * layout solver, third pass") */
            int av = shake ? (v % 2 ? PL_SHAKE_V1 : PL_SHAKE_V0) : round ? bestv : v;
            int ord = mode ? v : pl_avar[av][0], fit = mode ? 0 : pl_avar[av][1];
            if (round && v == nav) {
                if (s->cost[0] == UINT64_MAX) break;
                for (uint64_t k = 0; k < 2 * P; k++)
                    if (s->offa[k] != UINT64_MAX && s->offa[k] + pl->tunits[k] >= s->top[0]) s->boost[k]++;
            }
            /* the sort, the boosts and layout_cost's loops */
            if (!spend(s, 32 * m + s->no + 2 * s->nw + (mode ? 0 : s->ng))) return;
            pl_order = ord;
            pl_boost = shake ? s->big : round ? s->boost : NULL;
            qsort(pl->items, m, sizeof *pl->items, cmp_item);
            uint64_t tp = place_all(s, mode, fit, shake), c;
            if (s->over) return; /* the budget: the best variant complete is the layout */
            if (gm__gp_plan_verify) {
                gm__gp_plan_verified++;
                if (!gm__gp_layout_sound(pl->items, m, s->obs, s->no, mode, s->limit, 2 * s->T)) gm__gp_plan_wrong++;
            }
            for (uint64_t i = 0; round && i < m; i++)
                if (pl->items[i].off != UINT64_MAX && pl->items[i].off + pl->items[i].units >= tp) s->boost[pl->items[i].k]++;
            if (!layout_cost(s, mode, ord, fit, &c)) continue;
            PLOG("layout %c order %d fit %d%s: %llu granules, top %llu granules\n", mode ? 'B' : 'A', ord, fit, shake ? " (shake)" : round ? " (round)" : "", (unsigned long long)c, (unsigned long long)((tp + s->gu - 1) / s->gu));
            if (c >= s->cost[mode]) continue;
            if (!round) bestv = v;
            s->cost[mode] = c;
            s->top[mode] = tp;
            for (uint64_t i = 0; i < m; i++) {
                const pl_item *it = &pl->items[i];
                if (mode) {
                    pl->off[it->k] = it->off;
                    pl->inmain[it->k] = (uint8_t)it->where;
                } else {
                    s->offa[it->k] = it->off;
                }
            }
        }
    }
}

/* The cheaper layout (or the forced one) becomes the plan, if it holds
 * less than the arena maps now: pl->rebase, off, inmain, planned, fp and
 * top_units. GM_ENOMEM: no layout does. */
static int solve_adopt(pl_solve *s) {
    gp_plan *pl = s->pl;
    const uint64_t *cost = s->cost;
    if (cost[0] == UINT64_MAX && cost[1] == UINT64_MAX) return GM_ENOMEM;
    pl->rebase = cost[1] < cost[0];
    if (gm__gp_plan_force == 'A' && cost[0] != UINT64_MAX) pl->rebase = false;
    if (gm__gp_plan_force == 'B' && cost[1] != UINT64_MAX) pl->rebase = true;
    /* the plan must hold less than the arena holds now, else it is not made */
    uint64_t most = s->a->mapped_bytes;
    /* gpumem_slack:auto: the reserve budget is what memory may hold anyway; a
     * plan a little over it (1/64) still pays, since it makes later steps
     * map nothing where best fit under the budget moves granules every step */
    uint64_t bud = gm__gp_budget_bytes(s->st);
    bud += bud / 64;
    if (bud > most) most = bud;
    if (cost[pl->rebase] * s->st->gran >= most && !gm__gp_plan_force) {
        PLOG("layout at %llu: %llu granules, not less than the %.1f MiB mapped: no plan\n", (unsigned long long)pl->start, (unsigned long long)cost[pl->rebase], s->a->mapped_bytes / 1048576.0);
        return GM_ENOMEM;
    }
    if (pl->fp_words < s->nw) {
        if (!gm__realloc_array(&pl->fp, s->nw, sizeof *pl->fp)) return GM_ENOHOSTMEM;
        pl->fp_words = s->nw;
    }
    memset(pl->fp, 0, pl->fp_words * sizeof *pl->fp);
    for (uint64_t i = 0; i < s->m; i++) {
        pl_item *it = &pl->items[i];
        if (!pl->rebase) pl->off[it->k] = s->offa[it->k], pl->inmain[it->k] = 0;
        pl->planned[it->k] = pl->off[it->k] != UINT64_MAX;
        if (!pl->rebase && pl->planned[it->k]) /* A's footprint, kept when idle memory is given back */
            mark_granules(pl->fp, pl->off[it->k], it->units, s->gu, s->ng);
    }
    PLOG("layouts: around obstacles %llu granules (top %.1f MiB), apart %llu (own arena, %.1f MiB): %s\n",
         (unsigned long long)cost[0], s->top[0] / 2048.0, (unsigned long long)cost[1], s->top[1] / 2048.0,
         pl->rebase ? "apart" : "around");
    gm__gp_plan_park_chains(pl, s->m, s->T);
    uint64_t topm = s->top[pl->rebase];
    pl->top_units = topm;
#ifdef GP_PLAN_DEBUG
    solve_debug_result(s);
#endif
    PLOG("layout at %llu: P %llu T %lld intervals %llu (%llu large left out) obstacles %llu top %.1f MiB mapped %.1f MiB\n",
         (unsigned long long)pl->start, (unsigned long long)s->P, (long long)s->T, (unsigned long long)s->m, (unsigned long long)s->unplanned,
         (unsigned long long)s->no, topm / 2048.0, s->a->mapped_bytes / 1048576.0);
    return topm ? GM_OK : GM_ENOMEM;
}

/* Lay out the step [start - 2P, start - P) for the steps from `start` on,
 * around the blocks live in arena a now. */
int gm__gp_plan_solve(gp_state *st, gp_plan *pl, gp_arena *a) {
    uint64_t allowed = pl_work_allowed(pl);
    pl_solve s = {.st = st, .pl = pl, .a = a, .P = pl->P, .cost = {UINT64_MAX, UINT64_MAX},
                  .allow = allowed > pl->work ? allowed - pl->work : 0};
    int rc = GM_ENOMEM;
    if (!spend(&s, s.P)) goto out; /* solve_intervals' loop */
    if ((rc = solve_intervals(&s)) != GM_OK) return rc;
    if ((rc = solve_obstacles(&s)) != GM_OK) goto out;
    s.limit = a->va_size >> GP_ALIGN_SHIFT;
    s.gu = st->gran >> GP_ALIGN_SHIFT;
    s.ng = a->ngran;
    s.nw = (s.ng + 63) / 64;
#ifdef GP_PLAN_DEBUG
    solve_debug_problem(&s);
#endif
    if ((rc = solve_pins(&s)) != GM_OK || (rc = solve_arrays(&s)) != GM_OK) goto out;
    s.rng = 0x9e3779b97f4a7c15ull ^ pl->start;
    pl_cont = s.cont;
    qsort(s.obs, s.no, sizeof *s.obs, cmp_off); /* in address order, merged with the placed intervals */
    solve_layouts(&s);
    pl_cont = NULL;
    pl_boost = NULL;
    s.work += 4 * s.P; /* solve_adopt's loops and the park chains' (bounded scans) */
    rc = solve_adopt(&s);
out:
    pl->work += s.work;
    pl->wait = s.over ? 2 * s.work : 0; /* cut short: the next one waits until twice this is allowed */
    pl->starved += s.over;
    if (s.over) PLOG("layout at %llu stopped at the work budget: %llu steps spent\n", (unsigned long long)pl->start, (unsigned long long)s.work);
    pl_cont = NULL;
    pl_boost = NULL;
    free(s.cont), free(s.boost), free(s.big);
    free(s.pin), free(s.bits), free(s.pe);
    free(s.sorted[0]), free(s.sorted[1]);
    free(s.offa), free(s.all);
    return rc;
}
