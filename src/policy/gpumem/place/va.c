/* va.c — the virtual-range side of the `gpumem` policy: the segregated
 * free-range index of an arena (best fit, ties to the lower address), where
 * a block goes (choose: a range that needs no new mapping when there is
 * one), splitting and coalescing, and the flush of the size-class cache
 * back into the arenas (placement does it before it maps). The physical
 * chunks behind the arena are in chunks.c, below. */
#include "va.h"

#include <stdlib.h>
#include <string.h>

#ifndef GP_SCAN
#define GP_SCAN 16      /* entries looked at per bin when choosing best fit */
#endif
#ifndef GP_ALT_SCAN
#define GP_ALT_SCAN 128 /* ranges looked at to find one that needs no mapping */
#endif
#ifndef GP_DENSE_MIN
/* granules: a block this large that needs mapping, in a job no plan
 * serves, is placed over the most mapped memory its range holds (choose,
 * densest_window); 16 (32 MiB) or more: smaller ones move few granules, and
 * best fit's ends serve them (bench/RESULTS.md, "2026-12-07 (night)") */
#define GP_DENSE_MIN 16
#endif
#ifndef GP_COST_BUDGET
/* granules looked at for that: 8192 covers a 16 GiB arena, so a step
 * whose shapes change looks over all of it before memory moves
 * (bench/RESULTS.md, "2026-12-07 (evening)": bert_varlen) */
#define GP_COST_BUDGET 8192
#endif

/* ---- bins: exact below 32 KiB, then 32 steps per power of two ---------- */

unsigned gm__gp_bin_of(uint64_t u) {
    if (u < 64) return (unsigned)u;
    unsigned fl = 63u - (unsigned)__builtin_clzll(u);
    unsigned sl = (unsigned)(u >> (fl - 5)) & 31u;
    unsigned b = 64u + (fl - 6u) * 32u + sl;
    return b < GP_NBINS ? b : GP_NBINS - 1;
}

/* The links of the arena's lists (address order, bins, parked) without
 * branches on whether a neighbour exists, which on the warm path is a coin
 * toss: such branches were a good part of bert_varlen's mispredictions
 * (callgrind; bench/RESULTS.md, "branchless lists"). LINK_SET: x->field =
 * v, into the arena's sink when x is NULL. PREV_SET: p->field = v, or the
 * list's head when p is NULL. Both are selects of an address. */
#define LINK_SET(a, x, field, v) (((x) ? (x) : &(a)->sink)->field = (v))
#define PREV_SET(p, field, head, v) (*((p) ? &(p)->field : &(head)) = (v))

void gm__gp_bin_insert(gp_arena *a, gp_block *b) {
    unsigned bin = gm__gp_bin_of(b->h.size >> GP_ALIGN_SHIFT);
    b->bin = bin;
    b->fprev = NULL;
    b->fnext = a->bins[bin];
    LINK_SET(a, b->fnext, fprev, b);
    a->bins[bin] = b;
    a->bitmap[bin >> 6] |= (uint64_t)1 << (bin & 63);
    a->summary |= (uint64_t)1 << (bin >> 6);
}

void gm__gp_bin_remove(gp_arena *a, gp_block *b) {
    PREV_SET(b->fprev, fnext, a->bins[b->bin], b->fnext);
    LINK_SET(a, b->fnext, fprev, b->fprev);
    b->fprev = b->fnext = NULL;
    unsigned w = b->bin >> 6; /* the bin's bit, and its word's, cleared if it is empty now */
    a->bitmap[w] &= ~((uint64_t)(a->bins[b->bin] == NULL) << (b->bin & 63));
    a->summary &= ~((uint64_t)(a->bitmap[w] == 0) << w);
}

/* b, in its bin, to the bin's head, where gm__gp_bin_insert puts a range:
 * the bin stays non-empty, so its bitmaps stay as they are. */
static inline void bin_to_head(gp_arena *a, gp_block *b) {
    if (!b->fprev) return;
    b->fprev->fnext = b->fnext;
    LINK_SET(a, b->fnext, fprev, b->fprev);
    b->fprev = NULL;
    b->fnext = a->bins[b->bin];
    a->bins[b->bin]->fprev = b;
    a->bins[b->bin] = b;
}

