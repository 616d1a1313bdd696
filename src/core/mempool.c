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

#include <math.h>

static gm__mempool *slot_pool(const gm__device *d, uint16_t mpool) {
    return d->mp && mpool && mpool <= d->mp->n ? d->mp->slot[mpool - 1] : NULL;
}

gm__mempool *gm__mempool_find(gm__device *d, uint64_t id0, uint64_t id1) {
    if (!d->mp) return NULL;
    for (uint32_t i = 0; i < d->mp->n; i++) {
        gm__mempool *p = d->mp->slot[i];
        if (p && p->id0 == id0 && p->id1 == id1) return p;
    }
    return NULL;
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

/* A slot for a new pool: a freed one, else a new one (at most 65535). */
static int take_slot(gm__device *d, uint32_t *out) {
    if (!d->mp && !(d->mp = calloc(1, sizeof *d->mp))) return GM_ENOHOSTMEM;
    struct gm__mempools *mp = d->mp;
    for (uint32_t i = 0; i < mp->n; i++)
        if (!mp->slot[i]) {
            *out = i;
            return GM_OK;
        }
    if (mp->n == UINT16_MAX)
        return gm__set_error(GM_ENOSPACE, "device %d has %u private pools, the most gpumem keeps: release some "
                             "(CUDA graphs, MemPools) first", d->index, (unsigned)mp->n);
    if (mp->n == mp->cap) {
        uint32_t cap = mp->cap ? mp->cap * 2 : 8;
        gm__mempool **s = realloc(mp->slot, cap * sizeof *s);
        if (!s) return GM_ENOHOSTMEM;
        mp->slot = s;
        mp->cap = cap;
    }
    mp->slot[mp->n] = NULL;
    *out = mp->n++;
    return GM_OK;
}

static int create(gm__device *d, uint64_t id0, uint64_t id1, gm__mempool **out) {
    uint32_t i = 0;
    int rc = take_slot(d, &i);
    if (rc != GM_OK) return rc;
    gm__mempool *p = calloc(1, sizeof *p);
    if (!p) return gm__set_error(GM_ENOHOSTMEM, "out of host memory creating a private pool on device %d", d->index);
    p->id0 = id0;
    p->id1 = id1;
    p->cfg = *d->cfg;
    /* A pool's memory stays where the graph recorded it: no plan moving
     * blocks, no idle memory moved or given back while it is in use. */
    p->cfg.gpumem_plan = false;
    p->cfg.gpumem_slack = INFINITY;
    p->view = *d;
    p->view.owner = d;
    p->view.mp = NULL;
    p->view.capturing = 0;
    p->view.pstate = NULL;
    p->view.cfg = &p->cfg;
    p->view.pools_reserved = 0;
    p->view.synced = &p->synced;
    p->opt.size = sizeof p->opt;
    p->view.popt = &p->opt;
    p->view.track = NULL;
    if (gm__track_create(&p->view) != GM_OK) {
        free(p);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory creating a private pool on device %d", d->index);
    }
    memset(&p->view.stats, 0, sizeof p->view.stats);
    p->view.stats.size = sizeof p->view.stats;
    p->view.stats.max_split_size = d->stats.max_split_size;
    p->synced = p->view.stats;
    rc = p->view.pops->create(&p->view, &p->view.pstate);
    gm__mempool_sync(d, p);
    if (rc != GM_OK) {
        gm__track_destroy(&p->view);
        free(p);
        return gm__set_error(rc, "creating a private pool on device %d failed: %s", d->index, gm_strerror(rc));
    }
    p->use_count = 1;
    p->slot = (uint16_t)(i + 1);
    d->mp->slot[i] = p;
    *out = p;
    return GM_OK;
}

/* Contents of a sleeping pool's live blocks (GM_SLEEP_OFFLOAD). */
struct gm__saved {
    gm_devptr ptr;
    uint64_t size;
    void *buf;
};

static void drop_saved(gm__mempool *p) {
    for (size_t i = 0; i < p->nsaved; i++) free(p->saved[i].buf);
    free(p->saved);
    p->saved = NULL;
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
static int empty_pool(gm__device *d, gm__mempool *p) {
    p->emptying = true;
    int rc = p->view.pops->empty_cache(p->view.pstate);
    gm__mempool_sync(d, p);
    p->emptying = false;
    return rc;
}

/* Give back what the pool caches; the pool goes once released and empty. */
static void trim(gm__device *d, gm__mempool *p) {
    if (gm__device_capturing(d)) return; /* waits for the capture's end */
    if (p->use_count > 0 || p->emptying) return;
    (void)empty_pool(d, p);
    if (p->blocks) return;
    d->mp->slot[p->slot - 1] = NULL;
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

static bool pinned(const gm__mempool *p, gm_devptr ptr) {
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
    if (pinned(p, b->ptr) && hold(p, b)) return;
    p->view.pops->free(p->view.pstate, b);
    gm__mempool_sync(d, p);
    p->blocks--;
    if (!p->blocks && !p->use_count) trim(d, p);
}

int gm__mempool_empty_released(gm__device *d) {
    if (!d->mp || gm__device_capturing(d)) return GM_OK;
    for (uint32_t i = 0; i < d->mp->n; i++)
        if (d->mp->slot[i]) trim(d, d->mp->slot[i]);
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

/* ---- the public entry points ------------------------------------------- */

/* Lock the device of a pool call; GM_EINVAL for the id (0, 0), which names
 * the device's own pools. */
static int enter(gm_allocator *a, int device, uint64_t id0, uint64_t id1, const char *what, gm__device **out) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "%s: NULL allocator", what);
    if (!id0 && !id1)
        return gm__set_error(GM_EINVAL, "%s: pool id (0, 0) names the device's own pools, not a private pool; "
                             "pass the id of a CUDA graph's pool or a MemPool", what);
    int rc = gm__device_get(a, device, out);
    if (rc != GM_OK) return rc;
    gm__devlock_lock(&(*out)->lock);
    return GM_OK;
}

static int leave(gm__device *d, int rc) {
    gm__device_publish(d); /* a release or a restore may have changed the stats */
    gm__devlock_unlock(&d->lock);
    return rc;
}

/* enter() for a call on a pool that must exist: *pp is the pool, the device
 * locked; GM_EINVAL (unlocked) if the device has no such pool. */
static int enter_pool(gm_allocator *a, int device, uint64_t id0, uint64_t id1, const char *what, gm__device **out,
                      gm__mempool **pp) {
    int rc = enter(a, device, id0, id1, what, out);
    if (rc != GM_OK) return rc;
    if ((*pp = gm__mempool_find(*out, id0, id1))) return GM_OK;
    return leave(*out, gm__set_error(GM_EINVAL, "%s: device %d has no private pool (%llu, %llu) (never created, or "
                                     "released and gone); create it with gm_pool_retain or gm_pool_begin first",
                                     what, (*out)->index, (unsigned long long)id0, (unsigned long long)id1));
}

int gm_pool_retain(gm_allocator *a, int device, uint64_t id0, uint64_t id1) {
    gm__device *d;
    int rc = enter(a, device, id0, id1, "gm_pool_retain", &d);
    if (rc != GM_OK) return rc;
    gm__mempool *p = gm__mempool_find(d, id0, id1);
    if (p && p->use_count > 0) p->use_count++;
    else if (p) /* released, its last blocks still out: torch's pool would be gone */
        rc = gm__set_error(GM_ESTATE, "gm_pool_retain: private pool (%llu, %llu) on device %d was released and "
                           "waits for its last blocks to be freed; use a new pool id",
                           (unsigned long long)id0, (unsigned long long)id1, d->index);
    else rc = create(d, id0, id1, &p);
    return leave(d, rc);
}

int gm_pool_begin(gm_allocator *a, int device, uint64_t id0, uint64_t id1) {
    gm__device *d;
    int rc = enter(a, device, id0, id1, "gm_pool_begin", &d);
    if (rc != GM_OK) return rc;
    gm__mempool *p = gm__mempool_find(d, id0, id1);
    if (p && p->allocating)
        return leave(d, gm__set_error(GM_ESTATE, "gm_pool_begin: device %d is already allocating to private pool "
                                      "(%llu, %llu); call gm_pool_end first", d->index,
                                      (unsigned long long)id0, (unsigned long long)id1));
    if (p && p->use_count == 0)
        return leave(d, gm__set_error(GM_ESTATE, "gm_pool_begin: private pool (%llu, %llu) on device %d was "
                                      "released; use a new pool id", (unsigned long long)id0,
                                      (unsigned long long)id1, d->index));
    if (p) p->use_count++;
    else if ((rc = create(d, id0, id1, &p)) != GM_OK) return leave(d, rc);
    p->allocating = true;
    d->capturing++;
    return leave(d, GM_OK);
}

int gm_pool_end(gm_allocator *a, int device, uint64_t id0, uint64_t id1) {
    gm__device *d;
    gm__mempool *p;
    int rc = enter_pool(a, device, id0, id1, "gm_pool_end", &d, &p);
    if (rc != GM_OK) return rc;
    if (!p->allocating)
        return leave(d, gm__set_error(GM_ESTATE, "gm_pool_end: device %d is not allocating to private pool "
                                      "(%llu, %llu): gm_pool_begin was not called, or gm_pool_end twice",
                                      d->index, (unsigned long long)id0, (unsigned long long)id1));
    p->allocating = false;
    /* torch ends a graph's pool after cudaStreamEndCapture: pools released
     * during the capture can give their memory back now */
    if (--d->capturing == 0) gm__mempool_empty_released(d);
    return leave(d, GM_OK);
}

int gm_pool_release(gm_allocator *a, int device, uint64_t id0, uint64_t id1) {
    gm__device *d;
    gm__mempool *p;
    int rc = enter_pool(a, device, id0, id1, "gm_pool_release", &d, &p);
    if (rc != GM_OK) return rc;
    if (p->use_count == 0)
        return leave(d, gm__set_error(GM_ESTATE, "gm_pool_release: private pool (%llu, %llu) on device %d has no "
                                      "use left to release (released twice?)", (unsigned long long)id0,
                                      (unsigned long long)id1, d->index));
    if (p->use_count == 1 && p->allocating)
        return leave(d, gm__set_error(GM_ESTATE, "gm_pool_release: device %d is still allocating to private pool "
                                      "(%llu, %llu), its last use; call gm_pool_end first", d->index,
                                      (unsigned long long)id0, (unsigned long long)id1));
    if (--p->use_count == 0) trim(d, p);
    return leave(d, GM_OK);
}

int gm_pool_use_count(gm_allocator *a, int device, uint64_t id0, uint64_t id1, int *out) {
    gm__device *d;
    if (!out) return gm__set_error(GM_EINVAL, "gm_pool_use_count: NULL argument");
    gm__mempool *p;
    int rc = enter_pool(a, device, id0, id1, "gm_pool_use_count", &d, &p);
    if (rc != GM_OK) return rc;
    *out = p->use_count;
    return leave(d, GM_OK);
}

int gm_pool_capture_calls(gm_allocator *a, int device, int who, uint64_t *out, int n) {
    gm__clear_error();
    if (!a || !out || n < 0 || (who != 0 && who != 1))
        return gm__set_error(GM_EINVAL, "gm_pool_capture_calls: NULL allocator or buffer, negative length, or "
                             "who %d (0: the device's own pools, 1: private pools)", who);
    gm__device *d;
    int rc = gm__device_get(a, device, &d);
    if (rc != GM_OK) return rc;
    gm__devlock_lock(&d->lock);
    for (int k = 0; k < n && k < GM_BCALL_COUNT; k++) out[k] = d->capture_calls[who][k];
    gm__devlock_unlock(&d->lock);
    return GM_BCALL_COUNT;
}

/* One device's part of gm_pool_empty_cache (lock held). */
static int empty_one(gm__device *d, gm__mempool *p) {
    /* nothing is freed during a capture (as gm_empty_cache): ~MemPool calls
     * this, and a destructor must not fail; a released pool's memory goes
     * when the capture ends (gm_pool_end) */
    if (gm__device_capturing(d)) return GM_OK;
    int rc = empty_pool(d, p);
    if (p->use_count == 0 && p->blocks == 0) trim(d, p);
    return rc;
}

int gm_pool_empty_cache(gm_allocator *a, int device, uint64_t id0, uint64_t id1) {
    gm__device *d;
    if (a && device == -1) { /* every device holding the pool (torch's emptyCache(mempool_id)) */
        int rc = GM_OK;
        for (int i = 0; i < a->ndevices && rc == GM_OK; i++) {
            gm__device *e = __atomic_load_n(&a->devices[i], __ATOMIC_ACQUIRE);
            if (!e) continue;
            gm__devlock_lock(&e->lock);
            gm__mempool *p = gm__mempool_find(e, id0, id1);
            if (p) rc = empty_one(e, p);
            gm__device_publish(e);
            gm__devlock_unlock(&e->lock);
        }
        return rc;
    }
    gm__mempool *p;
    int rc = enter_pool(a, device, id0, id1, "gm_pool_empty_cache", &d, &p);
    if (rc != GM_OK) return rc;
    return leave(d, empty_one(d, p));
}

/* ---- checkpoints (torch's getCheckpointState / setCheckpointPoolState) ---
 * CUDA graph trees take a checkpoint of the pool after each recording and,
 * before recording a graph that follows another, restore one: the pool's
 * allocated blocks become exactly the checkpoint's, at their addresses.
 * gpumem cannot place a block at an address, so it keeps what a restore
 * needs instead: a block live at a checkpoint still held is pinned, and
 * when the program frees it the pool holds it back from its policy (its
 * memory is reused by nothing) until a restore hands it out again or the
 * last checkpoint pinning it is freed. Torch lets the memory be reused
 * meanwhile and re-creates the layout at the restore; the pool may hold
 * more, but every restore is exact. */

struct gm_pool_checkpoint {
    gm_allocator *alloc;
    int device;
    uint64_t id0, id1;
    size_t n;
    gm_devptr *ptr; /* the pool's live blocks at the checkpoint, sorted */
};

static int cmp_ptr(const void *x, const void *y) {
    gm_devptr a = *(const gm_devptr *)x, b = *(const gm_devptr *)y;
    return a < b ? -1 : a > b;
}

static bool in_checkpoint(const gm_pool_checkpoint *c, gm_devptr p) {
    return c->n && bsearch(&p, c->ptr, c->n, sizeof p, cmp_ptr) != NULL;
}

/* Drop one pin of each of the first n blocks of c. */
static void unpin(gm__mempool *p, const gm_pool_checkpoint *c, size_t n) {
    for (size_t i = 0; i < n && p->pins.cap; i++) {
        size_t j = gm__idmap_find(&p->pins, c->ptr[i]);
        if (p->pins.id[j] != GM__IDMAP_EMPTY && --p->pins.id[j] == 0) gm__idmap_del(&p->pins, j);
    }
}

static int pin(gm__mempool *p, const gm_pool_checkpoint *c) {
    for (size_t i = 0; i < c->n; i++) {
        if (gm__idmap_reserve(&p->pins, 64) != GM_OK) {
            unpin(p, c, i);
            return GM_ENOHOSTMEM;
        }
        size_t j = gm__idmap_find(&p->pins, c->ptr[i]);
        if (p->pins.id[j] == GM__IDMAP_EMPTY) gm__idmap_set(&p->pins, j, c->ptr[i], 1);
        else p->pins.id[j]++;
    }
    return GM_OK;
}

/* The live block at ptr if it belongs to pool slot s, else NULL. */
static gm__block_hdr *live_in(gm__device *d, uint16_t s, gm_devptr ptr) {
    gm__block_hdr *b = gm__ptrmap_find(&((gm__fe_dev *)d->fe)->map, ptr);
    return b && b->mpool == s ? b : NULL;
}

static size_t held_at(const gm__mempool *p, gm_devptr ptr) {
    for (size_t i = 0; i < p->nheld; i++)
        if (p->held[i]->ptr == ptr) return i;
    return SIZE_MAX;
}

int gm_pool_checkpoint_take(gm_allocator *a, int device, uint64_t id0, uint64_t id1, gm_pool_checkpoint **out) {
    if (!out) return gm__set_error(GM_EINVAL, "gm_pool_checkpoint_take: NULL out");
    *out = NULL;
    gm__device *d;
    gm__mempool *p;
    int rc = enter_pool(a, device, id0, id1, "gm_pool_checkpoint_take", &d, &p);
    if (rc != GM_OK) return rc;
    gm__fe_dev *fe = d->fe;
    uint16_t s = p->slot;
    gm_pool_checkpoint *c = calloc(1, sizeof *c);
    size_t n = 0;
    for (uint64_t i = 0; i <= fe->map.mask; i++) n += fe->map.slots[i].key && fe->map.slots[i].block->mpool == s;
    if (c && n) c->ptr = malloc(n * sizeof *c->ptr);
    if (!c || (n && !c->ptr)) {
        if (c) free(c->ptr);
        free(c);
        return leave(d, gm__set_error(GM_ENOHOSTMEM, "gm_pool_checkpoint_take: out of host memory"));
    }
    c->alloc = a;
    c->device = device;
    c->id0 = id0;
    c->id1 = id1;
    for (uint64_t i = 0; i <= fe->map.mask; i++)
        if (fe->map.slots[i].key && fe->map.slots[i].block->mpool == s) c->ptr[c->n++] = fe->map.slots[i].key;
    if (c->n) qsort(c->ptr, c->n, sizeof *c->ptr, cmp_ptr);
    if (pin(p, c) != GM_OK) {
        free(c->ptr);
        free(c);
        return leave(d, gm__set_error(GM_ENOHOSTMEM, "gm_pool_checkpoint_take: out of host memory"));
    }
    p->ncheckpoints++;
    *out = c;
    return leave(d, GM_OK);
}

/* Held blocks no checkpoint pins any more go back to the policy. */
static void give_back_unpinned(gm__device *d, gm__mempool *p) {
    size_t k = 0;
    for (size_t i = 0; i < p->nheld; i++) {
        gm__block_hdr *b = p->held[i];
        if (pinned(p, b->ptr)) {
            p->held[k++] = b;
        } else {
            p->view.pops->free(p->view.pstate, b);
            p->blocks--;
        }
    }
    p->nheld = k;
    gm__mempool_sync(d, p);
    if (!p->blocks && !p->use_count) trim(d, p);
}

void gm_pool_checkpoint_free(gm_allocator *a, gm_pool_checkpoint *c) {
    if (!c) return;
    gm__device *d = a && a == c->alloc ? __atomic_load_n(&a->devices[c->device], __ATOMIC_ACQUIRE) : NULL;
    if (d) {
        gm__devlock_lock(&d->lock);
        gm__mempool *p = gm__mempool_find(d, c->id0, c->id1);
        if (p && p->ncheckpoints) {
            unpin(p, c, c->n);
            p->ncheckpoints--;
            give_back_unpinned(d, p);
        }
        gm__device_publish(d);
        gm__devlock_unlock(&d->lock);
    }
    free(c->ptr);
    free(c);
}

/* What a restore would do, checked before anything changes: every block of
 * the checkpoint is live in the pool or held; *nrevive of them are held. */
static int restore_check(gm__device *d, gm__mempool *p, uint16_t s, const gm_pool_checkpoint *c,
                         size_t *nrevive) {
    *nrevive = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (live_in(d, s, c->ptr[i])) continue;
        if (held_at(p, c->ptr[i]) == SIZE_MAX)
            return gm__set_error(GM_ESTATE, "gm_pool_checkpoint_restore: block 0x%llx of the checkpoint is neither "
                                 "live nor held in pool (%llu, %llu) (out of host memory when it was freed?); "
                                 "nothing was changed", (unsigned long long)c->ptr[i],
                                 (unsigned long long)p->id0, (unsigned long long)p->id1);
        (*nrevive)++;
    }
    gm__ptrmap *m = &((gm__fe_dev *)d->fe)->map;
    while ((m->count + *nrevive) * 2 > m->mask + 1)
        if (gm__ptrmap_grow(m) != GM_OK) return gm__set_error(GM_ENOHOSTMEM, "gm_pool_checkpoint_restore: out of host memory");
    return GM_OK;
}

int gm_pool_checkpoint_restore(gm_allocator *a, const gm_pool_checkpoint *c, gm_pool_restore_cb cb, void *arg) {
    if (!c || !cb) return gm__set_error(GM_EINVAL, "gm_pool_checkpoint_restore: NULL argument");
    if (a != c->alloc)
        return gm__set_error(GM_EINVAL, "gm_pool_checkpoint_restore: the checkpoint was taken on another allocator");
    gm__device *d;
    gm__mempool *p;
    int rc = enter_pool(a, c->device, c->id0, c->id1, "gm_pool_checkpoint_restore", &d, &p);
    if (rc != GM_OK) return rc;
    uint16_t s = p->slot;
    size_t nrevive;
    if ((rc = restore_check(d, p, s, c, &nrevive)) != GM_OK) return leave(d, rc);
    gm__fe_dev *fe = d->fe;
    /* live now, not in the checkpoint: freed (one at a time: a free may
     * change the map) */
    for (bool again = true; again && rc == GM_OK;) {
        again = false;
        for (uint64_t i = 0; i <= fe->map.mask; i++) {
            gm__block_hdr *b = fe->map.slots[i].key ? fe->map.slots[i].block : NULL;
            if (!b || b->mpool != s || in_checkpoint(c, b->ptr)) continue;
            gm_devptr ptr = b->ptr;
            uint64_t size = b->size;
            if ((rc = gm__free_block(d, b, i)) == GM_OK) cb(ptr, size, false, arg);
            again = true;
            break;
        }
    }
    /* the checkpoint's blocks: live ones stay (freed and allocated again, in
     * torch's terms), held ones are handed out again */
    for (size_t i = 0; i < c->n && rc == GM_OK; i++) {
        gm__block_hdr *b = live_in(d, s, c->ptr[i]);
        if (b) {
            cb(b->ptr, b->size, false, arg);
        } else {
            size_t h = held_at(p, c->ptr[i]);
            b = p->held[h];
            p->held[h] = p->held[--p->nheld];
            gm__block_revive(d, b);
        }
        cb(b->ptr, b->size, true, arg);
    }
    return leave(d, rc);
}

/* ---- options: another allocator's memory, use_on_oom, no_split -----------
 * torch.cuda.MemPool(allocator=..., use_on_oom=..., no_split=...). A pool
 * of another allocator's memory has no VMM: its segments are plain device
 * allocations (devcall.c routes them to seg_alloc / seg_free), split as the
 * device's policy splits plain segments (policy:torch, as torch splits a
 * MemPool allocator's segments) or one per block (policy:gpumem's plain
 * path). no_split runs the gpumem policy's plain path whatever the device's
 * policy: every allocation a device allocation of its own. */

static bool same_source(const gm_pool_options *a, const gm_pool_options *b) {
    return a->no_split == b->no_split && a->seg_alloc == b->seg_alloc && a->seg_free == b->seg_free &&
           a->seg_ctx == b->seg_ctx;
}

/* A new policy instance for the pool's new options (it holds no memory). */
static int rebuild(gm__device *d, gm__mempool *p, const gm_pool_options *o) {
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

int gm_pool_set_options(gm_allocator *a, int device, uint64_t id0, uint64_t id1, const gm_pool_options *o) {
    if (!o || o->size < sizeof *o)
        return gm__set_error(GM_EINVAL, "gm_pool_set_options: NULL options, or size not set to sizeof(gm_pool_options)");
    if (!o->seg_alloc != !o->seg_free)
        return gm__set_error(GM_EINVAL, "gm_pool_set_options: seg_alloc and seg_free come together (both or neither)");
    gm__device *d;
    gm__mempool *p;
    int rc = enter_pool(a, device, id0, id1, "gm_pool_set_options", &d, &p);
    if (rc != GM_OK) return rc;
    if (!same_source(&p->opt, o)) {
        uint64_t phys = 0, plain = 0;
        gm__track_usage(&p->view, &phys, &plain);
        if (p->blocks || phys || plain || p->view.stats.reserved_bytes[GM_POOL_ALL].current || p->asleep)
            return leave(d, gm__set_error(GM_ESTATE, "gm_pool_set_options: private pool (%llu, %llu) on device %d "
                                          "already holds memory; its allocator and no_split are set before its "
                                          "first allocation (create a new pool)", (unsigned long long)id0,
                                          (unsigned long long)id1, d->index));
        if ((rc = rebuild(d, p, o)) != GM_OK)
            return leave(d, gm__set_error(rc, "gm_pool_set_options: the pool's policy could not be made again: %s",
                                          gm_strerror(rc)));
    }
    p->opt.use_on_oom = o->use_on_oom;
    return leave(d, GM_OK);
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

/* ---- tags, sleep and wake ----------------------------------------------- */

static int tag_check(const char *tag, bool null_ok, const char *what) {
    if (!tag) return null_ok ? GM_OK : gm__set_error(GM_EINVAL, "%s: NULL tag", what);
    size_t n = strlen(tag);
    if (n >= GM_TAG_MAX || (!n && null_ok))
        return gm__set_error(GM_EINVAL, "%s: tag '%.40s' is %s (1 to %d bytes)", what, tag, n ? "too long" : "empty",
                             GM_TAG_MAX - 1);
    return GM_OK;
}

int gm_pool_set_tag(gm_allocator *a, int device, uint64_t id0, uint64_t id1, const char *tag) {
    gm__clear_error();
    int rc = tag_check(tag, false, "gm_pool_set_tag");
    if (rc != GM_OK) return rc;
    gm__device *d;
    gm__mempool *p;
    if ((rc = enter_pool(a, device, id0, id1, "gm_pool_set_tag", &d, &p)) != GM_OK) return rc;
    if (p->asleep)
        return leave(d, gm__set_error(GM_ESTATE, "gm_pool_set_tag: private pool tagged '%s' is asleep; wake it "
                                      "before renaming it", p->tag));
    snprintf(p->tag, sizeof p->tag, "%s", tag); /* "" removes the tag */
    return leave(d, GM_OK);
}

static bool tag_match(const gm__mempool *p, const char *tag) {
    return p && p->tag[0] && (!tag || !strcmp(p->tag, tag));
}

/* Copy the pool's live blocks to host memory; nothing kept on failure. */
static int offload(gm__device *d, gm__mempool *p) {
    gm__fe_dev *fe = d->fe;
    size_t n = 0;
    for (uint64_t i = 0; i <= fe->map.mask; i++) n += fe->map.slots[i].key && fe->map.slots[i].block->mpool == p->slot;
    if (!n) return GM_OK;
    if (!(p->saved = calloc(n, sizeof *p->saved))) return GM_ENOHOSTMEM;
    int rc = GM_OK;
    for (uint64_t i = 0; i <= fe->map.mask && rc == GM_OK; i++) {
        gm__block_hdr *b = fe->map.slots[i].key ? fe->map.slots[i].block : NULL;
        if (!b || b->mpool != p->slot) continue;
        struct gm__saved *s = &p->saved[p->nsaved++];
        s->ptr = b->ptr;
        s->size = b->requested;
        if (!(s->buf = malloc(s->size))) rc = GM_ENOHOSTMEM;
        else rc = gm__be_copy_to_host(d, s->buf, s->ptr, s->size);
    }
    if (rc != GM_OK) drop_saved(p);
    return rc;
}

/* Can the pool sleep? Its memory must be mapped handles (GM_ENOTSUP). */
static int sleep_check(gm__device *d, gm__mempool *p) {
    uint64_t phys, plain;
    gm__track_usage(&p->view, &phys, &plain);
    if (!plain) return GM_OK;
    return gm__set_error(GM_ENOTSUP, "private pool tagged '%s' on device %d holds %llu plain device allocations "
                         "(policy:torch without expandable_segments, no_split, or another allocator's memory): "
                         "their memory cannot be given back at the same addresses; use policy:gpumem (the "
                         "default) or expandable_segments:True for pools that sleep", p->tag, d->index,
                         (unsigned long long)plain);
}

static int pool_sleep(gm__device *d, gm__mempool *p, bool save, uint64_t *released) {
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

static int pool_wake(gm__device *d, gm__mempool *p) {
    if (!p->asleep) return GM_OK;
    int rc = gm__track_wake(&p->view);
    gm__mempool_sync(d, p);
    if (rc != GM_OK)
        return gm__set_error(rc, "waking private pool tagged '%s' on device %d failed: %s; it stays asleep "
                             "(free device memory, then wake it again)", p->tag, d->index, gm_strerror(rc));
    p->asleep = false;
    /* contents back, for the blocks still live (a block freed while asleep lost them) */
    for (size_t i = 0; i < p->nsaved; i++) {
        const struct gm__saved *s = &p->saved[i];
        gm__block_hdr *b = live_in(d, p->slot, s->ptr);
        if (b && b->requested == s->size && rc == GM_OK) rc = gm__be_copy_to_device(d, s->ptr, s->buf, s->size);
    }
    drop_saved(p);
    return rc == GM_OK ? GM_OK
                       : gm__set_error(rc, "restoring the contents of private pool tagged '%s' on device %d failed: "
                                       "%s", p->tag, d->index, gm_strerror(rc));
}

/* The devices a sleep or wake acts on: `device`, or every one made (-1). */
static int sleep_devices(gm_allocator *a, int device, gm__device **list, int *n) {
    *n = 0;
    if (device == -1) {
        for (int i = 0; i < a->ndevices; i++)
            if ((list[*n] = __atomic_load_n(&a->devices[i], __ATOMIC_ACQUIRE))) (*n)++;
        return GM_OK;
    }
    int rc = gm__device_get(a, device, &list[0]);
    if (rc == GM_OK) *n = 1;
    return rc;
}

/* Check every device before changing any: capture, unknown tag, pools that cannot sleep. */
static int sleep_precheck(gm__device **list, int n, const char *tag, bool sleeping, const char *what) {
    int found = 0, rc = GM_OK;
    for (int k = 0; k < n && rc == GM_OK; k++) {
        gm__device *d = list[k];
        gm__devlock_lock(&d->lock);
        if (gm__device_capturing(d))
            rc = gm__set_error(GM_ESTATE, "%s: a capture (a CUDA graph, a use_mem_pool block) is under way on "
                               "device %d; end it first", what, d->index);
        for (uint32_t i = 0; d->mp && i < d->mp->n && rc == GM_OK; i++) {
            gm__mempool *p = d->mp->slot[i];
            if (!tag_match(p, tag)) continue;
            found++;
            if (sleeping && !p->asleep) rc = sleep_check(d, p);
        }
        gm__devlock_unlock(&d->lock);
    }
    if (rc == GM_OK && tag && !found)
        rc = gm__set_error(GM_EINVAL, "%s: no private pool is tagged '%s' (tag one with gm_pool_set_tag, or "
                           "gpumem.torch.sleep_pool('%s'))", what, tag, tag);
    return rc;
}

int gm_allocator_sleep(gm_allocator *a, int device, const char *tag, unsigned flags, uint64_t *released) {
    gm__clear_error();
    if (released) *released = 0;
    if (!a) return gm__set_error(GM_EINVAL, "gm_allocator_sleep: NULL allocator");
    if (flags & ~GM_SLEEP_OFFLOAD) return gm__set_error(GM_EINVAL, "gm_allocator_sleep: unknown flags 0x%x", flags);
    int rc = tag_check(tag, true, "gm_allocator_sleep"), n = 0;
    gm__device *list[GM_MAX_DEVICES];
    if (rc == GM_OK) rc = sleep_devices(a, device, list, &n);
    if (rc == GM_OK) rc = sleep_precheck(list, n, tag, true, "gm_allocator_sleep");
    for (int k = 0; k < n && rc == GM_OK; k++) {
        gm__device *d = list[k];
        gm__devlock_lock(&d->lock);
        int64_t before = d->stats.reserved_bytes[GM_POOL_ALL].current;
        uint64_t got = 0;
        for (uint32_t i = 0; d->mp && i < d->mp->n && rc == GM_OK; i++) {
            gm__mempool *p = d->mp->slot[i];
            if (!tag_match(p, tag)) continue;
            rc = pool_sleep(d, p, flags & GM_SLEEP_OFFLOAD, &got);
            if (released) *released += got;
        }
        if (rc == GM_OK && !tag) { /* the idle cache of everything else */
            rc = gm__device_process_events(d, true);
            if (rc == GM_OK) rc = d->pops->empty_cache(d->pstate);
            for (uint32_t i = 0; d->mp && i < d->mp->n && rc == GM_OK; i++)
                if (d->mp->slot[i] && !d->mp->slot[i]->asleep) rc = empty_pool(d, d->mp->slot[i]);
            if (rc == GM_OK) rc = gm__mempool_empty_released(d);
            int64_t drop = before - d->stats.reserved_bytes[GM_POOL_ALL].current;
            if (released && drop > 0) *released += (uint64_t)drop;
        }
        leave(d, rc);
    }
    return rc;
}

int gm_allocator_wake(gm_allocator *a, int device, const char *tag) {
    gm__clear_error();
    if (!a) return gm__set_error(GM_EINVAL, "gm_allocator_wake: NULL allocator");
    int rc = tag_check(tag, true, "gm_allocator_wake"), n = 0;
    gm__device *list[GM_MAX_DEVICES];
    if (rc == GM_OK) rc = sleep_devices(a, device, list, &n);
    if (rc == GM_OK) rc = sleep_precheck(list, n, tag, false, "gm_allocator_wake");
    for (int k = 0; k < n && rc == GM_OK; k++) {
        gm__device *d = list[k];
        gm__devlock_lock(&d->lock);
        for (uint32_t i = 0; d->mp && i < d->mp->n && rc == GM_OK; i++)
            if (tag_match(d->mp->slot[i], tag)) rc = pool_wake(d, d->mp->slot[i]);
        leave(d, rc);
    }
    return rc;
}

