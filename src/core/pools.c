/* pools.c — the private pools' entry points (gm_pool_*, their
 * checkpoints): the public calls on a pool, above both the pool machinery
 * (mempool.c, which says what a private pool is) and the front end
 * (allocator.h: a device, its publication, handing a block out and freeing
 * it), which calls neither back. */
#include "allocator.h"

#include <stdlib.h>

/* ---- the public entry points ------------------------------------------- */

/* Lock the device of a pool call; GM_EINVAL for the id (0, 0), which names
 * the device's own pools. */
static int enter(gm_allocator *a, int device, uint64_t id0, uint64_t id1, const char *what, gm__device **out) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "%s: NULL allocator", what);
    if (!id0 && !id1)
        return gm__set_error(GM_EINVAL, "%s: pool id (0, 0) names the device's own pools, not a private pool; "
                             "pass the id of a CUDA graph's pool or a MemPool", what);
    int rc = get_device(a, device, out);
    if (rc != GM_OK) return rc;
    gm__devlock_lock(&(*out)->lock);
    return GM_OK;
}

static int leave(gm__device *d, int rc) {
    publish(d); /* a release or a restore may have changed the stats */
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
    else rc = gm__mempool_create(d, id0, id1, &p);
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
    else if ((rc = gm__mempool_create(d, id0, id1, &p)) != GM_OK) return leave(d, rc);
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
    if (--p->use_count == 0) gm__mempool_trim(d, p);
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
    int rc = get_device(a, device, &d);
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
    int rc = gm__mempool_empty(d, p);
    if (p->use_count == 0 && p->blocks == 0) gm__mempool_trim(d, p);
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
            publish(e);
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
    uint64_t gen; /* the pool's: a later pool under the same id is another pool */
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
    c->gen = p->gen;
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
        if (gm__mempool_pinned(p, b->ptr)) {
            p->held[k++] = b;
        } else {
            p->view.pops->free(p->view.pstate, b);
            p->blocks--;
        }
    }
    p->nheld = k;
    gm__mempool_sync(d, p);
    if (!p->blocks && !p->use_count) gm__mempool_trim(d, p);
}

void gm_pool_checkpoint_free(gm_allocator *a, gm_pool_checkpoint *c) {
    if (!c) return;
    gm__device *d = a && a == c->alloc ? __atomic_load_n(&a->devices[c->device], __ATOMIC_ACQUIRE) : NULL;
    if (d) {
        gm__devlock_lock(&d->lock);
        gm__mempool *p = gm__mempool_find(d, c->id0, c->id1);
        if (p && p->gen == c->gen && p->ncheckpoints) { /* else its pool is gone: nothing of it is pinned */
            unpin(p, c, c->n);
            p->ncheckpoints--;
            give_back_unpinned(d, p);
        }
        publish(d);
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
        if (gm__mempool_live(d, s, c->ptr[i])) continue;
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
    if (p->gen != c->gen)
        return leave(d, gm__set_error(GM_ESTATE, "gm_pool_checkpoint_restore: the checkpoint was taken of an earlier "
                                      "private pool (%llu, %llu) on device %d, released and gone since; the pool "
                                      "now under that id is another one; nothing was changed (free the checkpoint)",
                                      (unsigned long long)c->id0, (unsigned long long)c->id1, d->index));
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
            if ((rc = free_block(d, b, i)) == GM_OK) cb(ptr, size, false, arg);
            again = true;
            break;
        }
    }
    /* the checkpoint's blocks: live ones stay (freed and allocated again, in
     * torch's terms), held ones are handed out again */
    for (size_t i = 0; i < c->n && rc == GM_OK; i++) {
        gm__block_hdr *b = gm__mempool_live(d, s, c->ptr[i]);
        if (b) {
            cb(b->ptr, b->size, false, arg);
        } else {
            size_t h = held_at(p, c->ptr[i]);
            b = p->held[h];
            p->held[h] = p->held[--p->nheld];
            hand_out(d, b, b->requested, b->stream, b->mpool);
        }
        cb(b->ptr, b->size, true, arg);
    }
    return leave(d, rc);
}

/* ---- options, tags, sleep and wake (what they do to a pool: mempool.c) -- */

static bool same_source(const gm_pool_options *a, const gm_pool_options *b) {
    return a->no_split == b->no_split && a->seg_alloc == b->seg_alloc && a->seg_free == b->seg_free &&
           a->seg_ctx == b->seg_ctx;
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
        if ((rc = gm__mempool_rebuild(d, p, o)) != GM_OK)
            return leave(d, gm__set_error(rc, "gm_pool_set_options: the pool's policy could not be made again: %s",
                                          gm_strerror(rc)));
    }
    p->opt.use_on_oom = o->use_on_oom;
    return leave(d, GM_OK);
}

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

/* The devices a sleep or wake acts on: `device`, or every one made (-1). */
static int sleep_devices(gm_allocator *a, int device, gm__device **list, int *n) {
    *n = 0;
    if (device == -1) {
        for (int i = 0; i < a->ndevices; i++)
            if ((list[*n] = dev_peek(a, i))) (*n)++;
        return GM_OK;
    }
    int rc = get_device(a, device, &list[0]);
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
            if (sleeping && !p->asleep) rc = gm__mempool_sleep_check(d, p);
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
            rc = gm__mempool_sleep(d, p, flags & GM_SLEEP_OFFLOAD, &got);
            if (released) *released += got;
        }
        if (rc == GM_OK && !tag) { /* the idle cache of everything else */
            rc = gm__device_process_events(d, true);
            if (rc == GM_OK) rc = d->pops->empty_cache(d->pstate);
            for (uint32_t i = 0; d->mp && i < d->mp->n && rc == GM_OK; i++)
                if (d->mp->slot[i] && !d->mp->slot[i]->asleep) rc = gm__mempool_empty(d, d->mp->slot[i]);
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
            if (tag_match(d->mp->slot[i], tag)) rc = gm__mempool_wake(d, d->mp->slot[i]);
        leave(d, rc);
    }
    return rc;
}
