/* plan.c — gpumem_plan:on: learn the repeating step of a
 * training loop online and serve its allocations at planned addresses.
 *
 * Why: online placement fixes a trace's peak the first time its peak is
 * requested (bench/gpumem_policy_tradeoff.md, "Why the default cannot also
 * reach <= 1.01"), and at gpumem_slack:inf the memory held is every granule
 * ever touched. A training step repeats the same allocation sequence, so
 * once it has been seen it can be placed offline, like a static-allocation
 * problem (TelaMalloc / MiniMalloc).
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
 *  - Marks: when the program calls gm_step_mark, the marks are the step
 *    boundaries and a plan starts once two marked steps allocate alike
 *    (the detector also needs equal live bytes; marks do not).
 *  - Plan: the step boundary is put at the phase where the least memory is
 *    live; the plan starts one step later (at the same phase). It covers
 *    two steps, from the last two recorded: a large block (> 1 MiB: small
 *    ones stay in the small pool) on the stream of the step's largest
 *    block is an interval (units, birth, death in operations since the step
 *    began) spanning its lifetimes in both steps; a death past the step's
 *    end is alive across the boundary ("circular"); a position whose two
 *    lifetimes disagree, or that lives two steps, is left to the usual
 *    placement. layout.c lays the intervals out (around
 *    the blocks live now, or in an arena of the plan's own) and the plan is
 *    made only if it holds less than the arena maps now.
 *  - Serving: a cursor follows the step. An allocation that matches the
 *    cursor's units and stream takes its planned address if that range is
 *    still inside one free range of the arena (an address index of the
 *    arena's free ranges, kept while a plan is active), mapping what it
 *    needs; else the usual placement. Planned blocks are ordinary used
 *    blocks of the arena, so two live blocks never overlap whatever
 *    happened since the plan was made, and a plan that stops matching
 *    holds nothing of its own. A block freed where the next planned block
 *    starts stays there, parked for it (park.c). One that does not match
 *    is a deviation (the cursor resyncs on a match a few positions ahead);
 *    more than a quarter of a step deviating drops the plan.
 *  - Switching and settling: a plan in its own arena moves idle chunks
 *    into it and gives the rest back when it starts; after the first step
 *    served with no deviation, idle chunks outside the plan's footprint are
 *    given back once. These are the plan's only device calls.
 *  - Variable shapes (elastic plans): a step that allocates in the same
 *    order and with the same lifetimes as the last, only smaller or larger
 *    (a new sequence length every step), matches on each allocation's
 *    signature (pl_rec: its stream and the frees since the last one), not
 *    its size. A second detector confirms such a period (detect_elastic);
 *    the plan lays each position out at the largest size it has had, in
 *    an arena of its own (layout B), and serves a block of the same
 *    signature at any size up to that, so every step no longer than the
 *    longest seen makes no device call. A step whose first allocation is
 *    larger than its slot is longer than any before: it is laid out before
 *    it runs at sizes foreseen from that one (foresee.c, foresee()), and
 *    maps what it needs past the last layout as new memory. A step that
 *    grows past its slots otherwise (or past its forecast)
 *    is placed best fit in the plan's arena, tight (gm__gp_tighten), and
 *    laid out again at its end (replan), around the granules it left
 *    unmapped (find_holes: nothing is moved back); a dropped
 *    elastic plan stays tight until it is made again. After a deviation
 *    the cursor resyncs on a signature, or on a block's exact size (a
 *    short step may free otherwise before a gradient). Measured:
 *    bench/gpumem_policy_tradeoff.md ("Variable shapes").
 *  - Work: a layout costs about its intervals times the blocks live around
 *    them, and elastic steps may ask for one every other step: the loops
 *    count their steps against a budget that grows with the operations
 *    (layout.h); past it no layout is made, and the usual placement serves.
 *  - Streams: the plan serves its own stream from that stream's arena, so a
 *    range is reused only by the stream that freed it (stream order makes
 *    that safe, as for every arena); the front end hands a block with
 *    pending record_stream uses to the policy only after its events
 *    completed.
 */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef GP_PLAN_DEBUG
#include <time.h>
#endif

#define PL_MAXP (PL_HIST / 4) /* longest step, in allocations */
_Static_assert(2 * PL_MAXP < UINT16_MAX, "gp_block.slot holds 1 + a position of two steps");
#define PL_MINP 8             /* shortest step */
#define PL_MINRUN 64          /* allocations matched before a period counts */
#define PL_W 8                /* allocations hashed to propose a period */
#define PL_TAB (1u << 14)     /* hash table of windows (256 KiB: stays in cache) */
#define PL_TRIES 8            /* plans made before the detector gives up */
#define PL_RESYNC 8           /* positions searched ahead after a deviation */
#define PL_RESYNC_ELASTIC 64  /* the same for an elastic plan (a short step may skip a few allocations) */
#define PL_GROW_RUN 4         /* elastic: steps in a row that grew before variable shapes are given up */
#ifndef PL_WARM
#define PL_WARM (PL_HIST / 2) /* gpumem_slack:auto: allocations warmed up tight at most */
#endif

