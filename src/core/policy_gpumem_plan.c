/* policy_gpumem_plan.c — gpumem_plan:on: learn the repeating step of a
 * training loop online and serve its allocations from a planned region.
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
 *    live. In the last whole step before it, a block made and freed inside
 *    the step is an interval (units, birth, death); one alive across the
 *    boundary, on another stream than the plan's, or small (<= 1 MiB: its
 *    memory counts in the small pool), is left to the usual placement. Intervals are placed greedily, largest first, each at the
 *    lowest offset free of every interval it overlaps in time. The plan's
 *    region (one used block of the stream's large arena, as large as the
 *    greedy layout) is placed when the next step begins.
 *  - Serving: a cursor follows the step. An allocation that matches the
 *    cursor's units and stream gets its planned offset if no live planned
 *    block overlaps that range (a sorted array of live ranges: whatever
 *    happened since the plan was made, two live blocks never overlap), else
 *    the usual placement. One that does not match is a deviation (the
 *    cursor resyncs on a match a few positions ahead); more than a quarter
 *    of a step's allocations deviating drops the plan, and its region is
 *    given back once its last planned block is freed. Out of memory drops
 *    it too.
 *  - Settling: after the first step served from the plan, every idle chunk
 *    (mapped, no live block) is given back, like empty_cache.
 *  - Streams: only the plan's stream is served from the region, so a range
 *    is reused only by the stream that freed it (stream order makes that
 *    safe, as for the arenas); the front end hands a block with pending
 *    record_stream uses to the policy only after its events completed.
 */
#include "policy_gpumem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#define PL_TAB (1u << 16)     /* hash table of windows */
#define PL_TRIES 8            /* plans made before the detector gives up */
#define PL_RESYNC 8           /* positions searched ahead after a deviation */

enum { PL_NONE, PL_PENDING, PL_ACTIVE, PL_DROPPING };

typedef struct pl_rec {
    uint64_t units;
    gm_stream stream;
    int64_t birth, death; /* operation numbers; death -1 while alive */
    uint64_t live;        /* units live just before this allocation */
} pl_rec;

typedef struct pl_live {
    uint64_t off, end; /* units, inside the region */
    gp_block *b;
} pl_live;

typedef struct pl_item {
    uint64_t units, off;
    int64_t b, e;
    uint32_t k;
} pl_item;

typedef struct gp_plan {
    pl_rec *hist;
    uint64_t n;   /* allocations so far */
    int64_t op;   /* operations (allocations + frees) so far */
    uint64_t live; /* units live */
    uint64_t *tab_key, *tab_pos; /* window hash -> allocation number + 1 */
    uint64_t cand, run;
    int state;
    uint64_t P, start; /* step length; allocation number where serving starts */
    uint64_t *tunits, *off;
    gm_stream *tstream;
    uint8_t *planned;
    uint64_t cap; /* of the per-position arrays */
    uint64_t region_units;
    gm_stream pstream;
    gp_block *region;
    gp_arena *ra;
    uint64_t cur, dev_step;
    bool settled;
    uint32_t tries;
    pl_live *lv;
    uint64_t nlv, lv_cap;
    pl_item *items, *tmp;
    uint64_t served;
} gp_plan;

