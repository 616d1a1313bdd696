/* chunks.c — the physical side of the `gpumem` policy: the
 * chunks (whole multiples of the VMM granule) behind each arena, which are
 * mapped where, which are idle (live counts, kept lazily at slack inf), and how
 * a placement that touches unmapped granules gets memory (reuse a loose chunk,
 * else create one within the slack budget, else move an idle one, releasing
 * idle chunks first so that physical memory never exceeds what live blocks
 * touch), the chunk sizes of gpumem_chunks:granule|run|auto and the cuts
 * that keep auto's multi-granule chunks whole or idle. */
#include "chunks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- granules ------------------------------------------------------------ */

static void chunk_list_del(gp_state *st, int32_t i);
static void chunk_list_add(gp_state *st, int32_t i, uint8_t list);

/* Each arena's index of the idle one-granule chunks mapped in it, by
 * address (a->idle1): the reserve budget moves granule after granule, and
 * finding the highest idle one (take_le_but) by reading the whole idle list
 * for each made a step's moves cost the square of the chunks held
 * (bench/RESULTS.md, "the idle granule found by address"). */
static inline void idle1_set(gp_state *st, const gp_chunk *c) {
    if (c->n != 1) return;
    gp_arena *a = st->arenas[c->arena];
    uint64_t g = (uint64_t)c->g0;
    a->idle1[g >> 6] |= (uint64_t)1 << (g & 63);
    a->idle1_sum[g >> 12] |= (uint64_t)1 << (g >> 6 & 63);
}

static inline void idle1_clear(gp_state *st, const gp_chunk *c) {
    if (c->n != 1) return;
    gp_arena *a = st->arenas[c->arena];
    uint64_t g = (uint64_t)c->g0;
    if (!(a->idle1[g >> 6] &= ~((uint64_t)1 << (g & 63))))
        a->idle1_sum[g >> 12] &= ~((uint64_t)1 << (g >> 6 & 63));
}

static int idle1_new(gp_arena *a) {
    uint64_t words = (a->ngran + 63) / 64;
    a->idle1 = calloc(words + (words + 63) / 64, sizeof *a->idle1);
    if (!a->idle1) return GM_ENOHOSTMEM;
    a->idle1_sum = a->idle1 + words;
    return GM_OK;
}

/* The highest granule at or below g where an idle one-granule chunk of a
 * starts, or -1. */
static int64_t idle1_below(const gp_arena *a, int64_t g) {
    if (g < 0) return -1;
    uint64_t w = (uint64_t)g >> 6;
    uint64_t m = a->idle1[w] & (~(uint64_t)0 >> (63 - (g & 63)));
    if (m) return (int64_t)(w << 6 | (63u - (unsigned)__builtin_clzll(m)));
    if (w-- == 0) return -1;
    uint64_t s = w >> 6;
    uint64_t sm = a->idle1_sum[s] & (~(uint64_t)0 >> (63 - (w & 63)));
    while (!sm) {
        if (s == 0) return -1;
        sm = a->idle1_sum[--s];
    }
    w = s << 6 | (63u - (unsigned)__builtin_clzll(sm));
    return (int64_t)(w << 6 | (63u - (unsigned)__builtin_clzll(a->idle1[w])));
}

/* Chunk i at the tail of the list with head *h and tail *t, as `list`;
 * out of it again. */
static inline void list_link(gp_state *st, int32_t i, gp_chunk *c, uint8_t list, int32_t *h, int32_t *t) {
    c->list = list;
    c->lnext = -1;
    c->lprev = *t;
    if (*t >= 0) st->chunks[*t].lnext = i;
    else *h = i;
    *t = i;
}

static inline void list_unlink(gp_state *st, gp_chunk *c, int32_t *h, int32_t *t) {
    if (c->lprev >= 0) st->chunks[c->lprev].lnext = c->lnext;
    else *h = c->lnext;
    if (c->lnext >= 0) st->chunks[c->lnext].lprev = c->lprev;
    else *t = c->lprev;
    c->list = GP_LIST_NONE;
    c->lprev = c->lnext = -1;
}