static bool keep_planned_st(gp_state *st, const gp_chunk *c);

int gm__gp_plan_create(gp_state *st) {
    gp_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return GM_ENOHOSTMEM;
    pl->hist = calloc(PL_HIST, sizeof *pl->hist);
    pl->tab = calloc(PL_TAB, sizeof *pl->tab);
    pl->tab2 = calloc(PL_TAB, sizeof *pl->tab2);
    if (!pl->hist || !pl->tab || !pl->tab2) {
        st->plan = pl;
        gm__gp_plan_destroy(st);
        return GM_ENOHOSTMEM;
    }
    st->plan = pl;
    st->keep = keep_planned_st;
    return GM_OK;
}

void gm__gp_plan_destroy(gp_state *st) {
    gp_plan *pl = st->plan;
    if (!pl) return;
    st->keep = NULL;
    PLOG("end: %llu allocations, state %d, plan from %llu\n", (unsigned long long)pl->n, pl->state, (unsigned long long)pl->start);
#ifdef GP_PLAN_DEBUG
    const char *hd = getenv("GP_PLAN_HIST"); /* the allocations remembered, for study offline */
    FILE *hf = hd ? fopen(hd, "w") : NULL;
    if (hf) {
        for (uint64_t i = pl->n > PL_HIST ? pl->n - PL_HIST : 0; i < pl->n; i++)
            fprintf(hf, "%llu %llu %llu %lld %lld %llu\n", (unsigned long long)i, (unsigned long long)rec(pl, i)->units, (unsigned long long)rec(pl, i)->stream,
                    (long long)rec(pl, i)->birth, (long long)rec(pl, i)->death, (unsigned long long)rec(pl, i)->live);
        fclose(hf);
    }
#endif
    free(pl->hist), free(pl->tab), free(pl->tab2);
    free(pl->tsig), free(pl->tunits), free(pl->off), free(pl->tstream), free(pl->planned), free(pl->inmain);
    free(pl->pend), free(pl->items), free(pl->fp), free(pl->holes), free(pl->tmax);
    free(pl->park_to), free(pl->park_src), free(pl->parked);
    free(pl);
    st->plan = NULL;
}

static inline bool same(gp_plan *pl, uint64_t i, uint64_t j) {
    const pl_rec *a = rec(pl, i), *b = rec(pl, j);
    return a->units == b->units && a->stream == b->stream;
}
/* The plan serves the stream of the largest block of the step of P
 * allocations from allocation `from`. */
static void plan_stream(gp_plan *pl, uint64_t from, uint64_t P) {
    uint64_t big = 0;
    for (uint64_t k = 0; k < P; k++) {
        const pl_rec *r = rec(pl, from + k);
        if (r->units > big) big = r->units, pl->pstream = r->stream;
    }
}

/* Elastic, a plan made again: the phase of the last one (its first
 * PL_W signatures), so that the largest sizes it kept per position
 * (tunits) stay in place; none found: least_live, and they are forgotten. */
static uint64_t same_phase(gp_plan *pl, uint64_t p, uint64_t P, uint64_t least_live) {
    for (uint64_t i = p - P + 1; i + PL_W <= p + 1; i++) {
        uint64_t j = 0;
        while (j < PL_W && rec(pl, i + j)->sig == pl->tsig[j]) j++;
        if (j == PL_W) return i;
    }
    pl->vP = 0;
    return least_live;
}

/* Period P confirmed at allocation p: the plan starts at the phase with the
 * least memory live, one step after the last time it was there. */
static void make_plan(gp_plan *pl, uint64_t p, uint64_t P, bool elastic) {
    pl->tries += !(elastic && pl->eP);
    uint64_t phi = p;
    for (uint64_t i = p - P + 1; i < p; i++)
        if (rec(pl, i)->live < rec(pl, phi)->live) phi = i;
    if (elastic && pl->vP == P) phi = same_phase(pl, p, P, phi);
    if (phi < 2 * P) return; /* the layout needs the whole step before phi */
    plan_stream(pl, phi - P, P);
    pl->P = P;
    pl->start = phi + P;
    pl->state = PL_PENDING;
    pl->elastic = elastic;
    PLOG("%speriod %llu confirmed at %llu: least live at %llu, plan from %llu\n", elastic ? "elastic " : "", (unsigned long long)P, (unsigned long long)p, (unsigned long long)phi, (unsigned long long)pl->start);
}

/* ---- detection ------------------------------------------------------------- */

static inline uint64_t rotl64(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }

/* A cyclic polynomial (buzhash) over the window of the last PL_W tokens
 * (token in enters at p, out leaves), O(1) per allocation: the allocation
 * number + 1 at which the same window was last seen in tab (0: never). */
static uint64_t window_seen(struct pl_slot *tab, uint64_t *wh, uint64_t in, uint64_t out, uint64_t p) {
    *wh = rotl64(*wh, 1) ^ in;
    if (p >= PL_W) *wh ^= rotl64(out, PL_W);
    if (p + 1 < PL_W) return 0;
    uint64_t h = *wh * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    struct pl_slot *sl = &tab[h & (PL_TAB - 1)];
    uint64_t q = sl->key == h ? sl->pos : 0;
    sl->key = h;
    sl->pos = p + 1;
    return q;
}