/* first non-empty bin >= bin, or -1 */
static int next_bin(const gp_arena *a, unsigned bin) {
    if (bin >= GP_NBINS) return -1;
    unsigned w = bin >> 6;
    uint64_t m = a->bitmap[w] & (~(uint64_t)0 << (bin & 63));
    if (m) return (int)(w * 64 + (unsigned)__builtin_ctzll(m));
    uint64_t s = (w + 1 < 64) ? a->summary & (~(uint64_t)0 << (w + 1)) : 0;
    if (!s) return -1;
    w = (unsigned)__builtin_ctzll(s);
    return (int)(w * 64 + (unsigned)__builtin_ctzll(a->bitmap[w]));
}

static bool better(const gp_block *c, const gp_block *best) {
    return !best || c->h.size < best->h.size ||
           (c->h.size == best->h.size && c->h.ptr < best->h.ptr);
}

/* Best fit (bounded scan per bin): the smallest range >= bytes. */
static gp_block *best_fit(gp_arena *a, uint64_t bytes) {
    unsigned b0 = gm__gp_bin_of(bytes >> GP_ALIGN_SHIFT);
    gp_block *best = NULL;
    int n = 0;
    for (gp_block *c = a->bins[b0]; c && n < GP_SCAN; c = c->fnext, n++)
        if (c->h.size >= bytes && better(c, best)) best = c;
    if (best) return best;
    int b = next_bin(a, b0 + 1);
    if (b < 0) return NULL;
    n = 0;
    for (gp_block *c = a->bins[b]; c && n < GP_SCAN; c = c->fnext, n++)
        if (better(c, best)) best = c;
    return best;
}

/* ---- free-range index by address (gpumem_plan:on, the plan's arena) ------- */

/* First index whose range starts at or after p. Without a branch on the
 * comparison (a conditional move): a plan's every placement searches here,
 * and the taken-or-not of a binary search is a coin toss that the branch
 * predictor lost often (callgrind --branch-sim, the bert_varlen loop:
 * bench/RESULTS.md, "warm ops after the branch work"). */
static uint64_t fidx_lower(const gp_arena *a, gm_devptr p) {
    uint64_t n = a->nfidx;
    if (!n) return 0;
    gp_block *const *base = a->fidx;
    while (n > 1) {
        uint64_t half = n / 2;
        base = base[half]->h.ptr < p ? base + half : base;
        n -= half;
    }
    return (uint64_t)(base - a->fidx) + (base[0]->h.ptr < p);
}

/* Insert b at index i (the ranges before it start below it). */
__attribute__((noinline, cold)) static void fidx_insert_at(gp_arena *a, uint64_t i, gp_block *b) {
    if (a->nfidx == a->fidx_cap) {
        uint64_t cap = a->fidx_cap * 2;
        gp_block **n = realloc(a->fidx, cap * sizeof *n);
        if (!n) { /* no index: the plan stops serving (gm__gp_plan_malloc) */
            free(a->fidx);
            a->fidx = NULL;
            a->nfidx = a->fidx_cap = 0;
            return;
        }
        a->fidx = n;
        a->fidx_cap = cap;
    }
    memmove(&a->fidx[i + 1], &a->fidx[i], (a->nfidx - i) * sizeof *a->fidx);
    a->fidx[i] = b;
    a->nfidx++;
}

static void fidx_delete_at(gp_arena *a, uint64_t i) {
    memmove(&a->fidx[i], &a->fidx[i + 1], (a->nfidx - i - 1) * sizeof *a->fidx);
    a->nfidx--;
}

/* The index of free range r in *i; hint: where it may be (a lookup's
 * answer). An index without r cannot happen (gm__gp_plan_check says so);
 * if it did, the index goes and with it the plan (it stops serving, as
 * when the index cannot grow): false. */
static inline bool fidx_find(gp_arena *a, const gp_block *r, uint64_t hint, uint64_t *i) {
    *i = hint < a->nfidx && a->fidx[hint] == r ? hint : fidx_lower(a, r->h.ptr);
    if (*i < a->nfidx && a->fidx[*i] == r) return true;
    (void)gm__gp_va_index(a, false);
    return false;
}

static void fidx_add(gp_arena *a, gp_block *b) { fidx_insert_at(a, fidx_lower(a, b->h.ptr), b); }

int gm__gp_va_index(gp_arena *a, bool on) {
    free(a->fidx);
    a->fidx = NULL;
    a->nfidx = a->fidx_cap = 0;
    if (!on) return GM_OK;
    uint64_t n = 0;
    for (const gp_block *b = a->head; b; b = b->next) n += b->state == GP_FREE;
    a->fidx_cap = n < 64 ? 64 : n * 2;
    a->fidx = malloc(a->fidx_cap * sizeof *a->fidx);
    if (!a->fidx) {
        a->fidx_cap = 0;
        return GM_ENOHOSTMEM;
    }
    for (gp_block *b = a->head; b; b = b->next)
        if (b->state == GP_FREE) a->fidx[a->nfidx++] = b;
    return GM_OK;
}

