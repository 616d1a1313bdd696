/* policy_gpumem.h — private structures of the `gpumem` policy, shared by
 * policy_gpumem.c (ops, arenas, size-class caches), policy_gpumem_va.c
 * (free-range index, placement), policy_gpumem_chunks.c (physical chunks,
 * mapping) and policy_gpumem_check.c
 * (invariant check, segment walk, fallback without VMM).
 *
 * Model (see policy_gpumem.c for the full story): every stream owns two large
 * virtual ranges (arenas, one per pool) where blocks are placed best-fit and coalesce; the
 * physical memory behind it is a per-device pool of chunks (whole multiples of
 * the VMM granule) that are mapped lazily, kept mapped while idle, and moved
 * between places (and arenas) only when a placement needs them. */
#ifndef GPUMEM_POLICY_GPUMEM_H
#define GPUMEM_POLICY_GPUMEM_H

#include "internal.h"

#define GP_ALIGN_SHIFT 9 /* 512-byte units, like torch */
#define GP_ALIGN ((uint64_t)1 << GP_ALIGN_SHIFT)
#define GP_SMALL_UNITS 2048 /* <= 1 MiB: small pool, size-class cache */
#define GP_QWORDS (GP_SMALL_UNITS / 64) /* quick-list bitmap: bit u-1 = quick[u] non-empty */
#define GP_NBINS 1152       /* see gm__gp_bin_of */
#define GP_NWORDS (GP_NBINS / 64)
#define GP_NORDERS 48
/* Tuning knobs (compile time; measured trade-offs in
 * bench/gpumem_policy_tradeoff.md and at the top of policy_gpumem.c). */
/*  GP_RUN_GRANULES        with gpumem_chunks:run (at gpumem_slack:inf), the largest chunk created for a
 *                         run of unmapped granules one placement needs (one
 *                         create + one map instead of one per granule on a
 *                         cold start); 512 granules = 1 GiB. */
#ifndef GP_RUN_GRANULES
#define GP_RUN_GRANULES 512
#endif
/*  GP_AUTO_PERMILLE       with gpumem_chunks:auto, chunks span runs (as with
 *                         :run) until memory held passes this share of the
 *                         device; past it, only a block's interior, and idle
 *                         chunks a placement would use in part are cut first.
 *  GP_AUTO_HEADROOM       with gpumem_chunks:auto, a new chunk is at most
 *                         1/GP_AUTO_HEADROOM of the memory still free.
 *                         Both measured: bench/gpumem_policy_tradeoff.md. */
#ifndef GP_AUTO_PERMILLE
#define GP_AUTO_PERMILLE 150
#endif
#ifndef GP_AUTO_HEADROOM
#define GP_AUTO_HEADROOM 1024
#endif

enum { GP_FREE = 0, GP_USED = 1, GP_CACHED = 2 };
enum { GP_LIST_NONE = 0, GP_LIST_IDLE = 1, GP_LIST_LOOSE = 2 };

