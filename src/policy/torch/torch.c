/* torch.c — the `torch` policy: a faithful model of PyTorch 2.11's
 * CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp), so that replay
 * and tune predict what the native allocator reserves, byte for byte.
 *
 * What it models: 512-byte rounding and roundup_power2_divisions; small
 * (<= 1 MiB) and large pools; 2 MiB / 20 MiB / 2 MiB-rounded segments;
 * best fit by (stream, size, address); the split rules and max_split_size /
 * max_non_split_rounding; merging of free neighbours; the garbage
 * collection threshold (only with a memory fraction, as in torch);
 * release of oversize cached blocks, then of the whole cache with a retry;
 * empty_cache; expandable segments (expandable.c); and the
 * stats torch keeps (segment, reserved, active, inactive_split per pool).
 * The front end keeps the request-level stats (allocation, allocated_bytes,
 * requested_bytes, oversize_allocations) and the stream events.
 *
 * Sets and block recycling: tree.c; check and segment walk:
 * check.c. */
#include "torch.h"
#include "check.h"
#include "expandable.h"

#include <stdlib.h>
#include <string.h>

/* Block structs a malloc or free may need beyond what it frees itself:
 * one split, plus the blocks an expandable map creates. */
#define TP_RESERVE_OP 8

/* ---- configuration, as torch reads it ---------------------------------- */

static uint64_t max_split(const tp_state *st) { return st->cfg->max_split_size; }

/* torch 2.11 keeps allowed_memory_maximum only for a fraction below 1 */
static int tp_limited(const tp_state *st) {
    return st->d->fraction_set && st->d->memory_fraction < 1.0;
}

static int tp_gc_enabled(const tp_state *st) {
    return tp_limited(st) && st->cfg->garbage_collection_threshold > 0.0;
}

static int floor_log2(uint64_t x) { return 63 - __builtin_clzll(x); }

/* AcceleratorAllocatorConfig::roundup_power2_divisions(size): intervals of
 * powers of two from 1 MiB; the last one covers everything above. */
static uint64_t roundup_divisions(const gm_config *cfg, uint64_t size) {
    int log_size = floor_log2(size);
    int index = log_size > 20 ? log_size - 20 : 0;
    if (index > GM_ROUNDUP_INTERVALS - 1) index = GM_ROUNDUP_INTERVALS - 1;
    return cfg->roundup_power2_divisions[index];
}

static uint64_t roundup_power2_next_division(uint64_t size, uint64_t divisions) {
    if ((size & (size - 1)) == 0) return size;
    uint64_t floor2 = (uint64_t)1 << floor_log2(size);
    uint64_t step = floor2 >> floor_log2(divisions);
    if (step == 0) return floor2 << 1;
    uint64_t down = size & ~(step - 1);
    return down == size ? size : down + step;
}

static uint64_t round_size(const gm_config *cfg, uint64_t size) {
    if (size < TP_MIN_BLOCK) return TP_MIN_BLOCK;
    uint64_t div = roundup_divisions(cfg, size);
    if (div > 1 && size > TP_MIN_BLOCK * div) return roundup_power2_next_division(size, div);
    return TP_MIN_BLOCK * ((size + TP_MIN_BLOCK - 1) / TP_MIN_BLOCK);
}

static uint64_t get_allocation_size(uint64_t size) {
    if (size <= TP_SMALL_SIZE) return TP_SMALL_BUFFER;
    if (size < TP_MIN_LARGE_ALLOC) return TP_LARGE_BUFFER;
    return TP_ROUND_LARGE * ((size + TP_ROUND_LARGE - 1) / TP_ROUND_LARGE);
}

static int should_split(const tp_state *st, const tp_block *b, uint64_t size) {
    uint64_t remaining = b->h.size - size;
    if (b->h.pool == GM_POOL_SMALL || st->cfg->expandable_segments)
        return remaining >= TP_MIN_BLOCK;
    return size < max_split(st) && remaining > TP_SMALL_SIZE;
}