/* ---- free ranges ------------------------------------------------------------ */

/* A free range counted in inactive_split (or no longer): every free range
 * but the arena's top one is a split. */
static inline void split_count(gp_state *st, gp_arena *a, gp_block *b) {
    b->split_cnt = b->next != NULL;
    if (b->split_cnt)
        gm__stat_block_inc(st->d->stats.inactive_split, st->d->stats.inactive_split_bytes, a->pool, b->h.size);
}
static inline __attribute__((always_inline)) void split_uncount(gp_state *st, gp_arena *a, gp_block *b) {
    if (b->split_cnt)
        gm__stat_block_dec(st->d->stats.inactive_split, st->d->stats.inactive_split_bytes, a->pool, b->h.size);
    b->split_cnt = 0;
}

/* A free range into the size bins (and the statistics); the address index,
 * where there is one, is the caller's: carve and gm__gp_va_free keep it
 * with the index they know, most often with no search and no move (a
 * range that keeps its start keeps its place). */
static void free_insert(gp_state *st, gp_arena *a, gp_block *b) {
    gm__gp_bin_insert(a, b);
    split_count(st, a, b);
}

static inline __attribute__((always_inline)) void free_remove(gp_state *st, gp_arena *a, gp_block *b) {
    gm__gp_bin_remove(a, b);
    split_uncount(st, a, b);
}

/* Free range r now spans [ptr, ptr+size), in place: a free_remove and
 * free_insert of it (the same statistics, the same bin order), with the
 * bin's bitmaps left alone while its size class stays. The warm path moves
 * one end of a range far more often than it makes or ends one (a block
 * carved from a range's start, a block freed just below one); with the
 * bitmaps' branches each time, bert_varlen's loop missed more branches
 * (callgrind's model; bench/RESULTS.md, "warm ops after the branch work").
 * r keeps its block and its place in the address index (no free range lies
 * between its old and new start), so the caller has no index entry to move
 * and no block to make or put. */
static void free_resize(gp_state *st, gp_arena *a, gp_block *r, gm_devptr ptr, uint64_t size) {
    split_uncount(st, a, r);
    r->h.ptr = ptr;
    r->h.size = size;
    if (gm__gp_bin_of(size >> GP_ALIGN_SHIFT) != r->bin) {
        gm__gp_bin_remove(a, r);
        gm__gp_bin_insert(a, r);
    } else {
        bin_to_head(a, r);
    }
    split_count(st, a, r);
}

static void link_after(gp_arena *a, gp_block *pos, gp_block *b) {
    b->prev = pos;
    b->next = pos->next;
    LINK_SET(a, pos->next, prev, b);
    pos->next = b;
}

/* Block struct tail made the free range [ptr, ptr+size) just above block
 * pos (the bins and statistics; the address index is the caller's). */
static void free_tail(gp_state *st, gp_arena *a, gp_block *pos, gp_block *tail, gm_devptr ptr, uint64_t size) {
    tail->h.ptr = ptr;
    tail->h.size = size;
    tail->h.stream = a->stream;
    tail->state = GP_FREE;
    tail->arena = (uint16_t)a->index;
    link_after(a, pos, tail);
    free_insert(st, a, tail);
}

static void link_before(gp_arena *a, gp_block *pos, gp_block *b) {
    b->next = pos;
    b->prev = pos->prev;
    PREV_SET(pos->prev, next, a->head, b);
    pos->prev = b;
}

static void unlink_block(gp_arena *a, gp_block *b) {
    PREV_SET(b->prev, next, a->head, b->next);
    LINK_SET(a, b->next, prev, b->prev);
}