static void detect(gp_plan *pl, uint64_t p) {
    if (pl->cand && same(pl, p, p - pl->cand)) {
        pl->run++;
    } else {
        pl->cand = pl->run = 0;
        if (pl->state == PL_PENDING && !pl->elastic) pl->state = PL_NONE, PLOG("step changed at %llu before the plan began\n", (unsigned long long)p); /* the step changed before it began */
    }
    const pl_rec *in = rec(pl, p), *out = p >= PL_W ? rec(pl, p - PL_W) : NULL;
    uint64_t q = window_seen(pl->tab, &pl->wh, mix(in->units, in->stream), out ? mix(out->units, out->stream) : 0, p);
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
        make_plan(pl, p, pl->cand, false);
}

/* While a plan serves, the exact detector rests: its hashing and table
 * writes were a good part of the serving path's instructions (callgrind;
 * note_alloc in bench/RESULTS.md, "warm allocator ops of the default").
 * When the plan drops, the window hash and the table catch up over the
 * history, so the detector goes on as if it had run throughout: the hash
 * holds the last PL_W allocations only, and a table entry older than the
 * history is never a period (P <= PL_MAXP). */
static void detect_catch_up(gp_plan *pl) {
    uint64_t from = pl->n > PL_HIST ? pl->n - PL_HIST : 0;
    pl->work += pl->n - from;
    pl->wh = 0;
    for (uint64_t p = from; p < pl->n; p++) {
        const pl_rec *in = rec(pl, p);
        if (p < from + PL_W && p >= PL_W) { /* its window starts before the history: the hash only */
            pl->wh = rotl64(pl->wh, 1) ^ mix(in->units, in->stream);
            continue;
        }
        (void)window_seen(pl->tab, &pl->wh, mix(in->units, in->stream),
                          p >= PL_W ? mix(rec(pl, p - PL_W)->units, rec(pl, p - PL_W)->stream) : 0, p);
    }
}

/* A step frees what it allocates: of the allocations of the step before
 * the last, at most one in eight still lives. A layer loop (its sizes may
 * differ layer by layer) keeps its activations for the backward pass.
 * O(P): looked at once every PL_MINRUN allocations at most. */
static bool closed(gp_plan *pl, uint64_t p, uint64_t P) {
    if (pl->closed_at && p < pl->closed_at + PL_MINRUN) return false;
    pl->closed_at = p;
    uint64_t alive = 0;
    for (uint64_t i = p - 2 * P + 1; i <= p - P; i++) alive += rec(pl, i)->death < 0;
    return alive * 8 <= P;
}

/* Variable shapes: the same detector over the allocations' signatures
 * (pl_rec: stream and frees, not units), so that steps with other sizes
 * match. A period whose units all repeat is the exact detector's (or a
 * layer loop's, whose live memory grows: the exact detector refuses it), so
 * a period counts here only if some allocation of its last step differs in
 * size, and only if the step is closed(). */
static void detect_elastic(gp_plan *pl, uint64_t p) {
    const pl_rec *in = rec(pl, p);
    if (pl->eP && pl->cand2 != pl->eP && p >= 2 * pl->eP) { /* the period known: windows of layer loops mislead */
        pl->cand2 = pl->eP;
        pl->run2 = pl->diff2 = 0;
    }
    if (pl->cand2 && rec(pl, p - pl->cand2)->sig == in->sig) {
        pl->run2++;
        if (rec(pl, p - pl->cand2)->units != in->units) pl->diff2 = p;
    } else {
        pl->cand2 = pl->run2 = 0;
        if (pl->eP) pl->cand2 = pl->eP;
        if (pl->state == PL_PENDING && pl->elastic) pl->state = PL_NONE, PLOG("elastic step changed at %llu before the plan began\n", (unsigned long long)p);
    }
    uint64_t q = window_seen(pl->tab2, &pl->wh2, in->sig, p >= PL_W ? rec(pl, p - PL_W)->sig : 0, p);
    if (!pl->cand2 && q) {
        uint64_t P = p + 1 - q;
        if (P >= PL_MINP && P <= PL_MAXP && p >= 2 * P) {
            uint64_t i = p;
            pl->diff2 = 0;
            for (; i > p - P - 1 && rec(pl, i)->sig == rec(pl, i - P)->sig; i--)
                if (!pl->diff2 && rec(pl, i)->units != rec(pl, i - P)->units) pl->diff2 = i;
            pl->cand2 = P;
            pl->run2 = p - i;
        }
    }
    /* once an elastic plan served a step, only that period again (and
     * without counting tries): a dropped plan comes back, a layer loop
     * whose sizes differ never replaces it */
    if (pl->state == PL_NONE && !pl->marked && pl->cand2 && pl->run2 >= pl->cand2 && pl->run2 >= PL_MINRUN &&
        (pl->eP ? pl->cand2 == pl->eP : pl->tries < PL_TRIES) && p >= 2 * pl->cand2 && pl->diff2 + pl->cand2 > p &&
        closed(pl, p, pl->cand2))
        make_plan(pl, p, pl->cand2, true);
}

