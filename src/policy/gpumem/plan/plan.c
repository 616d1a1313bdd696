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
 *  - Variable shapes: steps whose sizes change from one to the next (a
 *    new sequence length every step) are no period, and no plan is made:
 *    the usual placement serves them, under the reserve budget
 *    (mem/chunks.c).
 *  - Work: a layout costs about its intervals times the blocks live around
 *    them, and a run may make up to PL_TRIES of them: the loops count
 *    their steps against a budget that grows with the operations
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
#ifndef PL_WARM
#define PL_WARM (PL_HIST / 2) /* gpumem_slack:auto: allocations warmed up tight at most */
#endif

static bool keep_planned_st(gp_state *st, const gp_chunk *c);

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
    free(pl->hist), free(pl->tab);
    free(pl->tunits), free(pl->off), free(pl->tstream), free(pl->planned), free(pl->inmain);
    free(pl->pend), free(pl->items), free(pl->fp);
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

/* Period P confirmed at allocation p: the plan starts at the phase with the
 * least memory live, one step after the last time it was there. */
static void make_plan(gp_plan *pl, uint64_t p, uint64_t P) {
    pl->tries++;
    uint64_t phi = p;
    for (uint64_t i = p - P + 1; i < p; i++)
        if (rec(pl, i)->live < rec(pl, phi)->live) phi = i;
    if (phi < 2 * P) return; /* the layout needs the whole step before phi */
    plan_stream(pl, phi - P, P);
    pl->P = P;
    pl->start = phi + P;
    pl->state = PL_PENDING;
    PLOG("period %llu confirmed at %llu: least live at %llu, plan from %llu\n", (unsigned long long)P, (unsigned long long)p, (unsigned long long)phi, (unsigned long long)pl->start);
}

/* ---- detection ------------------------------------------------------------- */

static inline uint64_t rotl64(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }

/* An allocation's size and stream hashed (a token of the window hash). */
static inline uint64_t mix(uint64_t units, gm_stream stream) {
    uint64_t x = units * 0xff51afd7ed558ccdull ^ ((uint64_t)stream + 1) * 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 31);
}

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
        if (pl->state == PL_PENDING) pl->state = PL_NONE, PLOG("step changed at %llu before the plan began\n", (unsigned long long)p); /* the step changed before it began */
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
        make_plan(pl, p, pl->cand);
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

/* Block b allocated: its record, and in the block its allocation number,
 * which the plan reads back at its free. */
static void note_alloc(gp_plan *pl, gp_block *b, uint64_t units, gm_stream stream) {
    uint64_t p = pl->n++;
    b->serial = p;
    *rec(pl, p) = (pl_rec){units, stream, pl->op++, -1, pl->live};
    pl->live += units;
    if (pl->state == PL_ACTIVE) return; /* detect_catch_up when it drops */
    detect(pl, p);
}

/* ---- activation, settling, dropping ----------------------------------------- */

static void drop(gp_state *st) {
    gp_plan *pl = st->plan;
    gm__gp_plan_unpark_all(st, pl);
    PLOG("drop at %llu: peak %.1f MiB held %.1f MiB\n", (unsigned long long)pl->n, st->d->stats.reserved_bytes[GM_POOL_ALL].peak / 1048576.0, st->held_bytes / 1048576.0);
    if (pl->ra) (void)gm__gp_va_index(pl->ra, false);
    if (pl->ma) (void)gm__gp_va_index(pl->ma, false);
    pl->ra = pl->ma = NULL;
    pl->state = PL_NONE;
    pl->cand = pl->run = 0;
    detect_catch_up(pl);
}

/* Small blocks back into their arenas and every arena's frees synced, so
 * what is idle can be given back or moved: before a switch or a settle. */
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
    if (pl->rebase) return c->arena == pl->ra->index; /* B: its own arena */
    if (c->arena != pl->ma->index) return false;
    for (uint64_t g = (uint64_t)c->g0; g < (uint64_t)c->g0 + c->n && g / 64 < pl->fp_words; g++)
        if (pl->fp[g / 64] >> (g % 64) & 1) return true;
    return false;
}

