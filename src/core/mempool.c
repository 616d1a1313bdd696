/* mempool.c — private pools: the memory of a CUDA graph or a
 * torch.cuda.MemPool, as torch's caching allocator keeps them (PrivatePool,
 * keyed by MempoolId_t, a pair of integers).
 *
 * Each pool is an instance of the device's policy of its own: blocks it
 * places come from its own segments and go back to it, so memory freed in a
 * pool is reused only by that pool, and nothing of the device's own pools
 * lands in it. Its policy sees a view of the device (gm__mempool.view): the
 * same backend, index and limits, its own stats; after every call the
 * change of the view's stats is added to the device's, so reserved,
 * allocated, segments and the device-call counters count every pool, as in
 * torch.
 *
 * Life of a pool, as torch's: gm_pool_retain (createOrIncrefPool) and
 * gm_pool_begin (beginAllocateToPool) create it or add a use; gm_pool_end
 * stops allocating into it; gm_pool_release drops a use. When the last use
 * goes the pool's cached memory is given back, and the pool itself goes
 * with its last block (torch keeps a released pool's memory until the next
 * empty_cache or out-of-memory retry; gpumem gives it back at once, outside
 * a capture).
 *
 * While any pool of a device is between begin and end (a capture), the
 * device makes no free, unmap or event synchronisation: gm_malloc skips
 * the stream events, the policies skip their out-of-memory release,
 * gm_empty_cache and gm_pool_empty_cache release nothing (and succeed, as
 * torch's emptyCache does), and released pools wait for the capture's end.
 * Calls made anyway are counted (gm_pool_capture_calls). */
#include "frontend.h"
#include "mempool.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>

static gm__mempool *slot_pool(const gm__device *d, uint16_t mpool) {
    return d->mp && mpool && mpool <= d->mp->n ? d->mp->slot[mpool - 1] : NULL;
}

static uint64_t pool_key(uint64_t id0, uint64_t id1) {
    const uint64_t k[2] = {id0, id1};
    return gm__hash_bytes(k, sizeof k);
}

/* The slot of byid holding pool (id0, id1), or the empty one where it goes. */
static size_t index_find(const struct gm__mempools *mp, uint64_t id0, uint64_t id1, uint64_t key) {
    const gm__idmap *m = &mp->byid;
    size_t j = gm__idmap_home(m, key);
    gm__work_steps++; /* one a probe, as gm__idmap_find counts: replay feeds pool ids from a trace */
    for (; m->id[j] != GM__IDMAP_EMPTY; j = gm__idmap_next(m, j)) {
        const gm__mempool *p = mp->slot[m->id[j]];
        if (m->key[j] == key && p->id0 == id0 && p->id1 == id1) break;
    }
    return j;
}

gm__mempool *gm__mempool_find(gm__device *d, uint64_t id0, uint64_t id1) {
    if (!d->mp || !d->mp->byid.count) return NULL;
    const gm__idmap *m = &d->mp->byid;
    size_t j = index_find(d->mp, id0, id1, pool_key(id0, id1));
    return m->id[j] == GM__IDMAP_EMPTY ? NULL : d->mp->slot[m->id[j]];
}

/* The min-heap of vacant slot indices. */
static void vacant_push(struct gm__mempools *mp, uint16_t v) {
    uint32_t i = mp->nvacant++;
    for (; i && mp->vacant[(i - 1) / 2] > v; i = (i - 1) / 2) mp->vacant[i] = mp->vacant[(i - 1) / 2];
    mp->vacant[i] = v;
}

static uint16_t vacant_pop(struct gm__mempools *mp) {
    uint16_t top = mp->vacant[0], last = mp->vacant[--mp->nvacant];
    uint32_t i = 0, n = mp->nvacant;
    for (uint32_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && mp->vacant[c + 1] < mp->vacant[c]) c++;
        if (mp->vacant[c] >= last) break;
        mp->vacant[i] = mp->vacant[c];
    }
    if (n) mp->vacant[i] = last;
    return top;
}

static void fold(gm_stat *dst, const gm_stat *now, const gm_stat *was) {
    dst->current += now->current - was->current;
    if (dst->current > dst->peak) dst->peak = dst->current;
    dst->allocated += now->allocated - was->allocated;
    dst->freed += now->freed - was->freed;
}

