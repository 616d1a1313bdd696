/* policy_gpumem_va.c — the virtual-range side of the `gpumem` policy: the
 * segregated free-range index of an arena (best fit, ties to the lower
 * address), splitting and coalescing, and the physical chunks behind the
 * arena: which are mapped where, which are idle, and how a placement that
 * touches unmapped granules gets memory (reuse a loose chunk, else move an
 * idle one, else create one, releasing idle chunks first so that physical
 * memory never exceeds the granules live blocks touch). */
#include "policy_gpumem.h"

#include <stdlib.h>
#include <string.h>

#ifndef GP_SCAN
#define GP_SCAN 16      /* entries looked at per bin when choosing best fit */
#endif
#ifndef GP_ALT_SCAN
#define GP_ALT_SCAN 128 /* ranges looked at to find one that needs no mapping */
#endif
#ifndef GP_COST_BUDGET
#define GP_COST_BUDGET 4096 /* granules looked at for that */
#endif

/* ---- bins: exact below 32 KiB, then 32 steps per power of two ---------- */

unsigned gm__gp_bin_of(uint64_t u) {
    if (u < 64) return (unsigned)u;
    unsigned fl = 63u - (unsigned)__builtin_clzll(u);
    unsigned sl = (unsigned)(u >> (fl - 5)) & 31u;
    unsigned b = 64u + (fl - 6u) * 32u + sl;
    return b < GP_NBINS ? b : GP_NBINS - 1;
}

unsigned gm__gp_order(uint64_t n) { return 63u - (unsigned)__builtin_clzll(n); }

void gm__gp_bin_insert(gp_arena *a, gp_block *b) {
    unsigned bin = gm__gp_bin_of(b->h.size >> GP_ALIGN_SHIFT);
    b->bin = bin;
    b->fprev = NULL;
    b->fnext = a->bins[bin];
    if (b->fnext) b->fnext->fprev = b;
    a->bins[bin] = b;
    a->bitmap[bin >> 6] |= (uint64_t)1 << (bin & 63);
    a->summary |= (uint64_t)1 << (bin >> 6);
}