/* An allocation's signatures now (pl_rec): from its stream and the frees since the last one. */
typedef struct sigs {
    uint64_t s0, sig;
    uint16_t born; /* s0 = mix(born, stream); kept in the block (gp_block.born) */
} sigs;
static inline sigs cur_sigs(const gp_plan *pl, gm_stream stream) {
    uint16_t born = (uint16_t)((pl->nfree < 8 ? pl->nfree : 8) + 1);
    uint64_t s0 = mix(born, stream);
    return (sigs){s0, mix(pl->fsig ^ s0, stream), born};
}

/* Block b allocated: its record, and in the block what the plan reads back
 * at its free (serial, born). s: cur_sigs() before this allocation, worked
 * out once by the caller. */
static void note_alloc(gp_plan *pl, gp_block *b, uint64_t units, gm_stream stream, sigs s) {
    uint64_t p = pl->n++;
    b->serial = p;
    b->born = s.born;
    *rec(pl, p) = (pl_rec){units, stream, pl->op++, -1, pl->live, s.s0, s.sig};
    pl->fsig = pl->nfree = 0;
    pl->live += units;
    if (pl->state == PL_ACTIVE) return; /* detect_catch_up when it drops */
    detect(pl, p);
    if (!pl->no_elastic) detect_elastic(pl, p);
}

/* ---- activation, settling, dropping ----------------------------------------- */

/* A forecast laid out no more (foresee.c): the largest sizes seen come back. */
static void unforesee(gp_plan *pl) {
    for (uint64_t k = 0; k < pl->P; k++) pl->tunits[k] = pl->tunits[k + pl->P] = pl->tmax[k];
    pl->foreseen = false;
}

static void drop(gp_state *st) {
    gp_plan *pl = st->plan;
    if (pl->foreseen) unforesee(pl);
    gm__gp_plan_unpark_all(st, pl);
    PLOG("drop at %llu: peak %.1f MiB held %.1f MiB\n", (unsigned long long)pl->n, st->d->stats.reserved_bytes[GM_POOL_ALL].peak / 1048576.0, st->held_bytes / 1048576.0);
    if (pl->ra) (void)gm__gp_va_index(pl->ra, false);
    if (pl->ma) (void)gm__gp_va_index(pl->ma, false);
    pl->ra = pl->ma = NULL;
    pl->state = PL_NONE;
    gm__gp_set_stale_first(st, false);
    pl->cand = pl->run = 0;
    detect_catch_up(pl);
    pl->grew = pl->growing = false;
    /* elastic: the plan's arena holds the longest step's memory, which the
     * usual placement cannot use: tight until the plan is made again */
    if (pl->eP) gm__gp_tighten(st);
}

/* Small blocks back into their arenas and every arena's frees synced, so
 * what is idle can be given back or moved: before a switch, a settle, or
 * the end of the warm-up. */
static void quiesce(gp_state *st) {
    gm__gp_flush_quick(st);
    gm__gp_unpark_all(st);
    for (uint32_t k = 0; k < st->narenas; k++) gm__gp_sync_arena(st, st->arenas[k]);
}

/* Idle chunks the plan will use again: its own arena's, or (layout A) any
 * under its footprint in the stream's arena. */
static bool keep_planned_st(gp_state *st, const gp_chunk *c) {
    const gp_plan *pl = st->plan;
    if (c->arena < 0 || pl->state != PL_ACTIVE) return false;
    /* B: its own arena, up to the layout's top (an elastic plan's arena
     * may have grown past it while a step grew) */
    if (pl->rebase)
        return c->arena == pl->ra->index && (!pl->elastic || ((uint64_t)c->g0 << (st->gshift - GP_ALIGN_SHIFT)) < pl->top_units);
    if (c->arena != pl->ma->index) return false;
    for (uint64_t g = (uint64_t)c->g0; g < (uint64_t)c->g0 + c->n && g / 64 < pl->fp_words; g++)
        if (pl->fp[g / 64] >> (g % 64) & 1) return true;
    return false;
}

static bool keep_planned(void *arg, const gp_chunk *c) { return keep_planned_st(arg, c); }

/* Elastic, laid out again: a step that grew (tight) moved idle granules of
 * the plan's arena from under the old top to above it; laid out over [0,
 * top), the switch moved each back, an unmap and a map each
 * (bench/RESULTS.md, "short steps and re-layouts", has bert_varlen's
 * calls). So B goes around the unmapped runs below the highest mapped
 * granule (hole_top), obstacles for the whole period. */