void gm__mempool_sync(gm__device *d, gm__mempool *p) {
    gm_stats *s = &d->stats;
    const gm_stats *now = &p->view.stats, *was = &p->synced;
    int64_t msplit = s->max_split_size; /* a setting, not a count */
#define GM__MP_ARRAY(n) for (int i = 0; i < GM_POOL_COUNT; i++) fold(&s->n[i], &now->n[i], &was->n[i]);
#define GM__MP_SINGLE(n) fold(&s->n, &now->n, &was->n);
#define GM__MP_COUNTER(n) s->n += now->n - was->n;
    GM_STAT_ARRAYS(GM__MP_ARRAY)
    GM_STAT_SINGLES(GM__MP_SINGLE)
    GM_STAT_COUNTERS(GM__MP_COUNTER)
#undef GM__MP_ARRAY
#undef GM__MP_SINGLE
#undef GM__MP_COUNTER
    s->max_split_size = msplit;
    d->pools_reserved += (uint64_t)(now->reserved_bytes[GM_POOL_ALL].current - was->reserved_bytes[GM_POOL_ALL].current);
    p->synced = *now;
}

/* A slot for a new pool: the lowest freed one, else a new one (at most
 * 65535), and room for it in the index. */
static int take_slot(gm__device *d, uint32_t *out) {
    if (!d->mp && !(d->mp = calloc(1, sizeof *d->mp))) return GM_ENOHOSTMEM;
    struct gm__mempools *mp = d->mp;
    if (gm__idmap_reserve(&mp->byid, 16) != GM_OK) return GM_ENOHOSTMEM;
    if (mp->nvacant) {
        *out = vacant_pop(mp);
        return GM_OK;
    }
    if (mp->n == UINT16_MAX)
        return gm__set_error(GM_ENOSPACE, "device %d has %u private pools, the most gpumem keeps: release some "
                             "(CUDA graphs, MemPools) first", d->index, (unsigned)mp->n);
    if (mp->n == mp->cap) {
        uint32_t cap = mp->cap ? mp->cap * 2 : 8;
        if (!gm__realloc_array(&mp->slot, cap, sizeof *mp->slot) ||
            !gm__realloc_array(&mp->vacant, cap, sizeof *mp->vacant))
            return GM_ENOHOSTMEM;
        mp->cap = cap;
    }
    mp->slot[mp->n] = NULL;
    *out = mp->n++;
    return GM_OK;
}

int gm__mempool_create(gm__device *d, uint64_t id0, uint64_t id1, gm__mempool **out) {
    uint32_t i = 0;
    int rc = take_slot(d, &i);
    if (rc != GM_OK) return rc;
    gm__mempool *p = calloc(1, sizeof *p);
    if (!p) {
        vacant_push(d->mp, (uint16_t)i);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory creating a private pool on device %d", d->index);
    }
    p->id0 = id0;
    p->id1 = id1;
    p->cfg = *d->cfg;
    /* A pool's memory stays where the graph recorded it: no plan moving
     * blocks, no idle memory moved or given back while it is in use. */
    p->cfg.gpumem_plan = false;
    p->cfg.gpumem_slack = INFINITY;
    /* What the pool's policy sees of the device, field by field: never the lock
     * word, which other threads spin on meanwhile (a copy of the whole struct
     * raced gm__devlock_try, a data race TSan reported); the view's own lock is
     * never taken (the device's guards it). */
    p->view = (gm__device){.index = d->index, .alloc = d->alloc, .backend = d->backend, .pops = d->pops,
                           .total_memory = d->total_memory, .memory_fraction = d->memory_fraction,
                           .fraction_set = d->fraction_set, .allowed_memory_maximum = d->allowed_memory_maximum,
                           .fe = d->fe, .owner = d, .cfg = &p->cfg, .synced = &p->synced,
                           .popt = &p->opt};
    gm__devlock_init(&p->view.lock);
    p->opt.size = sizeof p->opt;
    if (gm__track_create(&p->view) != GM_OK) {
        free(p);
        vacant_push(d->mp, (uint16_t)i);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory creating a private pool on device %d", d->index);
    }
    p->view.stats.size = sizeof p->view.stats;
    p->view.stats.max_split_size = d->stats.max_split_size;
    p->synced = p->view.stats;
    rc = p->view.pops->create(&p->view, &p->view.pstate);
    gm__mempool_sync(d, p);
    if (rc != GM_OK) {
        gm__track_destroy(&p->view);
        free(p);
        vacant_push(d->mp, (uint16_t)i);
        return gm__set_error(rc, "creating a private pool on device %d failed: %s", d->index, gm_strerror(rc));
    }
    p->use_count = 1;
    p->slot = (uint16_t)(i + 1);
    p->gen = d->mp->made++;
    d->mp->slot[i] = p;
    uint64_t key = pool_key(id0, id1);
    gm__idmap_set(&d->mp->byid, index_find(d->mp, id0, id1, key), key, i); /* room: take_slot */
    *out = p;
    return GM_OK;
}