/* ---- finding a cached block -------------------------------------------- */

static uint64_t expandable_size(const tp_block *b) {
    return b->h.size + (b->next && !b->next->mapped ? b->next->h.size : 0);
}

/* get_free_block: best fit in the pool, under torch's oversize rules. */
static tp_block *get_free_block(tp_state *st, tp_pool *p, gm_stream stream, uint64_t size) {
    if (tp_gc_enabled(st)) p->get_free_blocks_call_count++;
    tp_block *it = tp_set_lower_bound(&p->blocks, stream, size, 0);
    if (!it || it->h.stream != stream) return NULL;
    if (it->seg->expandable) {
        if (st->cfg->expandable_segments) {
            /* a block followed by unmapped space counts as the size it can
             * grow to: prefer a smaller candidate further on */
            tp_block *nx = tp_set_next(&p->blocks, it);
            while (it->seg->expandable && nx && nx->h.stream == stream &&
                   expandable_size(nx) < expandable_size(it)) {
                it = nx;
                nx = tp_set_next(&p->blocks, nx);
            }
        } else {
            do {
                it = tp_set_next(&p->blocks, it);
            } while (it && it->seg->expandable && it->h.stream == stream);
            if (!it || it->h.stream != stream) return NULL;
        }
    }
    uint64_t msp = max_split(st);
    if (size < msp && it->h.size >= msp) return NULL; /* no oversize block for a normal request */
    if (size >= msp && it->h.size >= size + st->cfg->max_non_split_rounding) return NULL;
    return it; /* still in the set: alloc_found_block takes it out or rekeys the remainder */
}

/* ---- device segments ----------------------------------------------------- */

/* alloc_block for a plain segment: 1 = got one, 0 = out of memory, <0 error */
static int alloc_segment(tp_state *st, tp_pool *p, int pool, gm_stream stream, uint64_t size,
                         tp_block **out) {
    gm__device *d = st->d;
    tp_seg *seg = calloc(1, sizeof(*seg));
    if (!seg) return gm__set_error(GM_ENOHOSTMEM, "torch policy: no host memory for a segment");
    gm_devptr ptr = 0;
    int rc = gm__be_malloc(d, size, &ptr);
    if (rc < 0) {
        free(seg);
        return rc == GM_ENOMEM ? 0 : rc;
    }
    tp_block *b = tp_block_new(st); /* reserved by the caller */
    seg->base = ptr;
    seg->size = size;
    seg->stream = stream;
    seg->pool = (uint8_t)pool;
    seg->head = b;
    tp_seg_link(st, seg);
    b->h.ptr = ptr;
    b->h.size = size;
    b->h.stream = stream;
    b->h.pool = (uint8_t)pool;
    b->mapped = 1;
    b->seg = seg;
    st->total_allocated_memory += size;
    gm__stat_pool_add(d->stats.segment, pool, 1);
    gm__stat_pool_add(d->stats.reserved_bytes, pool, (int64_t)size);
    if (size >= max_split(st)) gm__stat_add(&d->stats.oversize_segments, 1);
    (void)p;
    *out = b;
    return 1;
}

typedef struct tp_params {
    tp_pool *pool;
    int pool_id;
    gm_stream stream;
    uint64_t size;       /* rounded request */
    uint64_t alloc_size; /* segment size for a new cudaMalloc */
    tp_block *block;
} tp_params;

static int alloc_block(tp_state *st, tp_params *p, int is_retry) {
    gm__device *d = st->d;
    if (is_retry) d->stats.num_alloc_retries++;
    /* total_allocated_memory is the device's in torch: every private pool's segments count */
    if (tp_limited(st) && st->total_allocated_memory + gm__device_others_reserved(d) + p->alloc_size >
                              d->allowed_memory_maximum)
        return 0;
    if (st->cfg->expandable_segments) {
        int err = GM_OK;
        p->block = tp_try_allocate_expandable_block(st, p->stream, p->pool, p->size, &err);
        if (err < 0) return err;
        return p->block != NULL;
    }
    return alloc_segment(st, p->pool, p->pool_id, p->stream, p->alloc_size, &p->block);
}