/* The idle list of chunk c's order: what touch() moves chunks in and out
 * of, once per granule of every large block allocated or freed, so it is
 * chunk_list_add/del without the list choice. */
static inline void idle_add(gp_state *st, int32_t i, gp_chunk *c) {
    unsigned o = gm__gp_order(c->n);
    idle1_set(st, c);
    c->idle_sync = st->arenas[c->arena]->syncs;
    list_link(st, i, c, GP_LIST_IDLE, &st->idle[o], &st->idle_tail[o]);
}

static inline void idle_del(gp_state *st, gp_chunk *c) {
    unsigned o = gm__gp_order(c->n);
    idle1_clear(st, c);
    list_unlink(st, c, &st->idle[o], &st->idle_tail[o]);
}

/* Add dir (+1 or -1) to the live count of every chunk under [p, p+bytes);
 * chunks that become idle or stop being idle move in or out of their idle
 * list, and live_gran follows. */
void gm__gp_touch(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes, int dir) {
    uint64_t g = (p - a->base) >> st->gshift;
    uint64_t ge = (p - a->base + bytes - 1) >> st->gshift;
    uint64_t live = st->live_gran;
    while (g <= ge) {
        int32_t i = a->gran[g];
        gp_chunk *c = &st->chunks[i];
        if (dir > 0 && c->live++ == 0) {
            if (c->list == GP_LIST_IDLE) idle_del(st, c);
            else chunk_list_del(st, i); /* any other list (none, in practice) */
            live += c->n;
            if (live > st->peak_live_gran) st->peak_live_gran = live;
        } else if (dir < 0 && --c->live == 0) {
            idle_add(st, i, c);
            live -= c->n;
        }
        g = (uint64_t)(c->g0 + (int64_t)c->n);
    }
    st->live_gran = live;
}

/* ---- when idle chunks move: gpumem_slack ------------------------------------ */

/* The chunk and live-count modes that follow from st->slack. */
void gm__gp_slack_modes(gp_state *st) {
    const gm_config *cfg = st->d->cfg;
    /* idle chunks move only under memory pressure at inf, so a chunk larger
     * than a granule costs no memory there while the device has room, and
     * saves device calls; under pressure a partly used one pins memory,
     * which auto avoids once the device may fill up (chunks.c) */
    st->autoc = isinf(st->slack) && cfg && cfg->gpumem_chunks == GM_GPUMEM_CHUNKS_AUTO &&
                !st->mode.autoslack; /* the reserve budget moves granules: every chunk must be able to */
    st->runs = isinf(st->slack) && cfg && (cfg->gpumem_chunks == GM_GPUMEM_CHUNKS_RUN || st->autoc);
    /* at inf nothing on the hot path reads live counts (chunks.c) */
    st->lazy_ok = isinf(st->slack);
}

void gm__gp_loosen(gp_state *st) {
    if (!st->mode.warming) return;
    st->mode.warming = false;
    st->slack = INFINITY;
    gm__gp_slack_modes(st);
    gm__gp_live_drop(st);
}

/* ---- live counts, kept lazily at slack inf ---------------------------------
 * At gpumem_slack:inf idle chunks move only under memory pressure (or are
 * given back by empty_cache), so nothing on the hot path reads the chunks'
 * live counts or idle lists, and keeping them exact costs a list update per
 * granule of every large block allocated or freed, a large part of a warm
 * pass (bench/RESULTS.md, "replay after the lazy live counts", has the warm
 * path before and after). There (st->lazy_ok) they are left stale
 * (st->lazy: every mapped chunk on no list) and recounted from the blocks,
 * in address order, just before something needs them (live_sync),
 * then dropped again (gm__gp_live_drop). Finite slack reads them on every
 * placement that maps, so it keeps them exact all the time. */