/* Contents of a sleeping pool's live blocks (GM_SLEEP_OFFLOAD). */
static void drop_saved(gm__mempool *p) {
    if (p->saved_pinned) gm__be_host_free(&p->view, p->saved_mem);
    else free(p->saved_mem);
    free(p->saved);
    p->saved = NULL;
    p->saved_mem = NULL;
    p->saved_pinned = false;
    p->nsaved = 0;
}

/* The host memory of a pool whose policy instance is gone. */
static void pool_free(gm__mempool *p) {
    drop_saved(p);
    gm__track_destroy(&p->view);
    free(p->held);
    gm__idmap_free(&p->pins);
    free(p);
}

/* The pool's policy gives its cache back. Its release may process the
 * device's pending frees and so hand the pool its last block: `emptying`
 * keeps that free from dropping the pool under this call. */
int gm__mempool_empty(gm__device *d, gm__mempool *p) {
    p->emptying = true;
    int rc = p->view.pops->empty_cache(p->view.pstate);
    gm__mempool_sync(d, p);
    p->emptying = false;
    return rc;
}

/* Give back what the pool caches; the pool goes once released and empty. */
void gm__mempool_trim(gm__device *d, gm__mempool *p) {
    if (gm__device_capturing(d)) return; /* waits for the capture's end */
    if (p->use_count > 0 || p->emptying) return;
    (void)gm__mempool_empty(d, p);
    if (p->blocks) return;
    gm__idmap_del(&d->mp->byid, index_find(d->mp, p->id0, p->id1, pool_key(p->id0, p->id1)));
    d->mp->slot[p->slot - 1] = NULL;
    vacant_push(d->mp, (uint16_t)(p->slot - 1));
    p->view.pops->destroy(p->view.pstate);
    /* whatever the policy still held is gone with it: out of the device's stats */
#define GM__MP_GONE(s) (s).freed += (s).current > 0 ? (s).current : 0, (s).current = 0;
#define GM__MP_GONE_ARRAY(n) for (int k = 0; k < GM_POOL_COUNT; k++) GM__MP_GONE(p->view.stats.n[k])
#define GM__MP_GONE_SINGLE(n) GM__MP_GONE(p->view.stats.n)
    GM_STAT_ARRAYS(GM__MP_GONE_ARRAY)
    GM_STAT_SINGLES(GM__MP_GONE_SINGLE)
#undef GM__MP_GONE_ARRAY
#undef GM__MP_GONE_SINGLE
#undef GM__MP_GONE
    gm__mempool_sync(d, p);
    pool_free(p);
}

gm__block_hdr *gm__mempool_live(gm__device *d, uint16_t s, gm_devptr ptr) {
    gm__block_hdr *b = gm__ptrmap_find(&((gm__fe_dev *)d->fe)->map, ptr);
    return b && b->mpool == s ? b : NULL;
}

bool gm__mempool_pinned(const gm__mempool *p, gm_devptr ptr) {
    if (!p->ncheckpoints || !p->pins.count) return false;
    return p->pins.id[gm__idmap_find(&p->pins, ptr)] != GM__IDMAP_EMPTY;
}

/* Keep a pinned block the program freed from the policy; false when there
 * is no host memory for it (the block then goes back: a restore of its
 * checkpoint will say it cannot). */
static bool hold(gm__mempool *p, gm__block_hdr *b) {
    if (p->nheld == p->cap_held) {
        size_t cap = p->cap_held ? p->cap_held * 2 : 16;
        gm__block_hdr **h = realloc(p->held, cap * sizeof *h);
        if (!h) return false;
        p->held = h;
        p->cap_held = cap;
    }
    p->held[p->nheld++] = b;
    return true;
}

void gm__mempool_free(gm__device *d, gm__block_hdr *b) {
    gm__mempool *p = slot_pool(d, b->mpool);
    if (gm__mempool_pinned(p, b->ptr) && hold(p, b)) return;
    p->view.pops->free(p->view.pstate, b);
    gm__mempool_sync(d, p);
    p->blocks--;
    if (!p->blocks && !p->use_count) gm__mempool_trim(d, p);
}

