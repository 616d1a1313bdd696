/* base.h — the bottom floor of the `gpumem` policy (src/policy/gpumem/): its
 * structures and what every file may use (base.c: block structs, syncing an
 * arena's stream). The files above, each including the header of the floor
 * below, so that a call can only go down (docs/architecture.md):
 *
 *   gpumem.c            the ops table (gpumem.h: the policy's one interface),
 *                       size-class cache, OOM retry
 *   check.c             invariant check, segment walk       (check.h)
 *   plan/               gpumem_plan:on: plan.c serves a step,
 *                       layout.c lays one out (layout_check.c
 *                       judges it), park.c keeps a
 *                       freed block for the next planned one,
 *                       plan_check.c its counters and check  (plan/plan.h)
 *   place/arena.c       per-stream arenas                    (place/arena.h)
 *   place/va.c,         placement: free-range index with VMM, plain
 *   place/plain.c       device allocations without           (place/va.h, place/plain.h)
 *   mem/chunks.c        physical chunks, mapping             (mem/chunks.h)
 *   mem/base.c          block structs, stream sync           (mem/base.h)
 *
 * Model (see gpumem.c for the full story): every stream owns two large
 * virtual ranges (arenas, one per pool) where blocks are placed best-fit and coalesce; the
 * physical memory behind it is a per-device pool of chunks (whole multiples of
 * the VMM granule) that are mapped lazily, kept mapped while idle, and moved
 * between places (and arenas) only when a placement needs them. */
#ifndef GPUMEM_POLICY_GPUMEM_GP_H
#define GPUMEM_POLICY_GPUMEM_GP_H

#include "internal.h"

#define GP_ALIGN_SHIFT 9 /* 512-byte units, like torch */
#define GP_ALIGN ((uint64_t)1 << GP_ALIGN_SHIFT)
#define GP_SMALL_UNITS 2048 /* <= 1 MiB: small pool, size-class cache */
#define GP_QWORDS (GP_SMALL_UNITS / 64) /* quick-list bitmap: bit u-1 = quick[u] non-empty */
#define GP_NBINS 1152       /* see gm__gp_bin_of */
#define GP_NWORDS (GP_NBINS / 64)
#define GP_NORDERS 48
/* Tuning knobs (compile time; measured trade-offs in
 * bench/gpumem_policy_tradeoff.md and at the top of gpumem.c). */
/*  GP_RUN_GRANULES        with gpumem_chunks:run (at gpumem_slack:inf), the largest chunk created for a
 *                         run of unmapped granules one placement needs (one
 *                         create + one map instead of one per granule on a
 *                         cold start); 512 granules = 1 GiB. Measured:
 *                         bench/gpumem_policy_tradeoff.md, "Cold pass: one
 *                         chunk per run of unmapped granules". */
#ifndef GP_RUN_GRANULES
#define GP_RUN_GRANULES 512
#endif
/*  GP_AUTO_PERMILLE       with gpumem_chunks:auto, chunks span runs (as with
 *                         :run) until memory held passes this share of the
 *                         device; past it, only a block's interior, and idle
 *                         chunks a placement would use in part are cut first.
 *  GP_AUTO_HEADROOM       with gpumem_chunks:auto, a new chunk is at most
 *                         1/GP_AUTO_HEADROOM of the memory still free.
 *                         Both measured: bench/gpumem_policy_tradeoff.md,
 *                         "Cold pass by default: gpumem_chunks:auto". */
#ifndef GP_AUTO_PERMILLE
#define GP_AUTO_PERMILLE 150
#endif
#ifndef GP_AUTO_HEADROOM
#define GP_AUTO_HEADROOM 1024
#endif

/*  GP_BUDGET_PERMILLE     gpumem_slack:auto once warmed up: memory held may pass the
 *                         run's peak allocated by this much before idle chunks move
 *                         (chunks.c, reserve_budget). Measured, with the other
 *                         budgets tried: bench/RESULTS.md, "the reserve budget:
 *                         jobs a user brings". */
#ifndef GP_BUDGET_PERMILLE
#define GP_BUDGET_PERMILLE 15
#endif

/* GP_PARKED: gpumem_plan:on, a freed block kept at its address for the
 * plan position that starts there next (plan/park.c) */
enum { GP_FREE = 0, GP_USED = 1, GP_CACHED = 2, GP_PARKED = 3 };
enum { GP_LIST_NONE = 0, GP_LIST_IDLE = 1, GP_LIST_LOOSE = 2 };