void gm__gp_bin_remove(gp_arena *a, gp_block *b) {
    if (b->fprev) b->fprev->fnext = b->fnext;
    else a->bins[b->bin] = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
    if (!a->bins[b->bin]) {
        a->bitmap[b->bin >> 6] &= ~((uint64_t)1 << (b->bin & 63));
        if (!a->bitmap[b->bin >> 6]) a->summary &= ~((uint64_t)1 << (b->bin >> 6));
    }
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

/* ---- granules ------------------------------------------------------------ */

/* touch_inc / touch_dec: add 1 to / take 1 from the live count of every
 * chunk under [p, p+bytes); chunks that become idle or stop being idle move
 * in or out of their idle list. */
static void chunk_list_del(gp_state *st, int32_t i);
static void chunk_list_add(gp_state *st, int32_t i, uint8_t list);

/* The idle list of chunk c's order: what touch() moves chunks in and out
 * of, once per granule of every large block allocated or freed, so it is
 * chunk_list_add/del without the list choice. */
static inline void idle_add(gp_state *st, int32_t i, gp_chunk *c) {
    unsigned o = gm__gp_order(c->n);
    int32_t t = st->idle_tail[o];
    c->list = GP_LIST_IDLE;
    c->lnext = -1;
    c->lprev = t;
    if (t >= 0) st->chunks[t].lnext = i;
    else st->idle[o] = i;
    st->idle_tail[o] = i;
}

static inline void idle_del(gp_state *st, gp_chunk *c) {
    unsigned o = gm__gp_order(c->n);
    if (c->lprev >= 0) st->chunks[c->lprev].lnext = c->lnext;
    else st->idle[o] = c->lnext;
    if (c->lnext >= 0) st->chunks[c->lnext].lprev = c->lprev;
    else st->idle_tail[o] = c->lprev;
    c->list = GP_LIST_NONE;
    c->lprev = c->lnext = -1;
}

static void touch_inc(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes) {
    if (st->lazy) return;
    uint64_t g = (p - a->base) >> st->gshift;
    uint64_t ge = (p - a->base + bytes - 1) >> st->gshift;
    uint64_t live = st->live_gran;
    while (g <= ge) {
        int32_t i = a->gran[g];
        gp_chunk *c = &st->chunks[i];
        if (c->live++ == 0) {
            if (c->list == GP_LIST_IDLE) idle_del(st, c);
            else chunk_list_del(st, i); /* any other list (none, in practice) */
            live += c->n;
            if (live > st->peak_live_gran) st->peak_live_gran = live;
        }
        g = (uint64_t)(c->g0 + (int64_t)c->n);
    }
    st->live_gran = live;
}

static void touch_dec(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes) {
    if (st->lazy) return;
    uint64_t g = (p - a->base) >> st->gshift;
    uint64_t ge = (p - a->base + bytes - 1) >> st->gshift;
    uint64_t live = st->live_gran;
    while (g <= ge) {
        int32_t i = a->gran[g];
        gp_chunk *c = &st->chunks[i];
        if (--c->live == 0) {
            idle_add(st, i, c);
            live -= c->n;
        }
        g = (uint64_t)(c->g0 + (int64_t)c->n);
    }
    st->live_gran = live;
}

/* ---- live counts, kept lazily at slack inf ---------------------------------
 * At gpumem_slack:inf idle chunks move only under memory pressure (or are
 * given back by empty_cache), so nothing on the hot path reads the chunks'
 * live counts or idle lists, and keeping them exact costs a list update per
 * granule of every large block allocated or freed: a third of a warm pass's
 * instructions. There (st->lazy_ok) they are left stale (st->lazy: every
 * mapped chunk on no list) and recounted from the blocks, in address order,
 * just before something needs them (gm__gp_live_sync), then dropped again
 * (gm__gp_live_drop). Finite slack reads them on every placement that maps,
 * so it keeps them exact all the time. */

void gm__gp_live_sync(gp_state *st) {
    if (!st->lazy) return;
    for (int32_t i = 0; i < st->nchunks; i++) st->chunks[i].live = 0;
    for (uint32_t k = 0; k < st->narenas; k++) {
        gp_arena *a = st->arenas[k];
        if (!a->gran) continue;
        for (gp_block *b = a->head; b; b = b->next) {
            if (b->state == GP_FREE) continue;
            uint64_t g = (b->h.ptr - a->base) >> st->gshift;
            uint64_t ge = (b->h.ptr - a->base + b->h.size - 1) >> st->gshift;
            while (g <= ge) {
                gp_chunk *c = &st->chunks[a->gran[g]];
                c->live++;
                g = (uint64_t)(c->g0 + (int64_t)c->n);
            }
        }
    }
    uint64_t live = 0;
    for (uint32_t k = 0; k < st->narenas; k++) {
        gp_arena *a = st->arenas[k];
        for (uint64_t g = 0; a->gran && g < a->ngran; g++) {
            if (!(a->mapped[g >> 6] >> (g & 63) & 1)) { /* skip unmapped words fast */
                if (!a->mapped[g >> 6]) g |= 63;
                continue;
            }
            int32_t i = a->gran[g];
            gp_chunk *c = &st->chunks[i];
            if ((uint64_t)c->g0 != g) continue; /* visit each chunk at its first granule */
            if (c->live) live += c->n;
            else idle_add(st, i, c);
        }
    }
    st->live_gran = live;
    if (live > st->peak_live_gran) st->peak_live_gran = live;
    st->lazy = false;
}

void gm__gp_live_drop(gp_state *st) {
    if (!st->lazy_ok || st->lazy) return;
    for (int o = 0; o < GP_NORDERS; o++) {
        for (int32_t i = st->idle[o]; i >= 0;) {
            gp_chunk *c = &st->chunks[i];
            int32_t nx = c->lnext;
            c->list = GP_LIST_NONE;
            c->lprev = c->lnext = -1;
            i = nx;
        }
        st->idle[o] = st->idle_tail[o] = -1;
    }
    st->lazy = true;
}

/* ---- chunk lists ----------------------------------------------------------- */

static int32_t *list_head(gp_state *st, uint8_t list, uint64_t n, int32_t **tail) {
    unsigned o = gm__gp_order(n);
    *tail = list == GP_LIST_IDLE ? &st->idle_tail[o] : &st->loose_tail[o];
    return list == GP_LIST_IDLE ? &st->idle[o] : &st->loose[o];
}

static void chunk_list_add(gp_state *st, int32_t i, uint8_t list) {
    gp_chunk *c = &st->chunks[i];
    int32_t *t, *h = list_head(st, list, c->n, &t);
    c->list = list;
    c->lnext = -1;
    c->lprev = *t;
    if (*t >= 0) st->chunks[*t].lnext = i;
    else *h = i;
    *t = i;
}

static void chunk_list_del(gp_state *st, int32_t i) {
    gp_chunk *c = &st->chunks[i];
    if (c->list == GP_LIST_NONE) return;
    int32_t *t, *h = list_head(st, c->list, c->n, &t);
    if (c->lprev >= 0) st->chunks[c->lprev].lnext = c->lnext;
    else *h = c->lnext;
    if (c->lnext >= 0) st->chunks[c->lnext].lprev = c->lprev;
    else *t = c->lprev;
    c->list = GP_LIST_NONE;
    c->lprev = c->lnext = -1;
}

static int32_t chunk_slot(gp_state *st) {
    if (st->chunk_free >= 0) {
        int32_t i = st->chunk_free;
        st->chunk_free = st->chunks[i].lnext;
        return i;
    }
    if (st->nchunks == st->chunks_cap) {
        int32_t cap = st->chunks_cap ? st->chunks_cap * 2 : 64;
        gp_chunk *n = realloc(st->chunks, (size_t)cap * sizeof *n);
        if (!n) return -1;
        st->chunks = n;
        st->chunks_cap = cap;
    }
    memset(&st->chunks[st->nchunks], 0, sizeof *st->chunks); /* inuse = 0 until created */
    return st->nchunks++;
}

static void reserved_add(gp_state *st, int pool, int64_t bytes, int nseg) {
    gm__stat_pool_add(st->d->stats.reserved_bytes, pool, bytes);
    gm__stat_pool_add(st->d->stats.segment, pool, nseg);
    st->held_bytes += (uint64_t)bytes;
}

/* Unmap chunk i (idle) after the work that used it is done; it becomes loose. */
static int chunk_unmap(gp_state *st, int32_t i) {
    gp_chunk *c = &st->chunks[i];
    gp_arena *a = st->arenas[c->arena];
    int rc = gm__gp_sync_arena(st, a);
    if (rc) return rc;
    rc = gm__be_unmap(st->d, a->base + ((uint64_t)c->g0 << st->gshift), c->n << st->gshift);
    if (rc) return rc;
    chunk_list_del(st, i);
    a->mapped_bytes -= c->n << st->gshift;
    for (uint64_t k = 0; k < c->n; k++) {
        uint64_t g = (uint64_t)c->g0 + k;
        a->gran[g] = -1;
        a->mapped[g >> 6] &= ~((uint64_t)1 << (g & 63));
    }
    c->arena = -1;
    c->g0 = -1;
    chunk_list_add(st, i, GP_LIST_LOOSE);
    return GM_OK;
}

/* Release chunk i (idle or loose) to the backend. */
static int chunk_map(gp_state *st, gp_arena *a, int32_t i, uint64_t g);

static int chunk_release(gp_state *st, int32_t i) {
    gp_chunk *c = &st->chunks[i];
    int32_t arena = c->arena;
    int64_t g0 = c->g0;
    if (arena >= 0) {
        int rc = chunk_unmap(st, i);
        if (rc) return rc;
    }
    int rc = gm__be_phys_release(st->d, c->h);
    if (rc) {
        /* keep it where it was, so every byte held stays in some segment */
        if (arena >= 0) chunk_map(st, st->arenas[arena], i, (uint64_t)g0);
        return rc;
    }
    chunk_list_del(st, i);
    reserved_add(st, c->pool, -(int64_t)(c->n << st->gshift), -1);
    if (c->n > 1) st->nmulti--;
    c->inuse = 0;
    c->lnext = st->chunk_free;
    st->chunk_free = i;
    return GM_OK;
}

static int chunk_map(gp_state *st, gp_arena *a, int32_t i, uint64_t g) {
    gp_chunk *c = &st->chunks[i];
    int rc = gm__be_map(st->d, a->base + (g << st->gshift), c->n << st->gshift, c->h);
    if (rc) return rc;
    chunk_list_del(st, i);
    if (c->pool != a->pool) { /* its bytes now count in the other pool */
        reserved_add(st, c->pool, -(int64_t)(c->n << st->gshift), -1);
        reserved_add(st, a->pool, (int64_t)(c->n << st->gshift), 1);
        c->pool = a->pool;
    }
    a->mapped_bytes += c->n << st->gshift;
    c->arena = a->index;
    c->g0 = (int64_t)g;
    c->live = 0;
    for (uint64_t k = 0; k < c->n; k++) {
        a->gran[g + k] = i;
        a->mapped[(g + k) >> 6] |= (uint64_t)1 << ((g + k) & 63);
    }
    if (!st->lazy) chunk_list_add(st, i, GP_LIST_IDLE); /* until the placement touches it */
    return GM_OK;
}

static bool excluded(const gp_chunk *c, const gp_arena *a, uint64_t pg0, uint64_t pg1) {
    return c->arena == a->index && (uint64_t)c->g0 <= pg1 &&
           (uint64_t)c->g0 + c->n - 1 >= pg0;
}

/* The largest chunk of `list` with at most n granules, not under the placement. */
static int32_t take_le(gp_state *st, uint8_t list, uint64_t n, const gp_arena *a,
                       uint64_t pg0, uint64_t pg1) {
    for (int o = (int)gm__gp_order(n); o >= 0; o--) {
        int32_t best = -1;
        int32_t h = list == GP_LIST_IDLE ? st->idle[o] : st->loose[o];
        for (int32_t i = h; i >= 0; i = st->chunks[i].lnext) {
            const gp_chunk *c = &st->chunks[i];
            if (c->n <= n && !excluded(c, a, pg0, pg1) &&
                (best < 0 || c->n > st->chunks[best].n)) {
                best = i;
                if (c->n == n || c->n == ((uint64_t)2 << o) - 1) break; /* cannot do better */
            }
        }
        if (best >= 0) return best;
    }
    return -1;
}

static bool all_unmapped(const gp_arena *a, uint64_t s, uint64_t e) {
    if (e > a->ngran) return false;
    for (uint64_t g = s; g < e; g++)
        if (a->gran[g] >= 0) return false;
    return true;
}

/* The smallest chunk of `list` larger than the run [g, g+n) that can cover it
 * by spilling into unmapped granules next to it (no memory is added: the
 * chunk exists already). *at gets where to map it. */
static int32_t take_over(gp_state *st, uint8_t list, const gp_arena *a, uint64_t g,
                         uint64_t n, uint64_t pg0, uint64_t pg1, uint64_t *at) {
    for (unsigned o = gm__gp_order(n); o < GP_NORDERS; o++) {
        int32_t best = -1;
        uint64_t best_at = 0;
        int32_t h = list == GP_LIST_IDLE ? st->idle[o] : st->loose[o];
        for (int32_t i = h; i >= 0; i = st->chunks[i].lnext) {
            const gp_chunk *c = &st->chunks[i];
            if (c->n <= n || excluded(c, a, pg0, pg1)) continue;
            if (best >= 0 && c->n >= st->chunks[best].n) continue;
            uint64_t m = c->n;
            if (all_unmapped(a, g + n, g + m)) {
                best = i, best_at = g;
            } else if (g + n >= m && all_unmapped(a, g + n - m, g)) {
                best = i, best_at = g + n - m;
            }
        }
        if (best >= 0) {
            *at = best_at;
            return best;
        }
    }
    return -1;
}

static int32_t any_chunk(gp_state *st, uint8_t list, const gp_arena *a, uint64_t pg0,
                         uint64_t pg1) {
    for (int o = GP_NORDERS - 1; o >= 0; o--) {
        int32_t h = list == GP_LIST_IDLE ? st->idle[o] : st->loose[o];
        for (int32_t i = h; i >= 0; i = st->chunks[i].lnext)
            if (!excluded(&st->chunks[i], a, pg0, pg1)) return i;
    }
    return -1;
}

/* New physical memory for n granules. First give back unused chunks worth at
 * least as much, so physical memory held never exceeds what live blocks need. */
static int chunk_create(gp_state *st, uint64_t n, gp_arena *a, uint64_t pg0,
                        uint64_t pg1, bool release_first, int32_t *out) {
    uint64_t freed = 0;
    while (release_first && freed < n) {
        int32_t i = any_chunk(st, GP_LIST_LOOSE, a, pg0, pg1);
        if (i < 0) i = any_chunk(st, GP_LIST_IDLE, a, pg0, pg1);
        if (i < 0) break;
        uint64_t m = st->chunks[i].n;
        int rc = chunk_release(st, i);
        if (rc) return rc;
        freed += m;
    }
    uint64_t bytes = n << st->gshift;
    gm__device *d = st->d;
    if (d->fraction_set && st->held_bytes + bytes > d->allowed_memory_maximum)
        return GM_ENOMEM;
    int32_t i = chunk_slot(st);
    if (i < 0) return GM_ENOHOSTMEM;
    gp_chunk *c = &st->chunks[i];
    int rc = gm__be_phys_create(d, bytes, &c->h);
    if (rc) {
        c->inuse = 0;
        c->lnext = st->chunk_free;
        st->chunk_free = i;
        return rc;
    }
    c->n = n;
    if (n > 1) st->nmulti++;
    c->g0 = -1;
    c->arena = -1;
    c->live = 0;
    c->inuse = 1;
    c->pool = a->pool;
    c->list = GP_LIST_NONE;
    c->lprev = c->lnext = -1;
    reserved_add(st, c->pool, (int64_t)bytes, 1);
    chunk_list_add(st, i, GP_LIST_LOOSE);
    *out = i;
    return GM_OK;
}

/* base granules plus the configured slack (gpumem_slack), saturating: with
 * slack inf the policy creates memory rather than move idle chunks, and moves
 * them only when creating fails (device full, memory fraction reached). */
static uint64_t slack_budget(const gp_state *st, uint64_t base) {
    double extra = (double)base * st->slack;
    if (!(extra < 1e18)) return UINT64_MAX; /* inf, or too large to matter */
    return base + (uint64_t)extra;
}

/* Back the unmapped granules [g, g+n) of arena a, part of the placement
 * [pg0, pg1]: loose chunks first, then idle ones moved here, then new ones. */
static int acquire_run(gp_state *st, gp_arena *a, uint64_t g, uint64_t n, uint64_t pg0,
                       uint64_t pg1, uint64_t cap) {
    while (n > 0) {
        uint64_t at = g;
        int32_t i = take_le(st, GP_LIST_LOOSE, n, a, pg0, pg1);
        /* Below a budget, new memory is cheaper than moving idle chunks
         * around every step: the budget is a small slack over the peak of
         * live granules, or GP_TARGET_PERMILLE over the peak of bytes
         * requested (the ratio the policy aims for), whichever is larger. */
        uint64_t need = st->live_gran + (pg1 - pg0 + 1);
        uint64_t base = st->peak_live_gran > need ? st->peak_live_gran : need;
        uint64_t budget = slack_budget(st, base);
        uint64_t req = (uint64_t)st->d->stats.requested_bytes[GM_POOL_ALL].peak;
        uint64_t target = (req + req / 1000 * GP_TARGET_PERMILLE) >> st->gshift;
        if (target > budget) budget = target;
        uint64_t held = st->held_bytes >> st->gshift;
        if (i < 0 && held + n <= budget) {
            int rc = chunk_create(st, n < cap ? n : cap, a, pg0, pg1, false, &i);
            if (rc && rc != GM_ENOMEM) return rc;
            if (rc) i = -1;
        }
        if (i < 0) gm__gp_live_sync(st); /* pressure: idle chunks must be known */
        if (i < 0) i = take_le(st, GP_LIST_IDLE, n, a, pg0, pg1);
        /* gpumem_chunks:auto: a chunk spilling past the run could end up
         * under more than one block (see split_partial) */
        if (i < 0 && cap > 1 && !st->autoc) i = take_over(st, GP_LIST_LOOSE, a, g, n, pg0, pg1, &at);
        if (i < 0 && cap > 1 && !st->autoc) i = take_over(st, GP_LIST_IDLE, a, g, n, pg0, pg1, &at);
        if (i < 0) {
            uint64_t want = n < cap ? n : cap;
            int rc = chunk_create(st, want, a, pg0, pg1, true, &i);
            /* near the limit, one granule may still fit where a run does not */
            if (rc == GM_ENOMEM && want > 1) rc = chunk_create(st, 1, a, pg0, pg1, true, &i);
            if (rc) return rc;
        }
        if (st->chunks[i].arena >= 0) {
            int rc = chunk_unmap(st, i);
            if (rc) return rc;
        }
        int rc = chunk_map(st, a, i, at);
        if (rc) { /* give it back rather than hold memory no segment shows */
            chunk_release(st, i);
            return rc;
        }
        uint64_t m = st->chunks[i].n;
        if (at != g || m >= n) return GM_OK; /* spilled over: run covered */
        g += m;
        n -= m;
    }
    return GM_OK;
}

/* What the device (or the memory fraction) lets this process hold. */
static uint64_t device_limit(const gp_state *st) {
    const gm__device *d = st->d;
    return d->fraction_set ? d->allowed_memory_maximum : d->total_memory;
}

/* gpumem_chunks:auto: physical memory held is past GP_AUTO_PERMILLE of the
 * limit, so the device may fill up: from here on no chunk may pin granules
 * that no block uses. */
static bool tight(const gp_state *st) {
    return st->held_bytes > device_limit(st) / 1000 * GP_AUTO_PERMILLE;
}

/* gpumem_chunks:auto: the largest chunk to create now, 1/GP_AUTO_HEADROOM of
 * the memory still free under the limit (at least a granule, at most
 * GP_RUN_GRANULES): early chunks are the ones a later block may pin in part. */
static uint64_t headroom_cap(const gp_state *st) {
    uint64_t lim = device_limit(st);
    uint64_t free_g = lim > st->held_bytes ? (lim - st->held_bytes) >> st->gshift : 0;
    uint64_t c = free_g / GP_AUTO_HEADROOM;
    return c < 1 ? 1 : c > GP_RUN_GRANULES ? GP_RUN_GRANULES : c;
}

static int ensure_mapped(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes) {
    uint64_t pg0 = (p - a->base) >> st->gshift;
    uint64_t pg1 = (p - a->base + bytes - 1) >> st->gshift;
    uint64_t off = p - a->base;
    uint64_t ig0 = (off + st->gran - 1) >> st->gshift, ig1 = (off + bytes) >> st->gshift;
    bool big = bytes >= GP_BIG_BYTES;
    uint64_t g = pg0;
    while (g <= pg1) {
        int32_t c = a->gran[g];
        if (c >= 0) {
            g = (uint64_t)(st->chunks[c].g0 + (int64_t)st->chunks[c].n);
            continue;
        }
        /* a big block's interior granules (no other block can share them
         * while it lives) get one chunk; anything else granule by granule,
         * so that memory between blocks can move where it is needed */
        bool inner = big && g >= ig0 && g < ig1;
        uint64_t e = g, cap = inner ? GP_MAX_CHUNK_GRANULES : 1;
        if (st->autoc && tight(st)) {
            /* gpumem_chunks:auto near full: only the block's interior (no
             * other block can touch it while this one lives) in one chunk */
            if (g >= ig0 && g < ig1) {
                while (e < ig1 && a->gran[e] < 0) e++;
                cap = headroom_cap(st);
            } else {
                e = g + 1; /* an edge granule: other blocks may share it */
            }
        } else if (st->runs) { /* gpumem_chunks:run (or auto with room): the whole unmapped run */
            while (e <= pg1 && a->gran[e] < 0) e++;
            cap = st->autoc ? headroom_cap(st) : GP_RUN_GRANULES;
        } else {
            while (e <= pg1 && a->gran[e] < 0 && (inner ? e < ig1 : !(big && e >= ig0 && e < ig1))) e++;
        }
        int rc = acquire_run(st, a, g, e - g, pg0, pg1, cap);
        if (rc) return rc;
        /* a spilled chunk may have covered more than the run */
    }
    return GM_OK;
}

/* ---- free ranges ------------------------------------------------------------ */

static void free_insert(gp_state *st, gp_arena *a, gp_block *b) {
    gm__gp_bin_insert(a, b);
    b->split_cnt = b->next != NULL; /* the arena's top range is not a split */
    if (b->split_cnt) {
        gm__stat_pool_inc(st->d->stats.inactive_split, a->pool, 1);
        gm__stat_pool_inc(st->d->stats.inactive_split_bytes, a->pool, (int64_t)b->h.size);
    }
}

static void free_remove(gp_state *st, gp_arena *a, gp_block *b) {
    gm__gp_bin_remove(a, b);
    if (b->split_cnt) {
        gm__stat_pool_dec(st->d->stats.inactive_split, a->pool, 1);
        gm__stat_pool_dec(st->d->stats.inactive_split_bytes, a->pool, (int64_t)b->h.size);
    }
    b->split_cnt = 0;
}

static void link_after(gp_block *pos, gp_block *b) {
    b->prev = pos;
    b->next = pos->next;
    if (pos->next) pos->next->prev = b;
    pos->next = b;
}

static void unlink_block(gp_arena *a, gp_block *b) {
    if (b->prev) b->prev->next = b->next;
    else a->head = b->next;
    if (b->next) b->next->prev = b->prev;
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
        gm__be_va_release(st->d, a->base, a->va_size);
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
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__)
/* the x86-64 baseline has no popcnt instruction: pick it at load time where the CPU has it */
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
    uint64_t best = st->nmulti && !st->runs ? cost(st, a, lo, bytes, UINT64_MAX, &budget)
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
    *needs_map = best % GP_COST_PARTIAL != 0;
    return pick;
}