int gm__mempool_empty_released(gm__device *d) {
    if (!d->mp || gm__device_capturing(d)) return GM_OK;
    for (uint32_t i = 0; i < d->mp->n; i++)
        if (d->mp->slot[i]) gm__mempool_trim(d, d->mp->slot[i]);
    return GM_OK;
}

void gm__mempool_destroy_all(gm__device *d) {
    if (!d->mp) return;
    for (uint32_t i = 0; i < d->mp->n; i++) {
        gm__mempool *p = d->mp->slot[i];
        if (!p) continue;
        p->view.pops->destroy(p->view.pstate);
        pool_free(p);
    }
    free(d->mp->slot);
    free(d->mp->vacant);
    gm__idmap_free(&d->mp->byid);
    free(d->mp);
    d->mp = NULL;
}

typedef struct walk_arg {
    gm_segment_cb cb;
    void *arg;
    const gm__mempool *p;
} walk_arg;

static int walk_cb(const gm_segment_info *seg, void *arg) {
    walk_arg *w = arg;
    gm_segment_info s = *seg;
    s.pool_id[0] = w->p->id0;
    s.pool_id[1] = w->p->id1;
    return w->cb(&s, w->arg);
}

int gm__mempool_walk_segments(gm__device *d, gm_segment_cb cb, void *arg) {
    for (uint32_t i = 0; d->mp && i < d->mp->n; i++) {
        gm__mempool *p = d->mp->slot[i];
        if (!p) continue;
        walk_arg w = {cb, arg, p};
        int rc = p->view.pops->walk_segments(p->view.pstate, walk_cb, &w);
        if (rc) return rc;
    }
    return GM_OK;
}

bool gm__mempool_owns(gm__device *d, gm_devptr ptr) {
    for (uint32_t i = 0; d->mp && i < d->mp->n; i++) {
        gm__mempool *p = d->mp->slot[i];
        if (p && p->view.pops->owns && p->view.pops->owns(p->view.pstate, ptr)) return true;
    }
    return false;
}

/* The device's stats less every pool's current values: what the device's
 * own policy instance accounts for (its check compares against them). */
static void own_stats(gm__device *d, gm_stats *s) {
    for (uint32_t i = 0; d->mp && i < d->mp->n; i++) {
        const gm__mempool *p = d->mp->slot[i];
        if (!p) continue;
#define GM__MP_OWN_ARRAY(n) for (int k = 0; k < GM_POOL_COUNT; k++) s->n[k].current -= p->view.stats.n[k].current;
#define GM__MP_OWN_SINGLE(n) s->n.current -= p->view.stats.n.current;
        GM_STAT_ARRAYS(GM__MP_OWN_ARRAY)
        GM_STAT_SINGLES(GM__MP_OWN_SINGLE)
#undef GM__MP_OWN_ARRAY
#undef GM__MP_OWN_SINGLE
    }
}

/* Each pool's blocks out equal its count, and its policy's check passes. */
static int pools_check(gm__device *d, char *err, size_t errlen) {
    uint32_t n = d->mp ? d->mp->n : 0;
    if (!n) return GM_OK;
    gm__fe_dev *fe = d->fe;
    uint64_t *count = calloc(n + 1, sizeof *count);
    if (!count) return GM_ENOHOSTMEM;
    int rc = GM_OK;
    for (uint64_t s = 0; s <= fe->map.mask && rc == GM_OK; s++) {
        if (!fe->map.slots[s].key) continue;
        uint16_t m = fe->map.slots[s].block->mpool;
        if (m && !slot_pool(d, m))
            rc = gm__check_fail(err, errlen, "device %d: block 0x%llx names private pool slot %u, which is empty",
                                d->index, (unsigned long long)fe->map.slots[s].key, (unsigned)m);
        else count[m]++;
    }
    for (size_t k = 0; k < fe->npending && rc == GM_OK; k++) count[fe->pending[k]->mpool]++;
    for (uint32_t i = 0; i < n; i++)
        if (d->mp->slot[i]) count[i + 1] += d->mp->slot[i]->nheld;
    for (uint32_t i = 0; i < n && rc == GM_OK; i++) {
        gm__mempool *p = d->mp->slot[i];
        if (!p) continue;
        if (count[i + 1] != p->blocks)
            rc = gm__check_fail(err, errlen, "device %d: private pool (%llu, %llu) counts %llu blocks, %llu are out",
                                d->index, (unsigned long long)p->id0, (unsigned long long)p->id1,
                                (unsigned long long)p->blocks, (unsigned long long)count[i + 1]);
        else rc = p->view.pops->check(p->view.pstate, err, errlen);
    }
    free(count);
    return rc;
}