typedef struct gp_block {
    gm__block_hdr h;              /* must be first: the front end sees this */
    struct gp_block *prev, *next; /* address order inside the arena */
    struct gp_block *fprev, *fnext; /* bin list, size-class list or pool */
    uint32_t bin;
    uint8_t state;      /* GP_FREE / GP_USED / GP_CACHED */
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
    gp_block *head;   /* first block in address order (VMM only) */
    gp_block *quick[GP_SMALL_UNITS + 1]; /* freed small blocks by units */
    uint64_t qmap[GP_QWORDS]; /* non-empty quick lists, so a flush visits only those */
    uint64_t ncached;
    bool dirty;       /* a block was freed since the stream was last synced */
    gp_block *bins[GP_NBINS];
    uint64_t bitmap[GP_NWORDS];
    uint64_t summary; /* bit w: bitmap[w] != 0 */
    /* gpumem_plan:on, the plan's arena only: its free ranges by address, so
     * a planned address finds the free range holding it (policy_gpumem_va.c) */
    gp_block **fidx;
    uint64_t nfidx, fidx_cap;
} gp_arena;

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
    /* by order of size, oldest first (the one idle longest moves first) */
    int32_t idle[GP_NORDERS], idle_tail[GP_NORDERS];   /* mapped, no live block */
    int32_t loose[GP_NORDERS], loose_tail[GP_NORDERS]; /* held but not mapped */
    uint64_t live_gran, peak_live_gran; /* granules of chunks holding live blocks */
    uint32_t nmulti;     /* chunks of more than one granule (none by default) */
    uint64_t held_bytes;       /* physical bytes held (chunks, or plain mallocs) */
    double slack;              /* cfg gpumem_slack: may hold (1 + slack) x peak live granules */
    bool warming;              /* gpumem_slack:auto, not loosened yet: slack is 0 (gm__gp_loosen) */
    bool runs;                 /* gpumem_chunks:run at slack inf: one chunk per run of unmapped granules */
    bool autoc;                /* gpumem_chunks:auto at slack inf (runs is set too) */
    bool lazy_ok;              /* slack inf: live counts may go stale between pressure events */
    bool lazy;                 /* chunks' live counts, idle lists, live_gran are stale now */
    gp_block *pool;            /* recycled block structs */
    void **slabs;              /* host allocations of block structs */
    size_t nslabs, slabs_cap;
    gp_block *plain;           /* no VMM: every live or cached device allocation */
    struct gp_plan *plan;      /* gpumem_plan:on (with VMM): step detection and the plan */
    uint64_t soft_cap;         /* gpumem_plan:on, while the plan maps its arena: no chunk is created past it (0: none) */
} gp_state;

/* policy_gpumem.c */
gp_block *gm__gp_block_new(gp_state *st);
/* gpumem_slack:auto: the warm-up is over (a plan served a step, or none
 * came): from now on idle chunks stay mapped, as at gpumem_slack:inf. */
void gm__gp_loosen(gp_state *st);
void gm__gp_block_put(gp_state *st, gp_block *b);
int gm__gp_sync_arena(gp_state *st, gp_arena *a);
int gm__gp_flush_quick(gp_state *st);

/* policy_gpumem_chunks.c. The wrappers below are inline because every
 * large malloc or free calls them and, at the default (slack inf, memory
 * held under GP_AUTO_PERMILLE of the device), they return at once: a call
 * into another file for that was 3% of a warm pass's instructions. */
void gm__gp_touch(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes, int dir);
int gm__gp_ensure_mapped(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes);
int gm__gp_release_unused(gp_state *st);
/* The same, keeping the idle chunks keep(arg, chunk) says to keep. */
int gm__gp_release_unused_but(gp_state *st, bool (*keep)(void *, const gp_chunk *), void *arg);
void gm__gp_release_all(gp_state *st);
void gm__gp_live_sync(gp_state *st);
void gm__gp_live_drop_now(gp_state *st);
int gm__gp_split_partial_at(gp_state *st, gp_arena *a, const gp_block *r, gm_devptr p, uint64_t bytes);

/* Live counts of the chunks under a block that starts or stops being used
 * (nothing while they are stale: st->lazy). */
static inline void gm__gp_touch_inc(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes) {
    if (!st->lazy) gm__gp_touch(st, a, p, bytes, 1);
}
static inline void gm__gp_touch_dec(gp_state *st, gp_arena *a, gm_devptr p, uint64_t bytes) {
    if (!st->lazy) gm__gp_touch(st, a, p, bytes, -1);
}
/* Let the live counts go stale again where slack inf allows it. */
static inline void gm__gp_live_drop(gp_state *st) {
    if (st->lazy_ok && !st->lazy) gm__gp_live_drop_now(st);
}
/* The memory the policy may hold: the fraction's limit, else the device. */
static inline uint64_t gm__gp_device_limit(const gp_state *st) {
    return st->d->fraction_set ? st->d->allowed_memory_maximum : st->d->total_memory;
}
/* gpumem_chunks:auto: physical memory held is past GP_AUTO_PERMILLE of the
 * limit, so the device may fill up: from here on no chunk may pin granules
 * that no block uses. */