typedef struct gp_block {
    gm__block_hdr h;              /* must be first: the front end sees this */
    struct gp_block *prev, *next; /* address order inside the arena */
    struct gp_block *fprev, *fnext; /* bin list, size-class list or pool */
    uint16_t bin;       /* free ranges: gm__gp_bin_of(units) */
    uint16_t slot;      /* gpumem_plan:on: 1 + the plan position a used block was served at,
                         * or a parked block waits for; 0: none (2 steps < 2^16 positions) */
    uint8_t state;      /* GP_FREE / GP_USED / GP_CACHED / GP_PARKED */
    uint8_t split_cnt;  /* counted in inactive_split (free, not arena top) */
    uint16_t arena;
    uint64_t serial;    /* gpumem_plan:on only: allocation number (plan history) */
} gp_block;

typedef struct gp_chunk {
    gm_physmem h;
    uint64_t n;       /* granules */
    int64_t g0;       /* first granule in its arena when mapped */
    int32_t arena;    /* -1: not mapped ("loose") */
    uint32_t live;    /* used or cached blocks overlapping it */
    int32_t lprev, lnext; /* idle / loose list, by order */
    uint8_t list;     /* GP_LIST_* */
    uint8_t inuse;    /* slot holds a chunk */
    uint8_t pool;     /* pool its bytes count in: the arena it was last mapped in */
    uint32_t idle_sync; /* on the idle list: its arena's syncs when it got there (chunks.c, chunk_unmap) */
} gp_chunk;

typedef struct gp_arena {
    gm_stream stream;
    int32_t index;    /* in gp_state.arenas */
    uint8_t pool;     /* GM_POOL_SMALL or GM_POOL_LARGE: blocks of one pool only */
    bool plan_only;   /* gpumem_plan:on: holds planned blocks only; arena_of never returns it */
    uint64_t mapped_bytes;
    gm_devptr base;
    uint64_t va_size;
    uint64_t ngran;
    int32_t *gran;    /* chunk index per granule, -1 unmapped (VMM only) */
    uint64_t *mapped; /* bit per granule: gran[g] >= 0, so cost() counts by words */
    uint64_t *idle1;  /* bit per granule where an idle one-granule chunk starts (st->idle[0]), */
    uint64_t *idle1_sum; /* and a bit per word of it that is not 0: its highest found in a few
                          * words (chunks.c, idle1_take); one allocation, made when a chunk is
                          * first mapped here, freed by gm__gp_release_all */
    gp_block *head;   /* first block in address order (VMM only) */
    gp_block *quick[GP_SMALL_UNITS + 1]; /* freed small blocks by units */
    uint64_t qmap[GP_QWORDS]; /* non-empty quick lists, so a flush visits only those */
    uint64_t ncached;
    gp_block *parked; /* GP_PARKED blocks (va.c, gm__gp_park), linked by fprev/fnext */
    gp_block sink;    /* takes the list links' stores that have no neighbour to go to (va.c, LINK_SET) */
    uint64_t nparked;
    bool dirty;       /* a block was freed since the stream was last synced */
    uint32_t syncs;   /* times its stream was synced (gm__gp_sync_arena) */
    gp_block *bins[GP_NBINS];
    uint64_t bitmap[GP_NWORDS];
    uint64_t summary; /* bit w: bitmap[w] != 0 */
    /* gpumem_plan:on, the plan's arena only: its free ranges by address, so
     * a planned address finds the free range holding it (va.c) */
    gp_block **fidx;
    uint64_t nfidx, fidx_cap;
} gp_arena;

/* What the plan (plan/) and gpumem_slack:auto tell the memory floor
 * (chunks.c, va.c): the one place the plan's state reaches into it. The
 * memory floor's own code (gm__gp_loosen, chunks.c) and
 * gp_create (gpumem.c) write it; everything else reads it through the
 * getters and the plan sets it through the setters below gp_state. */
typedef struct gp_mode {
    bool warming;              /* gpumem_slack:auto, not loosened yet: slack is 0 (gm__gp_loosen) */
    bool autoslack;            /* gpumem_slack:auto with a plan: the reserve budget holds once loosened (chunks.c) */
    uint64_t soft_cap;         /* gpumem_plan:on, while the plan maps its arena: no chunk is created past it (0: none) */
    bool planned;              /* a plan has served a step: steps repeat, and the plan's layout places them */
} gp_mode;