/* Split free range r so that [p, p+bytes) becomes a used block. */
static int carve(gp_state *st, gp_arena *a, gp_block *r, gm_devptr p, uint64_t bytes,
                 gp_block **out) {
    uint64_t front = p - r->h.ptr, back = r->h.ptr + r->h.size - (p + bytes);
    gp_block *b = NULL, *tail = NULL;
    if (front && !(b = gm__gp_block_new(st))) return GM_ENOHOSTMEM;
    if (back && !(tail = gm__gp_block_new(st))) {
        if (b) gm__gp_block_put(st, b);
        return GM_ENOHOSTMEM;
    }
    free_remove(st, a, r);
    uint64_t total = r->h.size;
    if (front) {
        r->h.size = front;
        link_after(r, b);
        free_insert(st, a, r);
    } else {
        b = r;
    }
    b->h.ptr = p;
    b->h.size = bytes;
    b->h.stream = a->stream;
    b->state = GP_USED;
    b->arena = (uint16_t)a->index;
    if (back) {
        tail->h.ptr = p + bytes;
        tail->h.size = total - front - bytes;
        tail->h.stream = a->stream;
        tail->state = GP_FREE;
        tail->arena = (uint16_t)a->index;
        link_after(b, tail);
        free_insert(st, a, tail);
    }
    touch_inc(st, a, p, bytes);
    *out = b;
    return GM_OK;
}