int gm__mempool_check(gm__device *d, char *err, size_t errlen) {
    int rc = pools_check(d, err, errlen);
    if (rc != GM_OK) return rc;
    gm_stats saved = d->stats;
    own_stats(d, &d->stats);
    rc = d->pops->check(d->pstate, err, errlen);
    d->stats = saved;
    return rc;
}

void gm__mempool_block_id(const gm__device *d, const gm__block_hdr *b, uint64_t id[2]) {
    const gm__mempool *p = slot_pool(d, b->mpool);
    id[0] = p ? p->id0 : 0;
    id[1] = p ? p->id1 : 0;
}

/* ---- options: another allocator's memory, use_on_oom, no_split -----------
 * torch.cuda.MemPool(allocator=..., use_on_oom=..., no_split=...). A pool
 * of another allocator's memory has no VMM: its segments are plain device
 * allocations (devcall.c routes them to seg_alloc / seg_free), split as the
 * device's policy splits plain segments (policy:torch, as torch splits a
 * MemPool allocator's segments) or one per block (policy:gpumem's plain
 * path). no_split runs the gpumem policy's plain path whatever the device's
 * policy: every allocation a device allocation of its own. The entry
 * points (gm_pool_set_options, gm_pool_set_tag, gm_allocator_sleep and
 * _wake) are in pools.c; what they do to one pool is here. */

/* A new policy instance for the pool's new options (it holds no memory). */
int gm__mempool_rebuild(gm__device *d, gm__mempool *p, const gm_pool_options *o) {
    gm_pool_options was = p->opt;
    const gm__policy_ops *was_ops = p->view.pops;
    bool was_exp = p->cfg.expandable_segments;
    p->view.pops->destroy(p->view.pstate);
    p->view.pstate = NULL;
    for (int k = 0; k < 2; k++) {
        const gm_pool_options *use = k ? &was : o;
        p->opt = *use;
        p->opt.size = sizeof p->opt;
        p->view.pops = use->no_split ? gm__policy_get(GM_POLICY_GPUMEM) : k ? was_ops : d->pops;
        p->cfg.expandable_segments = k ? was_exp : d->cfg->expandable_segments && !use->seg_alloc;
        int rc = p->view.pops->create(&p->view, &p->view.pstate);
        gm__mempool_sync(d, p);
        if (rc == GM_OK) return k ? GM_ENOHOSTMEM : GM_OK;
    }
    return GM_ENOHOSTMEM; /* not even the old one: the pool cannot place (every call fails cleanly) */
}

int gm__mempool_on_oom(gm__device *d, uint64_t size, gm_stream stream, gm__block_hdr **out, uint16_t *mpool) {
    int rc = GM_ENOMEM;
    for (uint32_t i = 0; d->mp && i < d->mp->n && rc == GM_ENOMEM; i++) {
        gm__mempool *p = d->mp->slot[i];
        if (!p || !p->opt.use_on_oom || !p->use_count || p->asleep) continue;
        rc = p->view.pops->malloc(p->view.pstate, size, stream, out);
        gm__mempool_sync(d, p);
        if (rc == GM_OK) {
            p->blocks++;
            *mpool = p->slot;
        } else if (rc != GM_ENOMEM) {
            rc = GM_ENOMEM; /* the device's own failure is what the caller reports */
        }
    }
    return rc;
}

/* ---- sleep and wake of one pool ------------------------------------------ */

/* Where offload keeps n bytes: page-locked memory when the backend has it
 * (copies at the link's speed, queued without a wait each), else malloc. A
 * pinning failure is said once per process, on stderr; the sleep goes on. */
#define GM__SAVE_ALIGN 256 /* each block's copy starts aligned, as DMA likes */
static inline uint64_t saved_span(const gm__block_hdr *b) {
    return (b->requested + GM__SAVE_ALIGN - 1) & ~(uint64_t)(GM__SAVE_ALIGN - 1);
}
static int saved_mem_alloc(gm__device *d, gm__mempool *p, uint64_t n) {
    static atomic_bool said;
    int rc = gm__be_host_alloc(d, n, &p->saved_mem);
    p->saved_pinned = rc == GM_OK;
    if (rc == GM_OK) return GM_OK;
    if (rc != GM_ENOTSUP && !atomic_exchange(&said, true))
        fprintf(stderr, "gpumem: no page-locked host memory for the %" PRIu64 " bytes sleep saves (%s%s%s); "
                "saving to pageable memory, copies are slower\n", n, gm_status_name(rc),
                gm_last_error_detail()[0] ? ": " : "", gm_last_error_detail());
    gm__clear_error(); /* the sleep goes on: no stale detail */
    p->saved_mem = n == (size_t)n ? malloc((size_t)n) : NULL;
    return p->saved_mem ? GM_OK : GM_ENOHOSTMEM;
}