/* release_block: cudaFree a whole, free, plain segment. */
static int release_block(tp_state *st, tp_block *b) {
    gm__device *d = st->d;
    tp_seg *seg = b->seg;
    tp_pool *p = tp_pool_of(st, b->h.pool);
    int rc = tp_set_remove(p, b);
    if (rc < 0) return rc;
    rc = gm__be_free(d, b->h.ptr, b->h.size);
    if (rc < 0) { /* still ours: back in the pool (its age kept) */
        (void)tp_set_insert(st, &p->blocks, b);
        return rc;
    }
    st->total_allocated_memory -= b->h.size;
    gm__stat_pool_add(d->stats.segment, b->h.pool, -1);
    gm__stat_pool_add(d->stats.reserved_bytes, b->h.pool, -(int64_t)b->h.size);
    if (b->h.size >= max_split(st)) gm__stat_add(&d->stats.oversize_segments, -1);
    tp_seg_unlink(st, seg);
    free(seg);
    tp_block_put(st, b);
    return GM_OK;
}

/* release_available_cached_blocks: free oversize blocks, just enough. */
static int release_available_cached_blocks(tp_state *st, const tp_params *p) {
    uint64_t msp = max_split(st);
    if (msp == UINT64_MAX) return 0;
    tp_set *set = &p->pool->blocks;
    uint64_t key = p->size < msp ? msp : p->size;
    tp_block *it = tp_set_lower_bound(set, p->stream, key, 0);
    if (it && it->h.stream == p->stream && !it->seg->expandable) {
        int rc = release_block(st, it);
        return rc < 0 ? rc : 1;
    }
    /* no single block is large enough: free the largest ones */
    tp_block *cur = tp_set_below(set, p->stream, key, 0);
    uint64_t released = 0;
    while (released < key && cur && cur->h.size >= msp && cur->h.stream == p->stream) {
        tp_block *below = tp_set_below(set, cur->h.stream, cur->h.size, cur->h.ptr);
        if (!cur->seg->expandable) {
            released += cur->h.size;
            int rc = release_block(st, cur);
            if (rc < 0) return rc;
        }
        cur = below;
    }
    return released >= key;
}

/* release_blocks: free every unsplit segment of the pool and unmap the free
 * pages of expandable ones. */
static int release_blocks(tp_state *st, tp_pool *p) {
    tp_block *to_unmap = NULL, **tail = &to_unmap;
    tp_block *nb;
    for (tp_block *b = tp_set_first(&p->blocks); b; b = nb) {
        nb = tp_set_next(&p->blocks, b);
        if (b->seg->expandable) {
            b->tmp_next = NULL;
            *tail = b;
            tail = &b->tmp_next;
        } else if (!tp_is_split(b)) {
            int rc = release_block(st, b);
            if (rc < 0) return rc;
        }
    }
    for (tp_block *b = to_unmap; b; b = nb) {
        nb = b->tmp_next;
        int rc = tp_reserve(st, 2);
        if (rc == GM_OK) rc = tp_unmap_block(st, b);
        if (rc < 0) return rc;
        if (!tp_is_split(b)) {
            rc = tp_release_expandable_segment(st, b);
            if (rc < 0) return rc;
        }
    }
    return GM_OK;
}

static int release_cached_blocks(tp_state *st) {
    /* torch synchronizes outstanding events first, so that blocks waiting on
     * other streams come back to the pools and can be released too */
    st->d->stats.num_sync_all_streams++;
    int rc = gm__device_process_events(st->d, true);
    if (rc < 0) return rc;
    rc = release_blocks(st, &st->large);
    if (rc < 0) return rc;
    return release_blocks(st, &st->small);
}

/* garbage_collect_cached_blocks: free the oldest unsplit large blocks until
 * the reserve falls under threshold * allowed (only with a fraction). */