static void live_sync(gp_state *st) {
    if (!st->lazy) return;
    st->lazy = false; /* from here touch() keeps counts, lists and live_gran */
    st->live_gran = 0;
    for (int32_t i = 0; i < st->nchunks; i++) st->chunks[i].live = 0;
    for (uint32_t k = 0; k < st->narenas; k++) {
        gp_arena *a = st->arenas[k];
        if (!a->gran) continue;
        for (gp_block *b = a->head; b; b = b->next)
            if (b->state != GP_FREE) gm__gp_touch(st, a, b->h.ptr, b->h.size, 1);
    }
    /* the chunks no block touches are idle: listed in address order */
    for (uint32_t k = 0; k < st->narenas; k++) {
        gp_arena *a = st->arenas[k];
        for (uint64_t g = 0; a->gran && g < a->ngran; g++) {
            if (!(a->mapped[g >> 6] >> (g & 63) & 1)) { /* skip unmapped words fast */
                if (!a->mapped[g >> 6]) g |= 63;
                continue;
            }
            int32_t i = a->gran[g];
            gp_chunk *c = &st->chunks[i];
            if ((uint64_t)c->g0 == g && !c->live) idle_add(st, i, c); /* once, at its first granule */
        }
    }
}

void gm__gp_live_drop_now(gp_state *st) {
    for (int o = 0; o < GP_NORDERS; o++) {
        for (int32_t i = st->idle[o]; i >= 0;) {
            gp_chunk *c = &st->chunks[i];
            int32_t nx = c->lnext;
            idle1_clear(st, c);
            c->list = GP_LIST_NONE;
            c->lprev = c->lnext = -1;
            i = nx;
        }
        st->idle[o] = st->idle_tail[o] = -1;
    }
    st->lazy = true;
}

/* ---- chunk lists ----------------------------------------------------------- */

/* The idle lists go through idle_add/idle_del (they keep the index too);
 * these are the loose lists. */
static void chunk_list_add(gp_state *st, int32_t i, uint8_t list) {
    gp_chunk *c = &st->chunks[i];
    if (list == GP_LIST_IDLE) {
        idle_add(st, i, c);
        return;
    }
    unsigned o = gm__gp_order(c->n);
    list_link(st, i, c, list, &st->loose[o], &st->loose_tail[o]);
}

