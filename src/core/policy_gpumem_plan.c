/* policy_gpumem_plan.c — gpumem_plan:on: learn the repeating step of a
 * training loop online and serve its allocations at planned addresses.
 *
 * Why: online placement fixes a trace's peak the first time its peak is
 * requested (bench/gpumem_policy_tradeoff.md), and at gpumem_slack:inf the
 * memory held is every granule ever touched. A training step repeats the
 * same allocation sequence, so once it has been seen it can be placed
 * offline, like a static-allocation problem (TelaMalloc / MiniMalloc).
 *
 * How:
 *  - History: every allocation is recorded (units, stream, the operation
 *    number at which it was made and freed, bytes live before it) in a ring
 *    of PL_HIST entries; a block remembers its allocation number (serial).
 *  - Period: the last PL_W allocations are hashed; the previous allocation
 *    number with the same hash proposes a period P, which is kept while
 *    allocation i matches allocation i - P (units and stream). A period
 *    counts once a whole step matched (run >= P, and >= PL_MINRUN) and the
 *    bytes live at the same phase of both steps are equal (a layer loop in
 *    a forward pass repeats too, but its live memory grows).
 *  - Plan: the step boundary is put at the phase where the least memory is
 *    live; the plan starts one step later (at the same phase). Then, from
 *    the last whole step before that one: a large block (> 1 MiB: small ones
 *    stay in the small pool, whose memory their stats count in) on the
 *    stream of the step's largest block, freed less than one step after it
 *    was made, is an interval (units, birth, death in operations since the
 *    step began; a death past the step's end wraps around: the block is
 *    alive across the boundary, "circular"). The obstacles are the blocks
 *    live in that stream's large arena when the plan starts, at their
 *    addresses: for ever, or, for the previous step's circular blocks, until
 *    their expected death. Intervals are placed greedily, largest first,
 *    each at the lowest address of the arena free of every interval and
 *    obstacle it overlaps in time (circular intervals overlap modulo the
 *    step). So the plan is a set of addresses in the ordinary arena, laid
 *    over the memory already mapped: no region, nothing held for the plan.
 *  - Serving: a cursor follows the step. An allocation that matches the
 *    cursor's units and stream takes its planned address if that range is
 *    still inside one free range of the arena (an address index of the
 *    arena's free ranges, kept while a plan is active), mapping what it
 *    needs; else the usual placement. Planned blocks are ordinary used
 *    blocks of the arena, so two live blocks never overlap whatever
 *    happened since the plan was made, online placements use the plan's
 *    gaps, and a plan that stops matching costs no memory. One that does
 *    not match is a deviation (the cursor resyncs on a match a few
 *    positions ahead); more than a quarter of a step deviating drops the
 *    plan (the detector may make another).
 *  - Settling: after the first step served from the plan with no deviation,
 *    every idle chunk (mapped, no live block) is given back, like
 *    empty_cache: a one-time cost in device calls.
 *  - Streams: the plan serves its own stream from that stream's arena, so a
 *    range is reused only by the stream that freed it (stream order makes
 *    that safe, as for every arena); the front end hands a block with
 *    pending record_stream uses to the policy only after its events
 *    completed.
 */
#include "policy_gpumem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef GP_PLAN_DEBUG
#include <time.h>
#endif

#ifdef GP_PLAN_DEBUG
#define PLOG(...) fprintf(stderr, "plan: " __VA_ARGS__)
#else
#define PLOG(...) ((void)0)
#endif

#define PL_HIST (1u << 15)    /* allocations remembered */
#define PL_MAXP (PL_HIST / 4) /* longest step, in allocations */
#define PL_MINP 8             /* shortest step */
#define PL_MINRUN 64          /* allocations matched before a period counts */
#define PL_W 8                /* allocations hashed to propose a period */
#define PL_TAB (1u << 14)     /* hash table of windows (256 KiB: stays in cache) */
#define PL_TRIES 8            /* plans made before the detector gives up */
#define PL_RESYNC 8           /* positions searched ahead after a deviation */

enum { PL_NONE, PL_PENDING, PL_ACTIVE };

typedef struct pl_rec {
    uint64_t units;
    gm_stream stream;
    int64_t birth, death; /* operation numbers; death -1 while alive */
    uint64_t live;        /* units live just before this allocation */
} pl_rec;

typedef struct pl_item {
    uint64_t units, off; /* off: units from the arena's base */
    int64_t b, e;        /* operations since the step began; e may pass the step (circular) */
    uint32_t k;          /* position in the step; PL_OBST: an obstacle */
    uint32_t where;      /* layout B: 1 in a pinned chunk of the obstacles' arena */
} pl_item;
#define PL_OBST UINT32_MAX

