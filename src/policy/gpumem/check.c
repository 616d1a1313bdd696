/* check.c — the `gpumem` policy's self-check (a full recount
 * of arenas, chunks and stats against what is stored, the plan's too), its
 * segment walk for snapshots, and whether a pointer lies in its arenas. */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct gp_count {
    int64_t active[GM_POOL_COUNT], active_bytes[GM_POOL_COUNT];
    int64_t split[GM_POOL_COUNT], split_bytes[GM_POOL_COUNT];
} gp_count;

static void count_add(int64_t arr[GM_POOL_COUNT], int pool, int64_t v) {
    arr[GM_POOL_ALL] += v;
    arr[pool] += v;
}

/* Walk one arena in address order: tiling, coalescing, bins, mappings. */
static int check_arena(gp_state *st, gp_arena *a, uint32_t *live, gp_count *cnt,
                       char *err, size_t errlen) {
    gm_devptr at = a->base;
    uint64_t nfree = 0, nparked = 0;
    const gp_block *prev = NULL;
    for (const gp_block *b = a->head; b; prev = b, b = b->next) {
        if (b->prev != prev) return gm__check_fail(err, errlen, "arena %d: broken address list at 0x%llx", a->index, (unsigned long long)b->h.ptr);
        if (b->h.ptr != at || b->h.size == 0 || (b->h.size & (GP_ALIGN - 1)))
            return gm__check_fail(err, errlen, "arena %d: block 0x%llx+%llu overlaps or leaves a gap (expected 0x%llx)", a->index,
                        (unsigned long long)b->h.ptr, (unsigned long long)b->h.size, (unsigned long long)at);
        if (b->arena != (uint16_t)a->index) return gm__check_fail(err, errlen, "block 0x%llx in wrong arena", (unsigned long long)b->h.ptr);
        at += b->h.size;
        if (b->state == GP_FREE) {
            nfree++;
            if (prev && prev->state == GP_FREE) return gm__check_fail(err, errlen, "arena %d: adjacent free ranges at 0x%llx not coalesced", a->index, (unsigned long long)b->h.ptr);
            if (b->bin != gm__gp_bin_of(b->h.size >> GP_ALIGN_SHIFT)) return gm__check_fail(err, errlen, "free range 0x%llx in wrong bin", (unsigned long long)b->h.ptr);
            if (b->split_cnt != (b->next != NULL)) return gm__check_fail(err, errlen, "free range 0x%llx split count wrong", (unsigned long long)b->h.ptr);
            if (b->split_cnt) {
                count_add(cnt->split, a->pool, 1);
                count_add(cnt->split_bytes, a->pool, (int64_t)b->h.size);
            }
            continue;
        }
        if (b->state != GP_USED && b->state != GP_CACHED && b->state != GP_PARKED) return gm__check_fail(err, errlen, "block 0x%llx has bad state", (unsigned long long)b->h.ptr);
        if (b->state == GP_USED) {
            count_add(cnt->active, b->h.pool, 1);
            count_add(cnt->active_bytes, b->h.pool, (int64_t)b->h.size);
        }
        nparked += b->state == GP_PARKED;
        uint64_t g = (b->h.ptr - a->base) >> st->gshift;
        uint64_t ge = (b->h.ptr - a->base + b->h.size - 1) >> st->gshift;
        while (g <= ge) {
            int32_t c = a->gran[g];
            if (c < 0) return gm__check_fail(err, errlen, "live block 0x%llx+%llu touches unmapped granule %llu", (unsigned long long)b->h.ptr, (unsigned long long)b->h.size, (unsigned long long)g);
            live[c]++;
            g = (uint64_t)(st->chunks[c].g0 + (int64_t)st->chunks[c].n);
        }
    }
    if (at != a->base + a->va_size) return gm__check_fail(err, errlen, "arena %d: blocks do not cover the range", a->index);
    if (nparked != a->nparked) return gm__check_fail(err, errlen, "arena %d: %llu parked blocks, %llu listed", a->index, (unsigned long long)nparked, (unsigned long long)a->nparked);
    uint64_t inbins = 0;
    for (unsigned k = 0; k < GP_NBINS; k++) {
        bool bit = (a->bitmap[k >> 6] >> (k & 63)) & 1;
        if (bit != (a->bins[k] != NULL)) return gm__check_fail(err, errlen, "arena %d: bin bitmap wrong at %u", a->index, k);
        for (const gp_block *f = a->bins[k]; f; f = f->fnext, inbins++)
            if (f->state != GP_FREE || f->bin != k) return gm__check_fail(err, errlen, "arena %d: bin %u holds a non-free block", a->index, k);
    }
    if (inbins != nfree) return gm__check_fail(err, errlen, "arena %d: %llu free ranges but %llu in bins", a->index, (unsigned long long)nfree, (unsigned long long)inbins);
    for (uint64_t g = 0; g < a->ngran; g++) {
        int32_t c = a->gran[g];
        if (((a->mapped[g >> 6] >> (g & 63)) & 1) != (c >= 0))
            return gm__check_fail(err, errlen, "arena %d: mapped bitmap wrong at granule %llu", a->index, (unsigned long long)g);
        if (c < 0) continue;
        const gp_chunk *ch = &st->chunks[c];
        if (!ch->inuse || ch->arena != a->index || (int64_t)g < ch->g0 || (int64_t)g >= ch->g0 + (int64_t)ch->n)
            return gm__check_fail(err, errlen, "arena %d: granule %llu maps to a chunk elsewhere", a->index, (unsigned long long)g);
    }
    return GM_OK;
}