static int find_holes(gp_state *st, gp_plan *pl) {
    const gp_arena *pa = pl->pa;
    uint64_t hm = pa && pa->gran && pl->elastic ? pa->ngran : 0, n = 0, gu = st->gran >> GP_ALIGN_SHIFT;
    pl->work += 2 * hm; /* its two scans */
    while (hm && pa->gran[hm - 1] < 0) hm--;
    for (uint64_t g = 0; g < hm; g++) n += pa->gran[g] < 0 && (g == 0 || pa->gran[g - 1] >= 0);
    pl->hole_top = pl->nh = 0;
    if (n && !gm__realloc_array(&pl->holes, n, sizeof *pl->holes)) return GM_ENOHOSTMEM;
    for (uint64_t g = 0, e; g < hm && n; g = e) {
        for (e = g; e < hm && pa->gran[e] < 0; e++) {}
        if (e == g) e++;
        else pl->holes[pl->nh++] = (pl_item){(e - g) * gu, g * gu, 0, INT64_MAX, PL_OBST, 0, ~(uint64_t)0};
    }
    pl->hole_top = pl->nh ? hm : 0;
    return GM_OK;
}

static void activate(gp_state *st) {
    gp_plan *pl = st->plan;
    gp_arena *a, *ra;
    pl->state = PL_NONE;
    if (gm__gp_arena_of(st, pl->pstream, GM_POOL_LARGE, &a) || !a->gran) {
        PLOG("no large arena mapped for stream %llu at %llu: no plan\n", (unsigned long long)pl->pstream, (unsigned long long)pl->n);
        return;
    }
    if (pl->work + pl->wait >= pl_work_allowed(pl)) { /* the budget (layout.h): served as if no plan */
        pl->starved++;
        PLOG("no layout at %llu: %llu steps of work spent, %llu allowed\n", (unsigned long long)pl->n, (unsigned long long)pl->work, (unsigned long long)pl_work_allowed(pl));
        return;
    }
#ifdef GP_PLAN_DEBUG
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int lrc = find_holes(st, pl) ? GM_ENOHOSTMEM : gm__gp_plan_solve(st, pl, a);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    PLOG("layout took %.1f ms\n", (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    if (lrc) return;
#else
    if (find_holes(st, pl) || gm__gp_plan_solve(st, pl, a)) return; /* served as before */
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
         * block it was one create + map per planned block, more calls in all:
         * bench/gpumem_policy_tradeoff.md, "The layout solver, third pass").
         * Out of memory here only means the rest is mapped block by block. */
        quiesce(st);
        pl->state = PL_ACTIVE; /* for keep_planned */
        pl->ra = ra;
        pl->ma = a;
        /* idle chunks move into the plan's arena (unmap + map) rather than
         * being given back and made anew (4 calls; at 1.01x capacity, one
         * granule each); what is left idle is then given back */
#ifdef GP_PLAN_DEBUG
        {
            uint64_t tg = (pl->top_units << GP_ALIGN_SHIFT) >> st->gshift, holes = 0, above = 0;
            for (uint64_t g = 0; g < ra->ngran; g++) {
                if (ra->gran[g] >= 0 && g >= tg) above++;
                if (ra->gran[g] < 0 && g < tg) holes++;
            }
            PLOG("switch: top %llu granules, holes under it %llu, mapped above %llu; calls %llu\n", (unsigned long long)tg, (unsigned long long)holes, (unsigned long long)above,
                 (unsigned long long)(st->d->stats.num_map + st->d->stats.num_unmap + st->d->stats.num_phys_create + st->d->stats.num_phys_release));
            for (uint32_t k = 0; k < st->narenas; k++)
                PLOG("  arena %u pool %d mapped %.1f MiB\n", k, st->arenas[k]->pool, st->arenas[k]->mapped_bytes / 1048576.0);
        }
#endif
        /* a forecast (foresee.c) is for a longer step: it maps new memory,
         * once what it does not keep is given back */
        gm__gp_set_soft_cap(st, pl->foresee ? 0 : st->held_bytes);
        if (pl->foresee) gm__gp_release_unused_but(st, keep_planned, st);
        /* elastic, laid out again: the layout left the holes below
         * hole_top out (find_holes), so only what lies past it is mapped */
        uint64_t from = pl->hole_top << st->gshift, top = pl->top_units << GP_ALIGN_SHIFT;
        if (top > from) (void)gm__gp_ensure_mapped(st, ra, ra->base + from, top - from);
        gm__gp_set_soft_cap(st, 0);
        gm__gp_release_unused_but(st, keep_planned, st);
        gm__gp_live_drop(st);
    }
    pl->ra = ra;
    pl->ma = a;
    pl->state = PL_ACTIVE;
    gm__gp_set_stale_first(st, pl->elastic);
    memset(pl->parked, 0, 2 * pl->P * sizeof *pl->parked);
    pl->cur = pl->dev_step = 0;
    pl->settled = pl->grew = pl->growing = false;
    pl->bound[2] = pl->n, pl->bound[1] = pl->n - pl->P, pl->bound[0] = pl->n - 2 * pl->P; /* laid out from those */
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
    quiesce(st);
    gm__gp_release_unused_but(st, keep_planned, st);
#ifdef GP_PLAN_DEBUG
    for (uint32_t k = 0; k < st->narenas; k++)
        PLOG("  after: arena %u mapped %.1f MiB, small requested %.1f MiB\n", k, st->arenas[k]->mapped_bytes / 1048576.0, st->d->stats.requested_bytes[GM_POOL_SMALL].current / 1048576.0);
#endif
}

