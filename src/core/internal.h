/* internal.h — what the allocator front end, the policies, the backend
 * wrapper and the monitor share inside libgpumem. Not installed.
 *
 * Layering (docs/architecture.md):  front end (allocator.c: locking, pointer
 *            map, stream events, request-level stats)  ->  policy (src/policy/:
 *            placement, segments, caching)  ->  device calls (devcall.c)  ->
 *            the backend table (src/backend/table.c)  ->  a backend. */
#ifndef GPUMEM_INTERNAL_H
#define GPUMEM_INTERNAL_H

#include "gpumem/backend.h"
#include "gpumem/gpumem.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devlock.h"
#include "util/gm_limits.h"
#include "util/text.h"
#include "util/util.h"

/* ---- statistics helpers (caller holds the device lock) ------------------ */

static inline void gm__stat_add(gm_stat *s, int64_t delta) {
    s->current += delta;
    if (s->current > s->peak) s->peak = s->current;
    if (delta > 0) s->allocated += delta;
    else s->freed -= delta;
}
/* Update pool `pool` (GM_POOL_SMALL/LARGE) and GM_POOL_ALL together. */
static inline void gm__stat_pool_add(gm_stat arr[GM_POOL_COUNT], int pool, int64_t delta) {
    gm__stat_add(&arr[GM_POOL_ALL], delta);
    gm__stat_add(&arr[pool], delta);
}
/* The same for a delta whose sign the caller knows (v >= 0), without the
 * sign branch: hot paths (every malloc/free, about eight counters each)
 * use these, always inlined (gcc made some of them calls of their own),
 * and the peak is tested before it is stored, as peaks stand in a warm
 * loop (bench/RESULTS.md, "parking", has the figures). current <= peak
 * always holds (only these helpers and reset_peak write peak), so a
 * decrease never moves peak. */
static inline __attribute__((always_inline)) void gm__stat_inc(gm_stat *s, int64_t v) {
    int64_t c = s->current + v;
    s->current = c;
    if (c > s->peak) s->peak = c; /* a branch, not a store each time: in a warm loop peaks stand */
    s->allocated += v;
}
static inline __attribute__((always_inline)) void gm__stat_dec(gm_stat *s, int64_t v) {
    s->current -= v;
    s->freed += v;
}
static inline __attribute__((always_inline)) void gm__stat_pool_inc(gm_stat arr[GM_POOL_COUNT], int pool, int64_t v) {
    gm__stat_inc(&arr[GM_POOL_ALL], v);
    gm__stat_inc(&arr[pool], v);
}
static inline __attribute__((always_inline)) void gm__stat_pool_dec(gm_stat arr[GM_POOL_COUNT], int pool, int64_t v) {
    gm__stat_dec(&arr[GM_POOL_ALL], v);
    gm__stat_dec(&arr[pool], v);
}
/* One block of `size` bytes entering / leaving a count-and-bytes pair of
 * stats (active / active_bytes, inactive_split / inactive_split_bytes,
 * allocation / allocated_bytes). */
static inline __attribute__((always_inline)) void gm__stat_block_inc(gm_stat count[GM_POOL_COUNT], gm_stat bytes[GM_POOL_COUNT], int pool,
                                      uint64_t size) {
    gm__stat_pool_inc(count, pool, 1);
    gm__stat_pool_inc(bytes, pool, (int64_t)size);
}
static inline __attribute__((always_inline)) void gm__stat_block_dec(gm_stat count[GM_POOL_COUNT], gm_stat bytes[GM_POOL_COUNT], int pool,
                                      uint64_t size) {
    gm__stat_pool_dec(count, pool, 1);
    gm__stat_pool_dec(bytes, pool, (int64_t)size);
}

/* ---- blocks ------------------------------------------------------------ */

struct gm__stream_uses; /* front end: extra streams recorded on a block */

/* Every policy's block struct begins with this header. The policy fills
 * ptr, size, pool and stream; the front end owns the rest. */
typedef struct gm__block_hdr {
    gm_devptr ptr;
    uint64_t size;      /* bytes set aside for it (torch: block->size) */
    uint64_t requested; /* bytes the caller asked for */
    gm_stream stream;   /* allocation stream */
    uint8_t pool;       /* GM_POOL_SMALL or GM_POOL_LARGE */
    uint8_t live;       /* front end: handed out and not yet freed by the caller */
    uint8_t category;   /* front end: 1 + gm_category set by gm_block_set_category, 0 = unknown */
    uint16_t mpool;     /* front end: 0 = the device's own pools, else 1 + the slot of the
                         * private pool (mempool.c) whose policy instance placed it */
    struct gm__stream_uses *uses; /* front end: NULL unless record_stream was called */
} gm__block_hdr;