static int check_quick(gp_state *st, gp_arena *a, gp_count *cnt, char *err, size_t errlen) {
    uint64_t n = 0;
    if (a->quick[0]) return gm__check_fail(err, errlen, "arena %d: a cached block of size 0", a->index);
    for (unsigned u = 1; u <= GP_SMALL_UNITS; u++) {
        bool bit = (a->qmap[(u - 1) >> 6] >> ((u - 1) & 63)) & 1;
        if (bit != (a->quick[u] != NULL))
            return gm__check_fail(err, errlen, "arena %d: size-class bitmap wrong at %u units", a->index, u);
        for (const gp_block *b = a->quick[u]; b; b = b->fnext, n++) {
            if (b->state != GP_CACHED || b->h.size != (uint64_t)u << GP_ALIGN_SHIFT)
                return gm__check_fail(err, errlen, "cached block 0x%llx in wrong size class", (unsigned long long)b->h.ptr);
            count_add(cnt->split, b->h.pool, 1);
            count_add(cnt->split_bytes, b->h.pool, (int64_t)b->h.size);
        }
    }
    if (n != a->ncached) return gm__check_fail(err, errlen, "arena %d: %llu cached blocks, counter says %llu", a->index, (unsigned long long)n, (unsigned long long)a->ncached);
    n = 0;
    for (const gp_block *b = a->parked, *prev = NULL; b; prev = b, b = b->fnext, n++) {
        if (b->state != GP_PARKED || b->arena != (uint16_t)a->index || b->fprev != prev || !b->slot)
            return gm__check_fail(err, errlen, "arena %d: parked block 0x%llx listed wrong", a->index, (unsigned long long)b->h.ptr);
        count_add(cnt->split, b->h.pool, 1);
        count_add(cnt->split_bytes, b->h.pool, (int64_t)b->h.size);
    }
    if (n != a->nparked) return gm__check_fail(err, errlen, "arena %d: %llu parked blocks, counter says %llu", a->index, (unsigned long long)n, (unsigned long long)a->nparked);
    return GM_OK;
}