/* The cursor at a step's first position (it runs over two steps, 0..2P-1):
 * compared, not cur % P, as this runs on every allocation and a division
 * costs more than an instruction count shows (bench/RESULTS.md, "warm ops
 * after the branch work"). */
static inline bool step_start(const gp_plan *pl) { return pl->cur == 0 || pl->cur == pl->P; }

static void advance(gp_state *st) {
    gp_plan *pl = st->plan;
    if (++pl->cur == 2 * pl->P) pl->cur = 0; /* a resync stays below 2P */
    if (!step_start(pl)) return;
    pl->growing = false;
    pl->bound[0] = pl->bound[1], pl->bound[1] = pl->bound[2], pl->bound[2] = pl->n + 1; /* the next step's first */
    PLOG("step end at %llu: peak %.1f MiB calls %llu held %.1f MiB dev %llu grew %d\n", (unsigned long long)pl->n, st->d->stats.reserved_bytes[GM_POOL_ALL].peak / 1048576.0,
         (unsigned long long)(st->d->stats.num_map + st->d->stats.num_unmap + st->d->stats.num_phys_create + st->d->stats.num_phys_release),
         st->held_bytes / 1048576.0, (unsigned long long)pl->dev_step, pl->grew);
    gm__gp_loosen(st); /* a step served from the plan: the warm-up is over */
    if (pl->elastic) pl->eP = pl->P;
    if (!pl->grew && !pl->foreseen) pl->grow_run = 0;
    if (!pl->grew) pl->foreseen = false; /* a forecast that hosted its step: its sizes are the largest now */
    /* settling syncs and gives back: not during a capture (a later step settles) */
    if (!pl->settled && pl->dev_step == 0 && !pl->grew && !gm__device_capturing(st->d)) settle(st);
    pl->dev_step = 0;
}

static void deviation(gp_state *st) {
    gp_plan *pl = st->plan;
    /* elastic: a short step may skip allocations, and the ones after differ in signature for a while */
    if (++pl->dev_step > (pl->elastic ? pl->P / 2 : pl->P / 4) + 4) drop(st);
}

/* ---- ops ------------------------------------------------------------------- */

/* Position c of the plan takes this allocation: the same units and stream,
 * or (elastic) the same signature and at most the planned units. */
static inline bool fits(const gp_plan *pl, uint64_t c, uint64_t units, gm_stream stream, uint64_t sig) {
    if (pl->tstream[c] != stream) return false;
    return pl->elastic ? pl->tsig[c] == sig && units <= pl->tunits[c] : pl->tunits[c] == units;
}

/* Elastic, resyncing after a deviation: a position of exactly this size
 * (a block whose size does not scale, such as a weight's gradient) takes
 * it whatever its signature. A short step that skips kernels frees
 * otherwise before it, so the cursor stayed off: bert_varlen's short steps
 * put its embedding gradient in new memory, and a later large block met a
 * small slot of its signature and was taken for a longer step (tight:
 * calls in steps no longer than the longest; a guard against growing after
 * a deviation did as well in replay but dropped the plan at bench_hotpath's
 * pass boundaries, more layouts: bench/RESULTS.md, "short steps and
 * re-layouts"). */
static inline bool same_size(const gp_plan *pl, uint64_t c, uint64_t units, gm_stream stream) {
    return pl->elastic && pl->tunits[c] == units && pl->tstream[c] == stream && units > GP_SMALL_UNITS;
}

/* Elastic, the rest of a step that grew past the plan: its large blocks of
 * the plan's stream go best fit into the plan's own arena, over the memory
 * it maps already (the slots of the longest step so far, mostly idle), and
 * past its end only for what is new; the step is laid out again at its end.
 * Else (0) the usual placement. */
static int unplanned(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out) {
    gp_plan *pl = st->plan;
    if (!pl->growing || !pl->rebase || stream != pl->pstream || units <= GP_SMALL_UNITS) return 0;
    gp_block *b;
    if (gm__gp_va_place(st, pl->ra, units, &b) != GM_OK) return 0;
    b->h.pool = (uint8_t)pool;
    *out = b;
    return 1;
}