typedef struct gp_plan {
    pl_rec *hist;
    uint64_t n;   /* allocations so far */
    int64_t op;   /* operations (allocations + frees) so far */
    uint64_t live; /* units live */
    struct pl_slot { uint64_t key, pos; } *tab; /* window hash -> allocation number + 1 */
    uint64_t wh;  /* rolling hash of the last PL_W allocations */
    uint64_t cand, run;
    int state;
    uint64_t P, start; /* step length; allocation number where serving starts */
    uint64_t *tunits, *off;
    gm_stream *tstream;
    uint8_t *planned;
    uint8_t *inmain; /* layout B: served from the obstacles' arena (ma), not the plan's own */
    int64_t *pend; /* phase end per position (0: not an interval) */
    uint64_t cap;  /* of the per-position arrays */
    gm_stream pstream;
    gp_arena *ra; /* where planned blocks go: the stream's arena (A) or the plan's own (B) */
    gp_arena *ma; /* the stream's arena */
    uint64_t cur, dev_step;
    bool settled;
    bool rebase; /* layout B: in the plan's own arena (pa); idle memory given back at the start */
    uint64_t top_units; /* the layout's extent */
    uint64_t *fp, fp_words; /* layout A: granules of the stream's arena the plan uses */
    gp_arena *pa; /* the plan's own arena of pstream, once made (reused by later plans) */
    uint32_t tries;
    bool marked;       /* gm_step_mark was called: marks, not the detector, make plans */
    uint64_t mark[3];  /* allocation numbers at the last three marks */
    uint64_t nmarks;
    pl_item *items;
    uint64_t served;
} gp_plan;

int gm__gp_plan_create(gp_state *st) {
    gp_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return GM_ENOHOSTMEM;
    pl->hist = calloc(PL_HIST, sizeof *pl->hist);
    pl->tab = calloc(PL_TAB, sizeof *pl->tab);
    if (!pl->hist || !pl->tab) {
        st->plan = pl;
        gm__gp_plan_destroy(st);
        return GM_ENOHOSTMEM;
    }
    st->plan = pl;
    return GM_OK;
}

void gm__gp_plan_destroy(gp_state *st) {
    gp_plan *pl = st->plan;
    if (!pl) return;
    free(pl->hist);
    free(pl->tab);
    free(pl->tunits);
    free(pl->off);
    free(pl->tstream);
    free(pl->planned);
    free(pl->inmain);
    free(pl->pend);
    free(pl->items);
    free(pl->fp);
    free(pl);
    st->plan = NULL;
}

static inline pl_rec *rec(gp_plan *pl, uint64_t i) { return &pl->hist[i & (PL_HIST - 1)]; }

static inline bool same(gp_plan *pl, uint64_t i, uint64_t j) {
    const pl_rec *a = rec(pl, i), *b = rec(pl, j);
    return a->units == b->units && a->stream == b->stream;
}

/* ---- the plan: greedy placement of one step's intervals -------------------- */

/* The greedy's orders (layout() tries each, keeps the best): 0 largest
 * first, 1 longest-lived first, 2 largest size x lifetime first, 3 born
 * first; ties: larger, longer, earlier, position. */
#define PL_ORDERS 4
#define PL_ORDERS_MAXM 8192 /* intervals above which only the first order is tried */
static _Thread_local int pl_order; /* for cmp_item (qsort has no argument for it); per thread: devices lay out plans under their own locks */

static int cmp_item(const void *x, const void *y) {
    const pl_item *a = x, *b = y;
    int64_t la = a->e - a->b, lb = b->e - b->b;
    if (pl_order == 1 && la != lb) return la > lb ? -1 : 1;
    if (pl_order == 2) {
        double xa = (double)a->units * (double)la, xb = (double)b->units * (double)lb;
        if (xa != xb) return xa > xb ? -1 : 1;
    }
    if (pl_order == 3 && a->b != b->b) return a->b < b->b ? -1 : 1;
    if (a->units != b->units) return a->units > b->units ? -1 : 1;
    if (la != lb) return la > lb ? -1 : 1;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k;
}

static int cmp_off(const void *x, const void *y) {
    const pl_item *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off;
}

/* Do two intervals of a period of T operations overlap in time? Both
 * repeat every period, and each is shorter than a period. */
static bool overlap(const pl_item *x, const pl_item *y, int64_t T) {
    for (int64_t s = -T; s <= T; s += T)
        if (x->b < y->e + s && y->b + s < x->e) return true;
    return false;
}

/* Does an obstacle (there from the plan's start until o->e, not repeating)
 * overlap interval x of the first planned step? */
static bool blocks(const pl_item *o, const pl_item *x) { return x->b < o->e; }

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

static const pl_item *cit_next(cit *c) {
    for (;;) {
        const pl_item *a = c->i < c->ns ? &c->items[c->s[c->i]] : NULL;
        const pl_item *b = c->use_obs && c->j < c->no ? &c->obs[c->j] : NULL;
        if (!a && !b) return NULL;
        if (a && (!b || a->off <= b->off)) {
            c->i++;
            if (overlap(a, c->it, c->period)) return a;
        } else {
            c->j++;
            if (blocks(b, c->it)) return b;
        }
    }
}