int gm__gp_arena_init_va(gp_state *st, gp_arena *a) {
    uint64_t want = st->d->total_memory * 2;
    if (want < GM__GIB) want = GM__GIB;
    want = (want + st->gran - 1) & ~(st->gran - 1);
    int rc = gm__be_va_reserve(st->d, want, &a->base);
    if (rc) return rc; /* the next request for this stream tries again */
    a->va_size = want;
    a->ngran = want >> st->gshift;
    a->gran = malloc(a->ngran * sizeof *a->gran);
    a->mapped = calloc((a->ngran + 63) / 64, sizeof *a->mapped);
    gp_block *top = gm__gp_block_new(st);
    if (!a->gran || !a->mapped || !top) {
        free(a->gran);
        free(a->mapped);
        a->gran = NULL;
        a->mapped = NULL;
        if (top) gm__gp_block_put(st, top);
        (void)gm__be_cleanup_va_release(st->d, a->base, a->va_size);
        return GM_ENOHOSTMEM;
    }
    memset(a->gran, 0xff, a->ngran * sizeof *a->gran);
    top->h.ptr = a->base;
    top->h.size = a->va_size;
    top->h.stream = a->stream;
    top->state = GP_FREE;
    top->arena = (uint16_t)a->index;
    top->prev = top->next = NULL;
    a->head = top;
    free_insert(st, a, top);
    if (a->fidx) fidx_add(a, top);
    return GM_OK;
}

/* How much a placement at [p, p+bytes) costs: 0 = only mapped granules of
 * chunks that hold live blocks already (or idle chunks it covers whole);
 * n = n granules need mapping; GP_COST_PARTIAL more if it would leave an idle
 * multi-granule chunk partly used: that chunk could then neither move to
 * where memory is needed nor be given back, the main source of waste. */
#define GP_COST_PARTIAL ((uint64_t)1 << 40)
static uint64_t cost(const gp_state *st, const gp_arena *a, gm_devptr p, uint64_t bytes,
                     uint64_t stop, int64_t *budget) {
    uint64_t g = (p - a->base) >> st->gshift;
    uint64_t ge = (p - a->base + bytes - 1) >> st->gshift;
    uint64_t miss = 0, part = 0;
    while (g <= ge) {
        if (--*budget < 0) return UINT64_MAX; /* looked long enough: not better */
        int32_t i = a->gran[g];
        if (i < 0) {
            if (part + ++miss >= stop) return part + miss;
            g++;
            continue;
        }
        const gp_chunk *c = &st->chunks[i];
        uint64_t ce = (uint64_t)(c->g0 + (int64_t)c->n);
        /* at slack inf idle chunks stay put, so a partly used one wastes nothing */
        if (!st->runs && !st->lazy && !c->live && c->n > 1 && ((uint64_t)c->g0 < g || ce - 1 > ge)) {
            part = GP_COST_PARTIAL;
            if (part + miss >= stop) return part + miss;
        }
        g = ce;
    }
    return part + miss;
}

/* cost() of [p, p+bytes) without a stop or budget while every chunk is one
 * granule (the default: no chunk can be partly used): the unmapped granules,
 * counted 64 at a time. Best fit's first look at a large block would
 * otherwise visit each of its granules, the longest step of a warm malloc. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__) && \
    !defined(__SANITIZE_THREAD__) && !defined(GM_TSAN)
/* the x86-64 baseline has no popcnt instruction: pick it at load time where
 * the CPU has it. Not under ThreadSanitizer: gcc-12's TSan binaries crash
 * in the ifunc resolver, which runs before the TSan runtime is set up. */
__attribute__((target_clones("popcnt", "default")))
#endif
static uint64_t unmapped_in(const gp_state *st, const gp_arena *a, gm_devptr p, uint64_t bytes) {
    uint64_t g = (p - a->base) >> st->gshift;
    uint64_t ge = (p - a->base + bytes - 1) >> st->gshift;
    uint64_t w0 = g >> 6, w1 = ge >> 6, n = ge - g + 1, set = 0;
    uint64_t lo = ~(uint64_t)0 << (g & 63), hi = ~(uint64_t)0 >> (63 - (ge & 63));
    if (w0 == w1) return n - (uint64_t)__builtin_popcountll(a->mapped[w0] & lo & hi);
    set = (uint64_t)__builtin_popcountll(a->mapped[w0] & lo);
    for (uint64_t w = w0 + 1; w < w1; w++) set += (uint64_t)__builtin_popcountll(a->mapped[w]);
    set += (uint64_t)__builtin_popcountll(a->mapped[w1] & hi);
    return n - set;
}

/* A place for `bytes` inside free range r over mapped granules only (a run
 * of them in the middle of the range), or false. */
static bool mapped_window(const gp_state *st, const gp_arena *a, const gp_block *r,
                          uint64_t bytes, int64_t *budget, gm_devptr *at) {
    gm_devptr end = r->h.ptr + r->h.size;
    uint64_t g = (r->h.ptr - a->base) >> st->gshift;
    uint64_t ge = (end - 1 - a->base) >> st->gshift;
    gm_devptr run = 0; /* start of the current mapped run, 0 = none */
    for (; g <= ge; g++) {
        if (--*budget < 0) return false;
        if (a->gran[g] < 0) {
            run = 0;
            continue;
        }
        gm_devptr gs = a->base + (g << st->gshift);
        if (!run) run = gs > r->h.ptr ? gs : r->h.ptr;
        gm_devptr ge_va = gs + st->gran < end ? gs + st->gran : end;
        if (ge_va - run >= bytes) {
            *at = run;
            return true;
        }
    }
    return false;
}

