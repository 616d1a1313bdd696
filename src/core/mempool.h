/* mempool.h — private pools (mempool.c): the pool machinery the front end
 * (allocator.c, events.c) and the pool entry points (pools.c) call, device
 * lock held. */
#ifndef GPUMEM_CORE_MEMPOOL_H
#define GPUMEM_CORE_MEMPOOL_H

#include "internal.h"
#include "util/idmap.h"

/* ---- private pools (mempool.c) -----------------------------------------
 * A private pool (torch's PrivatePool: a CUDA graph's memory, a MemPool) is
 * a policy instance of its own, keyed by a pool id (torch's MempoolId_t).
 * Its policy sees `view`, a copy of the device with its own stats; after
 * every call into it the change of view.stats is folded into the device's
 * (gm__mempool_sync), so the device's stats count every pool, as torch's
 * do. Every function here runs with the device lock held. */
typedef struct gm__mempool {
    uint64_t id0, id1;
    uint64_t gen;      /* pools made on the device before it: a checkpoint names the pool it was taken of */
    uint16_t slot;     /* its index in gm__mempools.slot + 1: what its blocks' mpool holds */
    int use_count;     /* graphs and MemPool handles holding it (createOrIncrefPool) */
    bool allocating;   /* between gm_pool_begin and gm_pool_end */
    bool emptying;     /* its policy is giving its cache back (mempool.c: empty_pool) */
    uint64_t blocks;   /* blocks its policy placed and has not had back */
    gm__device view;   /* the device as the pool's policy sees it */
    gm_config cfg;     /* the device's, with what a pool must not do turned off */
    gm_stats synced;   /* view.stats as last folded into the device's */
    /* checkpoints (gm_pool_checkpoint_take, CUDA graph trees): a block live
     * at a checkpoint not yet freed is pinned; freed by the program, it is
     * held back from the policy (so nothing reuses it) until a restore
     * hands it out again or its last checkpoint goes */
    uint32_t ncheckpoints;
    gm__idmap pins;        /* block address -> checkpoints it is live in */
    gm__block_hdr **held;  /* pinned blocks the program freed */
    size_t nheld, cap_held;
    /* gm_pool_set_options (view.popt points here), gm_pool_set_tag, and
     * sleep: while asleep its memory is given back (view.track) and, with
     * GM_SLEEP_OFFLOAD, the live blocks' contents wait in `saved`: one
     * entry per block, all in one host buffer `saved_mem` (page-locked when
     * `saved_pinned`, else malloc'd) */
    gm_pool_options opt;
    char tag[GM_TAG_MAX];
    bool asleep, saved_pinned;
    gm_backend_copy *saved;
    size_t nsaved;
    void *saved_mem;
} gm__mempool;

struct gm__mempools {
    gm__mempool **slot; /* by gm__block_hdr.mpool - 1; NULL = free slot */
    uint32_t n;         /* slots in use or freed (high-water mark) */
    uint32_t cap;
    /* Lookups and creation do not walk the pools (bench/RESULTS.md, "private
     * pools at their most"): byid maps a keyed hash of the pool id to its slot
     * index (ids compared on a match), vacant is a min-heap of freed slot
     * indices (the lowest is reused first, as the walk did). */
    gm__idmap byid;
    uint16_t *vacant;
    uint32_t nvacant;
    uint64_t made;      /* pools created so far: the next one's gen */
};

/* The pool (id0, id1) of d, or NULL. */
gm__mempool *gm__mempool_find(gm__device *d, uint64_t id0, uint64_t id1);
/* The pool's stats changes into the device's stats. */
void gm__mempool_sync(gm__device *d, gm__mempool *p);
/* A block of a private pool back to its pool's policy; a released pool whose
 * last block this was gives its memory back (outside a capture). */
void gm__mempool_free(gm__device *d, gm__block_hdr *b);
/* Give back the cached memory of every released pool, and drop those left
 * empty (gm_empty_cache; never during a capture). */
int gm__mempool_empty_released(gm__device *d);
/* Destroy every pool (the device goes). */
void gm__mempool_destroy_all(gm__device *d);
/* A new pool (id0, id1) of d, with one use; the pool's policy gives its
 * cache back; give back what a pool caches, the pool gone once released and
 * empty; is ptr pinned by a checkpoint of p (pools.c, the entry points). */
int gm__mempool_create(gm__device *d, uint64_t id0, uint64_t id1, gm__mempool **out);
int gm__mempool_empty(gm__device *d, gm__mempool *p);
void gm__mempool_trim(gm__device *d, gm__mempool *p);
bool gm__mempool_pinned(const gm__mempool *p, gm_devptr ptr);
/* The live block at ptr if it belongs to pool slot s, else NULL. */
gm__block_hdr *gm__mempool_live(gm__device *d, uint16_t s, gm_devptr ptr);
/* Every pool's segments, with their pool id; every pool's check. */
int gm__mempool_walk_segments(gm__device *d, gm_segment_cb cb, void *arg);
/* pools' block counts and policy checks, then the device's own policy
 * check against the device's stats less the pools' */
int gm__mempool_check(gm__device *d, char *err, size_t errlen);
/* Does a pool's policy hold address space at ptr (policies with owns)? */
bool gm__mempool_owns(gm__device *d, gm_devptr ptr);
/* An allocation of the device's own pools ran out of memory: place it in a
 * use_on_oom pool instead (torch's use_on_oom); *mpool is its slot. */
int gm__mempool_on_oom(gm__device *d, uint64_t size, gm_stream stream, gm__block_hdr **out, uint16_t *mpool);
/* gm_pool_set_options (pools.c): a new policy instance for pool p, which
 * holds no memory, under options o (its allocator, no_split); on failure
 * the old one again (GM_ENOHOSTMEM either way). */
int gm__mempool_rebuild(gm__device *d, gm__mempool *p, const gm_pool_options *o);
/* Sleep and wake of one tagged pool (gm_allocator_sleep / _wake, pools.c):
 * can it sleep (GM_ENOTSUP when its memory is not mapped handles); give its
 * memory back at stable addresses, the live blocks' contents first copied
 * to host memory with `save` (*released: bytes given back); its memory
 * back, and the saved contents of the blocks still live. A failed sleep
 * releases nothing; a failed wake leaves the pool asleep (a failed copy of
 * the contents back is reported, the pool awake). */
int gm__mempool_sleep_check(gm__device *d, gm__mempool *p);
int gm__mempool_sleep(gm__device *d, gm__mempool *p, bool save, uint64_t *released);
int gm__mempool_wake(gm__device *d, gm__mempool *p);
/* The pool id of block b (0, 0 for the device's own pools). */
void gm__mempool_block_id(const gm__device *d, const gm__block_hdr *b, uint64_t id[2]);

/* Every free of a block to its policy goes through here: the device's own
 * pools, or the private pool that placed it. */
static inline void gm__policy_free(gm__device *d, gm__block_hdr *b) {
    if (__builtin_expect(b->mpool == 0, 1)) d->pops->free(d->pstate, b);
    else gm__mempool_free(d, b);
}

#endif /* GPUMEM_CORE_MEMPOOL_H */