int gm__gp_plan_create(gp_state *st) {
    gp_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return GM_ENOHOSTMEM;
    pl->hist = calloc(PL_HIST, sizeof *pl->hist);
    pl->tab_key = calloc(PL_TAB, sizeof *pl->tab_key);
    pl->tab_pos = calloc(PL_TAB, sizeof *pl->tab_pos);
    if (!pl->hist || !pl->tab_key || !pl->tab_pos) {
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
    free(pl->tab_key);
    free(pl->tab_pos);
    free(pl->tunits);
    free(pl->off);
    free(pl->tstream);
    free(pl->planned);
    free(pl->lv);
    free(pl->items);
    free(pl->tmp);
    free(pl);
    st->plan = NULL;
}

static inline pl_rec *rec(gp_plan *pl, uint64_t i) { return &pl->hist[i & (PL_HIST - 1)]; }

static inline bool same(gp_plan *pl, uint64_t i, uint64_t j) {
    const pl_rec *a = rec(pl, i), *b = rec(pl, j);
    return a->units == b->units && a->stream == b->stream;
}

/* ---- live planned ranges: sorted by offset, never overlapping ---------- */

/* First live range with off >= x. */
static uint64_t lv_lower(const gp_plan *pl, uint64_t x) {
    uint64_t lo = 0, hi = pl->nlv;
    while (lo < hi) {
        uint64_t m = (lo + hi) / 2;
        if (pl->lv[m].off < x) lo = m + 1;
        else hi = m;
    }
    return lo;
}

/* Is [off, end) free of live planned blocks? Sets *at to the insert index. */
static bool lv_free(const gp_plan *pl, uint64_t off, uint64_t end, uint64_t *at) {
    uint64_t i = lv_lower(pl, off);
    *at = i;
    if (i < pl->nlv && pl->lv[i].off < end) return false;
    if (i > 0 && pl->lv[i - 1].end > off) return false;
    return true;
}

static int lv_insert(gp_plan *pl, uint64_t at, uint64_t off, uint64_t end, gp_block *b) {
    if (pl->nlv == pl->lv_cap) {
        uint64_t cap = pl->lv_cap ? pl->lv_cap * 2 : 256;
        pl_live *n = realloc(pl->lv, cap * sizeof *n);
        if (!n) return GM_ENOHOSTMEM;
        pl->lv = n;
        pl->lv_cap = cap;
    }
    memmove(&pl->lv[at + 1], &pl->lv[at], (pl->nlv - at) * sizeof *pl->lv);
    pl->lv[at] = (pl_live){off, end, b};
    pl->nlv++;
    return GM_OK;
}

static void lv_remove(gp_plan *pl, uint64_t off) {
    uint64_t i = lv_lower(pl, off);
    if (i >= pl->nlv || pl->lv[i].off != off) return; /* cannot happen: check() says so */
    memmove(&pl->lv[i], &pl->lv[i + 1], (pl->nlv - i - 1) * sizeof *pl->lv);
    pl->nlv--;
}

/* ---- the plan: greedy placement of one step's intervals -------------------- */

static int cmp_item(const void *x, const void *y) {
    const pl_item *a = x, *b = y;
    if (a->units != b->units) return a->units > b->units ? -1 : 1;
    int64_t la = a->e - a->b, lb = b->e - b->b;
    if (la != lb) return la > lb ? -1 : 1;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k;
}

static int cmp_off(const void *x, const void *y) {
    const pl_item *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off;
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
    pl_item *it = realloc(pl->items, P * sizeof *it);
    if (it) pl->items = it;
    pl_item *tp = realloc(pl->tmp, P * sizeof *tp);
    if (tp) pl->tmp = tp;
    if (!tu || !of || !ts || !pn || !it || !tp) return GM_ENOHOSTMEM;
    pl->cap = P;
    return GM_OK;
}

/* Period P confirmed at allocation p: lay out the step that ends at the
 * phase with the least memory live before p, to be served from the next one. */
static void make_plan(gp_plan *pl, uint64_t p) {
    uint64_t P = pl->cand;
    pl->tries++;
    if (grow(pl, P)) return;
    uint64_t phi = p;
    for (uint64_t i = p - P + 1; i < p; i++)
        if (rec(pl, i)->live < rec(pl, phi)->live) phi = i;
    uint64_t w0 = phi - P;
    int64_t t0 = rec(pl, w0)->birth, tend = rec(pl, phi)->birth;
    uint64_t big = 0;
    for (uint64_t k = 0; k < P; k++) {
        const pl_rec *r = rec(pl, w0 + k);
        if (r->units > big) big = r->units, pl->pstream = r->stream;
    }
    uint64_t m = 0;
    for (uint64_t k = 0; k < P; k++) {
        const pl_rec *r = rec(pl, w0 + k);
        pl->tunits[k] = r->units;
        pl->tstream[k] = r->stream;
        /* small blocks stay in the small pool's arena, whose memory their
         * stats count in (allocated <= reserved per pool) */
        pl->planned[k] = r->units > GP_SMALL_UNITS && r->stream == pl->pstream && r->death >= 0 && r->death < tend;
        if (pl->planned[k]) pl->items[m++] = (pl_item){r->units, 0, r->birth - t0, r->death - t0, (uint32_t)k};
    }
    qsort(pl->items, m, sizeof *pl->items, cmp_item);
    uint64_t top = 0;
    for (uint64_t i = 0; i < m; i++) {
        pl_item *it = &pl->items[i];
        uint64_t nc = 0;
        for (uint64_t j = 0; j < i; j++)
            if (pl->items[j].b < it->e && it->b < pl->items[j].e) pl->tmp[nc++] = pl->items[j];
        qsort(pl->tmp, nc, sizeof *pl->tmp, cmp_off);
        uint64_t pos = 0;
        for (uint64_t j = 0; j < nc; j++) {
            if (pl->tmp[j].off >= pos + it->units) break;
            if (pl->tmp[j].off + pl->tmp[j].units > pos) pos = pl->tmp[j].off + pl->tmp[j].units;
        }
        it->off = pos;
        pl->off[it->k] = pos;
        if (pos + it->units > top) top = pos + it->units;
    }
    if (!top) return;
#ifdef GP_PLAN_DEBUG
    {   /* the bound: most units live at once among the planned intervals */
        uint64_t mx = 0;
        for (uint64_t i = 0; i < m; i++) {
            uint64_t l = 0;
            for (uint64_t j = 0; j < m; j++)
                if (pl->items[j].b <= pl->items[i].b && pl->items[i].b < pl->items[j].e) l += pl->items[j].units;
            if (l > mx) mx = l;
        }
        PLOG("alloc %llu: P %llu phi %llu planned %llu region %.1f MiB maxlive %.1f MiB live@phi %.1f MiB\n",
             (unsigned long long)p, (unsigned long long)P, (unsigned long long)phi, (unsigned long long)m,
             top / 2048.0, mx / 2048.0, rec(pl, phi)->live / 2048.0);
    }
#endif
    pl->region_units = top;
    pl->P = P;
    pl->start = phi + P;
    pl->state = PL_PENDING;
}

/* ---- detection ------------------------------------------------------------- */

static void detect(gp_plan *pl, uint64_t p) {
    if (pl->cand && same(pl, p, p - pl->cand)) {
        pl->run++;
    } else {
        pl->cand = pl->run = 0;
        if (pl->state == PL_PENDING) pl->state = PL_NONE; /* the step changed before it began */
    }
    if (p + 1 < PL_W) return;
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = p + 1 - PL_W; i <= p; i++) {
        const pl_rec *r = rec(pl, i);
        h = (h ^ r->units) * 1099511628211ull;
        h = (h ^ (uint64_t)r->stream) * 1099511628211ull;
    }
    h ^= h >> 29;
    uint64_t s = h & (PL_TAB - 1);
    uint64_t q = pl->tab_key[s] == h ? pl->tab_pos[s] : 0;
    pl->tab_key[s] = h;
    pl->tab_pos[s] = p + 1;
    if (!pl->cand && q) {
        uint64_t P = p + 1 - q;
        if (P >= PL_MINP && P <= PL_MAXP && p >= 2 * P) {
            uint64_t i = p;
            while (i > p - P - 1 && same(pl, i, i - P)) i--;
            pl->cand = P;
            pl->run = p - i;
        }
    }
    if (pl->state == PL_NONE && pl->cand && pl->run >= pl->cand && pl->run >= PL_MINRUN &&
        pl->tries < PL_TRIES && p >= 2 * pl->cand && rec(pl, p)->live == rec(pl, p - pl->cand)->live)
        make_plan(pl, p);
}