static int garbage_collect_cached_blocks(tp_state *st) {
    tp_pool *p = &st->large;
    uint64_t threshold =
        (uint64_t)(st->cfg->garbage_collection_threshold * (double)st->d->allowed_memory_maximum);
    uint64_t total = st->total_allocated_memory + gm__device_others_reserved(st->d); /* the device's, as torch's */
    if (total <= threshold) return GM_OK;
    uint64_t target = total - threshold, reclaimed = 0;
    uint64_t total_age = 0;
    int64_t count = 0;
    for (tp_block *b = tp_set_first(&p->blocks); b; b = tp_set_next(&p->blocks, b)) {
        if (!tp_is_split(b)) {
            total_age += (uint64_t)(int)(p->get_free_blocks_call_count - b->gc_count_base);
            count++;
        }
    }
    int freed = 1;
    while (reclaimed < target && freed && count > 0) {
        double age_threshold = (double)total_age / (double)count;
        freed = 0;
        tp_block *nb;
        for (tp_block *b = tp_set_first(&p->blocks); b; b = nb) {
            nb = tp_set_next(&p->blocks, b);
            uint64_t age = (uint64_t)(int)(p->get_free_blocks_call_count - b->gc_count_base);
            if (!tp_is_split(b) && !b->seg->expandable && (double)age >= age_threshold) {
                freed = 1;
                reclaimed += b->h.size;
                total_age -= age;
                count--;
                int rc = release_block(st, b);
                if (rc < 0) return rc;
            }
        }
    }
    return GM_OK;
}

/* ---- the ops ------------------------------------------------------------- */

/* alloc_found_block: split off the remainder if torch would, update stats. */
static tp_block *alloc_found_block(tp_state *st, tp_params *p, int split) {
    gm__device *d = st->d;
    tp_block *b = p->block;
    /* a cached block is still in its set; without a split it leaves */
    if (!split && b->in_set == TP_SET_BLOCKS && tp_set_erase(&p->pool->blocks, b) < 0) return NULL;
    int already_split = tp_is_split(b);
    int pool = p->pool_id;
    int plain = !b->seg->expandable;
    if (split) {
        tp_block *rem = b;
        b = tp_block_new(st); /* reserved */
        b->h.ptr = rem->h.ptr;
        b->h.size = p->size;
        b->h.stream = p->stream;
        b->h.pool = (uint8_t)pool;
        b->mapped = 1;
        b->seg = rem->seg;
        b->prev = rem->prev;
        if (b->prev) b->prev->next = b;
        else b->seg->head = b;
        b->next = rem;
        rem->prev = b;
        rem->h.ptr += p->size;
        rem->h.size -= p->size;
        if (rem->in_set == TP_SET_NONE) {
            tp_pool_insert_block(st, p->pool, rem);
        } else { /* the remainder keeps the found block's node when it can */
            rem->gc_count_base = p->pool->get_free_blocks_call_count;
            (void)tp_set_rekey(st, &p->pool->blocks, rem, -1); /* smaller size, same stream */
        }
        if (plain && already_split) {
            gm__stat_pool_add(d->stats.inactive_split_bytes, pool, -(int64_t)b->h.size);
        } else if (plain) {
            gm__stat_pool_add(d->stats.inactive_split_bytes, pool, (int64_t)rem->h.size);
            gm__stat_pool_add(d->stats.inactive_split, pool, 1);
        }
    } else if (plain && already_split) {
        gm__stat_pool_add(d->stats.inactive_split_bytes, pool, -(int64_t)b->h.size);
        gm__stat_pool_add(d->stats.inactive_split, pool, -1);
    }
    b->allocated = 1;
    gm__stat_pool_add(d->stats.active, pool, 1);
    gm__stat_pool_add(d->stats.active_bytes, pool, (int64_t)b->h.size);
    return b;
}

/* Find or make a block (torch's malloc between process_events and
 * alloc_found_block): 1 found, 0 out of memory, <0 error. */