/* Replace idle chunk i by chunks over the same granules, cut at the sorted
 * granule positions cut[0..ncut) inside it: the same memory stays mapped in
 * the same place (so placement goes on as if nothing happened), in pieces.
 * Its arena's stream must be done with it first (chunk_unmap syncs). A
 * piece that cannot be created stays unmapped: a placement maps what it
 * needs anyway. */
static int chunk_split(gp_state *st, int32_t i, const uint64_t *cut, int ncut) {
    gp_chunk *c = &st->chunks[i];
    gp_arena *a = st->arenas[c->arena];
    uint64_t c0 = (uint64_t)c->g0, c1 = c0 + c->n;
    int rc = chunk_release(st, i);
    if (rc) return rc;
    st->nsplit++;
    for (int k = 0; k <= ncut; k++) {
        uint64_t s = k ? cut[k - 1] : c0, e = k < ncut ? cut[k] : c1;
        if (e <= s) continue;
        int32_t j;
        if (chunk_create(st, e - s, a, s, e - 1, false, &j)) break;
        if (chunk_map(st, a, j, s)) {
            chunk_release(st, j);
            break;
        }
    }
    return GM_OK;
}

/* No used or cached block of arena a touches chunk i (mapped in a), which
 * overlaps free range r. The live counts may be stale (slack inf), so ask
 * the blocks around r. */