static int check_chunks(gp_state *st, const uint32_t *live, char *err, size_t errlen) {
    uint64_t held = 0;
    int64_t pheld[GM_POOL_COUNT] = {0}, nseg[GM_POOL_COUNT] = {0};
    for (int32_t i = 0; i < st->nchunks; i++) {
        const gp_chunk *c = &st->chunks[i];
        if (!c->inuse) continue;
        held += c->n << st->gshift;
        count_add(pheld, c->pool, (int64_t)(c->n << st->gshift));
        count_add(nseg, c->pool, 1);
        if (c->arena >= 0 && st->arenas[c->arena]->pool != c->pool) return gm__check_fail(err, errlen, "chunk %d counted in the wrong pool", i);
        /* stale by design while st->lazy: mapped chunks then sit on no list */
        if (!st->lazy && c->live != live[i]) return gm__check_fail(err, errlen, "chunk %d: live count %u, recount %u", i, c->live, live[i]);
        uint8_t want = c->arena < 0 ? GP_LIST_LOOSE : (c->live || st->lazy ? GP_LIST_NONE : GP_LIST_IDLE);
        if (c->list != want) return gm__check_fail(err, errlen, "chunk %d on the wrong list", i);
    }
    for (int pass = 0; pass < 2; pass++)
        for (int o = 0; o < GP_NORDERS; o++)
            for (int32_t i = pass ? st->idle[o] : st->loose[o]; i >= 0; i = st->chunks[i].lnext)
                if (!st->chunks[i].inuse || gm__gp_order(st->chunks[i].n) != (unsigned)o)
                    return gm__check_fail(err, errlen, "chunk %d listed under the wrong order", i);
    /* the arenas' index of idle one-granule chunks (chunks.c): a bit where each starts, none elsewhere */
    uint64_t nidle1 = 0, nbits = 0;
    for (int32_t i = st->idle[0]; i >= 0; i = st->chunks[i].lnext, nidle1++) {
        const gp_arena *a = st->arenas[st->chunks[i].arena];
        uint64_t g = (uint64_t)st->chunks[i].g0;
        if (!a->idle1 || !(a->idle1[g >> 6] >> (g & 63) & 1)) return gm__check_fail(err, errlen, "idle chunk %d not in its arena's index", i);
    }
    for (uint32_t k = 0; k < st->narenas; k++) {
        const gp_arena *a = st->arenas[k];
        uint64_t words = (a->ngran + 63) / 64;
        for (uint64_t w = 0; a->idle1 && w < (words + 63) / 64 * 64; w++) {
            uint64_t bits = w < words ? a->idle1[w] : 0;
            nbits += (uint64_t)__builtin_popcountll(bits);
            if ((a->idle1_sum[w >> 6] >> (w & 63) & 1) != (bits != 0))
                return gm__check_fail(err, errlen, "arena %d: idle index summary wrong at word %llu", a->index, (unsigned long long)w);
        }
    }
    if (nbits != nidle1) return gm__check_fail(err, errlen, "idle index holds %llu chunks, idle list %llu", (unsigned long long)nbits, (unsigned long long)nidle1);
    const gm_stats *s = &st->d->stats;
    if (held != st->held_bytes || (int64_t)held != s->reserved_bytes[GM_POOL_ALL].current)
        return gm__check_fail(err, errlen, "reserved %lld bytes but chunks hold %llu", (long long)s->reserved_bytes[GM_POOL_ALL].current, (unsigned long long)held);
    for (int p = 0; p < GM_POOL_COUNT; p++)
        if (nseg[p] != s->segment[p].current || pheld[p] != s->reserved_bytes[p].current)
            return gm__check_fail(err, errlen, "pool %d: %lld segments / %lld bytes, chunks %lld / %lld", p, (long long)s->segment[p].current,
                        (long long)s->reserved_bytes[p].current, (long long)nseg[p], (long long)pheld[p]);
    for (uint32_t k = 0; k < st->narenas; k++) {
        const gp_arena *a = st->arenas[k];
        uint64_t m = 0;
        for (int32_t i = 0; i < st->nchunks; i++)
            if (st->chunks[i].inuse && st->chunks[i].arena == a->index) m += st->chunks[i].n << st->gshift;
        if (m != a->mapped_bytes) return gm__check_fail(err, errlen, "arena %d: mapped bytes %llu, chunks %llu", a->index, (unsigned long long)a->mapped_bytes, (unsigned long long)m);
    }
    return GM_OK;
}

static int check_plain(gp_state *st, gp_count *cnt, char *err, size_t errlen) {
    uint64_t held = 0;
    for (const gp_block *b = st->plain; b; b = b->next) {
        held += b->h.size;
        if (b->state == GP_USED) {
            count_add(cnt->active, b->h.pool, 1);
            count_add(cnt->active_bytes, b->h.pool, (int64_t)b->h.size);
        }
        for (const gp_block *o = b->next; o; o = o->next)
            if (o->h.ptr < b->h.ptr + b->h.size && b->h.ptr < o->h.ptr + o->h.size)
                return gm__check_fail(err, errlen, "device allocations 0x%llx and 0x%llx overlap", (unsigned long long)b->h.ptr, (unsigned long long)o->h.ptr);
    }
    if (held != st->held_bytes || (int64_t)held != st->d->stats.reserved_bytes[GM_POOL_ALL].current)
        return gm__check_fail(err, errlen, "reserved bytes differ from device allocations held");
    return GM_OK;
}

static int check_stats(gp_state *st, const gp_count *c, char *err, size_t errlen) {
    const gm_stats *s = &st->d->stats;
    for (int p = 0; p < GM_POOL_COUNT; p++) {
        if (s->active[p].current != c->active[p] || s->active_bytes[p].current != c->active_bytes[p])
            return gm__check_fail(err, errlen, "active stats (pool %d) %lld/%lld, recount %lld/%lld", p, (long long)s->active[p].current,
                        (long long)s->active_bytes[p].current, (long long)c->active[p], (long long)c->active_bytes[p]);
        if (s->inactive_split[p].current != c->split[p] || s->inactive_split_bytes[p].current != c->split_bytes[p])
            return gm__check_fail(err, errlen, "inactive_split stats (pool %d) differ from recount", p);
    }
    return GM_OK;
}