static void note_alloc(gp_plan *pl, uint64_t units, gm_stream stream) {
    uint64_t p = pl->n++;
    *rec(pl, p) = (pl_rec){units, stream, pl->op++, -1, pl->live};
    pl->live += units;
    detect(pl, p);
}

/* ---- region ---------------------------------------------------------------- */

static void release_region(gp_state *st) {
    gp_plan *pl = st->plan;
    if (pl->region) gm__gp_va_free(st, pl->ra, pl->region);
    pl->region = NULL;
    pl->ra = NULL;
    pl->state = PL_NONE;
    pl->cand = pl->run = 0;
}

static void activate(gp_state *st) {
    gp_plan *pl = st->plan;
    gp_arena *a;
    gp_block *rb = NULL;
    pl->state = PL_NONE;
    if (gm__gp_arena_of(st, pl->pstream, GM_POOL_LARGE, &a)) return;
    /* give back the idle memory first, so the region's memory comes on top
     * of only what is live now (the least of the step) */
    gm__gp_flush_quick(st);
    for (uint32_t k = 0; k < st->narenas; k++) gm__gp_sync_arena(st, st->arenas[k]);
    gm__gp_release_unused(st);
    int rc = gm__gp_va_place(st, a, pl->region_units, &rb);
    PLOG("activate at %llu: rc %d held %.1f MiB\n", (unsigned long long)pl->n, rc, st->held_bytes / 1048576.0);
    if (rc) return; /* served as before */
    rb->h.pool = GM_POOL_LARGE;
    pl->region = rb;
    pl->ra = a;
    pl->state = PL_ACTIVE;
    pl->cur = pl->dev_step = 0;
    pl->settled = false;
}