/* The first granule in [g, end) whose mapped bit is `set`, or end. */
static uint64_t next_bit(const gp_arena *a, uint64_t g, uint64_t end, bool set) {
    while (g < end) {
        uint64_t w = a->mapped[g >> 6] ^ (set ? 0 : ~(uint64_t)0);
        w &= ~(uint64_t)0 << (g & 63);
        if (w) {
            g = (g & ~(uint64_t)63) + (uint64_t)__builtin_ctzll(w);
            return g < end ? g : end;
        }
        g = (g | 63) + 1;
    }
    return end;
}

/* The place for `bytes` inside free range r that needs the fewest granules
 * mapped, if it needs fewer than *best (then *best and *at are set). The
 * best window starts where a run of mapped granules starts or ends where one
 * ends (else sliding it toward that run would cover more of it), so those
 * are the places looked at, in address order, until the budget runs out.
 * A step whose largest block changes size then lands over the memory the
 * last step's left mapped (the top range of an arena is most of its span,
 * where the range's ends are far from it). */
static bool densest_window(const gp_state *st, const gp_arena *a, const gp_block *r, uint64_t bytes,
                           int64_t *budget, uint64_t *best, gm_devptr *at) {
    gm_devptr lo = r->h.ptr, hi = r->h.ptr + r->h.size - bytes; /* the first and last start */
    uint64_t g = (lo - a->base) >> st->gshift, gend = ((r->h.ptr + r->h.size - 1 - a->base) >> st->gshift) + 1;
    int64_t per = (int64_t)((bytes >> st->gshift) >> 6) + 2; /* unmapped_in's words */
    bool found = false, partial = st->nmulti && !st->runs && !st->lazy; /* as choose() */
    while (*best && *budget > 0) {
        uint64_t s = next_bit(a, g, gend, true);
        if (s >= gend) break;
        uint64_t e = next_bit(a, s, gend, false);
        *budget -= 2 * per + (int64_t)((e - s) >> 6) + 1;
        /* from the run's start, or up to its end; kept inside the range */
        gm_devptr cand[2] = {a->base + (s << st->gshift), a->base + (e << st->gshift) - bytes};
        for (int k = 0; k < 2; k++) {
            gm_devptr p = cand[k] < lo ? lo : cand[k] > hi ? hi : cand[k];
            uint64_t n = partial ? cost(st, a, p, bytes, *best, budget) : unmapped_in(st, a, p, bytes);
            if (n < *best) *best = n, *at = p, found = true;
        }
        g = e;
    }
    return found;
}

/* Where to put `bytes`: best fit, moved to a cheaper range (see cost) when
 * the best fit needs mapping or would split an idle chunk: lazily kept
 * mappings get reused, so a repeating workload settles into making no device
 * calls, and idle chunks stay whole, so they can move where they are needed. */