int gm__gp_check(void *state, char *err, size_t errlen) {
    gp_state *st = state;
    gp_count cnt = {0};
    uint32_t *live = calloc((size_t)st->nchunks + 1, sizeof *live);
    if (!live) return GM_ENOHOSTMEM;
    int rc = GM_OK;
    for (uint32_t k = 0; k < st->narenas && !rc; k++) {
        if (st->vmm) rc = check_arena(st, st->arenas[k], live, &cnt, err, errlen);
        if (!rc) rc = check_quick(st, st->arenas[k], &cnt, err, errlen);
    }
    if (!rc) rc = st->vmm ? check_chunks(st, live, err, errlen) : check_plain(st, &cnt, err, errlen);
    if (!rc) rc = gm__gp_plan_check(st, err, errlen);
    if (!rc) rc = check_stats(st, &cnt, err, errlen);
    free(live);
    return rc;
}

/* ---- segment walk --------------------------------------------------------
 * Like torch's snapshot under expandable_segments: one segment per maximal
 * run of mapped granules in an arena (total == mapped == the run's bytes),
 * never the arena's whole virtual range, so the sizes add up to the memory
 * held. A live block lies on mapped granules only (check_arena), so it lies
 * in exactly one run. */

/* First granule >= g whose mapped bit is `want`, or a->ngran. */
static uint64_t next_gran(const gp_arena *a, uint64_t g, bool want) {
    while (g < a->ngran) {
        uint64_t w = a->mapped[g >> 6];
        if (!want) w = ~w;
        w &= ~(uint64_t)0 << (g & 63);
        if (w) {
            g = (g & ~(uint64_t)63) + (uint64_t)__builtin_ctzll(w);
            return g < a->ngran ? g : a->ngran;
        }
        g = (g | 63) + 1;
    }
    return a->ngran;
}

static int walk_arena(gp_state *st, const gp_arena *a, gm__segment_cb cb, void *arg) {
    gm_segment_info si = {.size_of = sizeof si, .stream = a->stream, .pool = a->pool, .expandable = true};
    const gp_block *b = a->head;
    for (uint64_t g = next_gran(a, 0, true); g < a->ngran;) {
        uint64_t e = next_gran(a, g, false);
        si.address = a->base + (g << st->gshift);
        si.total_size = si.mapped_size = (e - g) << st->gshift;
        si.allocated_size = 0;
        gm_devptr end = si.address + si.total_size;
        while (b && b->h.ptr + b->h.size <= si.address) b = b->next;
        /* only a free range can reach past the run: skipping it loses nothing */
        for (; b && b->h.ptr < end; b = b->next) /* not freed by the caller */
            if (b->state == GP_USED && b->h.live) si.allocated_size += b->h.size;
        int rc = cb(&si, arg);
        if (rc) return rc;
        g = next_gran(a, e, true);
    }
    return GM_OK;
}

int gm__gp_walk(void *state, gm__segment_cb cb, void *arg) {
    gp_state *st = state;
    gm_segment_info si = {.size_of = sizeof si, .pool = GM_POOL_LARGE};
    if (!st->vmm) {
        for (const gp_block *b = st->plain; b; b = b->next) {
            si.address = b->h.ptr;
            si.total_size = si.mapped_size = b->h.size;
            si.allocated_size = b->state == GP_USED && b->h.live ? b->h.size : 0;
            si.stream = b->h.stream;
            si.pool = b->h.pool;
            int rc = cb(&si, arg);
            if (rc) return rc;
        }
        return GM_OK;
    }
    for (uint32_t k = 0; k < st->narenas; k++) {
        int rc = walk_arena(st, st->arenas[k], cb, arg);
        if (rc) return rc;
    }
    return GM_OK;
}

bool gm__gp_owns(void *state, gm_devptr p) {
    gp_state *st = state;
    for (uint32_t k = 0; st->vmm && k < st->narenas; k++) {
        const gp_arena *a = st->arenas[k];
        if (p >= a->base && p - a->base < a->va_size) return true;
    }
    for (const gp_block *b = st->plain; b; b = b->next)
        if (p >= b->h.ptr && p - b->h.ptr < b->h.size) return true;
    return false;
}
