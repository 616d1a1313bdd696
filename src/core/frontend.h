/* frontend.h — private to the allocator front end (allocator.c, ptrmap.c,
 * events.c, stats.c, config.c): the pointer map, the per-device front-end
 * state, the blocks waiting for stream events and the text writer. Not for
 * policies. */
#ifndef GPUMEM_FRONTEND_H
#define GPUMEM_FRONTEND_H

#include "internal.h"
#include "util/idmap.h"

#include <stdatomic.h>

/* ---- pointer map: open addressing, linear probing, backward-shift delete.
 * Keys are block addresses (never 0). It allocates only when it grows, so a
 * steady malloc/free loop never touches the host heap. */
typedef struct gm__pm_entry {
    gm_devptr key; /* 0 = empty */
    gm__block_hdr *block;
} gm__pm_entry;

typedef struct gm__ptrmap {
    gm__pm_entry *slots;
    uint64_t mask; /* capacity - 1 (capacity a power of two) */
    uint64_t count;
    int shift;     /* 64 - log2(capacity) */
} gm__ptrmap;

int gm__ptrmap_init(gm__ptrmap *m);
void gm__ptrmap_free(gm__ptrmap *m);
/* Double the table (gm__ptrmap_reserve's slow path). */
int gm__ptrmap_grow(gm__ptrmap *m);
/* Empty slot i, pulling later entries of its chain back (ptrmap.c). */
void gm__ptrmap_remove_at(gm__ptrmap *m, uint64_t i);

/* The lookups are inline: every malloc inserts and every free looks up and
 * removes. Blocks are >= 512-byte aligned: drop those bits, then Fibonacci
 * hash. */
static inline uint64_t gm__ptrmap_home(const gm__ptrmap *m, gm_devptr key) {
    return ((key >> 9) * 0x9E3779B97F4A7C15ull) >> m->shift;
}

/* The table stays at most 1/PM_LOAD_DIV full: at 1/2, the probe loops'
 * exits mispredicted often enough to cost more than the larger table's
 * cache lines do (bench/RESULTS.md, "the pointer map", has the figures). */
#ifndef PM_LOAD_DIV
#define PM_LOAD_DIV 4
#endif

/* Make room for one more entry (the only call that may allocate). */
static inline int gm__ptrmap_reserve(gm__ptrmap *m) {
    if ((m->count + 1) * PM_LOAD_DIV <= m->mask + 1) return GM_OK;
    return gm__ptrmap_grow(m);
}

/* Insert after gm__ptrmap_reserve succeeded: cannot fail. */
static inline void gm__ptrmap_insert(gm__ptrmap *m, gm__block_hdr *b) {
    uint64_t i = gm__ptrmap_home(m, b->ptr);
    while (m->slots[i].key) i = (i + 1) & m->mask;
    m->slots[i].key = b->ptr;
    m->slots[i].block = b;
    m->count++;
}

/* The slot holding key (never 0), or UINT64_MAX. */
static inline uint64_t gm__ptrmap_slot(const gm__ptrmap *m, gm_devptr key) {
    uint64_t i = gm__ptrmap_home(m, key);
    for (;;) {
        gm_devptr k = m->slots[i].key;
        if (k == key) return i;
        if (!k) return UINT64_MAX;
        i = (i + 1) & m->mask;
    }
}

static inline gm__block_hdr *gm__ptrmap_find(const gm__ptrmap *m, gm_devptr key) {
    if (!key) return NULL;
    uint64_t i = gm__ptrmap_slot(m, key);
    return i == UINT64_MAX ? NULL : m->slots[i].block;
}

/* ---- record_stream bookkeeping -------------------------------------------- */

/* Extra streams a live block was used on; at free time one event per stream
 * is recorded into `events`, and the block waits until all have completed. */
struct gm__stream_uses {
    uint32_t n, cap;
    uint32_t done;    /* events[0..done) already completed and destroyed */
    gm_stream *streams;
    gm_event *events; /* n entries once the block is freed */
    bool deferred;    /* freed during a capture: pending, its events not yet recorded */
};

typedef struct gm__fe_dev {
    gm__ptrmap map;
    gm__block_hdr **pending; /* freed blocks waiting for their events */
    size_t npending, cap_pending;
    /* in gm__device_process_events: a block it hands back may be a private
     * pool's last, whose release asks for the events again (not nested) */
    bool in_events;
    /* [lo, hi): addresses of every block this device handed out so far; lets
     * gm_free find the device without a lock. Only ever grows. */
    _Atomic uint64_t lo, hi;
} gm__fe_dev;