static gp_block *choose(gp_state *st, gp_arena *a, uint64_t bytes, gm_devptr *at,
                        bool *needs_map) {
    gp_block *r = best_fit(a, bytes);
    if (!r) return NULL;
    gm_devptr lo = r->h.ptr, hi = r->h.ptr + r->h.size - bytes;
    int64_t budget = INT64_MAX;
    /* cost() differs from the unmapped count only where it may charge the
     * partial-chunk penalty (multi-granule chunks, live counts kept exact) */
    uint64_t best = st->nmulti && !st->runs && !st->lazy ? cost(st, a, lo, bytes, UINT64_MAX, &budget)
                                            : unmapped_in(st, a, lo, bytes);
    *at = lo;
    budget = GP_COST_BUDGET; /* granule steps spent looking for a cheaper place */
    if (best && hi != lo) {
        uint64_t ch = cost(st, a, hi, bytes, best, &budget);
        if (ch < best) best = ch, *at = hi;
    }
    gp_block *pick = r;
    int seen = 0;
    for (int b = best ? next_bin(a, gm__gp_bin_of(bytes >> GP_ALIGN_SHIFT)) : -1;
         b >= 0 && seen < GP_ALT_SCAN && best && budget > 0; b = next_bin(a, (unsigned)b + 1)) {
        for (gp_block *c = a->bins[b]; c && seen < GP_ALT_SCAN && best && budget > 0;
             c = c->fnext, seen++) {
            if (c->h.size < bytes || c == r) continue;
            gm_devptr clo = c->h.ptr, chi = c->h.ptr + c->h.size - bytes;
            uint64_t k = cost(st, a, clo, bytes, best, &budget);
            if (k < best) best = k, *at = clo, pick = c;
            if (best && chi != clo) {
                k = cost(st, a, chi, bytes, best, &budget);
                if (k < best) best = k, *at = chi, pick = c;
            }
            gm_devptr w; /* a mapped stretch in the middle of the range */
            if (best && c->h.size >= bytes + st->gran && mapped_window(st, a, c, bytes, &budget, &w) &&
                cost(st, a, w, bytes, best, &budget) < best)
                best = 0, *at = w, pick = c;
        }
    }
    /* still mapping, under the reserve budget, where no plan lays steps out: a
     * large block over the memory r has mapped, wherever in r that is (a
     * budget of its own: the search above is as it was) */
    if (best && hi != lo && gm__gp_reserving(st) && !gm__gp_planned(st) &&
        bytes >= ((uint64_t)GP_DENSE_MIN << st->gshift)) {
        budget = GP_COST_BUDGET;
        if (densest_window(st, a, r, bytes, &budget, &best, at)) pick = r;
    }
    *needs_map = best % GP_COST_PARTIAL != 0;
    return pick;
}

/* Split free range r so that [p, p+bytes) becomes a used block. fi: where
 * r may be in the address index (a lookup's answer; checked). */
static inline __attribute__((always_inline)) int carve(gp_state *st, gp_arena *a, gp_block *r, gm_devptr p, uint64_t bytes,
                 uint64_t fi, gp_block **out) {
    uint64_t front = p - r->h.ptr, back = r->h.ptr + r->h.size - (p + bytes);
    gp_block *b = NULL, *tail = NULL;
    if (!front && back) { /* the most common cut: r stays free above the new block */
        if (!(b = gm__gp_block_new(st))) return GM_ENOHOSTMEM;
        free_resize(st, a, r, p + bytes, back);
        link_before(a, r, b);
        goto used;
    }
    if (front && !(b = gm__gp_block_new(st))) return GM_ENOHOSTMEM;
    if (back && !(tail = gm__gp_block_new(st))) {
        if (b) gm__gp_block_put(st, b);
        return GM_ENOHOSTMEM;
    }
    free_remove(st, a, r);
    if (__builtin_expect(a->fidx != NULL, 0) && fidx_find(a, r, fi, &fi)) { /* plans only: off the warm path */
        if (front && back) fidx_insert_at(a, fi + 1, tail); /* r keeps its start, and its place */
        else if (back) a->fidx[fi] = tail;                  /* the tail takes r's place */
        else if (!front) fidx_delete_at(a, fi);
    }
    uint64_t total = r->h.size;
    if (front) {
        r->h.size = front;
        link_after(a, r, b);
        free_insert(st, a, r);
    } else {
        b = r;
    }
    if (back) free_tail(st, a, b, tail, p + bytes, total - front - bytes);
used:
    b->h.ptr = p;
    b->h.size = bytes;
    b->h.stream = a->stream;
    b->state = GP_USED;
    b->slot = 0; /* the plan marks what it serves */
    b->arena = (uint16_t)a->index;
    gm__gp_touch_inc(st, a, p, bytes);
    *out = b;
    return GM_OK;
}

static int va_place(gp_state *st, gp_arena *a, uint64_t units, gp_block **out) {
    uint64_t bytes = units << GP_ALIGN_SHIFT;
    if (bytes > a->va_size) return GM_ENOMEM;
    for (int pass = 0;; pass++) {
        gm_devptr at;
        bool needs_map;
        gp_block *r = choose(st, a, bytes, &at, &needs_map);
        if (!r) return GM_ENOMEM; /* address range exhausted */
        /* before mapping more, cached small blocks back */
        if (needs_map && pass == 0 && gm__gp_flush_quick(st)) continue;
        if (needs_map && pass == 1 && gm__gp_flush_quick(st)) continue;
        int cut = gm__gp_split_partial(st, a, r, at, bytes);
        if (cut < 0) return cut;
        if (cut) needs_map = true;
        if (needs_map) {
            int rc = gm__gp_ensure_mapped(st, a, at, bytes);
            if (rc) return rc;
        }
        return carve(st, a, r, at, bytes, UINT64_MAX, out);
    }
}