static int serve(gp_state *st, uint64_t units, int pool, gm_stream stream, uint64_t sig, gp_block **out) {
    gp_plan *pl = st->plan;
    if (!pl->ra->fidx || !pl->ma->fidx) { /* an index could not grow */
        drop(st);
        return 0;
    }
    uint64_t c = pl->cur;
    bool grown = false;
    if (!fits(pl, c, units, stream, sig)) {
        PLOG("mismatch at %llu pos %llu: %llu units, plan %llu\n", (unsigned long long)pl->n, (unsigned long long)c, (unsigned long long)units, (unsigned long long)pl->tunits[c]);
        /* elastic: the position, larger than any step before: the step
         * grows (unplanned(), tight), and is laid out again at its end */
        grown = pl->elastic && pl->tsig[c] == sig && pl->tstream[c] == stream;
        if (!grown) {
            deviation(st);
            if (pl->state != PL_ACTIVE) return 0;
            uint64_t k = 1, ahead = pl->elastic ? PL_RESYNC_ELASTIC : PL_RESYNC;
            while (k <= ahead && c + k < 2 * pl->P && !fits(pl, c + k, units, stream, sig) && !same_size(pl, c + k, units, stream)) k++;
            if (k > ahead || c + k >= 2 * pl->P) return unplanned(st, units, pool, stream, out);
            pl->cur = c = c + k;
        }
    }
    if (grown && !pl->growing) { /* tight for the rest of the step: what is new comes from idle memory */
        pl->grew = pl->growing = true;
        gm__gp_plan_unpark_all(st, pl); /* best fit places the rest: parked ranges are free memory again */
        gm__gp_tighten(st);
    }
    bool growing = pl->growing;
    advance(st); /* ends growing at the step's end */
    if (growing) return unplanned(st, units, pool, stream, out);
    if (!pl->planned[c] || (pl->elastic && units <= GP_SMALL_UNITS)) return 0; /* small blocks stay small */
    gp_block *b;
    /* laid over the mapped memory (layout A), the plan maps nothing of its
     * own before it settled: a plan that falls apart in its first step then
     * held no more than the usual placement would have */
    gp_arena *a = gm__gp_plan_arena(pl, c);
    gm_devptr at = a->base + (pl->off[c] << GP_ALIGN_SHIFT);
    if (pl->parked[c] && (b = gm__gp_plan_claim(st, pl, a, c, at, units)) != NULL) {
        pl->claimed++;
        goto served;
    }
    int rc = gm__gp_va_place_at(st, a, at, units, pl->rebase || pl->settled || gm__gp_warming(st), &b);
    if (rc == 2) return 0;
    if (rc <= 0) {
#ifdef GP_PLAN_DEBUG
        for (const gp_block *o = a->head; o && rc == 0; o = o->next)
            if (o->state == GP_USED && o->h.ptr < at + (units << GP_ALIGN_SHIFT) && at < o->h.ptr + o->h.size)
                PLOG("slot %llu (%llu units) at %llu taken by serial %llu (pos %lld, %llu units)\n", (unsigned long long)c, (unsigned long long)units, (unsigned long long)pl->n, (unsigned long long)o->serial, (long long)(o->serial - pl->start) % (long long)pl->P, (unsigned long long)(o->h.size >> 9));
#endif
        if (rc == 0) deviation(st); /* something else is there */
        return rc;
    }
served:
    b->h.pool = (uint8_t)pool;
    b->slot = (uint16_t)(c + 1);
    pl->served++;
    *out = b;
    return 1;
}

/* Elastic, at a step's end: may the last two steps be laid out anew? */
static bool relayout_ok(const gp_plan *pl) {
    uint64_t P = pl->P, n = pl->n;
    /* the last two steps as the cursor followed them, each P allocations
     * (a short step skipped some: its positions would not align) */
    if (pl->bound[2] != n || pl->bound[1] + P != n || pl->bound[0] + P != pl->bound[1]) return false;
    uint64_t differ = 0; /* positions the layout leaves out */
    for (uint64_t k = 0; k < P; k++)
        differ += rec(pl, n - 2 * P + k)->sig != rec(pl, n - P + k)->sig;
    return differ <= P / 16;
}

/* Elastic, a step that grew: after PL_GROW_RUN in a row (a generate
 * loop's caches) no plan pays, and elastic plans are given up: true. */
static bool give_up(gp_state *st) {
    gp_plan *pl = st->plan;
    if (++pl->grow_run <= PL_GROW_RUN) return false;
    PLOG("elastic: %u steps in a row grew, given up at %llu\n", PL_GROW_RUN, (unsigned long long)pl->n);
    pl->eP = 0;
    pl->no_elastic = true;
    drop(st);
    gm__gp_loosen(st);
    quiesce(st);
    (void)gm__gp_release_unused(st);
    return true;
}

/* Elastic, at a step's end: a step grew past the plan, so the last two
 * steps (if they allocated alike) are laid out anew, with each position at
 * the largest size it has had. Else the plan serves on, and this is tried
 * again at the next step's end. */
static void replan(gp_state *st) {
    gp_plan *pl = st->plan;
    uint64_t n = pl->n;
    if (!relayout_ok(pl)) return;
    if (!pl->foreseen && give_up(st)) return; /* a forecast that fell short counted its step already */
    PLOG("elastic: a step grew, laid out again at %llu\n", (unsigned long long)n);
    pl->grew = false;
    drop(st);
    pl->start = n;
    activate(st);
}

/* Elastic, a step's first allocation larger than its slot: the step is
 * longer than any before, so it is laid out now at sizes foreseen from
 * this one (foresee.c) rather than grown into the last layout. A block
 * that outgrows its forecast grows the step as before (laid out again at
 * its end); else the forecast's sizes are the largest seen from then on. */