static int find_or_allocate(tp_state *st, tp_params *p) {
    p->block = get_free_block(st, p->pool, p->stream, p->size);
    if (p->block) return 1;
    int rc;
    /* torch runs its garbage collection and frees oversize cached blocks
     * here even while a capture is under way, where a cudaFree invalidates
     * the capture; gpumem frees nothing during one (the allocation may fail
     * instead: out of memory, the capture intact) */
    bool capturing = gm__device_capturing(st->d);
    if (!capturing && tp_gc_enabled(st) && (rc = garbage_collect_cached_blocks(st)) < 0) return rc;
    if ((rc = alloc_block(st, p, 0)) != 0) return rc;
    if (capturing) return 0; /* torch: nor is the whole cache released while a capture is under way */
    if ((rc = release_available_cached_blocks(st, p)) < 0) return rc;
    if (rc > 0 && (rc = alloc_block(st, p, 0)) != 0) return rc;
    if ((rc = release_cached_blocks(st)) < 0) return rc;
    if ((rc = tp_reserve(st, TP_RESERVE_OP)) < 0) return rc;
    return alloc_block(st, p, 1);
}

/* Once a set operation was refused the pools cannot be trusted: fail every
 * request (and gm_check says why) rather than hand out memory twice. */
static int refuse_if_corrupt(const tp_state *st) {
    uint64_t n = tp_misuse(st);
    if (!n) return GM_OK;
    return gm__set_error(GM_ESTATE, "torch policy: %llu refused pool set operations; the "
                         "allocator state is corrupt (gm_check names the first broken invariant)",
                         (unsigned long long)n);
}

static int tp_malloc(void *state, uint64_t size, gm_stream stream, gm__block_hdr **out) {
    tp_state *st = state;
    int rc = refuse_if_corrupt(st);
    if (rc < 0) return rc;
    rc = tp_reserve(st, TP_RESERVE_OP);
    if (rc < 0) return rc;
    /* rounding (512 B, power-2 divisions, 2 MiB segments) must not wrap:
     * SIZE_MAX would round to 0 and share a block with the next request */
    if (size > GM_LIMIT_ALLOC_BYTES)
        return gm__set_error(GM_ENOMEM, "torch policy: %llu bytes is more than the %llu-byte limit on one "
                             "allocation (GM_LIMIT_ALLOC_BYTES)", (unsigned long long)size,
                             (unsigned long long)GM_LIMIT_ALLOC_BYTES);
    tp_params p = {0};
    p.size = round_size(st->cfg, size);
    p.pool_id = p.size <= TP_SMALL_SIZE ? GM_POOL_SMALL : GM_POOL_LARGE;
    p.pool = tp_pool_of(st, p.pool_id);
    p.stream = stream;
    p.alloc_size = get_allocation_size(p.size);
    rc = find_or_allocate(st, &p);
    if (rc >= 0 && tp_misuse(st)) rc = refuse_if_corrupt(st);
    if (rc < 0) return rc;
    if (rc == 0)
        return gm__set_error(GM_ENOMEM, "torch policy: no memory for %llu bytes (segment of %llu)",
                             (unsigned long long)p.size, (unsigned long long)p.alloc_size);
    tp_block *b = alloc_found_block(st, &p, should_split(st, p.block, p.size));
    if (!b || tp_misuse(st)) return refuse_if_corrupt(st);
    b->h.requested = size;
    *out = &b->h;
    return GM_OK;
}

/* free_block's merge of free neighbour src into b: b takes src's node in
 * the pool set when it has none yet (one rekey, usually in place, instead
 * of an erase and an insert), else src leaves and b is rekeyed. Inlined
 * into tp_free, as it was before the merge helpers moved to tree.h (warm-pass
 * instructions, bench/hotpath_ir.sh). */