/* ---- devices ----------------------------------------------------------- */

typedef struct gm__device gm__device;
typedef struct gm__policy_ops gm__policy_ops;

struct gm__device {
    int index;
    struct gm_allocator *alloc;
    gm_backend *backend;
    const gm_config *cfg;        /* the allocator's config */
    const gm__policy_ops *pops;  /* the policy */
    void *pstate;                /* the policy's state */
    gm__devlock lock;            /* guards everything below and pstate */
    gm_stats stats;
    uint64_t total_memory;       /* backend mem_info total at creation */
    double memory_fraction;      /* 1.0 unless set */
    bool fraction_set;           /* torch: set_fraction */
    uint64_t allowed_memory_maximum; /* total * fraction when fraction_set */
    void *fe;                    /* front end private (pending events, ...) */
    /* Private pools (CUDA graphs, torch.cuda.MemPool; mempool.c). Each is a
     * policy instance of its own that sees a view of this device: a
     * gm__device whose owner is this one, with its own stats (folded into
     * these after every call) and the same backend, index and limits. */
    gm__device *owner;           /* a pool's view: the device; NULL for the device itself */
    struct gm__mempools *mp;     /* the device's private pools, NULL before the first */
    uint32_t capturing;          /* pools between gm_pool_begin and gm_pool_end */
    /* Device calls attempted while capturing, per kind: [0] by the device's
     * own policy instance, [1] by a private pool's (gm_pool_capture_calls;
     * kept on the device, never on a view). */
    uint64_t capture_calls[2][GM_BCALL_COUNT];
    /* A memory fraction limits what all of a device's policy instances
     * reserve together, as torch's one total_allocated_memory does
     * (gm__device_others_reserved; mempool.c keeps these two). */
    uint64_t pools_reserved;     /* the device: its private pools' reserved bytes, as last folded in */
    const gm_stats *synced;      /* a pool's view: its stats as last folded into the owner's */
    /* A private pool's view only (mempool.c sets them; devcall.c follows
     * them on every device call of the view): the pool's options (another
     * allocator's segments, no VMM), and its physical handles, tracked so
     * that the pool can sleep and wake at stable addresses. NULL on the
     * device itself: its calls pay one branch each. */
    const gm_pool_options *popt;
    struct gm__phys_track *track;
};

/* The bytes reserved on d's device by policy instances other than d's: the
 * private pools for the device itself; the device and the other pools for
 * a pool's view (the owner's stats hold all of them as last folded in,
 * while the view's changes since then are its own). */
static inline uint64_t gm__device_others_reserved(const gm__device *d) {
    if (!d->owner) return d->pools_reserved;
    return (uint64_t)(d->owner->stats.reserved_bytes[GM_POOL_ALL].current -
                      d->synced->reserved_bytes[GM_POOL_ALL].current);
}

/* A capture is under way on d's device (a private pool is being allocated
 * into): no device free, no event synchronisation, no cache release, as
 * torch's allocator does while captures_underway is not empty. */
static inline bool gm__device_capturing(const gm__device *d) {
    return (d->owner ? d->owner : d)->capturing != 0;
}

/* Count a device call made during a capture, by whose instance made it. */
static inline void gm__capture_note(gm__device *d, int kind) {
    gm__device *o = d->owner ? d->owner : d;
    if (__builtin_expect(o->capturing != 0, 0)) o->capture_calls[d->owner != NULL][kind]++;
}

/* Front-end services a policy may call (device lock held):
 * complete blocks whose stream events are done; with synchronize, wait for
 * all of them first (torch: synchronize_and_free_events before a retry). */
int gm__device_process_events(gm__device *d, bool synchronize);

/* ---- policies ---------------------------------------------------------- */

typedef int (*gm__segment_cb)(const gm_segment_info *seg, void *arg);