static bool chunk_idle(const gp_state *st, const gp_arena *a, int32_t i, const gp_block *r) {
    const gp_chunk *c = &st->chunks[i];
    gm_devptr s = a->base + ((uint64_t)c->g0 << st->gshift), e = s + (c->n << st->gshift);
    for (const gp_block *b = r->prev; b && b->h.ptr + b->h.size > s; b = b->prev)
        if (b->state != GP_FREE) return false;
    for (const gp_block *b = r->next; b && b->h.ptr < e; b = b->next)
        if (b->state != GP_FREE) return false;
    return true;
}

/* Once the device may fill up (tight), gpumem_chunks:auto keeps every
 * multi-granule chunk it creates or cuts under the interior (granules it
 * covers whole) of at most one live block, so that the chunk is either wholly
 * needed or idle: it pins no granule that no block uses, and can move or be
 * given back under pressure like a granule. (Chunks made earlier may still be
 * pinned in part; headroom_cap keeps those small.) A placement over
 * [p, p+bytes) in free range r can only meet such a chunk idle, and only at
 * one of its edge granules if the chunk is not inside its interior: then the
 * chunk is cut there, at the placement's edges and interior, into chunks over
 * the same granules, so the placement uses whole chunks and memory stays
 * where it was (placement goes on exactly as with granule chunks). An older
 * chunk met there with a live block is left alone. Returns 1 if a chunk was
 * cut. */