/* ---- parked blocks (gpumem_plan:on) ------------------------------------------
 * A planned block freed where the next planned block starts: it stays a
 * block at its address, off the bins and the address index, so its free
 * and the next malloc there touch them at most to move one free range's
 * end (the plan's warm path: plan/park.c). It counts as a cached block
 * (inactive_split, its granules live). It is the plan's: the usual
 * placement does not see it (a block placed there would be in the plan's
 * way). It goes back into the free ranges when a planned placement finds
 * it in the way (gm__gp_va_place_at), when the plan drops, and with
 * everything cached before memory is given back (gm__gp_unpark_all: OOM,
 * empty_cache, the plan's quiesce). */

void gm__gp_park(gp_state *st, gp_arena *a, gp_block *b, uint32_t slot) {
    b->state = GP_PARKED;
    b->slot = (uint16_t)slot;
    b->fprev = NULL;
    b->fnext = a->parked;
    LINK_SET(a, a->parked, fprev, b);
    a->parked = b;
    a->nparked++;
    a->dirty = true;
    gm__gp_cached_inc(st, b);
}

void gm__gp_unpark(gp_state *st, gp_arena *a, gp_block *b, bool release) {
    PREV_SET(b->fprev, fnext, a->parked, b->fnext);
    LINK_SET(a, b->fnext, fprev, b->fprev);
    b->fprev = b->fnext = NULL;
    a->nparked--;
    gm__gp_cached_dec(st, b);
    b->state = GP_USED;
    b->slot = 0;
    if (release) gm__gp_va_free(st, a, b);
}

/* Parked block b taken as the used block [b->ptr, +bytes): cut down (its
 * tail freed, into the free range above when there is one, as a free
 * does) or grown over the free range above it (whose start moves up, in
 * place: it keeps its place in the address index). false, and b parked as
 * it was, when that range is not free, too short or not all mapped, or no
 * block struct can be had. */
bool gm__gp_unpark_to(gp_state *st, gp_arena *a, gp_block *b, uint64_t bytes) {
    gp_block *n = b->next;
    bool nf = n && n->state == GP_FREE;
    uint64_t size = b->h.size;
    /* growing: over mapped memory only, and (once multi-granule chunks may
     * need cutting first: gm__gp_split_partial) not at all */
    if (bytes > size && (!nf || n->h.size < bytes - size || unmapped_in(st, a, n->h.ptr, bytes - size) ||
                         (st->autoc && st->nmulti && gm__gp_tight(st))))
        return false;
    gp_block *tail = NULL;
    if (bytes < size && !nf && !(tail = gm__gp_block_new(st))) return false;
    gm__gp_unpark(st, a, b, false);
    if (bytes == size) return true;
    gm__gp_touch_dec(st, a, b->h.ptr, size);
    b->h.size = bytes;
    gm__gp_touch_inc(st, a, b->h.ptr, bytes);
    gm_devptr end = b->h.ptr + bytes;
    if (bytes > size) { /* n gives up its start */
        uint64_t left = n->h.size - (bytes - size);
        if (left) {
            free_resize(st, a, n, end, left);
        } else {
            uint64_t i;
            free_remove(st, a, n);
            if (a->fidx && fidx_find(a, n, UINT64_MAX, &i)) fidx_delete_at(a, i);
            unlink_block(a, n);
            gm__gp_block_put(st, n);
        }
    } else if (nf) { /* the tail joins the free range above */
        free_resize(st, a, n, end, n->h.size + size - bytes);
    } else {
        free_tail(st, a, b, tail, end, size - bytes);
        if (a->fidx) fidx_add(a, tail);
    }
    a->dirty = true;
    return true;
}

int gm__gp_unpark_all(gp_state *st) {
    int n = 0;
    for (uint32_t k = 0; k < st->narenas; k++)
        for (gp_arena *a = st->arenas[k]; a->parked; n++) gm__gp_unpark(st, a, a->parked, true);
    return n;
}

/* A parked block overlapping [p, p+bytes) back into the free ranges: true,
 * or false when a used block is in the way (or nothing is). r: the last
 * free range starting at or before p, if any. */
static bool unpark_in_way(gp_state *st, gp_arena *a, gp_block *r, gm_devptr p, uint64_t bytes) {
    if (!a->nparked) return false;
    for (gp_block *b = r ? r : a->head; b && b->h.ptr < p + bytes; b = b->next) {
        if (b->h.ptr + b->h.size <= p || b->state == GP_FREE) continue;
        if (b->state != GP_PARKED) return false;
        gm__gp_unpark(st, a, b, true);
        return true;
    }
    return false;
}