static inline bool gm__gp_tight(const gp_state *st) {
    return st->held_bytes > gm__gp_device_limit(st) / 1000 * GP_AUTO_PERMILLE;
}
/* Cut idle multi-granule chunks the placement [p, p+bytes) in free range r
 * would use in part (gpumem_chunks:auto, once tight): 1 if one was cut, 0,
 * or an error. */
static inline int gm__gp_split_partial(gp_state *st, gp_arena *a, const gp_block *r, gm_devptr p,
                                       uint64_t bytes) {
    if (!st->autoc || !st->nmulti || !gm__gp_tight(st)) return 0;
    return gm__gp_split_partial_at(st, a, r, p, bytes);
}

/* policy_gpumem_va.c */
int gm__gp_arena_init_va(gp_state *st, gp_arena *a);
int gm__gp_va_place(gp_state *st, gp_arena *a, uint64_t units, gp_block **out);
void gm__gp_va_free(gp_state *st, gp_arena *a, gp_block *b);
/* gpumem_plan:on: [p, p+units) as a used block if it lies inside one free
 * range (mapping what it needs): 1 and *out, 0 when it is not free (or
 * memory ran out: the usual placement decides), 2 when it would need
 * mapping and !map_ok, or an error. Needs the arena's free-range index
 * (gm__gp_va_index). */
int gm__gp_va_place_at(gp_state *st, gp_arena *a, gm_devptr p, uint64_t units, bool map_ok, gp_block **out);
/* Build (on) or drop the arena's free-range index; GM_ENOHOSTMEM leaves none. */
int gm__gp_va_index(gp_arena *a, bool on);
void gm__gp_bin_insert(gp_arena *a, gp_block *b);
void gm__gp_bin_remove(gp_arena *a, gp_block *b);
unsigned gm__gp_bin_of(uint64_t units);
unsigned gm__gp_order(uint64_t n);

/* policy_gpumem_check.c */
int gm__gp_check(void *state, char *err, size_t errlen);
int gm__gp_walk(void *state, gm__segment_cb cb, void *arg);
bool gm__gp_owns(void *state, gm_devptr p);
int gm__gp_plain_malloc(gp_state *st, gp_arena *a, uint64_t units, gp_block **out);
void gm__gp_plain_free(gp_state *st, gp_block *b);

/* policy_gpumem.c */
int gm__gp_arena_of(gp_state *st, gm_stream stream, int pool, gp_arena **out);
/* A new arena of the stream and pool that only the plan places in. */
int gm__gp_arena_new_plan(gp_state *st, gm_stream stream, int pool, gp_arena **out);

/* policy_gpumem_plan.c (gpumem_plan:on; st->plan is NULL otherwise) */
int gm__gp_plan_create(gp_state *st);
void gm__gp_plan_destroy(gp_state *st);
/* Before the usual placement: 1 and *out when the allocation was served
 * at its planned address, 0 when the caller places it, or an error. */
int gm__gp_plan_malloc(gp_state *st, uint64_t units, int pool, gm_stream stream, gp_block **out);
/* After the usual placement served it. */
void gm__gp_plan_placed(gp_state *st, gp_block *b);
/* Every free, before the block goes back to its arena as usual. */
void gm__gp_plan_free(gp_state *st, const gp_block *b);
/* A step boundary marked by the program (gm_step_mark). */
void gm__gp_plan_step(gp_state *st);
uint64_t gm__gp_plan_served(const gp_state *st); /* allocations served from a plan so far */
/* The active plan's layout: 'A' (around the live blocks), 'B' (own arena), 0 none. */
int gm__gp_plan_layout(const gp_state *st);
/* Tests: 0 the cheaper layout (default), 'A' or 'B' that one whenever it fits. */
extern int gm__gp_plan_force;
/* Tests: when gm__gp_plan_verify is set, every layout the solver tries (each
 * order, fit and round) is checked: no two intervals that meet in time share
 * an address, none meets an obstacle it overlaps, none passes the arena's
 * end. Counts of layouts checked and found wrong. */
extern int gm__gp_plan_verify;
extern uint64_t gm__gp_plan_verified, gm__gp_plan_wrong;
int gm__gp_plan_check(gp_state *st, char *err, size_t errlen);

#endif /* GPUMEM_POLICY_GPUMEM_H */