/* Copy the pool's live blocks to host memory, one buffer for all of them and
 * one wait for all the copies; nothing kept on failure. */
static int offload(gm__device *d, gm__mempool *p) {
    gm__fe_dev *fe = d->fe;
    size_t n = 0;
    uint64_t bytes = 0;
    for (uint64_t i = 0; i <= fe->map.mask; i++) {
        gm__block_hdr *b = fe->map.slots[i].key ? fe->map.slots[i].block : NULL;
        if (!b || b->mpool != p->slot) continue;
        n++;
        bytes += saved_span(b);
    }
    if (!n) return GM_OK;
    if (!(p->saved = calloc(n, sizeof *p->saved))) return GM_ENOHOSTMEM;
    int rc = saved_mem_alloc(d, p, bytes);
    uint64_t off = 0;
    for (uint64_t i = 0; i <= fe->map.mask && rc == GM_OK; i++) {
        gm__block_hdr *b = fe->map.slots[i].key ? fe->map.slots[i].block : NULL;
        if (!b || b->mpool != p->slot) continue;
        p->saved[p->nsaved++] = (gm_backend_copy){.dev = b->ptr, .host = (char *)p->saved_mem + off,
                                                  .size = b->requested};
        off += saved_span(b);
    }
    if (rc == GM_OK) rc = gm__be_copy_many(d, false, p->saved, p->nsaved);
    if (rc != GM_OK) drop_saved(p);
    return rc;
}

/* Can the pool sleep? Its memory must be mapped handles (GM_ENOTSUP). */
int gm__mempool_sleep_check(gm__device *d, gm__mempool *p) {
    uint64_t phys, plain;
    gm__track_usage(&p->view, &phys, &plain);
    if (!plain) return GM_OK;
    return gm__set_error(GM_ENOTSUP, "private pool tagged '%s' on device %d holds %llu plain device allocations "
                         "(policy:torch without expandable_segments, no_split, or another allocator's memory): "
                         "their memory cannot be given back at the same addresses; use policy:gpumem (the "
                         "default) or expandable_segments:True for pools that sleep", p->tag, d->index,
                         (unsigned long long)plain);
}

int gm__mempool_sleep(gm__device *d, gm__mempool *p, bool save, uint64_t *released) {
    *released = 0;
    if (p->asleep) return GM_OK;
    int rc = save ? offload(d, p) : GM_OK;
    if (rc != GM_OK)
        return gm__set_error(rc, "saving the contents of private pool tagged '%s' on device %d failed: %s; "
                             "nothing was released", p->tag, d->index, gm_strerror(rc));
    rc = gm__track_sleep(&p->view, released);
    gm__mempool_sync(d, p);
    if (rc != GM_OK) {
        drop_saved(p);
        return gm__set_error(rc, "releasing private pool tagged '%s' on device %d failed: %s; nothing was "
                             "released", p->tag, d->index, gm_strerror(rc));
    }
    p->asleep = true;
    return GM_OK;
}

int gm__mempool_wake(gm__device *d, gm__mempool *p) {
    if (!p->asleep) return GM_OK;
    int rc = gm__track_wake(&p->view);
    gm__mempool_sync(d, p);
    if (rc != GM_OK)
        return gm__set_error(rc, "waking private pool tagged '%s' on device %d failed: %s; it stays asleep "
                             "(free device memory, then wake it again)", p->tag, d->index, gm_strerror(rc));
    p->asleep = false;
    /* contents back, for the blocks still live (a block freed while asleep lost them) */
    size_t n = 0;
    for (size_t i = 0; i < p->nsaved; i++) {
        gm__block_hdr *b = gm__mempool_live(d, p->slot, p->saved[i].dev);
        if (b && b->requested == p->saved[i].size) p->saved[n++] = p->saved[i];
    }
    if (n) rc = gm__be_copy_many(d, true, p->saved, n);
    drop_saved(p);
    return rc == GM_OK ? GM_OK
                       : gm__set_error(rc, "restoring the contents of private pool tagged '%s' on device %d failed: "
                                       "%s", p->tag, d->index, gm_strerror(rc));
}
