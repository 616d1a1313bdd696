/* tree.h — the bottom floor of the `torch` policy (src/policy/torch/), private
 * to it: the block, segment and pool structures of our model of PyTorch
 * 2.11's CUDACachingAllocator, the ordered sets and block structs (tree.c)
 * and the segment and pool helpers every file shares (inline below). The
 * files above, each including the header of the floor below, so that a call
 * only goes down (docs/architecture.md):
 *
 *   torch.c        the ops table (torch.h: the policy's one interface),
 *                  malloc/free/release as torch does them
 *   check.c        invariant check, segment walk      (check.h)
 *   expandable.c   expandable segments                (expandable.h)
 *   tree.c         sets (treaps), block structs       (tree.h)
 *
 * Names follow torch's where a reader will want to compare the two:
 * get_free_block, alloc_block, free_block, try_merge_blocks, release_block,
 * map_block, unmap_block, ... */
#ifndef GPUMEM_POLICY_TORCH_TP_H
#define GPUMEM_POLICY_TORCH_TP_H

#include "internal.h"

/* torch's constants (CUDACachingAllocator.cpp) */
#define TP_MIN_BLOCK ((uint64_t)512)          /* kMinBlockSize */
#define TP_SMALL_SIZE (GM__MIB)               /* kSmallSize */
#define TP_SMALL_BUFFER (2 * GM__MIB)         /* kSmallBuffer */
#define TP_LARGE_BUFFER (20 * GM__MIB)        /* kLargeBuffer */
#define TP_MIN_LARGE_ALLOC (10 * GM__MIB)     /* kMinLargeAlloc */
#define TP_ROUND_LARGE (2 * GM__MIB)          /* kRoundLarge */

typedef struct tp_seg tp_seg;

/* One block: a piece of a segment, free (in a pool set) or handed out. */
typedef struct tp_block {
    gm__block_hdr h;              /* ptr, size, stream, pool (+ front end's) */
    /* treap links while in a pool set, next to the key so that a descent
     * reads one cache line per node: left, right; parent (erase and
     * successor without a descent from the root) */
    struct tp_block *child[2];
    struct tp_block *up;
    uint32_t prio;                /* treap priority */
    struct tp_block *prev, *next; /* address neighbours in the segment */
    uint8_t allocated;            /* handed out, policy free not yet called */
    uint8_t mapped;               /* backed by memory (false: unmapped VA) */
    uint8_t in_set;               /* TP_SET_NONE / _BLOCKS / _UNMAPPED */
    tp_seg *seg;
    int64_t gc_count_base;        /* pool's get_free_blocks count at insert */
    struct tp_block *tmp_next;    /* scratch list (release_blocks) */
} tp_block;

enum { TP_SET_NONE = 0, TP_SET_BLOCKS = 1, TP_SET_UNMAPPED = 2 };

/* An ordered set of blocks: a treap keyed by (stream, size, ptr) for free
 * blocks, or by (stream, ptr) for unmapped ranges (by_addr). */
typedef struct tp_set {
    tp_block *root;
    uint64_t count;
    int by_addr;
    /* refused inserts/erases (a block already in a set, not in this one, or
     * not found where its key says): the state is corrupt from then on, so
     * malloc fails with GM_ESTATE and check names it, instead of a cycle in
     * the treap turning the next descent into an endless loop */
    uint64_t misuse;
} tp_set;

/* A device allocation (cudaMalloc) or an expandable segment (a reserved VA
 * range mapped page by page). */
struct tp_seg {
    struct tp_seg *prev_seg, *next_seg; /* list of all segments */
    tp_block *head;       /* first block (lowest address) */
    gm_devptr base;
    uint64_t size;        /* bytes of the allocation / of the VA range */
    gm_stream stream;
    uint8_t pool;         /* GM_POOL_SMALL / GM_POOL_LARGE */
    uint8_t expandable;
    /* expandable only */
    uint64_t page;        /* segment_size_: 2 MiB small, 20 MiB large */
    uint64_t max_handles;
    uint64_t nhandles;    /* handles_.size() */
    uint64_t cap_handles;
    struct tp_handle { gm_physmem h; int present; } *handles;
    uint64_t mapped_size;
};

typedef struct tp_pool {
    tp_set blocks;   /* free mapped blocks */
    tp_set unmapped; /* free unmapped ranges of expandable segments */
    int is_small;
    int64_t get_free_blocks_call_count;
} tp_pool;

typedef struct tp_chunk {
    struct tp_chunk *next;
    tp_block blocks[];
} tp_chunk;

typedef struct tp_state {
    gm__device *d;
    const gm_config *cfg;
    tp_pool small, large;
    tp_seg *segs;             /* every live segment */
    uint64_t total_allocated_memory;
    tp_block *free_list;      /* recycled block structs */
    uint64_t nfree;           /* length of free_list */
    tp_chunk *chunks;
    uint32_t rng;             /* treap priorities */
} tp_state;