static inline __attribute__((always_inline)) uint64_t merge_freed(tp_state *st, tp_block *b, tp_block *src, tp_pool *p) {
    if (!src || src->allocated || b->mapped != src->mapped) return 0;
    if (src->in_set != TP_SET_BLOCKS || b->in_set == TP_SET_UNMAPPED) { /* not the usual shape */
        uint64_t n = tp_try_merge_blocks(st, b, src, p);
        if (n && b->in_set == TP_SET_BLOCKS) (void)tp_set_rekey(st, &p->blocks, b, 1);
        return n;
    }
    int take = b->in_set == TP_SET_NONE;
    if (!take && tp_set_erase(&p->blocks, src) < 0) return 0;
    uint64_t absorbed = tp_absorb(b, src);
    if (take) (void)tp_set_replace(st, &p->blocks, src, b);
    else (void)tp_set_rekey(st, &p->blocks, b, 1); /* larger size, same stream */
    tp_block_put(st, src);
    return absorbed;
}

/* free_block: merge with free neighbours and return to the pool. */
static void tp_free(void *state, gm__block_hdr *hdr) {
    tp_state *st = state;
    gm__device *d = st->d;
    tp_block *b = (tp_block *)hdr;
    tp_pool *p = tp_pool_of(st, b->h.pool);
    int pool = b->h.pool;
    uint64_t orig_size = b->h.size;
    int64_t net_blocks = 0, net_bytes = 0;
    b->allocated = 0;
    tp_block *prev = b->prev, *next = b->next;
    uint64_t absorbed = merge_freed(st, b, prev, p);
    if (absorbed) net_blocks--, net_bytes -= (int64_t)absorbed;
    absorbed = merge_freed(st, b, next, p);
    if (absorbed) net_blocks--, net_bytes -= (int64_t)absorbed;
    if (b->in_set == TP_SET_NONE) tp_pool_insert_block(st, p, b);
    else b->gc_count_base = p->get_free_blocks_call_count; /* as torch's insert stamps it */
    if (tp_is_split(b)) net_blocks++, net_bytes += (int64_t)b->h.size;
    if (!b->seg->expandable) {
        if (net_blocks) gm__stat_pool_add(d->stats.inactive_split, pool, net_blocks);
        if (net_bytes) gm__stat_pool_add(d->stats.inactive_split_bytes, pool, net_bytes);
    }
    gm__stat_pool_add(d->stats.active, pool, -1);
    gm__stat_pool_add(d->stats.active_bytes, pool, -(int64_t)orig_size);
}

static int tp_empty_cache(void *state) {
    tp_state *st = state;
    int rc = refuse_if_corrupt(st);
    if (rc < 0) return rc;
    rc = tp_reserve(st, TP_RESERVE_OP);
    if (rc < 0) return rc;
    return release_cached_blocks(st);
}

static int tp_create(gm__device *d, void **state) {
    tp_state *st = calloc(1, sizeof(*st));
    if (!st) return gm__set_error(GM_ENOHOSTMEM, "torch policy: no host memory for its state");
    st->d = d;
    st->cfg = d->cfg;
    st->small.is_small = 1;
    tp_set_init(&st->small.blocks, 0);
    tp_set_init(&st->small.unmapped, 1);
    tp_set_init(&st->large.blocks, 0);
    tp_set_init(&st->large.unmapped, 1);
    st->rng = 0x9e3779b9u;
    /* torch reports SIZE_MAX cast to int64 (-1) when unlimited */
    d->stats.max_split_size = (int64_t)st->cfg->max_split_size;
    *state = st;
    return GM_OK;
}

static void tp_destroy(void *state) {
    tp_state *st = state;
    if (!st) return;
    while (st->segs) {
        tp_seg *s = st->segs;
        tp_seg_unlink(st, s);
        if (s->expandable) tp_expandable_destroy(st, s);
        else (void)gm__be_cleanup_free(st->d, s->base, s->size);
        free(s->handles);
        free(s);
    }
    tp_blocks_destroy(st);
    free(st);
}

const gm__policy_ops gm__policy_torch = {
    .name = "torch",
    .create = tp_create,
    .destroy = tp_destroy,
    .malloc = tp_malloc,
    .free = tp_free,
    .empty_cache = tp_empty_cache,
    .check = tp_check,
    .walk_segments = tp_walk_segments,
};