struct gm__policy_ops {
    const char *name;
    int (*create)(gm__device *d, void **state);
    /* release every device allocation; blocks still live are dropped */
    void (*destroy)(void *state);
    /* place `size` bytes for `stream`. Fill (*out)->ptr,size,pool,stream.
     * Update segment/reserved/active/inactive_split/oversize_segments and
     * num_alloc_retries stats. On failure after freeing the cache and
     * retrying, return GM_ENOMEM (front end counts num_ooms and explains). */
    int (*malloc)(void *state, uint64_t size, gm_stream stream, gm__block_hdr **out);
    /* the block is no longer used by any stream: make it reusable */
    void (*free)(void *state, gm__block_hdr *b);
    /* return cached unused memory to the backend */
    int (*empty_cache)(void *state);
    /* recount and compare: GM_OK or GM_ESTATE naming the broken invariant */
    int (*check)(void *state, char *err, size_t errlen);
    int (*walk_segments)(void *state, gm__segment_cb cb, void *arg);
    /* optional (NULL: a pointer inside a walked segment is ours): does p lie
     * in address space the policy holds, mapped or not? Tells a double free
     * from a foreign pointer when segments do not cover the address space */
    bool (*owns)(void *state, gm_devptr p);
    /* optional (NULL: ignored): the program marked the end of a step (gm_step_mark) */
    void (*step_mark)(void *state);
};
/* Each policy's ops table is declared in its one interface header,
 * src/policy/NAME/NAME.h, which only the policy table (src/policy/table.c)
 * includes. */

/* A policy's entry in the registry (policy.c): index = gm_policy_kind. */
typedef struct gm__policy_desc {
    const char *name;          /* policy:NAME */
    const gm__policy_ops *ops;
    const char *doc;           /* one line for `gpumem config --list` */
    const char *const *tune;   /* settings `gpumem tune` tries, NULL-terminated */
} gm__policy_desc;
/* The policies gm_policy_kind names, in its order: the policy table
 * (src/policy/table.c) lends them to the registry when the library loads. */
#define GM__POLICY_BUILTIN 2
/* What the registry says when nothing lent it a policy. */
#define GM__POLICY_NONE                                                                                               \
    "no policy is linked in (a static link of libgpumem.a needs -Wl,-u,gm__policy_table, as gpumem.pc and "           \
    "find_package(gpumem) give)"
void gm__policy_lend(const gm__policy_desc builtin[GM__POLICY_BUILTIN]);
/* The ops of policy `kind`, or NULL. */
const gm__policy_ops *gm__policy_get(int kind);
/* Add a policy (tests); returns its kind, or GM_EINVAL. */
int gm__policy_register(const gm__policy_desc *p);
void gm__policy_unregister_last(void);
/* "torch or gpumem", for error messages. */
void gm__policy_names(char *buf, size_t len);

/* ---- backend wrapper (src/backend/backend.c) --------------------------- *
 * The only way the core reaches a backend. Each counts the call in the
 * backend's per-device counters and in d->stats (num_device_alloc, ...),
 * and applies fault injection. */
int gm__be_mem_info(gm__device *d, uint64_t *free_bytes, uint64_t *total_bytes);
int gm__be_malloc(gm__device *d, uint64_t size, gm_devptr *out);
/* size: the allocation's bytes, for the history and the segment observer */
int gm__be_free(gm__device *d, gm_devptr ptr, uint64_t size);
int gm__be_granularity(gm__device *d, uint64_t *bytes); /* GM_ENOTSUP without VMM */
int gm__be_va_reserve(gm__device *d, uint64_t size, gm_devptr *out);
int gm__be_va_release(gm__device *d, gm_devptr va, uint64_t size);
int gm__be_phys_create(gm__device *d, uint64_t size, gm_physmem *out);
int gm__be_phys_release(gm__device *d, gm_physmem h);
int gm__be_map(gm__device *d, gm_devptr va, uint64_t size, gm_physmem h);
int gm__be_unmap(gm__device *d, gm_devptr va, uint64_t size);
int gm__be_event_record(gm__device *d, gm_stream stream, gm_event *out);
int gm__be_event_query(gm__device *d, gm_event ev, bool *done);
int gm__be_event_sync(gm__device *d, gm_event ev);
int gm__be_event_destroy(gm__device *d, gm_event ev);
/* The same calls for cleanup paths: tried twice; if both fail the object is
 * left to the backend and counted in gm_backend_dropped_count. Return the
 * last status. */
int gm__be_cleanup_free(gm__device *d, gm_devptr ptr, uint64_t size);
int gm__be_cleanup_va_release(gm__device *d, gm_devptr va, uint64_t size);
int gm__be_cleanup_phys_release(gm__device *d, gm_physmem h);
int gm__be_cleanup_unmap(gm__device *d, gm_devptr va, uint64_t size);
int gm__be_cleanup_event_destroy(gm__device *d, gm_event ev);
/* Synchronous copies (gm_allocator_sleep's offload; GM_ENOTSUP without). */
int gm__be_copy_to_host(gm__device *d, void *dst, gm_devptr src, uint64_t size);
int gm__be_copy_to_device(gm__device *d, gm_devptr dst, const void *src, uint64_t size);
/* Many copies waited for once (the backend's copy_many, else the above one
 * by one), and page-locked host memory for them (GM_ENOTSUP without). */