/* events.c */
int gm__uses_add(gm__block_hdr *b, gm_stream stream);
void gm__uses_free(gm__block_hdr *b);
/* Record one event per extra stream of b and queue it as pending. On error
 * nothing changed (events recorded so far are destroyed). */
int gm__events_reserve_pending(gm__fe_dev *fe);
int gm__events_record(gm__device *d, gm__block_hdr *b);
/* Queue b as pending without recording (a capture allows no event; torch
 * defers them until no capture is under way): the first processing of the
 * pending list after the capture records them. */
int gm__events_defer(gm__device *d, gm__block_hdr *b);
/* Drop every pending block at destroy: wait for and destroy its events. */
void gm__events_drain(gm__device *d);

/* putbuf.c: text into a caller's buffer of len bytes (config.c, stats.c).
 * gm__put writes what fits and counts on past the end; gm__put_finish then
 * gives GM_OK, or GM_ENOSPACE naming `what` and the size needed, with the
 * text truncated and NUL-terminated. */
typedef struct gm__putbuf {
    char *buf;
    size_t len, pos;
    bool overflow;
} gm__putbuf;
void gm__put(gm__putbuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int gm__put_finish(gm__putbuf *o, const char *what);

/* allocator.c: the device holding live block ptr, returned locked (its
 * header in *out, its pointer-map slot in *slot), or NULL. */
gm__device *gm__lock_owner(gm_allocator *a, gm_devptr ptr, gm__block_hdr **out, uint64_t *slot);

/* ---- private pools (mempool.c) -----------------------------------------
 * A private pool (torch's PrivatePool: a CUDA graph's memory, a MemPool) is
 * a policy instance of its own, keyed by a pool id (torch's MempoolId_t).
 * Its policy sees `view`, a copy of the device with its own stats; after
 * every call into it the change of view.stats is folded into the device's
 * (gm__mempool_sync), so the device's stats count every pool, as torch's
 * do. Every function here runs with the device lock held. */
typedef struct gm__mempool {
    uint64_t id0, id1;
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
     * GM_SLEEP_OFFLOAD, the live blocks' contents wait in `saved` */
    gm_pool_options opt;
    char tag[GM_TAG_MAX];
    bool asleep;
    struct gm__saved *saved;
    size_t nsaved;
} gm__mempool;

struct gm__mempools {
    gm__mempool **slot; /* by gm__block_hdr.mpool - 1; NULL = free slot */
    uint32_t n;         /* slots in use or freed (high-water mark) */
    uint32_t cap;
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
/* The pool id of block b (0, 0 for the device's own pools). */
void gm__mempool_block_id(const gm__device *d, const gm__block_hdr *b, uint64_t id[2]);

/* Every free of a block to its policy goes through here: the device's own
 * pools, or the private pool that placed it. */
static inline void gm__policy_free(gm__device *d, gm__block_hdr *b) {
    if (__builtin_expect(b->mpool == 0, 1)) d->pops->free(d->pstate, b);
    else gm__mempool_free(d, b);
}

/* allocator.c: the device (created on first use), for the pool entry points. */
int gm__device_get(gm_allocator *a, int device, gm__device **out);
/* The device's stats to the monitor's sink, if one is set (lock held). */
void gm__device_publish(gm__device *d);
/* allocator.c, lock held: gm_free's work on live block b at pointer-map
 * slot `slot`; a block freed by the program and held back from its policy
 * (a private pool's checkpoint) handed out again as it was (the pointer
 * map has room). */
int gm__free_block(gm__device *d, gm__block_hdr *b, uint64_t slot);
void gm__block_revive(gm__device *d, gm__block_hdr *b);

/* config.c: GM_OK, or GM_ECONFIG naming the first field out of range. */
int gm__config_check(const gm_config *cfg, char *err, size_t errlen);
/* config.c: the first key fixed at the allocator's start that differs between was and now, or NULL. */
const char *gm__config_fixed_change(const gm_config *was, const gm_config *now);

/* stats.c */
int gm__format_summary(const gm_stats *s, int device, bool abbreviated, char *buf, size_t len);

#endif /* GPUMEM_FRONTEND_H */