static int split_partial(gp_state *st, gp_arena *a, const gp_block *r, gm_devptr p, uint64_t bytes) {
    uint64_t off = p - a->base;
    uint64_t pg0 = off >> st->gshift, pg1 = (off + bytes - 1) >> st->gshift;
    uint64_t ig0 = (off + st->gran - 1) >> st->gshift, ig1 = (off + bytes) >> st->gshift;
    uint64_t edge[2] = {pg0, pg1};
    int split = 0;
    for (int k = 0; k < 2; k++) {
        int32_t i = a->gran[edge[k]];
        if (i < 0) continue;
        const gp_chunk *c = &st->chunks[i];
        uint64_t c0 = (uint64_t)c->g0, c1 = c0 + c->n;
        if (c->n == 1 || (c0 >= ig0 && c1 <= ig1) || !chunk_idle(st, a, i, r)) continue;
        /* cut points in order: pg0 <= ig0 and ig1 <= pg1 + 1, and with no
         * interior (ig0 > ig1) the block is inside granule pg0 = pg1 */
        uint64_t pts[4] = {pg0, ig0 <= ig1 ? ig0 : pg0 + 1, ig0 <= ig1 ? ig1 : pg0 + 1, pg1 + 1};
        uint64_t cut[4];
        int ncut = 0;
        for (int m = 0; m < 4; m++)
            if (pts[m] > c0 && pts[m] < c1 && (!ncut || pts[m] > cut[ncut - 1])) cut[ncut++] = pts[m];
        int rc = chunk_split(st, i, cut, ncut);
        if (rc) return rc;
        split = 1;
    }
    return split;
}