static void chunk_list_del(gp_state *st, int32_t i) {
    gp_chunk *c = &st->chunks[i];
    if (c->list == GP_LIST_NONE) return;
    if (c->list == GP_LIST_IDLE) {
        idle_del(st, c);
        return;
    }
    unsigned o = gm__gp_order(c->n);
    list_unlink(st, c, &st->loose[o], &st->loose_tail[o]);
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

/* Unmap chunk i (idle) after the work that used it is done; it becomes loose.
 * A chunk on the idle list (counts exact) since before its stream's last sync
 * needs no new sync: the work that used it was queued before that one. Any
 * other waits for the stream, which on a GPU stalls the host until the work
 * queued so far has run (bench/RESULTS.md, "moves without a sync"). */
static int chunk_unmap(gp_state *st, int32_t i) {
    gp_chunk *c = &st->chunks[i];
    gp_arena *a = st->arenas[c->arena];
    bool done = !st->lazy && c->list == GP_LIST_IDLE && c->idle_sync != a->syncs;
    int rc = done ? GM_OK : gm__gp_sync_arena(st, a);
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
    if (!a->idle1 && idle1_new(a)) return GM_ENOHOSTMEM;
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

/* x before y, as the idle chunk to move into arena a: the higher in a first,
 * a's before other arenas'. Placement fills an arena from the bottom, so the
 * highest idle chunk is the one the placements after this one are least
 * likely to need where it is: moving the one idle longest instead moved, in
 * steps that grow, chunks the same step then had to move back
 * (bench/RESULTS.md, "the highest idle chunk moves"). */
static inline bool higher(const gp_chunk *x, const gp_chunk *y, const gp_arena *a) {
    return (x->arena == a->index ? x->g0 : -1) > (y->arena == a->index ? y->g0 : -1);
}

/* take_le_but's idle one-granule chunk: by higher(), the highest of a's not
 * under the placement [pg0, pg1] (nor, with spare, kept: st->keep), found in
 * its index; if a has none, the first of other arenas' on the list. */
static int32_t idle1_take(gp_state *st, const gp_arena *a, uint64_t pg0, uint64_t pg1, bool spare) {
    for (int64_t g = a->idle1 ? idle1_below(a, (int64_t)a->ngran - 1) : -1; g >= 0;) {
        if ((uint64_t)g >= pg0 && (uint64_t)g <= pg1) { /* excluded() */
            g = idle1_below(a, (int64_t)pg0 - 1);
            continue;
        }
        int32_t i = a->gran[g];
        if (!spare || !st->keep(st, &st->chunks[i])) return i;
        g = idle1_below(a, g - 1);
    }
    for (int32_t i = st->idle[0]; i >= 0; i = st->chunks[i].lnext) {
        const gp_chunk *c = &st->chunks[i];
        if (c->arena != a->index && !(spare && st->keep(st, c))) return i;
    }
    return -1;
}

/* The largest chunk of `list` with at most n granules, not under the placement
 * (nor, with spare, one the plan keeps for its next steps: st->keep). */
static int32_t take_le_but(gp_state *st, uint8_t list, uint64_t n, const gp_arena *a,
                           uint64_t pg0, uint64_t pg1, bool spare) {
    /* idle chunks: the whole list is read, and of equal sizes the higher wins
     * (one-granule ones: idle1_take, from the index) */
    bool high = list == GP_LIST_IDLE;
    for (int o = (int)gm__gp_order(n); o >= 0; o--) {
        if (high && o == 0) return idle1_take(st, a, pg0, pg1, spare);
        int32_t best = -1;
        int32_t h = list == GP_LIST_IDLE ? st->idle[o] : st->loose[o];
        for (int32_t i = h; i >= 0; i = st->chunks[i].lnext) {
            const gp_chunk *c = &st->chunks[i];
            if (c->n > n || excluded(c, a, pg0, pg1)) continue;
            if (spare && st->keep(st, c)) continue;
            const gp_chunk *b = best >= 0 ? &st->chunks[best] : NULL;
            if (b && !(c->n > b->n || (high && c->n == b->n && higher(c, b, a)))) continue;
            best = i;
            if (!high && (c->n == n || c->n == ((uint64_t)2 << o) - 1)) break; /* cannot do better */
        }
        if (best >= 0) return best;
    }
    return -1;
}

static int32_t take_le(gp_state *st, uint8_t list, uint64_t n, const gp_arena *a,
                       uint64_t pg0, uint64_t pg1) {
    return take_le_but(st, list, n, a, pg0, pg1, false);
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
    if (gm__device_capturing(st->d)) release_first = false; /* no unmap during a capture */
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
    if (d->fraction_set && st->held_bytes + gm__device_others_reserved(d) + bytes > d->allowed_memory_maximum)
        return GM_ENOMEM;
    if (gm__gp_soft_cap(st) && st->held_bytes + bytes > gm__gp_soft_cap(st)) return GM_ENOMEM; /* gpumem_plan: move, do not grow */
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

/* gpumem_slack:auto once warmed up: the reserve budget, in granules. Memory
 * held may grow to GP_BUDGET_PERMILLE over the run's peak allocated so far
 * (the placement under way counted at its span); past that, idle chunks move
 * to where a placement needs them instead of new memory being made. Any
 * phase of a job (an evaluation pass, a longer batch, a new request shape)
 * then reuses the memory an earlier phase left idle, whatever arena holds
 * it, and steps that repeat at the same addresses make no device call. */
static uint64_t reserve_budget(const gp_state *st, uint64_t span) {
    const gm_stats *s = &st->d->stats;
    uint64_t now = (uint64_t)s->allocated_bytes[GM_POOL_ALL].current + (span << st->gshift);
    uint64_t peak = (uint64_t)s->allocated_bytes[GM_POOL_ALL].peak;
    if (now > peak) peak = now;
    return (peak + peak / 1000 * GP_BUDGET_PERMILLE) >> st->gshift;
}

/* Below this many granules held, new memory is cheaper than moving idle
 * chunks: the reserve budget when it is in force; else a small slack over the
 * peak of live granules (the placement's span counted), or the peak of bytes
 * requested, whichever is larger. */
static uint64_t create_budget(const gp_state *st, uint64_t span) {
    if (gm__gp_reserving(st)) return reserve_budget(st, span);
    uint64_t need = st->live_gran + span;
    uint64_t budget = slack_budget(st, st->peak_live_gran > need ? st->peak_live_gran : need);
    uint64_t target = (uint64_t)st->d->stats.requested_bytes[GM_POOL_ALL].peak >> st->gshift;
    return target > budget ? target : budget;
}

uint64_t gm__gp_budget_bytes(const gp_state *st) {
    return st->mode.autoslack ? reserve_budget(st, 0) << st->gshift : 0;
}

/* Back the unmapped granules [g, g+n) of arena a, part of the placement
 * [pg0, pg1]: loose chunks first, then idle ones moved here, then new ones. */
static int acquire_run(gp_state *st, gp_arena *a, uint64_t g, uint64_t n, uint64_t pg0,
                       uint64_t pg1, uint64_t cap) {
    while (n > 0) {
        uint64_t at = g;
        int32_t i = take_le(st, GP_LIST_LOOSE, n, a, pg0, pg1);
        uint64_t budget = create_budget(st, pg1 - pg0 + 1);
        /* the reserve budget spares what a plan that serves keeps for its next steps:
         * moving that would move it back in every step; past them, new memory */
        bool spare = gm__gp_reserving(st) && st->keep && !a->plan_only;
        uint64_t held = st->held_bytes >> st->gshift;
        if (i < 0 && held + n <= budget) {
            int rc = chunk_create(st, n < cap ? n : cap, a, pg0, pg1, false, &i);
            if (rc && rc != GM_ENOMEM) return rc;
            if (rc) i = -1;
        }
        /* an idle chunk moves by an unmap, which a capture does not allow */
        bool may_move = !gm__device_capturing(st->d);
        if (i < 0 && may_move) live_sync(st); /* pressure: idle chunks must be known */
        if (i < 0 && may_move) i = take_le_but(st, GP_LIST_IDLE, n, a, pg0, pg1, spare);
        /* gpumem_chunks:auto: a chunk spilling past the run could end up
         * under more than one block (see split_partial) */
        if (i < 0 && cap > 1 && !st->autoc) i = take_over(st, GP_LIST_LOOSE, a, g, n, pg0, pg1, &at);
        if (i < 0 && cap > 1 && !st->autoc && may_move) i = take_over(st, GP_LIST_IDLE, a, g, n, pg0, pg1, &at);
        if (i < 0) {
            uint64_t want = n < cap ? n : cap;
            int rc = chunk_create(st, want, a, pg0, pg1, !spare, &i);
            if (rc == GM_ENOMEM && spare) rc = chunk_create(st, want, a, pg0, pg1, true, &i);
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

/* gpumem_chunks:auto: the largest chunk to create now, 1/GP_AUTO_HEADROOM of
 * the memory still free under the limit (at least a granule, at most
 * GP_RUN_GRANULES): early chunks are the ones a later block may pin in part. */
static uint64_t headroom_cap(const gp_state *st) {
    uint64_t lim = gm__gp_device_limit(st);
    uint64_t free_g = lim > st->held_bytes ? (lim - st->held_bytes) >> st->gshift : 0;
    uint64_t c = free_g / GP_AUTO_HEADROOM;
    return c < 1 ? 1 : c > GP_RUN_GRANULES ? GP_RUN_GRANULES : c;
}

/* The first granule from g on, below end, that is mapped (or end). */
static uint64_t unmapped_end(const gp_arena *a, uint64_t g, uint64_t end) {
    while (g < end && a->gran[g] < 0) g++;
    return g;
}

int gm__gp_ensure_mapped(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes) {
    uint64_t pg0 = (p - a->base) >> st->gshift;
    uint64_t pg1 = (p - a->base + bytes - 1) >> st->gshift;
    uint64_t off = p - a->base;
    uint64_t ig0 = (off + st->gran - 1) >> st->gshift, ig1 = (off + bytes) >> st->gshift;
    uint64_t g = pg0;
    while (g <= pg1) {
        int32_t c = a->gran[g];
        if (c >= 0) {
            g = (uint64_t)(st->chunks[c].g0 + (int64_t)st->chunks[c].n);
            continue;
        }
        /* granule by granule (gpumem_chunks:granule), so that memory between
         * blocks can move where it is needed; auto and run make larger chunks */
        uint64_t e = g, cap = 1;
        if (st->autoc && gm__gp_tight(st)) {
            /* gpumem_chunks:auto near full: only the block's interior (no
             * other block can touch it while this one lives) in one chunk */
            if (g >= ig0 && g < ig1) {
                e = unmapped_end(a, g, ig1);
                cap = headroom_cap(st);
            } else {
                e = g + 1; /* an edge granule: other blocks may share it */
            }
        } else if (st->runs) { /* gpumem_chunks:run (or auto with room): the whole unmapped run */
            e = unmapped_end(a, g, pg1 + 1);
            cap = st->autoc ? headroom_cap(st) : GP_RUN_GRANULES;
        } else {
            while (e <= pg1 && a->gran[e] < 0) e++;
        }
        int rc = acquire_run(st, a, g, e - g, pg0, pg1, cap);
        if (rc) return rc;
        /* a spilled chunk may have covered more than the run */
    }
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
int gm__gp_split_partial_at(gp_state *st, gp_arena *a, const gp_block *r, gm_devptr p, uint64_t bytes) {
    uint64_t off = p - a->base;
    uint64_t pg0 = off >> st->gshift, pg1 = (off + bytes - 1) >> st->gshift;
    uint64_t ig0 = (off + st->gran - 1) >> st->gshift, ig1 = (off + bytes) >> st->gshift;
    uint64_t edge[2] = {pg0, pg1};
    int split = 0;
    if (gm__device_capturing(st->d)) return 0; /* a cut unmaps: not during a capture */
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

/* Give every idle or loose chunk back to the backend. Each chunk listed at
 * the start of a pass is tried once: a chunk whose release fails goes back to
 * the tail of its list (chunk_release maps it again), so walking until the
 * list ends would try the failed ones forever while the backend keeps
 * failing. */
int gm__gp_release_unused(gp_state *st) { return gm__gp_release_unused_but(st, NULL, NULL); }

int gm__gp_release_unused_but(gp_state *st, bool (*keep)(void *, const gp_chunk *), void *arg) {
    int first = GM_OK;
    live_sync(st);
    for (int o = 0; o < GP_NORDERS; o++) {
        for (int pass = 0; pass < 2; pass++) {
            int32_t *h = pass ? &st->idle[o] : &st->loose[o];
            uint64_t left = 0;
            for (int32_t i = *h; i >= 0; i = st->chunks[i].lnext) left++;
            int32_t i = *h;
            while (i >= 0 && left-- > 0) {
                int32_t nx = st->chunks[i].lnext;
                if (keep && keep(arg, &st->chunks[i])) {
                    i = nx;
                    continue;
                }
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
    for (uint32_t k = 0; k < st->narenas; k++) {
        free(st->arenas[k]->idle1);
        st->arenas[k]->idle1 = st->arenas[k]->idle1_sum = NULL;
    }
    for (int32_t i = 0; i < st->nchunks; i++) {
        gp_chunk *c = &st->chunks[i];
        if (!c->inuse) continue;
        if (c->arena >= 0) {
            gp_arena *a = st->arenas[c->arena];
            (void)gm__be_cleanup_unmap(st->d, a->base + ((uint64_t)c->g0 << st->gshift),
                                       c->n << st->gshift);
        }
        (void)gm__be_cleanup_phys_release(st->d, c->h);
        c->inuse = 0;
    }
}