typedef struct gp_state {
    gm__device *d;
    bool vmm;
    uint64_t gran;       /* granule bytes */
    unsigned gshift;     /* log2(gran) */
    gp_arena **arenas;
    uint32_t narenas, arenas_cap;
    gp_arena *last[GM_POOL_COUNT]; /* last arena used per pool: most programs use one stream */
    gp_chunk *chunks;
    int32_t nchunks, chunks_cap, chunk_free; /* chunk_free: recycled slot list via lnext */
    /* by order of size, in the order they became idle */
    int32_t idle[GP_NORDERS], idle_tail[GP_NORDERS];   /* mapped, no live block */
    int32_t loose[GP_NORDERS], loose_tail[GP_NORDERS]; /* held but not mapped */
    uint64_t live_gran, peak_live_gran; /* granules of chunks holding live blocks */
    uint32_t nmulti;     /* chunks of more than one granule (none by default) */
    uint64_t held_bytes;       /* physical bytes held (chunks, or plain mallocs) */
    double slack;              /* cfg gpumem_slack: may hold (1 + slack) x peak live granules */
    gp_mode mode;              /* the plan's and gpumem_slack:auto's say (gp_mode; getters below) */
    bool runs;                 /* gpumem_chunks:run at slack inf: one chunk per run of unmapped granules */
    bool autoc;                /* gpumem_chunks:auto at slack inf (runs is set too) */
    bool lazy_ok;              /* slack inf: live counts may go stale between pressure events */
    bool lazy;                 /* chunks' live counts, idle lists, live_gran are stale now */
    gp_block *pool;            /* recycled block structs */
    void **slabs;              /* host allocations of block structs */
    size_t nslabs, slabs_cap;
    gp_block *plain;           /* no VMM: every live or cached device allocation */
    struct gp_plan *plan;      /* gpumem_plan:on (with VMM): step detection and the plan */
    bool (*keep)(struct gp_state *, const gp_chunk *); /* gpumem_plan: an idle chunk the plan serving now
                                * uses again in its next steps (plan.c); NULL without a plan */
} gp_state;

/* The plan's say over the memory floor (gp_mode). */
static inline bool gm__gp_warming(const gp_state *st) { return st->mode.warming; }
/* gpumem_slack:auto and warmed up: the reserve budget is in force (chunks.c, reserve_budget). */
static inline bool gm__gp_reserving(const gp_state *st) { return st->mode.autoslack && !st->mode.warming; }
static inline uint64_t gm__gp_soft_cap(const gp_state *st) { return st->mode.soft_cap; }
static inline bool gm__gp_planned(const gp_state *st) { return st->mode.planned; }
static inline void gm__gp_set_soft_cap(gp_state *st, uint64_t bytes) { st->mode.soft_cap = bytes; }
static inline void gm__gp_set_planned(gp_state *st) { st->mode.planned = true; }

/* base.c */
gp_block *gm__gp_block_new(gp_state *st);
void gm__gp_block_put(gp_state *st, gp_block *b);
/* Wait for the work queued so far on the arena's stream: after this, memory
 * freed in the arena may be unmapped or handed to another stream. */
int gm__gp_sync_arena(gp_state *st, gp_arena *a);

/* log2 of a chunk's granules: the idle and loose lists it is on */
static inline unsigned gm__gp_order(uint64_t n) { return 63u - (unsigned)__builtin_clzll(n); }

/* Stats of a block entering / leaving a size-class list (every small malloc
 * and free: inc/dec, no sign branches). */
static inline void gm__gp_cached_inc(gp_state *st, const gp_block *b) {
    gm__stat_block_inc(st->d->stats.inactive_split, st->d->stats.inactive_split_bytes, b->h.pool, b->h.size);
}
static inline void gm__gp_cached_dec(gp_state *st, const gp_block *b) {
    gm__stat_block_dec(st->d->stats.inactive_split, st->d->stats.inactive_split_bytes, b->h.pool, b->h.size);
}
/* The memory the policy may hold: the fraction's limit, else the device,
 * less what the device's other policy instances (private pools) reserve. */
static inline uint64_t gm__gp_device_limit(const gp_state *st) {
    uint64_t lim = st->d->fraction_set ? st->d->allowed_memory_maximum : st->d->total_memory;
    uint64_t others = gm__device_others_reserved(st->d);
    return lim > others ? lim - others : 0;
}
/* gpumem_chunks:auto: physical memory held is past GP_AUTO_PERMILLE of the
 * limit, so the device may fill up: from here on no chunk may pin granules
 * that no block uses. */
static inline bool gm__gp_tight(const gp_state *st) {
    return st->held_bytes > gm__gp_device_limit(st) / 1000 * GP_AUTO_PERMILLE;
}

#endif /* GPUMEM_POLICY_GPUMEM_GP_H */