/* Memory the plan does not need: idle chunks, given back once. */
static void settle(gp_state *st) {
    gp_plan *pl = st->plan;
    pl->settled = true;
    PLOG("settle at %llu\n", (unsigned long long)pl->n);
    gm__gp_flush_quick(st);
    for (uint32_t k = 0; k < st->narenas; k++) gm__gp_sync_arena(st, st->arenas[k]);
    gm__gp_release_unused(st);
}

int gm__gp_plan_drop(gp_state *st) {
    gp_plan *pl = st->plan;
    if (!pl) return 0;
    if (pl->state == PL_PENDING) pl->state = PL_NONE;
    if (pl->state == PL_ACTIVE) pl->state = PL_DROPPING, PLOG("drop at %llu\n", (unsigned long long)pl->n);
    if (pl->state == PL_DROPPING && !pl->nlv) {
        release_region(st);
        return 1;
    }
    return 0;
}

static void advance(gp_state *st) {
    gp_plan *pl = st->plan;
    if (++pl->cur < pl->P) return;
    pl->cur = 0;
    if (pl->state == PL_ACTIVE && !pl->settled && pl->dev_step == 0) settle(st);
    pl->dev_step = 0;
}

static void deviation(gp_state *st) {
    gp_plan *pl = st->plan;
    if (++pl->dev_step > pl->P / 4 + 4) gm__gp_plan_drop(st);
}

/* ---- ops ------------------------------------------------------------------- */

static int serve(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out) {
    gp_plan *pl = st->plan;
    uint64_t c = pl->cur;
    if (pl->tunits[c] != units || pl->tstream[c] != stream) {
        deviation(st);
        uint64_t k = 1;
        while (k <= PL_RESYNC && c + k < pl->P && (pl->tunits[c + k] != units || pl->tstream[c + k] != stream)) k++;
        if (k > PL_RESYNC || c + k >= pl->P) return 0;
        pl->cur = c = c + k;
    }
    advance(st);
    if (!pl->planned[c] || pl->state != PL_ACTIVE) return 0;
    uint64_t off = pl->off[c], at;
    if (!lv_free(pl, off, off + units, &at)) {
        deviation(st); /* the previous occupant is still alive */
        return 0;
    }
    gp_block *b = gm__gp_block_new(st);
    if (!b) return GM_ENOHOSTMEM;
    if (lv_insert(pl, at, off, off + units, b)) {
        gm__gp_block_put(st, b);
        return GM_ENOHOSTMEM;
    }
    b->h.ptr = pl->region->h.ptr + (off << GP_ALIGN_SHIFT);
    b->h.size = units << GP_ALIGN_SHIFT;
    b->h.stream = stream;
    b->h.pool = (uint8_t)pool;
    b->state = GP_PLANNED;
    b->arena = (uint16_t)pl->ra->index;
    pl->served++;
    *out = b;
    return 1;
}