static int va_place(gp_state *st, gp_arena *a, uint64_t units, gp_block **out) {
    uint64_t bytes = units << GP_ALIGN_SHIFT;
    if (bytes > a->va_size) return GM_ENOMEM;
    for (int pass = 0;; pass++) {
        gm_devptr at;
        bool needs_map;
        gp_block *r = choose(st, a, bytes, &at, &needs_map);
        if (!r) return GM_ENOMEM; /* address range exhausted */
        if (needs_map && pass == 0 && gm__gp_flush_quick(st)) continue; /* cached blocks back first */
        if (st->autoc && st->nmulti && tight(st)) {
            int rc = split_partial(st, a, r, at, bytes);
            if (rc < 0) return rc;
            if (rc) needs_map = true;
        }
        if (needs_map) {
            int rc = ensure_mapped(st, a, at, bytes);
            if (rc) return rc;
        }
        return carve(st, a, r, at, bytes, out);
    }
}

int gm__gp_va_place(gp_state *st, gp_arena *a, uint64_t units, gp_block **out) {
    int rc = va_place(st, a, units, out);
    gm__gp_live_drop(st); /* the pressure (if any) is over */
    return rc;
}

void gm__gp_va_free(gp_state *st, gp_arena *a, gp_block *b) {
    touch_dec(st, a, b->h.ptr, b->h.size);
    b->state = GP_FREE;
    gp_block *p = b->prev, *n = b->next;
    if (p && p->state == GP_FREE) {
        free_remove(st, a, p);
        p->h.size += b->h.size;
        unlink_block(a, b);
        gm__gp_block_put(st, b);
        b = p;
    }
    if (n && n->state == GP_FREE) {
        free_remove(st, a, n);
        b->h.size += n->h.size;
        unlink_block(a, n);
        gm__gp_block_put(st, n);
    }
    free_insert(st, a, b);
    a->dirty = true;
}

/* Give every idle or loose chunk back to the backend. */
int gm__gp_release_unused(gp_state *st) {
    int first = GM_OK;
    gm__gp_live_sync(st);
    for (int o = 0; o < GP_NORDERS; o++) {
        for (int pass = 0; pass < 2; pass++) {
            int32_t *h = pass ? &st->idle[o] : &st->loose[o];
            int32_t i = *h;
            while (i >= 0) {
                int32_t nx = st->chunks[i].lnext;
                int rc = chunk_release(st, i);
                if (rc && !first) first = rc;
                i = nx;
            }
        }
    }
    gm__gp_live_drop(st);
    return first;
}

/* Destroy: unmap and release every chunk, whatever uses it. */
void gm__gp_release_all(gp_state *st) {
    for (int32_t i = 0; i < st->nchunks; i++) {
        gp_chunk *c = &st->chunks[i];
        if (!c->inuse) continue;
        if (c->arena >= 0) {
            gp_arena *a = st->arenas[c->arena];
            gm__be_unmap(st->d, a->base + ((uint64_t)c->g0 << st->gshift), c->n << st->gshift);
        }
        gm__be_phys_release(st->d, c->h);
        c->inuse = 0;
    }
}