int gm__be_copy_many(gm__device *d, bool to_device, const gm_backend_copy *v, size_t n);
int gm__be_host_alloc(gm__device *d, uint64_t size, void **out);
int gm__be_host_free(gm__device *d, void *ptr);

/* ---- sleep and wake of a private pool's view (devcall.c) ------------------
 * A view with a tracker hands its policy handles of its own (not the
 * backend's), so the memory behind them can be released and created again
 * at the same addresses while the policy keeps its handles. */
int gm__track_create(gm__device *view);
void gm__track_destroy(gm__device *view);
/* Bytes of physical memory the view holds; plain (malloc'd) segments live. */
void gm__track_usage(const gm__device *view, uint64_t *phys_bytes, uint64_t *plain_segments);
bool gm__track_asleep(const gm__device *view);
/* Unmap and release every handle (a failed unmap maps back what was
 * unmapped and changes nothing); *released: bytes given back. */
int gm__track_sleep(gm__device *view, uint64_t *released);
/* Create and map every released handle again (a failure gives back what
 * this call made: still asleep). */
int gm__track_wake(gm__device *view);

/* ---- hooks: what the layers above lend the core -------------------------
 * The core calls nothing above it (docs/architecture.md). Two things it does
 * need from above reach it as hooks instead:
 *
 *  - a statistics sink: the monitor's publisher (src/monitor/publish.c)
 *    embeds a gm__sink as its first member. The allocator holds at most one,
 *    a->sink, set by gm_allocator_publish while other threads may allocate:
 *    every read and write of it is atomic (gm__sink_get / gm__sink_set).
 *  - the allocator's hooks (gm__hooks), given when it is created:
 *    gm_allocator_create (src/api/) lends the estimator's OOM explanation.
 */
typedef struct gm__sink gm__sink;
typedef struct gm__sink_ops {
    /* after every change of a device's stats (device lock held); must be a
     * few stores under a seqlock, nothing more */
    void (*update)(gm__sink *s, int device, const gm_stats *st);
    /* the device's total memory, once per device */
    void (*set_total)(gm__sink *s, int device, uint64_t total);
    void (*close)(gm__sink *s);
    /* gm_step_mark: on each device marked (device lock held; a few stores),
     * then once with no lock held (device as given to gm_step_mark), where
     * the sink may walk the blocks through the public API */
    void (*step)(gm__sink *s, int device, const gm_stats *st);
    void (*step_walk)(gm__sink *s, gm_allocator *a, int device);
} gm__sink_ops;
struct gm__sink {
    const gm__sink_ops *ops;
};

typedef struct gm__hooks {
    /* At an OOM, device lock held: writes what holds the memory and what
     * would have made it fit into tail (NUL-terminated) and returns nonzero,
     * or returns 0 with nothing to say (the core then gives its own advice). */
    int (*explain_oom)(const gm__device *d, uint64_t requested, uint64_t device_free, uint64_t device_total,
                       char *tail, size_t len);
} gm__hooks;

/* gm_allocator_create's work, with the hooks of the layers above (NULL:
 * none). Public callers use gm_allocator_create; a simulation inside the
 * library (replay, the report's timeline) calls this with NULL. */
int gm__allocator_create(gm_allocator **out, gm_backend *backend, const gm_config *cfg, const gm__hooks *hooks);

/* ---- the allocator object ---------------------------------------------- */

struct gm_allocator {
    gm_backend *backend;
    gm_config cfg;
    int ndevices;
    gm__device *devices[GM_MAX_DEVICES]; /* created on first use */
    pthread_mutex_t devices_lock;         /* guards creation of devices[] */
    gm__sink *sink;                       /* NULL unless publishing: gm__sink_get/_set only */
    const gm__hooks *hooks;               /* NULL: none; fixed at creation */
    void *fe;                             /* front end private (pointer map) */
};

/* The allocator's statistics sink, read and written atomically (the
 * acquire pairs with the release of the store, so a sink is seen filled). */
static inline gm__sink *gm__sink_get(const gm_allocator *a) { return __atomic_load_n(&a->sink, __ATOMIC_ACQUIRE); }
static inline void gm__sink_set(gm_allocator *a, gm__sink *s) { __atomic_store_n(&a->sink, s, __ATOMIC_RELEASE); }

#endif /* GPUMEM_INTERNAL_H */