int gm__gp_plan_malloc(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out) {
    gp_plan *pl = st->plan;
    if (pl->state == PL_PENDING && pl->n == pl->start) activate(st);
    int rc = 0;
    if (pl->state == PL_ACTIVE || pl->state == PL_DROPPING) rc = serve(st, units, pool, stream, out);
    if (rc < 0) return rc;
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

int gm__gp_plan_free(gp_state *st, gp_block *b) {
    gp_plan *pl = st->plan;
    uint64_t units = b->h.size >> GP_ALIGN_SHIFT;
    pl->live -= units;
    if (b->serial < pl->n && pl->n - b->serial <= PL_HIST) rec(pl, b->serial)->death = pl->op;
    pl->op++;
    if (b->state != GP_PLANNED) return 0;
    lv_remove(pl, (b->h.ptr - pl->region->h.ptr) >> GP_ALIGN_SHIFT);
    gm__gp_block_put(st, b);
    pl->ra->dirty = true; /* its stream may still use it: sync before the memory moves */
    if (pl->state == PL_DROPPING && !pl->nlv) release_region(st);
    return 1;
}

uint64_t gm__gp_plan_served(const gp_state *st) { return st->plan ? st->plan->served : 0; }

bool gm__gp_plan_is_region(const gp_state *st, const gp_block *b) {
    return st->plan && st->plan->region == b;
}

uint64_t gm__gp_plan_live_bytes(const gp_state *st, const gp_arena *a) {
    const gp_plan *pl = st->plan;
    if (!pl || pl->ra != a) return 0;
    uint64_t n = 0;
    for (uint64_t i = 0; i < pl->nlv; i++)
        if (pl->lv[i].b->h.live) n += pl->lv[i].b->h.size;
    return n;
}

/* Every live planned block lies inside the region, sorted, none overlapping;
 * adds them to the active counts. */
int gm__gp_plan_check(gp_state *st, int64_t *active, int64_t *active_bytes, char *err, size_t errlen) {
    gp_plan *pl = st->plan;
    if (!pl) return GM_OK;
    if (pl->nlv && !pl->region) return gm__check_fail(err, errlen, "plan: %llu live planned blocks but no region", (unsigned long long)pl->nlv);
    if (pl->region && (pl->region->state != GP_USED || pl->region->h.size != pl->region_units << GP_ALIGN_SHIFT))
        return gm__check_fail(err, errlen, "plan: region block changed");
    for (uint64_t i = 0; i < pl->nlv; i++) {
        const pl_live *l = &pl->lv[i];
        const gp_block *b = l->b;
        if (l->end <= l->off || l->end > pl->region_units) return gm__check_fail(err, errlen, "plan: live range %llu outside the region", (unsigned long long)i);
        if (i && pl->lv[i - 1].end > l->off) return gm__check_fail(err, errlen, "plan: planned blocks at %llu and %llu overlap", (unsigned long long)pl->lv[i - 1].off, (unsigned long long)l->off);
        if (b->state != GP_PLANNED || b->h.ptr != pl->region->h.ptr + (l->off << GP_ALIGN_SHIFT) ||
            b->h.size != (l->end - l->off) << GP_ALIGN_SHIFT)
            return gm__check_fail(err, errlen, "plan: planned block 0x%llx does not match its range", (unsigned long long)b->h.ptr);
        active[GM_POOL_ALL]++;
        active[b->h.pool]++;
        active_bytes[GM_POOL_ALL] += (int64_t)b->h.size;
        active_bytes[b->h.pool] += (int64_t)b->h.size;
    }
    return GM_OK;
}