/* Insert item index k into s (sorted by the items' offsets). */
static void sorted_insert(const pl_item *items, uint32_t *s, uint64_t *ns, uint32_t k) {
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

static int grow(gp_plan *pl, uint64_t P) {
    if (P <= pl->cap) return GM_OK;
    uint64_t *tu = realloc(pl->tunits, P * sizeof *tu);
    if (tu) pl->tunits = tu;
    uint64_t *of = realloc(pl->off, P * sizeof *of);
    if (of) pl->off = of;
    gm_stream *ts = realloc(pl->tstream, P * sizeof *ts);
    if (ts) pl->tstream = ts;
    uint8_t *pn = realloc(pl->planned, P * sizeof *pn);
    if (pn) pl->planned = pn;
    uint8_t *im = realloc(pl->inmain, P * sizeof *im);
    if (im) pl->inmain = im;
    int64_t *pe = realloc(pl->pend, P * sizeof *pe);
    if (pe) pl->pend = pe;
    pl_item *it = realloc(pl->items, P * sizeof *it);
    if (it) pl->items = it;
    if (!tu || !of || !ts || !pn || !im || !pe || !it) return GM_ENOHOSTMEM;
    pl->cap = P;
    return GM_OK;
}

/* Period P confirmed at allocation p: the plan starts at the phase with the
 * least memory live, one step after the last time it was there. */
static void make_plan(gp_plan *pl, uint64_t p) {
    uint64_t P = pl->cand;
    pl->tries++;
    uint64_t phi = p;
    for (uint64_t i = p - P + 1; i < p; i++)
        if (rec(pl, i)->live < rec(pl, phi)->live) phi = i;
    if (phi < 2 * P) return; /* the layout needs the whole step before phi */
    uint64_t big = 0;
    for (uint64_t k = 0; k < P; k++) {
        const pl_rec *r = rec(pl, phi - P + k);
        if (r->units > big) big = r->units, pl->pstream = r->stream;
    }
    pl->P = P;
    pl->start = phi + P;
    pl->state = PL_PENDING;
    PLOG("period %llu confirmed at %llu: least live at %llu, plan from %llu\n", (unsigned long long)P, (unsigned long long)p, (unsigned long long)phi, (unsigned long long)pl->start);
}

/* Lay out the step [start - 2P, start - P) for the steps from `start` on,
 * around the blocks live in arena a now. */
static int layout(gp_state *st, gp_plan *pl, gp_arena *a) {
    uint64_t P = pl->P, w0 = pl->start - 2 * P, w1 = pl->start - P;
    int rc = grow(pl, 2 * P);
    if (rc) return rc;
    /* both recorded steps: an interval spans the block's lifetimes in either
     * (so the plan holds if later steps behave like one of them), and a
     * position whose lifetimes disagree on crossing the boundary is left
     * to the usual placement. A block may live up to two steps, so the plan
     * covers two steps (2P positions, period 2T): each position twice. */
    int64_t t0 = rec(pl, w0)->birth, t1 = rec(pl, w1)->birth, T0 = t1 - t0, T = pl->op - t1;
    uint64_t m = 0, unplanned = 0; /* large blocks of the stream left to the usual placement */
    for (uint64_t k = 0; k < P; k++) {
        const pl_rec *r0 = rec(pl, w0 + k), *r1 = rec(pl, w1 + k);
        pl->tunits[k] = pl->tunits[k + P] = r1->units;
        pl->tstream[k] = pl->tstream[k + P] = r1->stream;
        pl->planned[k] = pl->planned[k + P] = 0;
        pl->inmain[k] = pl->inmain[k + P] = 0;
        pl->off[k] = pl->off[k + P] = UINT64_MAX;
        pl->pend[k] = 0;
        if (r1->units <= GP_SMALL_UNITS || r1->stream != pl->pstream) continue;
        unplanned++; /* until it is an interval */
        if (r0->units != r1->units || r0->stream != r1->stream || r0->death < 0) continue;
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
        pl->items[m++] = (pl_item){r1->units, 0, b, e, (uint32_t)k, 0};
        pl->items[m++] = (pl_item){r1->units, 0, b + T, e + T, (uint32_t)(k + P), 0};
    }
    uint64_t nobs = 0;
    for (const gp_block *b = a->head; b; b = b->next) nobs += b->state == GP_USED;
    pl_item *all = malloc((m + nobs + 1) * sizeof *all);
    if (!all) return GM_ENOHOSTMEM;
    pl_item *obs = all + m;
    uint64_t no = 0;
    for (const gp_block *b = a->head; b; b = b->next) {
        if (b->state != GP_USED) continue;
        pl_item o = {b->h.size >> GP_ALIGN_SHIFT, (b->h.ptr - a->base) >> GP_ALIGN_SHIFT, 0, INT64_MAX, PL_OBST, 0};
        /* blocks of the last two steps: gone at their expected death */
        if (b->serial >= w0 && b->serial < pl->start) {
            uint64_t k = (b->serial - w0) % P, back = 2 - (b->serial - w0) / P; /* steps ago */
            int64_t e = pl->pend[k] - (int64_t)back * T;
            if (pl->pend[k] && e > 0 && pl->tunits[k] == o.units) o.e = e;
        }
        obs[no++] = o;
    }
    uint64_t limit = a->va_size >> GP_ALIGN_SHIFT, gu = st->gran >> GP_ALIGN_SHIFT;
    /* Two layouts: A, around the obstacles in their arena (fills the holes
     * between them, over memory mapped already); B, the step alone, in an
     * arena of its own (so blocks left to the usual placement never land in
     * the plan's slots; measured: in one arena they did, on
     * gpt2_small_adamw, and the plan fell apart), the holes' memory given
     * back. The one touching fewer granules wins: that is the memory it
     * holds (a tie goes to A, which gives nothing back). */
    /* B also uses the memory the permanent obstacles pin: the free parts
     * of their chunks (whole chunks stay mapped while a block lives in
     * them), for blocks that fit there, in the obstacles' arena. */
    uint64_t ng = a->ngran, nw = (ng + 63) / 64, npe = 0;
    uint64_t *pin = calloc(nw, sizeof *pin), *bits = calloc(nw, sizeof *bits);
    pl_item *pe = malloc((no + 1) * sizeof *pe);
    if (!pin || !bits || !pe) {
        free(pin), free(bits), free(pe), free(all);
        return GM_ENOHOSTMEM;
    }
    /* pass 0: chunks of every obstacle (held until the last steps' blocks
     * die: B's first step needs them and its own arena at once); pass 1:
     * of the permanent ones (held for good) */
    uint64_t pin_all = 0;
    for (int pass = 0; pass < 2; pass++) {
        memset(pin, 0, nw * sizeof *pin);
        for (uint64_t j = 0; j < no; j++) {
            if (pass && obs[j].e != INT64_MAX) continue;
            for (uint64_t g = obs[j].off / gu; g <= (obs[j].off + obs[j].units - 1) / gu && g < ng; g++) {
                if (a->gran[g] < 0) continue;
                const gp_chunk *ch = &st->chunks[a->gran[g]];
                for (uint64_t h = (uint64_t)ch->g0; h < (uint64_t)ch->g0 + ch->n && h < ng; h++)
                    pin[h / 64] |= (uint64_t)1 << (h % 64);
            }
        }
        for (uint64_t w = 0; !pass && w < nw; w++) pin_all += (uint64_t)__builtin_popcountll(pin[w]);
    }
    /* the usual placement prefers mapped free ranges, so blocks left to it
     * would take those parts first: only when every large block of the
     * step is planned */
    for (uint64_t g = 0; !unplanned && g < ng && npe < no + 1; g++) { /* runs of pinned granules, in units */
        if (!(pin[g / 64] >> (g % 64) & 1)) {
            if (!pin[g / 64]) g |= 63;
            continue;
        }
        if (npe && pe[npe - 1].off + pe[npe - 1].units == g * gu) pe[npe - 1].units += gu;
        else pe[npe++] = (pl_item){gu, g * gu, 0, 0, 0, 0};
    }
    uint64_t cost[2] = {UINT64_MAX, UINT64_MAX}, top[2] = {0, 0};
    uint64_t *offa = malloc(2 * P * sizeof *offa);
    uint32_t *sorted[2] = {malloc((m + 1) * sizeof(uint32_t)), malloc((m + 1) * sizeof(uint32_t))};
    if (!offa || !sorted[0] || !sorted[1]) {
        free(sorted[0]), free(sorted[1]);
        free(offa), free(pin), free(bits), free(pe), free(all);
        return GM_ENOHOSTMEM;
    }
    qsort(obs, no, sizeof *obs, cmp_off); /* in address order, merged with the placed intervals */
    for (uint64_t k = 0; k < 2 * P; k++) offa[k] = UINT64_MAX;
    for (int mode = 1; mode >= 0; mode--) {
      /* several orders, the best kept (one when the step is long: each is O(m^2)) */
      for (int ord = 0; ord < (m > PL_ORDERS_MAXM ? 1 : PL_ORDERS); ord++) {
        pl_order = ord;
        qsort(pl->items, m, sizeof *pl->items, cmp_item);
        uint64_t c = 0, tp = 0, ns[2] = {0, 0};
        for (uint64_t i = 0; i < m; i++) {
            pl_item *it = &pl->items[i];
            it->where = 0;
            it->off = UINT64_MAX;
        }
        for (uint64_t i = 0; i < m; i++) {
            pl_item *it = &pl->items[i];
            uint64_t pos = UINT64_MAX;
            if (mode && npe) { /* in a pinned chunk's free part first: the gaps between what is in the way there */
                cit ci = {pl->items, sorted[1], ns[1], 0, obs, no, 0, true, it, 2 * T};
                uint64_t cov = 0, x = 0;
                for (const pl_item *cf = cit_next(&ci);; cf = cit_next(&ci)) {
                    uint64_t gs = cov, ge = cf ? cf->off : UINT64_MAX;
                    if (cf && cf->off + cf->units > cov) cov = cf->off + cf->units;
                    if (ge > gs) {
                        while (x < npe && pe[x].off + pe[x].units <= gs) x++;
                        for (uint64_t y = x; y < npe && pe[y].off < ge; y++) {
                            uint64_t s0 = gs > pe[y].off ? gs : pe[y].off, e0 = pe[y].off + pe[y].units;
                            if (e0 > ge) e0 = ge;
                            if (e0 - s0 >= it->units) {
                                pos = s0;
                                break;
                            }
                        }
                    }
                    if (pos != UINT64_MAX || !cf || x >= npe) break;
                }
                if (pos != UINT64_MAX) {
                    it->off = pos;
                    it->where = 1;
                    sorted_insert(pl->items, sorted[1], &ns[1], (uint32_t)i);
                    continue;
                }
            }
            cit ci = {pl->items, sorted[0], ns[0], 0, obs, no, 0, !mode, it, 2 * T};
            pos = 0; /* first fit */
            for (const pl_item *cf = cit_next(&ci); cf; cf = cit_next(&ci)) {
                if (cf->off >= pos + it->units) break;
                if (cf->off + cf->units > pos) pos = cf->off + cf->units;
            }
            if (pos + it->units > limit) continue;
            it->off = pos;
            sorted_insert(pl->items, sorted[0], &ns[0], (uint32_t)i);
            if (pos + it->units > tp) tp = pos + it->units;
        }
        /* granules touched: the obstacles' chunks (whole) and the layout's
         * (B: in its own arena, apart; its blocks in pinned chunks are free) */
        memcpy(bits, pin, nw * sizeof *bits);
        if (mode) {
            for (uint64_t w = 0; w < nw; w++) c += (uint64_t)__builtin_popcountll(bits[w]);
            memset(bits, 0, nw * sizeof *bits);
        }
        for (uint64_t j = 0; j < m + no; j++) {
            const pl_item *x = j < m ? &pl->items[j] : &obs[j - m];
            if (x->off == UINT64_MAX || (j < m && x->where)) continue;
            if (mode && j >= m) continue; /* counted in pin */
            for (uint64_t g = x->off / gu; g <= (x->off + x->units - 1) / gu && g < ng; g++) bits[g / 64] |= (uint64_t)1 << (g % 64);
        }
        for (uint64_t w = 0; w < nw; w++) c += (uint64_t)__builtin_popcountll(bits[w]);
        if (mode == 1) {
            /* B's first step holds every obstacle's chunks and its own arena
             * (mapped at once): that must stay within the peak held so far,
             * so the plan never raises the whole run's peak */
            uint64_t pinned = 0;
            for (uint64_t w = 0; w < nw; w++) pinned += (uint64_t)__builtin_popcountll(pin[w]);
            uint64_t first = st->held_bytes - a->mapped_bytes + (pin_all + c - pinned) * st->gran;
            if (first > (uint64_t)st->d->stats.reserved_bytes[GM_POOL_ALL].peak) {
                PLOG("layout B (order %d): first step would hold %.1f MiB, the peak so far %.1f MiB\n", ord, first / 1048576.0,
                     st->d->stats.reserved_bytes[GM_POOL_ALL].peak / 1048576.0);
                continue;
            }
        }
        PLOG("layout %c order %d: %llu granules\n", mode ? 'B' : 'A', ord, (unsigned long long)c);
        if (c >= cost[mode]) continue;
        cost[mode] = c;
        top[mode] = tp;
        for (uint64_t i = 0; i < m; i++) {
            const pl_item *it = &pl->items[i];
            if (mode) {
                pl->off[it->k] = it->off;
                pl->inmain[it->k] = (uint8_t)it->where;
            } else {
                offa[it->k] = it->off;
            }
        }
      }
    }
    free(pin);
    free(bits);
    free(pe);
    free(sorted[0]);
    free(sorted[1]);
    if (cost[0] == UINT64_MAX && cost[1] == UINT64_MAX) {
        free(offa), free(all);
        return GM_ENOMEM;
    }
    pl->rebase = cost[1] < cost[0];
    if (gm__gp_plan_force == 'A' && cost[0] != UINT64_MAX) pl->rebase = false;
    if (gm__gp_plan_force == 'B' && cost[1] != UINT64_MAX) pl->rebase = true;
    /* the plan must hold less than the arena holds now, else it is not made */
    if (cost[pl->rebase] * st->gran >= a->mapped_bytes && !gm__gp_plan_force) {
        PLOG("layout at %llu: %llu granules, not less than the %.1f MiB mapped: no plan\n", (unsigned long long)pl->start, (unsigned long long)cost[pl->rebase], a->mapped_bytes / 1048576.0);
        free(offa), free(all);
        return GM_ENOMEM;
    }
    if (pl->fp_words < nw) {
        uint64_t *f = realloc(pl->fp, nw * sizeof *f);
        if (!f) {
            free(offa), free(all);
            return GM_ENOHOSTMEM;
        }
        pl->fp = f;
        pl->fp_words = nw;
    }
    memset(pl->fp, 0, pl->fp_words * sizeof *pl->fp);
    for (uint64_t i = 0; i < m; i++) {
        pl_item *it = &pl->items[i];
        if (!pl->rebase) pl->off[it->k] = offa[it->k], pl->inmain[it->k] = 0;
        pl->planned[it->k] = pl->off[it->k] != UINT64_MAX;
        if (!pl->rebase && pl->planned[it->k]) /* A's footprint, kept when idle memory is given back */
            for (uint64_t g = pl->off[it->k] / gu; g <= (pl->off[it->k] + it->units - 1) / gu && g < ng; g++)
                pl->fp[g / 64] |= (uint64_t)1 << (g % 64);
    }
    free(offa);
    PLOG("layouts: around obstacles %llu granules (top %.1f MiB), apart %llu (own arena, %.1f MiB): %s\n",
         (unsigned long long)cost[0], top[0] / 2048.0, (unsigned long long)cost[1], top[1] / 2048.0,
         pl->rebase ? "apart" : "around");
    uint64_t topm = top[pl->rebase];
    pl->top_units = topm;
#ifdef GP_PLAN_DEBUG
    {
        uint64_t osum = 0, otop = 0, mx = 0;
        for (uint64_t j = 0; j < no; j++) {
            if (obs[j].e == INT64_MAX) osum += obs[j].units;
            if (obs[j].off + obs[j].units > otop) otop = obs[j].off + obs[j].units;
        }
        for (uint64_t i = 0; i < m; i++) {
            uint64_t l = 0;
            for (uint64_t j = 0; j < m; j++)
                if (overlap(&(pl_item){0, 0, pl->items[i].b, pl->items[i].b + 1, 0, 0}, &pl->items[j], 2 * T)) l += pl->items[j].units;
            if (l > mx) mx = l;
        }
        PLOG("obstacles: permanent %.1f MiB, top %.1f MiB; intervals max live %.1f MiB\n", osum / 2048.0, otop / 2048.0, mx / 2048.0);
    }
#endif
    PLOG("layout at %llu: P %llu T %lld intervals %llu (%llu large left out) obstacles %llu top %.1f MiB mapped %.1f MiB\n",
         (unsigned long long)pl->start, (unsigned long long)P, (long long)T, (unsigned long long)m, (unsigned long long)unplanned,
         (unsigned long long)no, topm / 2048.0, a->mapped_bytes / 1048576.0);
    free(all);
    return topm ? GM_OK : GM_ENOMEM;
}

/* ---- detection ------------------------------------------------------------- */

static inline uint64_t rotl64(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t mix(uint64_t units, gm_stream stream) {
    uint64_t x = units * 0xff51afd7ed558ccdull ^ ((uint64_t)stream + 1) * 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 31);
}

static void detect(gp_plan *pl, uint64_t p) {
    if (pl->cand && same(pl, p, p - pl->cand)) {
        pl->run++;
    } else {
        pl->cand = pl->run = 0;
        if (pl->state == PL_PENDING) pl->state = PL_NONE, PLOG("step changed at %llu before the plan began\n", (unsigned long long)p); /* the step changed before it began */
    }
    /* a cyclic polynomial (buzhash) over the window: O(1) per allocation */
    const pl_rec *in = rec(pl, p);
    pl->wh = rotl64(pl->wh, 1) ^ mix(in->units, in->stream);
    if (p >= PL_W) {
        const pl_rec *out = rec(pl, p - PL_W);
        pl->wh ^= rotl64(mix(out->units, out->stream), PL_W);
    }
    if (p + 1 < PL_W) return;
    uint64_t h = pl->wh * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    struct pl_slot *sl = &pl->tab[h & (PL_TAB - 1)];
    uint64_t q = sl->key == h ? sl->pos : 0;
    sl->key = h;
    sl->pos = p + 1;
    if (!pl->cand && q) {
        uint64_t P = p + 1 - q;
        if (P >= PL_MINP && P <= PL_MAXP && p >= 2 * P) {
            uint64_t i = p;
            while (i > p - P - 1 && same(pl, i, i - P)) i--;
            pl->cand = P;
            pl->run = p - i;
        }
    }
    if (pl->state == PL_NONE && !pl->marked && pl->cand && pl->run >= pl->cand && pl->run >= PL_MINRUN &&
        pl->tries < PL_TRIES && p >= 2 * pl->cand && rec(pl, p)->live == rec(pl, p - pl->cand)->live)
        make_plan(pl, p);
}

static void note_alloc(gp_plan *pl, uint64_t units, gm_stream stream) {
    uint64_t p = pl->n++;
    *rec(pl, p) = (pl_rec){units, stream, pl->op++, -1, pl->live};
    pl->live += units;
    detect(pl, p);
}

/* ---- activation, settling, dropping ----------------------------------------- */

static void drop(gp_state *st) {
    gp_plan *pl = st->plan;
    PLOG("drop at %llu\n", (unsigned long long)pl->n);
    if (pl->ra) (void)gm__gp_va_index(pl->ra, false);
    if (pl->ma) (void)gm__gp_va_index(pl->ma, false);
    pl->ra = pl->ma = NULL;
    pl->state = PL_NONE;
    pl->cand = pl->run = 0;
}

/* Idle chunks the plan will use again: its own arena's, or (layout A) any
 * under its footprint in the stream's arena. */
static bool keep_planned(void *arg, const gp_chunk *c) {
    gp_state *st = arg;
    const gp_plan *pl = st->plan;
    if (c->arena < 0 || pl->state != PL_ACTIVE) return false;
    if (pl->rebase) return c->arena == pl->ra->index;
    if (c->arena != pl->ma->index) return false;
    for (uint64_t g = (uint64_t)c->g0; g < (uint64_t)c->g0 + c->n && g / 64 < pl->fp_words; g++)
        if (pl->fp[g / 64] >> (g % 64) & 1) return true;
    return false;
}

static void activate(gp_state *st) {
    gp_plan *pl = st->plan;
    gp_arena *a, *ra;
    pl->state = PL_NONE;
    if (gm__gp_arena_of(st, pl->pstream, GM_POOL_LARGE, &a) || !a->gran) return;
#ifdef GP_PLAN_DEBUG
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int lrc = layout(st, pl, a);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    PLOG("layout took %.1f ms\n", (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    if (lrc) return;
#else
    if (layout(st, pl, a)) return; /* served as before */
#endif
    ra = a;
    if (pl->rebase) {
        if (pl->pa && pl->pa->stream != pl->pstream) return; /* one own arena, for the first plan's stream */
        if (!pl->pa && (gm__gp_arena_new_plan(st, pl->pstream, GM_POOL_LARGE, &pl->pa) || !pl->pa->gran)) return;
        ra = pl->pa;
    }
    if (gm__gp_va_index(a, true)) return;
    if (ra != a && gm__gp_va_index(ra, true)) {
        (void)gm__gp_va_index(a, false);
        return;
    }
    if (pl->rebase) {
        /* the holes' memory is not needed: give it back, then map the plan's
         * range at once, in chunks as large as gpumem_chunks allows (block by
         * block it was one create + map per planned block: 1689 calls on
         * gpt2_small_train against 869). Out of memory here only means
         * the rest is mapped block by block. */
        gm__gp_flush_quick(st);
        for (uint32_t k = 0; k < st->narenas; k++) gm__gp_sync_arena(st, st->arenas[k]);
        pl->state = PL_ACTIVE; /* for keep_planned */
        pl->ra = ra;
        pl->ma = a;
        /* idle chunks move into the plan's arena (unmap + map) rather than
         * being given back and made anew (4 calls; at 1.01x capacity, one
         * granule each); what is left idle is then given back */
        st->soft_cap = st->held_bytes;
        if (pl->top_units) (void)gm__gp_ensure_mapped(st, ra, ra->base, pl->top_units << GP_ALIGN_SHIFT);
        st->soft_cap = 0;
        gm__gp_release_unused_but(st, keep_planned, st);
        gm__gp_live_drop(st);
    }
    pl->ra = ra;
    pl->ma = a;
    pl->state = PL_ACTIVE;
    pl->cur = pl->dev_step = 0;
    pl->settled = false;
}

/* Memory the plan does not need: idle chunks, given back once. */
static void settle(gp_state *st) {
    gp_plan *pl = st->plan;
    pl->settled = true;
    PLOG("settle at %llu held %.1f MiB\n", (unsigned long long)pl->n, st->held_bytes / 1048576.0);
#ifdef GP_PLAN_DEBUG
    for (uint32_t k = 0; k < st->narenas; k++)
        PLOG("  arena %u pool %d stream %llu mapped %.1f MiB\n", k, st->arenas[k]->pool, (unsigned long long)st->arenas[k]->stream, st->arenas[k]->mapped_bytes / 1048576.0);
#endif
    gm__gp_flush_quick(st);
    for (uint32_t k = 0; k < st->narenas; k++) gm__gp_sync_arena(st, st->arenas[k]);
    gm__gp_release_unused_but(st, keep_planned, st);
#ifdef GP_PLAN_DEBUG
    for (uint32_t k = 0; k < st->narenas; k++)
        PLOG("  after: arena %u mapped %.1f MiB, small requested %.1f MiB\n", k, st->arenas[k]->mapped_bytes / 1048576.0, st->d->stats.requested_bytes[GM_POOL_SMALL].current / 1048576.0);
#endif
}

static void advance(gp_state *st) {
    gp_plan *pl = st->plan;
    if (++pl->cur % pl->P) return;
    if (pl->cur == 2 * pl->P) pl->cur = 0;
    if (!pl->settled && pl->dev_step == 0) settle(st);
    pl->dev_step = 0;
}

static void deviation(gp_state *st) {
    gp_plan *pl = st->plan;
    if (++pl->dev_step > pl->P / 4 + 4) drop(st);
}

/* ---- ops ------------------------------------------------------------------- */

static int serve(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out) {
    gp_plan *pl = st->plan;
    if (!pl->ra->fidx || !pl->ma->fidx) { /* an index could not grow */
        drop(st);
        return 0;
    }
    uint64_t c = pl->cur;
    if (pl->tunits[c] != units || pl->tstream[c] != stream) {
        PLOG("mismatch at %llu pos %llu: %llu units, plan %llu\n", (unsigned long long)pl->n, (unsigned long long)c, (unsigned long long)units, (unsigned long long)pl->tunits[c]);
        deviation(st);
        if (pl->state != PL_ACTIVE) return 0;
        uint64_t k = 1;
        while (k <= PL_RESYNC && c + k < 2 * pl->P && (pl->tunits[c + k] != units || pl->tstream[c + k] != stream)) k++;
        if (k > PL_RESYNC || c + k >= 2 * pl->P) return 0;
        pl->cur = c = c + k;
    }
    advance(st);
    if (!pl->planned[c]) return 0;
    gp_block *b;
    /* laid over the mapped memory (layout A), the plan maps nothing of its
     * own before it settled: a plan that falls apart in its first step then
     * held no more than the usual placement would have */
    gp_arena *a = pl->rebase && !pl->inmain[c] ? pl->ra : pl->ma;
    int rc = gm__gp_va_place_at(st, a, a->base + (pl->off[c] << GP_ALIGN_SHIFT), units,
                                pl->rebase || pl->settled, &b);
    if (rc == 2) return 0;
    if (rc <= 0) {
#ifdef GP_PLAN_DEBUG
        if (rc == 0) {
            gm_devptr p0 = a->base + (pl->off[c] << GP_ALIGN_SHIFT);
            for (const gp_block *o = a->head; o; o = o->next)
                if (o->state == GP_USED && o->h.ptr < p0 + (units << GP_ALIGN_SHIFT) && p0 < o->h.ptr + o->h.size)
                    PLOG("slot %llu (%llu units) at %llu taken by serial %llu (pos %lld, %llu units)\n", (unsigned long long)c, (unsigned long long)units, (unsigned long long)pl->n, (unsigned long long)o->serial, (long long)(o->serial - pl->start) % (long long)pl->P, (unsigned long long)(o->h.size >> 9));
        }
#endif
        if (rc == 0) deviation(st); /* something else is there */
        return rc;
    }
    b->h.pool = (uint8_t)pool;
    pl->served++;
    *out = b;
    return 1;
}

int gm__gp_plan_malloc(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out) {
    gp_plan *pl = st->plan;
    if (pl->state == PL_PENDING && pl->n == pl->start) {
        const pl_rec *r = rec(pl, pl->start - pl->P); /* the step must begin as the last one did */
        if (r->units == units && r->stream == stream) activate(st);
        else pl->state = PL_NONE;
    }
    if (pl->state != PL_ACTIVE) return 0;
    int rc = serve(st, units, pool, stream, out);
    if (rc == 1) {
        (*out)->serial = pl->n;
        note_alloc(pl, units, stream);
    }
    return rc;
}

void gm__gp_plan_placed(gp_state *st, gp_block *b) {
    gp_plan *pl = st->plan;
    b->serial = pl->n;
    note_alloc(pl, b->h.size >> GP_ALIGN_SHIFT, st->arenas[b->arena]->stream);
}

void gm__gp_plan_free(gp_state *st, const gp_block *b) {
    gp_plan *pl = st->plan;
    pl->live -= b->h.size >> GP_ALIGN_SHIFT;
    if (b->serial < pl->n && pl->n - b->serial <= PL_HIST) rec(pl, b->serial)->death = pl->op;
    pl->op++;
}

/* gm_step_mark: the marks are the step boundaries. Once the last two
 * marked steps made the same allocations (count, units, streams), the plan
 * starts now, laid out from them; from the first mark on, the period
 * detector (which needs the bytes live to repeat too) makes no plan. */
void gm__gp_plan_step(gp_state *st) {
    gp_plan *pl = st->plan;
    pl->marked = true;
    pl->mark[0] = pl->mark[1];
    pl->mark[1] = pl->mark[2];
    pl->mark[2] = pl->n;
    pl->nmarks++;
    if (pl->state != PL_NONE || pl->nmarks < 3 || pl->tries >= PL_TRIES) return;
    uint64_t P = pl->mark[2] - pl->mark[1];
    if (P < PL_MINP || P > PL_MAXP || pl->mark[1] - pl->mark[0] != P || pl->n - pl->mark[0] > PL_HIST) return;
    for (uint64_t k = 0; k < P; k++)
        if (!same(pl, pl->mark[0] + k, pl->mark[1] + k)) return;
    uint64_t big = 0;
    for (uint64_t k = 0; k < P; k++) {
        const pl_rec *r = rec(pl, pl->mark[1] + k);
        if (r->units > big) big = r->units, pl->pstream = r->stream;
    }
    pl->tries++;
    pl->P = P;
    pl->start = pl->n;
    pl->state = PL_PENDING;
    PLOG("marked steps of %llu alike: plan from %llu\n", (unsigned long long)P, (unsigned long long)pl->start);
}

uint64_t gm__gp_plan_served(const gp_state *st) { return st->plan ? st->plan->served : 0; }

int gm__gp_plan_force;

int gm__gp_plan_layout(const gp_state *st) {
    const gp_plan *pl = st->plan;
    return pl && pl->state == PL_ACTIVE ? (pl->rebase ? 'B' : 'A') : 0;
}

/* Only the active plan's arenas have a free-range index, and it lists
 * exactly that arena's free ranges in address order. */
int gm__gp_plan_check(gp_state *st, char *err, size_t errlen) {
    gp_plan *pl = st->plan;
    for (uint32_t k = 0; k < st->narenas; k++) {
        const gp_arena *a = st->arenas[k];
        if (!a->fidx) continue;
        if (!pl || pl->state != PL_ACTIVE || (pl->ra != a && pl->ma != a))
            return gm__check_fail(err, errlen, "arena %d has a free-range index but no active plan", a->index);
        uint64_t i = 0;
        for (const gp_block *b = a->head; b; b = b->next) {
            if (b->state != GP_FREE) continue;
            if (i >= a->nfidx || a->fidx[i] != b)
                return gm__check_fail(err, errlen, "plan: free range 0x%llx missing from the index at %llu",
                                      (unsigned long long)b->h.ptr, (unsigned long long)i);
            i++;
        }
        if (i != a->nfidx) return gm__check_fail(err, errlen, "plan: index holds %llu ranges, the arena %llu", (unsigned long long)a->nfidx, (unsigned long long)i);
    }
    return GM_OK;
}