int gm__gp_va_place_at(gp_state *st, gp_arena *a, gm_devptr p, uint64_t units, bool map_ok, gp_block **out) {
    uint64_t bytes = units << GP_ALIGN_SHIFT;
    if (!a->fidx || p < a->base || p - a->base > a->va_size - bytes || bytes > a->va_size) return 0;
    uint64_t i;
    gp_block *r;
    for (;;) {
        i = fidx_lower(a, p + 1); /* the last free range starting at or before p */
        r = i ? a->fidx[i - 1] : NULL;
        if (r && r->h.ptr + r->h.size >= p + bytes) break;
        if (!unpark_in_way(st, a, r, p, bytes)) return 0; /* a live block is in the way */
        if (!a->fidx) return 0; /* the index went (fidx_find) */
    }
    bool unmapped = unmapped_in(st, a, p, bytes) != 0;
    if (unmapped) {
        if (!map_ok) return 2;
        gm__gp_flush_quick(st); /* cached small blocks back first, as va_place does */
    }
    int rc = gm__gp_split_partial(st, a, r, p, bytes);
    if (rc > 0 || (rc == 0 && unmapped)) rc = gm__gp_ensure_mapped(st, a, p, bytes);
    if (rc == GM_OK) rc = carve(st, a, r, p, bytes, i - 1, out);
    gm__gp_live_drop(st);
    if (rc == GM_ENOMEM) return 0; /* the usual placement and its OOM retry decide */
    return rc ? rc : 1;
}

int gm__gp_va_place(gp_state *st, gp_arena *a, uint64_t units, gp_block **out) {
    int rc = va_place(st, a, units, out);
    gm__gp_live_drop(st); /* the pressure (if any) is over */
    return rc;
}

void gm__gp_va_free(gp_state *st, gp_arena *a, gp_block *b) {
    gm__gp_touch_dec(st, a, b->h.ptr, b->h.size);
    b->state = GP_FREE;
    gp_block *p = b->prev, *n = b->next;
    bool pf = p && p->state == GP_FREE, nf = n && n->state == GP_FREE;
    if (nf && !pf) { /* the most common merge: the range above grows down over b, keeping its place */
        free_resize(st, a, n, b->h.ptr, b->h.size + n->h.size);
        unlink_block(a, b);
        gm__gp_block_put(st, b);
        a->dirty = true;
        return;
    }
    if (__builtin_expect(a->fidx != NULL, 0)) { /* plans only: a merged range keeps the lower one's place */
        uint64_t i;
        if (nf) {
            if (fidx_find(a, n, UINT64_MAX, &i)) {
                if (pf) fidx_delete_at(a, i);
                else a->fidx[i] = b;
            }
        } else if (!pf) {
            fidx_add(a, b);
        }
    }
    if (pf) {
        free_remove(st, a, p);
        p->h.size += b->h.size;
        unlink_block(a, b);
        gm__gp_block_put(st, b);
        b = p;
    }
    if (nf) {
        free_remove(st, a, n);
        b->h.size += n->h.size;
        unlink_block(a, n);
        gm__gp_block_put(st, n);
    }
    free_insert(st, a, b);
    a->dirty = true;
}

/* ---- the size-class cache, back into the arenas ------------------------- */

/* Return every cached small block to its arena. Returns how many. Visits
 * only the non-empty lists (qmap), in the same order as a scan of every
 * size class would (ascending units, each list from its head): this runs
 * on every placement that needs mapping, and a scan of all 2048 classes
 * there was a visible part of the latency tail. */
int gm__gp_flush_quick(gp_state *st) {
    int n = 0;
    for (uint32_t k = 0; k < st->narenas; k++) {
        gp_arena *a = st->arenas[k];
        if (!a->ncached) continue;
        for (unsigned w = 0; w < GP_QWORDS; w++) {
            for (uint64_t m = a->qmap[w]; m; m &= m - 1) {
                unsigned u = w * 64 + (unsigned)__builtin_ctzll(m) + 1;
                gp_block *b;
                while ((b = a->quick[u]) != NULL) {
                    a->quick[u] = b->fnext;
                    b->fnext = NULL;
                    a->ncached--;
                    gm__gp_cached_dec(st, b);
                    gm__gp_block_release(st, a, b);
                    n++;
                }
            }
            a->qmap[w] = 0;
        }
    }
    return n;
}