static void foresee(gp_state *st, uint64_t units, gm_stream stream, uint64_t sig) {
    gp_plan *pl = st->plan;
    uint64_t c = pl->cur, P = pl->P;
    if (units <= pl->tunits[c] || pl->tsig[c] != sig || pl->tstream[c] != stream ||
        gm__device_capturing(st->d) || !relayout_ok(pl) || !gm__realloc_array(&pl->tmax, P, sizeof *pl->tmax))
        return;
    pl->fref = c % P, pl->fx = units, pl->fX = pl->tunits[c];
    if (!gm__gp_plan_foresee_ok(pl, pl->n - 2 * P, pl->n - P) || give_up(st)) return;
    memcpy(pl->tmax, pl->tunits, P * sizeof *pl->tmax);
    PLOG("elastic: step longer than any at %llu (%llu units, planned %llu): laid out from a forecast\n", (unsigned long long)pl->n, (unsigned long long)units, (unsigned long long)pl->fX);
    drop(st);
    gm__gp_loosen_granules(st); /* what the forecast needs past the last layout is new memory */
    pl->start = pl->n;
    pl->foresee = true;
    activate(st);
    pl->foresee = false;
    pl->foreseen = true; /* the tunits are the forecast's, plan or not */
    if (pl->state != PL_ACTIVE) { /* no forecast fits: the plan as it was, the step grows into it */
        PLOG("elastic: no forecast fits at %llu\n", (unsigned long long)pl->n);
        unforesee(pl);
        gm__gp_tighten(st);
        pl->grow_run--; /* the step counts when it is laid out again at its end */
        activate(st);
    }
}

int gm__gp_plan_malloc(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out) {
    gp_plan *pl = st->plan;
    sigs s = cur_sigs(pl, stream); /* nothing below frees: they hold until note_alloc */
    /* a re-layout syncs and gives back: not during a capture (the next step's end tries again) */
    if (pl->state == PL_ACTIVE && pl->grew && step_start(pl) && !gm__device_capturing(st->d)) replan(st);
    if (pl->state == PL_PENDING && pl->n == pl->start) {
        const pl_rec *r = rec(pl, pl->start - pl->P); /* the step must begin as the last one did */
        bool alike = pl->elastic ? r->sig == s.sig : r->units == units;
        /* a switch syncs and gives back, which a capture does not allow: the
         * plan is not started (the detector tries again at later marks) */
        if (gm__device_capturing(st->d)) pl->state = PL_NONE, PLOG("no switch during a capture at %llu\n", (unsigned long long)pl->n);
        else if (alike && r->stream == stream) activate(st);
        else pl->state = PL_NONE, PLOG("the step begins otherwise at %llu: %llu units, the last %llu\n", (unsigned long long)pl->n, (unsigned long long)units, (unsigned long long)r->units);
    }
    if (pl->state == PL_ACTIVE && pl->elastic && pl->rebase && step_start(pl)) foresee(st, units, stream, s.sig);
    if (pl->state != PL_ACTIVE) return 0;
    int rc = serve(st, units, pool, stream, s.sig, out);
    if (rc == 1) note_alloc(pl, *out, units, stream, s);
    return rc;
}

void gm__gp_plan_placed(gp_state *st, gp_block *b) {
    gp_plan *pl = st->plan;
    gm_stream stream = st->arenas[b->arena]->stream;
    note_alloc(pl, b, b->h.size >> GP_ALIGN_SHIFT, stream, cur_sigs(pl, stream));
    /* gpumem_slack:auto and no plan serves yet: warming up tight costs
     * device calls in every step, so it ends when the detector gives up or
     * after PL_WARM allocations, whichever comes first. The idle chunks are
     * given back then, once: kept where the tight steps left them, they sat
     * under the later steps' new placements and the run held more
     * (bench/gpumem_policy_tradeoff.md, "Tight warm-up, then the plan") */
    if (gm__gp_warming(st) && pl->state != PL_ACTIVE && !pl->eP && (pl->tries >= PL_TRIES || pl->n >= PL_WARM) &&
        !gm__device_capturing(st->d)) { /* it syncs and gives back: the first allocation after a capture */
        gm__gp_loosen(st);
        quiesce(st);
        (void)gm__gp_release_unused(st);
    }
}

bool gm__gp_plan_free(gp_state *st, gp_block *b) {
    gp_plan *pl = st->plan;
    pl->live -= b->h.size >> GP_ALIGN_SHIFT;
    /* what the freed block's allocation looked like, whatever its size: its
     * record's sig0, worked out from the block, whose header is in the cache
     * already (the record's line is written, not read) */
    uint64_t s0 = 1;
    if (b->serial < pl->n && pl->n - b->serial <= PL_HIST) rec(pl, b->serial)->death = pl->op, s0 = mix(b->born, b->h.stream);
    pl->fsig = rotl64(pl->fsig, 5) ^ s0 * 0x9e3779b97f4a7c15ull;
    pl->nfree++;
    pl->op++;
    return b->slot && pl->state == PL_ACTIVE && !pl->growing && gm__gp_plan_park(st, pl, b);
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
    plan_stream(pl, pl->mark[1], P);
    pl->tries++;
    pl->P = P;
    pl->start = pl->n;
    pl->state = PL_PENDING;
    PLOG("marked steps of %llu alike: plan from %llu\n", (unsigned long long)P, (unsigned long long)pl->start);
}