static bool keep_planned(void *arg, const gp_chunk *c) { return keep_planned_st(arg, c); }

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
    int lrc = gm__gp_plan_solve(st, pl, a);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    PLOG("layout took %.1f ms\n", (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    if (lrc) return;
#else
    if (gm__gp_plan_solve(st, pl, a)) return; /* served as before */
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
        gm__gp_set_soft_cap(st, st->held_bytes);
        uint64_t top = pl->top_units << GP_ALIGN_SHIFT;
        if (top) (void)gm__gp_ensure_mapped(st, ra, ra->base, top);
        gm__gp_set_soft_cap(st, 0);
        gm__gp_release_unused_but(st, keep_planned, st);
        gm__gp_live_drop(st);
    }
    pl->ra = ra;
    pl->ma = a;
    pl->state = PL_ACTIVE;
    memset(pl->parked, 0, 2 * pl->P * sizeof *pl->parked);
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
    PLOG("step end at %llu: peak %.1f MiB calls %llu held %.1f MiB dev %llu\n", (unsigned long long)pl->n, st->d->stats.reserved_bytes[GM_POOL_ALL].peak / 1048576.0,
         (unsigned long long)(st->d->stats.num_map + st->d->stats.num_unmap + st->d->stats.num_phys_create + st->d->stats.num_phys_release),
         st->held_bytes / 1048576.0, (unsigned long long)pl->dev_step);
    gm__gp_loosen(st); /* a step served from the plan: the warm-up is over */
    gm__gp_set_planned(st);
    /* settling syncs and gives back: not during a capture (a later step settles) */
    if (!pl->settled && pl->dev_step == 0 && !gm__device_capturing(st->d)) settle(st);
    pl->dev_step = 0;
}

static void deviation(gp_state *st) {
    gp_plan *pl = st->plan;
    if (++pl->dev_step > pl->P / 4 + 4) drop(st);
}

/* ---- ops ------------------------------------------------------------------- */

/* Position c of the plan takes this allocation: the same units and stream. */
static inline bool fits(const gp_plan *pl, uint64_t c, uint64_t units, gm_stream stream) {
    return pl->tstream[c] == stream && pl->tunits[c] == units;
}

static int serve(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out) {
    gp_plan *pl = st->plan;
    if (!pl->ra->fidx || !pl->ma->fidx) { /* an index could not grow */
        drop(st);
        return 0;
    }
    uint64_t c = pl->cur;
    if (!fits(pl, c, units, stream)) {
        PLOG("mismatch at %llu pos %llu: %llu units, plan %llu\n", (unsigned long long)pl->n, (unsigned long long)c, (unsigned long long)units, (unsigned long long)pl->tunits[c]);
        deviation(st);
        if (pl->state != PL_ACTIVE) return 0;
        uint64_t k = 1;
        while (k <= PL_RESYNC && c + k < 2 * pl->P && !fits(pl, c + k, units, stream)) k++;
        if (k > PL_RESYNC || c + k >= 2 * pl->P) return 0;
        pl->cur = c = c + k;
    }
    advance(st);
    if (!pl->planned[c]) return 0;
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

int gm__gp_plan_malloc(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out) {
    gp_plan *pl = st->plan;
    if (pl->state == PL_PENDING && pl->n == pl->start) {
        const pl_rec *r = rec(pl, pl->start - pl->P); /* the step must begin as the last one did */
        bool alike = r->units == units;
        /* a switch syncs and gives back, which a capture does not allow: the
         * plan is not started (the detector tries again at later marks) */
        if (gm__device_capturing(st->d)) pl->state = PL_NONE, PLOG("no switch during a capture at %llu\n", (unsigned long long)pl->n);
        else if (alike && r->stream == stream) activate(st);
        else pl->state = PL_NONE, PLOG("the step begins otherwise at %llu: %llu units, the last %llu\n", (unsigned long long)pl->n, (unsigned long long)units, (unsigned long long)r->units);
    }
    if (pl->state != PL_ACTIVE) return 0;
    int rc = serve(st, units, pool, stream, out);
    if (rc == 1) note_alloc(pl, *out, units, stream);
    return rc;
}

void gm__gp_plan_placed(gp_state *st, gp_block *b) {
    gp_plan *pl = st->plan;
    gm_stream stream = st->arenas[b->arena]->stream;
    note_alloc(pl, b, b->h.size >> GP_ALIGN_SHIFT, stream);
    /* gpumem_slack:auto and no plan serves yet: warming up tight costs
     * device calls in every step, so it ends when the detector gives up or
     * after PL_WARM allocations, whichever comes first. What the warm-up
     * left idle stays mapped: the reserve budget moves it where later steps
     * need it. Giving it back here (as the default did before the budget)
     * only made the next steps create it again: bench/RESULTS.md,
     * "2026-12-07 (evening)", "the warm-up's end keeps its memory". */
    if (gm__gp_warming(st) && pl->state != PL_ACTIVE && (pl->tries >= PL_TRIES || pl->n >= PL_WARM))
        gm__gp_loosen(st);
}

bool gm__gp_plan_free(gp_state *st, gp_block *b) {
    gp_plan *pl = st->plan;
    pl->live -= b->h.size >> GP_ALIGN_SHIFT;
    if (b->serial < pl->n && pl->n - b->serial <= PL_HIST) rec(pl, b->serial)->death = pl->op;
    pl->op++;
    return b->slot && pl->state == PL_ACTIVE && gm__gp_plan_park(st, pl, b);
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