/* ---- tree.c: sets and block structs ---- */
void tp_set_init(tp_set *s, int by_addr);
/* Both keep b->in_set (TP_SET_BLOCKS for key-ordered sets, _UNMAPPED for
 * by_addr ones) and refuse misuse: insert of a block already in a set,
 * erase of one that is not in this set. GM_OK, or GM_ESTATE (counted in
 * s->misuse) with nothing changed. */
int tp_set_insert(tp_state *st, tp_set *s, tp_block *b);
int tp_set_erase(tp_set *s, tp_block *b);
/* b is in s and its key was just changed on purpose (a split or a merge):
 * keep it in place when its neighbours in the order still bracket the new
 * key, else move it (erase + insert). dir: <0 the key only decreased, >0
 * it only increased, 0 unknown. */
int tp_set_rekey(tp_state *st, tp_set *s, tp_block *b, int dir);
/* b (in no set) takes old's place in s (links and priority), old leaves;
 * then b is rekeyed; b's key must be greater than old's (b absorbed old) */
int tp_set_replace(tp_state *st, tp_set *s, tp_block *old, tp_block *b);
/* total refused operations on the policy's sets: nonzero = corrupt */
uint64_t tp_misuse(const tp_state *st);
tp_block *tp_set_first(const tp_set *s);
/* smallest block >= key (by_addr sets ignore size) */
tp_block *tp_set_lower_bound(const tp_set *s, gm_stream stream, uint64_t size, gm_devptr ptr);
/* largest block < key */
tp_block *tp_set_below(const tp_set *s, gm_stream stream, uint64_t size, gm_devptr ptr);
tp_block *tp_set_next(const tp_set *s, const tp_block *b);
/* make sure n block structs can be taken without failing */
int tp_reserve(tp_state *st, uint64_t n);
tp_block *tp_block_new(tp_state *st); /* after tp_reserve: never NULL */
void tp_block_put(tp_state *st, tp_block *b);
void tp_blocks_destroy(tp_state *st);

/* ---- segments and pools: shared by torch.c and expandable.c ---- */
static inline tp_pool *tp_pool_of(tp_state *st, int pool) {
    return pool == GM_POOL_SMALL ? &st->small : &st->large;
}
static inline int tp_is_split(const tp_block *b) { return b->prev || b->next; }
static inline void tp_seg_link(tp_state *st, tp_seg *s) {
    s->prev_seg = NULL;
    s->next_seg = st->segs;
    if (st->segs) st->segs->prev_seg = s;
    st->segs = s;
}

static inline void tp_seg_unlink(tp_state *st, tp_seg *s) {
    if (s->prev_seg) s->prev_seg->next_seg = s->next_seg;
    else st->segs = s->next_seg;
    if (s->next_seg) s->next_seg->prev_seg = s->prev_seg;
}

/* insert into pool->blocks, stamping gc_count_base (insert_into_blocks) */
static inline void tp_pool_insert_block(tp_state *st, tp_pool *p, tp_block *b) {
    b->gc_count_base = p->get_free_blocks_call_count;
    (void)tp_set_insert(st, &p->blocks, b); /* a refusal is counted: malloc reports it */
}

/* out of whichever set b is in; GM_ESTATE if it could not be unlinked */
static inline int tp_set_remove(tp_pool *p, tp_block *b) {
    if (b->in_set == TP_SET_BLOCKS) return tp_set_erase(&p->blocks, b);
    if (b->in_set == TP_SET_UNMAPPED) return tp_set_erase(&p->unmapped, b);
    return GM_OK;
}

/* dst takes over its address neighbour src's bytes and place in the segment's
 * block list (src is left for the caller to recycle). Returns the bytes taken. */
static inline uint64_t tp_absorb(tp_block *dst, tp_block *src) {
    if (dst->prev == src) {
        dst->h.ptr = src->h.ptr;
        dst->prev = src->prev;
        if (dst->prev) dst->prev->next = dst;
        else dst->seg->head = dst;
    } else {
        dst->next = src->next;
        if (dst->next) dst->next->prev = dst;
    }
    dst->h.size += src->h.size;
    return src->h.size;
}

/* Absorb free neighbour src into dst (try_merge_blocks); the bytes taken, or 0. */
static inline uint64_t tp_try_merge_blocks(tp_state *st, tp_block *dst, tp_block *src, tp_pool *p) {
    if (!src || src->allocated || dst->mapped != src->mapped) return 0;
    /* unlink first: a struct recycled while still in a tree makes a cycle */
    if (tp_set_remove(p, src) < 0) return 0;
    uint64_t absorbed = tp_absorb(dst, src);
    tp_block_put(st, src);
    return absorbed;
}

#endif /* GPUMEM_POLICY_TORCH_TP_H */
