/* gpumem.h — public API of libgpumem: a caching device-memory allocator with
 * PyTorch-compatible statistics, pluggable policies and device backends.
 *
 * Conventions: every function that can fail returns an int status (GM_OK == 0,
 * negative on error, see GM_STATUS_LIST). The library never aborts and never
 * prints. Structs that cross the API carry their own size in a `size` field as
 * their first member, so fields can be appended without breaking callers. */
#ifndef GPUMEM_GPUMEM_H
#define GPUMEM_GPUMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GM_BUILDING_LIBRARY)
#define GM_API __attribute__((visibility("default")))
#else
#define GM_API
#endif

#define GM_VERSION_MAJOR 0
#define GM_VERSION_MINOR 1
#define GM_VERSION_PATCH 0
#define GM_VERSION_STRING "0.1.0"

GM_API const char *gm_version(void);

/* ---- status codes ------------------------------------------------------ */

#define GM_STATUS_LIST(X)                                                      \
    X(GM_OK, 0, "success")                                                     \
    X(GM_EINVAL, -1, "invalid argument")                                       \
    X(GM_ENOMEM, -2, "out of device memory")                                   \
    X(GM_ENOHOSTMEM, -3, "out of host memory")                                 \
    X(GM_EDOUBLEFREE, -4, "pointer was already freed")                         \
    X(GM_EFOREIGN, -5, "pointer was not allocated by this allocator")          \
    X(GM_EDEVICE, -6, "invalid device index")                                  \
    X(GM_EBACKEND, -7, "device backend call failed")                           \
    X(GM_ECONFIG, -8, "invalid allocator configuration")                       \
    X(GM_ENODRIVER, -9, "no CUDA driver (libcuda.so.1 could not be loaded)")   \
    X(GM_EFORMAT, -10, "malformed input")                                      \
    X(GM_EIO, -11, "I/O error")                                                \
    X(GM_ENOTSUP, -12, "operation not supported by this backend or policy")    \
    X(GM_ESTATE, -13, "operation not allowed in the current state")            \
    X(GM_ENOSPACE, -14, "output buffer too small")

typedef enum gm_status {
#define GM__STATUS_ENUM(name, value, msg) name = value,
    GM_STATUS_LIST(GM__STATUS_ENUM)
#undef GM__STATUS_ENUM
} gm_status;

/* Human-readable message / enum name ("GM_ENOMEM") for a status. Never NULL. */
GM_API const char *gm_strerror(int status);
GM_API const char *gm_status_name(int status);

/* Details of the last error on the calling thread (e.g. the OOM explanation:
 * what was asked for, what is allocated, reserved, free, and advice).
 * Empty string if the last call succeeded or set no detail. */
GM_API const char *gm_last_error_detail(void);

/* ---- basic device types ------------------------------------------------ */

typedef uint64_t gm_devptr;  /* device address (CUdeviceptr) */
typedef uint64_t gm_stream;  /* stream handle value (cudaStream_t); 0 = default */
typedef uint64_t gm_event;   /* backend-defined event handle */
typedef uint64_t gm_physmem; /* backend-defined physical memory handle */

#define GM_MAX_DEVICES 64

/* ---- configuration ----------------------------------------------------- */

typedef enum gm_policy_kind {
    GM_POLICY_TORCH = 0,  /* faithful model of PyTorch's CUDACachingAllocator */
    GM_POLICY_GPUMEM = 1, /* gpumem's own low-fragmentation policy */
} gm_policy_kind;

/* gm_config.gpumem_slack: tight while warming up, loose once planned */
#define GM_GPUMEM_SLACK_AUTO (-1.0)

/* gm_config.gpumem_chunks: how large the gpumem policy's physical chunks are */
typedef enum gm_gpumem_chunks {
    GM_GPUMEM_CHUNKS_GRANULE = 0, /* one granule each */
    GM_GPUMEM_CHUNKS_RUN = 1,     /* one per run of unmapped granules (slack inf only) */
    GM_GPUMEM_CHUNKS_AUTO = 2     /* run while the device has room, then granule-safe
                                     (slack inf only; the default) */
} gm_gpumem_chunks;

#define GM_ROUNDUP_INTERVALS 16 /* torch: 1 MiB, 2 MiB, ... 32 GiB (last one is ">") */

/* Settings in PYTORCH_CUDA_ALLOC_CONF syntax ("key:value,key:value").
 * Every key torch accepts is accepted; host-side (pinned_*) keys are kept
 * but have no effect. gpumem adds `policy:torch|gpumem`. */
typedef struct gm_config {
    uint32_t size;                       /* sizeof(gm_config) */
    gm_policy_kind policy;               /* policy:torch|gpumem (default torch) */
    uint64_t max_split_size;             /* bytes; UINT64_MAX = unlimited (default) */
    uint64_t max_non_split_rounding;     /* bytes; default 20 MiB */
    double garbage_collection_threshold; /* 0 = off (default); (0,1) */
    bool expandable_segments;
    uint32_t roundup_power2_divisions[GM_ROUNDUP_INTERVALS]; /* 0 = off */
    bool release_lock_on_cudamalloc;
    bool pinned_use_cuda_host_register;
    uint32_t pinned_num_register_threads;
    bool pinned_use_background_threads;
    bool graph_capture_record_stream_reuse;
    double per_process_memory_fraction; /* 1.0 = whole device (default) */
    char backend[32];                   /* "native" (default) or "cudaMallocAsync" */
    /* gpumem policy only: gpumem_slack:auto|<fraction>|inf. Memory the policy
     * may hold over the peak of live granules before it moves idle memory
     * instead of creating more: 0 = least memory (moves every step), inf =
     * moves only under memory pressure (no device calls once warm). auto
     * (GM_GPUMEM_SLACK_AUTO, the default with gpumem_plan:on): 0 while the
     * program warms up, so the whole run's peak never forms, then inf once a
     * plan has served a step (or no plan came: see policy_gpumem.c). */
    double gpumem_slack;
    /* gpumem policy only: gpumem_chunks:auto|granule|run (the physical
     * chunks' size; run and auto apply at gpumem_slack:inf only, granule
     * otherwise). granule: one chunk per 2 MiB granule, so memory between
     * blocks moves granule by granule under pressure, but a cold first pass
     * makes one create+map per granule (several times slower than PyTorch's
     * first pass; bench/RESULTS.md has the H200 figures). run: one chunk per run of unmapped granules a placement needs
     * (up to 1 GiB): few calls, same memory with room to spare, but a partly
     * live chunk pins all its granules, so it runs out of memory earlier on
     * a nearly full device. auto (default): like run while memory held is
     * below 15% of the device, with chunks of at most 1/1024 of the free
     * memory; past that, only a large block's interior gets a multi-granule
     * chunk and an idle one that a placement would use in part is first cut
     * into chunks over the same granules: run's cold pass (1.0-1.5x its
     * calls), granule's memory and out-of-memory behaviour on every trace
     * measured (bench/gpumem_policy_tradeoff.md). */
    gm_gpumem_chunks gpumem_chunks;
    /* gpumem policy only: gpumem_plan:off|on (default on). on: the policy
     * finds the repeating allocation sequence of a training step online,
     * lays out two steps' blocks at planned addresses (greedy, by size) and
     * serves later steps' matching allocations there with no device call;
     * anything that deviates goes to the usual placement
     * (src/policy/gpumem/plan/plan.c, bench/gpumem_policy_tradeoff.md). */
    bool gpumem_plan;
} gm_config;

/* Fill with torch's defaults (policy torch). */
GM_API void gm_config_init(gm_config *cfg);
/* Parse `str` on top of `cfg`. On error returns GM_ECONFIG, writes a message
 * naming the offending key/value into err (if errlen > 0), and leaves cfg
 * unchanged: nothing of the string is applied. NULL or "" is valid (no-op). */
GM_API int gm_config_parse(gm_config *cfg, const char *str, char *err, size_t errlen);
/* Format as a canonical PYTORCH_CUDA_ALLOC_CONF string, only non-default keys. */
GM_API int gm_config_format(const gm_config *cfg, char *buf, size_t len);
/* The value of one key as text ("inf", "True", "128"), default or not. */
GM_API int gm_config_get(const gm_config *cfg, const char *key, char *buf, size_t len);

/* The settings table: every key gm_config_parse accepts, in canonical order.
 * Strings are static. policy is NULL for a key of every policy. */
typedef struct gm_setting_desc {
    const char *key, *alias, *policy, *def, *range, *doc;
} gm_setting_desc;
GM_API int gm_setting_count(void);
GM_API int gm_setting_info(int index, gm_setting_desc *out);

/* The policy table: index = gm_policy_kind. tune: the settings `gpumem tune`
 * tries under this policy (NULL-terminated; "{fit}" stands for a memory
 * fraction sized to the trace). */
typedef struct gm_policy_desc {
    const char *name, *doc;
    const char *const *tune;
} gm_policy_desc;
GM_API int gm_policy_count(void);
GM_API int gm_policy_info(int kind, gm_policy_desc *out);
/* The kind of policy `name`, or -1. */
GM_API int gm_policy_find(const char *name);
/* The name of policy `kind`, or NULL. */
GM_API const char *gm_policy_name(int kind);

/* ---- statistics -------------------------------------------------------- */

/* One counter, exactly like torch's Stat. */
typedef struct gm_stat {
    int64_t current, peak, allocated, freed;
} gm_stat;

enum { GM_POOL_ALL = 0, GM_POOL_SMALL = 1, GM_POOL_LARGE = 2, GM_POOL_COUNT = 3 };
#define GM_POOL_NAMES {"all", "small_pool", "large_pool"}

/* The single list of statistics; it generates the struct, the
 * torch.cuda.memory_stats() keys (gm_stats_to_json) and resets. Names are
 * torch's keys. What a process publishes to gpumem smi/top/log/exporter is
 * the subset in GM_MON_STATS (src/monitor/monitor.h), named by these keys.
 *   GM_STAT_ARRAYS:   gm_stat per pool   -> "<name>.<pool>.<current|peak|allocated|freed>"
 *   GM_STAT_SINGLES:  one gm_stat        -> "<name>.<current|peak|allocated|freed>"
 *   GM_STAT_COUNTERS: one int64_t        -> "<name>"                           */
#define GM_STAT_ARRAYS(X)                                                      \
    X(allocation) X(segment) X(active) X(inactive_split) X(allocated_bytes)    \
    X(reserved_bytes) X(active_bytes) X(inactive_split_bytes) X(requested_bytes)
#define GM_STAT_SINGLES(X) X(oversize_allocations) X(oversize_segments)
/* num_device_* count backend calls made for this device. The torch group
 * is in torch's DeviceStats too; the VMM group is gpumem's own.
 * num_stream_waits: times the host waited for a stream's queued work before
 * memory it had freed moved (policy:gpumem): the device calls above are the
 * driver's work, this is the GPU's lead given up. */
#define GM_STAT_TORCH_COUNTERS(X)                                              \
    X(num_alloc_retries) X(num_ooms) X(num_sync_all_streams)                   \
    X(num_device_alloc) X(num_device_free) X(max_split_size)
#define GM_STAT_VMM_COUNTERS(X)                                                \
    X(num_va_reserve) X(num_va_release) X(num_phys_create)                     \
    X(num_phys_release) X(num_map) X(num_unmap) X(num_stream_waits)
#define GM_STAT_COUNTERS(X) GM_STAT_TORCH_COUNTERS(X) GM_STAT_VMM_COUNTERS(X)

typedef struct gm_stats {
    uint32_t size; /* sizeof(gm_stats) */
#define GM__STAT_ARRAY_FIELD(n) gm_stat n[GM_POOL_COUNT];
#define GM__STAT_SINGLE_FIELD(n) gm_stat n;
#define GM__STAT_COUNTER_FIELD(n) int64_t n;
    GM_STAT_ARRAYS(GM__STAT_ARRAY_FIELD)
    GM_STAT_SINGLES(GM__STAT_SINGLE_FIELD)
    GM_STAT_COUNTERS(GM__STAT_COUNTER_FIELD)
#undef GM__STAT_ARRAY_FIELD
#undef GM__STAT_SINGLE_FIELD
#undef GM__STAT_COUNTER_FIELD
} gm_stats;

/* Write all stats as a flat JSON object with torch's memory_stats() keys. */
GM_API int gm_stats_to_json(const gm_stats *s, char *buf, size_t len);

/* ---- publishing another allocator's statistics ---------------------------
 * For a process that keeps PyTorch's own allocator (gpumem.publish_native,
 * `gpumem run --native`): a segment that gpumem smi/top/log/exporter read
 * like a gpumem allocator's, filled from torch.cuda.memory_stats() values.
 * gm_native_publisher_key(i) lists the memory_stats keys update() takes, in
 * order (NULL past the last): the binding reads them, never retypes them. */
typedef struct gm_native_publisher gm_native_publisher;
GM_API int gm_native_publisher_open(const char *label, gm_native_publisher **out);
GM_API const char *gm_native_publisher_key(int i);
GM_API int gm_native_publisher_update(gm_native_publisher *p, int device, const int64_t *values, int n);
/* A training step ended (the step record, as gm_step_mark publishes it):
 * allocated and reserved bytes now, the step's peak allocated bytes (-1 when
 * unknown). No block walk: the other allocator's blocks are not ours. */
GM_API int gm_native_publisher_step(gm_native_publisher *p, int device, int64_t allocated, int64_t reserved,
                                    int64_t step_peak);
GM_API void gm_native_publisher_close(gm_native_publisher *p);

/* ---- backends ---------------------------------------------------------- */

typedef struct gm_backend gm_backend; /* see gpumem/backend.h */

typedef struct gm_sim_options {
    uint32_t size;          /* sizeof(gm_sim_options) */
    int device_count;       /* default 1 */
    uint64_t capacity;      /* bytes per device; default 141 GiB */
    uint64_t granularity;   /* VMM granularity; default 2 MiB */
    bool events_manual;     /* events complete only under test control (default false: complete at once) */
} gm_sim_options;

GM_API void gm_sim_options_init(gm_sim_options *o);
/* A simulated device: deterministic fake addresses, capacity accounting,
 * VMM semantics checked like the driver's. */
GM_API int gm_sim_create(gm_backend **out, const gm_sim_options *opts);
/* Test control (sim only): complete every event recorded so far on `stream`
 * of `device` (stream == UINT64_MAX: every stream). */
GM_API int gm_sim_complete_events(gm_backend *b, int device, gm_stream stream);

/* Sim only: the next malloc of exactly `size` bytes on `device` gets
 * `addr` if that range is free (hints are taken oldest first, each once).
 * Replay feeds a trace's segment addresses so best-fit ties, which break
 * by address, go as they went on the real device. */
GM_API int gm_sim_add_address_hint(gm_backend *b, int device, uint64_t size, gm_devptr addr);

/* Sim only: successful calls of `kind` (GM_BCALL_MALLOC, _FREE, _PHYS_CREATE,
 * _PHYS_RELEASE, _MAP, _UNMAP; other kinds stay 0) on `device` so far, by
 * size: count[k] calls and bytes[k] bytes in all of sizes 2^k..2^(k+1)-1.
 * On a GPU a call's cost depends on its size (bench/vmm_cost.c). */
/* Sim only: what is alive on `device` right now. After gm_allocator_destroy
 * every count is 0 unless the backend kept failing cleanup calls, and then
 * each equals gm_backend_dropped_count of its kind (tests/stress/test_faults.c). */
typedef struct gm_sim_live {
    uint32_t size;         /* sizeof(gm_sim_live) */
    uint64_t allocations;  /* malloc'd ranges */
    uint64_t reservations; /* VA reservations */
    uint64_t phys;         /* physical handles */
    uint64_t mapped_pages; /* granules mapped */
    uint64_t events;
    uint64_t used_bytes;   /* capacity consumed */
} gm_sim_live;
GM_API int gm_sim_live_objects(gm_backend *b, int device, gm_sim_live *out);

#define GM_SIM_SIZE_BUCKETS 64
GM_API int gm_sim_call_sizes(gm_backend *b, int device, int kind, uint64_t count[GM_SIM_SIZE_BUCKETS],
                             uint64_t bytes[GM_SIM_SIZE_BUCKETS]);
/* Sim only: write / read n bytes of mapped memory at addr (contents the
 * simulator keeps for the memory it maps; never-written memory reads as
 * zeros). GM_EINVAL where a byte is not mapped. Tests of sleep and wake. */
GM_API int gm_sim_write(gm_backend *b, int device, gm_devptr addr, const void *src, uint64_t n);
GM_API int gm_sim_read(gm_backend *b, int device, gm_devptr addr, void *dst, uint64_t n);

/* The CUDA driver backend (libcuda.so.1 via dlopen). GM_ENODRIVER without it. */
GM_API int gm_cuda_create(gm_backend **out);

GM_API void gm_backend_destroy(gm_backend *b);
GM_API const char *gm_backend_name(const gm_backend *b);
GM_API int gm_backend_device_count(gm_backend *b, int *count);

/* Fault injection (any backend): counting from this call, the nth call
 * (1-based) of `kind` (a gm_bcall from gpumem/backend.h, or GM_BCALL_ANY)
 * fails with `status`. nth == 0 disarms. */
GM_API int gm_backend_inject_fault(gm_backend *b, int kind, uint64_t nth, int status);
/* Like gm_backend_inject_fault; flags GM_FAULT_PERSISTENT: the nth call and
 * every later call of `kind` fail until the fault is disarmed (nth == 0). */
#define GM_FAULT_PERSISTENT 1u
GM_API int gm_backend_inject_fault_ex(gm_backend *b, int kind, uint64_t nth, int status,
                                      unsigned flags);
/* Objects of `kind` (GM_BCALL_FREE, _VA_RELEASE, _PHYS_RELEASE, _UNMAP,
 * _EVENT_DESTROY, or GM_BCALL_ANY) on `dev` that the allocator could not give
 * back (the call failed twice, on a path that cannot report it: destroy,
 * rollback) and left to the backend. 0 unless the backend keeps failing. */
GM_API uint64_t gm_backend_dropped_count(const gm_backend *b, int dev, int kind);

/* ---- the allocator ----------------------------------------------------- */

typedef struct gm_allocator gm_allocator;

/* The allocator does not own the backend; destroy the allocator first.
 * cfg == NULL means defaults. */
GM_API int gm_allocator_create(gm_allocator **out, gm_backend *backend, const gm_config *cfg);
/* Returns all device memory to the backend and frees everything. */
GM_API void gm_allocator_destroy(gm_allocator *a);
GM_API const gm_config *gm_allocator_config(const gm_allocator *a);

/* size 0 sets *out = 0 and returns GM_OK, like torch.
 * On GM_ENOMEM, gm_last_error_detail() explains. */
GM_API int gm_malloc(gm_allocator *a, int device, size_t size, gm_stream stream, gm_devptr *out);
/* GM_EDOUBLEFREE / GM_EFOREIGN leave the allocator unchanged. */
GM_API int gm_free(gm_allocator *a, gm_devptr ptr);
/* Mark `ptr` as used on `stream`: its memory is not reused until the work
 * queued on `stream` at free time has completed. */
GM_API int gm_record_stream(gm_allocator *a, gm_devptr ptr, gm_stream stream);
/* Release cached, unused device memory. device -1 = every device. A
 * device where a capture is under way (gm_pool_begin) releases nothing. */
GM_API int gm_empty_cache(gm_allocator *a, int device);
/* The program finished one step of a repeating loop (e.g. after
 * optimizer.step()). With gpumem_plan:on the gpumem policy takes the marks
 * as step boundaries: once two marked steps made the same allocations, the
 * next ones are served from a plan. Other policies ignore it. A published
 * allocator also publishes the step record (step count, allocated and
 * reserved at the step's start, the step's peak; at most once a second the
 * largest free block and bytes by category: docs/monitoring.md, "Steps").
 * device -1 = every device. */
GM_API int gm_step_mark(gm_allocator *a, int device);
/* Like torch.cuda.set_per_process_memory_fraction. */
GM_API int gm_set_memory_fraction(gm_allocator *a, int device, double fraction);
/* Free and total bytes of the device as the backend reports them. */
GM_API int gm_mem_get_info(gm_allocator *a, int device, uint64_t *free_bytes, uint64_t *total_bytes);

GM_API int gm_get_stats(gm_allocator *a, int device, gm_stats *out);
GM_API int gm_reset_peak_stats(gm_allocator *a, int device);
GM_API int gm_reset_accumulated_stats(gm_allocator *a, int device);
/* torch.cuda.memory_summary() layout. abbreviated as torch's argument. */
GM_API int gm_memory_summary(gm_allocator *a, int device, bool abbreviated, char *buf, size_t len);

/* Verify every internal invariant of `device` (-1 = all): no overlapping live
 * blocks, reserved >= allocated >= requested, stats equal a recount of the
 * block lists. GM_OK or GM_ESTATE with the broken invariant in err. */
GM_API int gm_check(gm_allocator *a, int device, char *err, size_t errlen);

/* One segment as seen by a memory snapshot, as torch reports them: a device
 * allocation (policy:torch; policy:gpumem without VMM), or one contiguous
 * mapped run of an expandable range (expandable true: policy:gpumem's
 * arenas, torch's expandable segments; unmapped space is not reported). */
typedef struct gm_segment_info {
    uint32_t size_of; /* sizeof(gm_segment_info) */
    gm_devptr address;
    uint64_t total_size;     /* bytes of address range */
    uint64_t mapped_size;    /* bytes backed by device memory (== total_size unless VMM) */
    uint64_t allocated_size; /* bytes in live allocations */
    gm_stream stream;
    int pool; /* GM_POOL_SMALL / GM_POOL_LARGE */
    bool expandable;
    uint64_t pool_id[2]; /* the private pool holding it (torch's segment_pool_id), 0, 0: the device's own */
} gm_segment_info;
typedef int (*gm_segment_cb)(const gm_segment_info *seg, void *arg);
GM_API int gm_walk_segments(gm_allocator *a, int device, gm_segment_cb cb, void *arg);
/* What a live allocation holds (a gm_category: parameters, gradients, ...),
 * as gpumem.torch.track() knows it; an out-of-memory explanation then says
 * which categories hold the device and what each strategy would free.
 * GM_EFOREIGN if ptr is not a live allocation of a. */
GM_API int gm_block_set_category(gm_allocator *a, gm_devptr ptr, int category);

/* One block handed out by the allocator (torch's snapshot: a block in state
 * active_allocated, or active_pending_free while live is false: freed by the
 * caller but waiting for streams it was recorded on). */
typedef struct gm_block_info {
    uint32_t size_of;   /* sizeof(gm_block_info) */
    gm_devptr address;
    uint64_t size;      /* bytes set aside for it (torch: block->size) */
    uint64_t requested; /* bytes the caller asked for */
    gm_stream stream;   /* allocation stream */
    int pool;           /* GM_POOL_SMALL / GM_POOL_LARGE */
    bool live;
    int16_t category;   /* gm_category set by gm_block_set_category, -1 unknown (in what was padding) */
    uint64_t pool_id[2]; /* the private pool it came from, 0, 0: the device's own pools */
} gm_block_info;
typedef int (*gm_block_cb)(const gm_block_info *b, void *arg);
/* The live block that starts at ptr, and its device (device may be NULL).
 * GM_EFOREIGN if ptr is not the start of a live block. */
GM_API int gm_block_lookup(gm_allocator *a, gm_devptr ptr, int *device, gm_block_info *out);
/* Every block of `device` (-1 = all), in no particular order; cb runs under
 * the device lock and must not call the allocator; a nonzero return stops. */
GM_API int gm_walk_blocks(gm_allocator *a, int device, gm_block_cb cb, void *arg);

/* ---- private pools: CUDA graphs, torch.cuda.MemPool (src/core/mempool.c) --
 * A private pool is memory of its own on one device, named by a pool id
 * (torch's MempoolId_t, a pair of integers; (0, 0) names the device's own
 * pools and is refused): blocks placed in it come from its own segments and,
 * freed, are reused only by it. The device's statistics count every pool.
 *
 * retain creates the pool or adds a use (torch's createOrIncrefPool: a
 * MemPool, a graph sharing a pool); begin does the same and starts a
 * capture into it (beginAllocateToPool); end stops it; release drops a use:
 * when the last goes, the pool's cached memory is given back, and the pool
 * goes with its last block. While any pool of a device is between begin and
 * end, the device frees nothing and synchronises with no event (a CUDA
 * graph capture allows none of it): gm_empty_cache and gm_pool_empty_cache
 * then release nothing and return GM_OK, as torch's emptyCache does while
 * captures are under way.
 * gm_malloc_pool places an allocation in the pool (which must hold a use);
 * gm_free returns it to the pool it came from. Each call changes nothing
 * when it fails: an unknown pool is GM_EINVAL, a release with no use left,
 * a second begin or an end without begin GM_ESTATE. */
GM_API int gm_pool_retain(gm_allocator *a, int device, uint64_t id0, uint64_t id1);
GM_API int gm_pool_begin(gm_allocator *a, int device, uint64_t id0, uint64_t id1);
GM_API int gm_pool_end(gm_allocator *a, int device, uint64_t id0, uint64_t id1);
GM_API int gm_pool_release(gm_allocator *a, int device, uint64_t id0, uint64_t id1);
GM_API int gm_pool_use_count(gm_allocator *a, int device, uint64_t id0, uint64_t id1, int *out);
/* Give back the pool's cached memory (torch's emptyCache(mempool_id)); device
 * -1: on every device that has the pool (none: nothing to do). */
GM_API int gm_pool_empty_cache(gm_allocator *a, int device, uint64_t id0, uint64_t id1);
GM_API int gm_malloc_pool(gm_allocator *a, int device, size_t size, gm_stream stream, uint64_t id0, uint64_t id1,
                          gm_devptr *out);
/* Device calls attempted on `device` while a capture was under way there (a
 * private pool between gm_pool_begin and gm_pool_end), one counter per
 * gm_bcall kind (gpumem/backend.h), counted since the allocator was made:
 * `who` 0 the calls of the device's own pools, 1 those of private pools.
 * Copies up to n counters into out; returns GM_BCALL_COUNT, or an error.
 * A capture must make no FREE, UNMAP, PHYS_RELEASE, VA_RELEASE, EVENT_SYNC
 * or EVENT_QUERY (tests/gpu/test_graphs.py asserts it on the GPU). */
GM_API int gm_pool_capture_calls(gm_allocator *a, int device, int who, uint64_t *out, int n);
/* Checkpoints of a private pool (torch's getCheckpointState /
 * setCheckpointPoolState; CUDA graph trees restore one before recording a
 * graph that follows another). take records the pool's live blocks; while
 * a checkpoint holding a block is not freed, a free of that block keeps it
 * from reuse (allocated in the pool, not live). restore makes the pool's
 * live blocks exactly the checkpoint's: blocks live now and not in it are
 * freed (cb(ptr, size, false)), each block of it is reported freed and
 * allocated again if live (cb false, then true) or handed out again if
 * held (cb true); callbacks run under the device lock and must not call the
 * allocator. A checkpoint names the pool it was taken of, not only its id:
 * once that pool is gone (released, its last block freed), restoring the
 * checkpoint is GM_ESTATE and changes nothing, even if a new pool has the
 * id, and freeing it leaves the new pool alone. Free every checkpoint
 * before destroying the allocator. */
typedef struct gm_pool_checkpoint gm_pool_checkpoint;
typedef void (*gm_pool_restore_cb)(gm_devptr ptr, uint64_t size, bool allocated, void *arg);
GM_API int gm_pool_checkpoint_take(gm_allocator *a, int device, uint64_t id0, uint64_t id1,
                                   gm_pool_checkpoint **out);
GM_API int gm_pool_checkpoint_restore(gm_allocator *a, const gm_pool_checkpoint *c, gm_pool_restore_cb cb,
                                      void *arg);
GM_API void gm_pool_checkpoint_free(gm_allocator *a, gm_pool_checkpoint *c);

/* Options of a private pool (torch.cuda.MemPool(allocator=..., use_on_oom=...,
 * no_split=...)). use_on_oom: an allocation on the device's own pools that
 * runs out of memory is placed in this pool before it fails (torch's
 * use_on_oom). no_split: every allocation in the pool is a device allocation
 * of its own (torch's no_split; also what a pool served by another allocator
 * does under policy:gpumem). seg_alloc / seg_free: the pool's device memory
 * comes from another allocator (torch's MemPool(allocator=...), e.g. NCCL's
 * ncclMemAlloc) instead of the backend; gpumem places blocks in it and counts
 * it in the device's statistics as its own. They run under the device lock
 * and must not call gpumem; seg_alloc returns GM_ENOMEM when it has nothing.
 * Options that change how the pool gets memory (no_split, the allocator) are
 * taken only while the pool holds no memory (else GM_ESTATE); use_on_oom any
 * time. */
typedef int (*gm_seg_alloc_fn)(void *ctx, int device, uint64_t size, gm_stream stream, gm_devptr *out);
typedef void (*gm_seg_free_fn)(void *ctx, int device, gm_devptr ptr, uint64_t size);
typedef struct gm_pool_options {
    uint32_t size; /* sizeof(gm_pool_options) */
    bool use_on_oom;
    bool no_split;
    gm_seg_alloc_fn seg_alloc; /* NULL: the backend's memory */
    gm_seg_free_fn seg_free;
    void *seg_ctx;
} gm_pool_options;
GM_API int gm_pool_set_options(gm_allocator *a, int device, uint64_t id0, uint64_t id1, const gm_pool_options *o);

/* ---- sleep and wake (vLLM's sleep mode, RL weight swaps) -----------------
 * A tagged private pool can be put to sleep: the physical memory behind all
 * of its segments (live blocks and idle cache) is given back to the device
 * while every address stays reserved, and wake maps fresh memory at the same
 * addresses. With GM_SLEEP_OFFLOAD the live blocks' contents are copied to
 * host memory first (one page-locked buffer per pool where the backend has
 * it, else malloc'd) and back at wake (vLLM's sleep level 1); without it they
 * are lost (level 2, a KV cache). The caller synchronises the device first:
 * nothing may run on the pool's memory while it sleeps.
 *
 * gm_pool_set_tag names a private pool ("weights", "kv_cache"; at most
 * GM_TAG_MAX - 1 bytes). gm_allocator_sleep(tag) sleeps every pool with that
 * tag on `device` (-1: every device); tag NULL sleeps every tagged pool and
 * gives back the idle cache of the rest (gm_empty_cache). *released (may be
 * NULL) is the device memory given back. An unknown tag is GM_EINVAL; a pool
 * whose segments are not mapped memory (policy:torch without
 * expandable_segments, another allocator's pool) is GM_ENOTSUP, checked
 * before anything changes; during a capture GM_ESTATE. Sleeping a sleeping
 * pool, or waking an awake one, does nothing. While a pool sleeps an
 * allocation in it is GM_ESTATE (wake it first); a free is fine (its saved
 * contents are dropped); the device's own pools allocate as usual, on
 * fresh memory. Statistics keep counting a sleeping pool's memory as
 * reserved (its layout is unchanged); the device's free memory (and
 * nvidia-smi) shows it released. A wake that runs out of memory gives back
 * what it mapped and leaves the pool asleep (GM_ENOMEM). */
#define GM_TAG_MAX 32
#define GM_SLEEP_OFFLOAD 1u
GM_API int gm_pool_set_tag(gm_allocator *a, int device, uint64_t id0, uint64_t id1, const char *tag);
GM_API int gm_allocator_sleep(gm_allocator *a, int device, const char *tag, unsigned flags, uint64_t *released);
GM_API int gm_allocator_wake(gm_allocator *a, int device, const char *tag);

/* Change settings while the allocator runs (torch.cuda.memory.
 * _set_allocator_settings): `str` in PYTORCH_CUDA_ALLOC_CONF syntax, on top
 * of the settings in effect. Keys the policy reads on every call change at
 * once (roundup_power2_divisions, garbage_collection_threshold,
 * max_non_split_rounding, expandable_segments for new segments, the memory
 * fraction, the host-side keys); a key fixed when the allocator was made
 * (policy, backend, max_split_size_mb, gpumem_*) is GM_ECONFIG naming it, as
 * is a key gm_config_parse refuses. Nothing of the string applies then. */
GM_API int gm_allocator_set_settings(gm_allocator *a, const char *str);

/* ---- publication for out-of-process monitors --------------------------- */

/* Publish this allocator's per-device stats in a POSIX shared-memory
 * segment (owner-only) that `gpumem smi/top/log/exporter` read. `label`
 * names the process in those views (NULL: the command name). Also enabled at
 * creation when the environment variable GPUMEM_PUBLISH=1 is set. */
GM_API int gm_allocator_publish(gm_allocator *a, const char *label);
/* Stops publishing. Safe while other threads allocate; not while one is
 * inside gm_step_mark (which publishes the step record, then walks the
 * blocks with no lock held). */
GM_API void gm_allocator_unpublish(gm_allocator *a);

/* ---- scopes, categories and allocation history (src/core/scope.c) ------- */

/* Memory categories of `gpumem report` and history tags, in the report's
 * stacking order. */
#define GM_CATEGORY_LIST(X)                                                    \
    X(PARAMETERS, "parameters") X(GRADIENTS, "gradients")                      \
    X(OPTIMIZER, "optimizer_state") X(ACTIVATIONS, "activations")              \
    X(TEMPORARIES, "temporaries") X(OTHER, "other")
typedef enum gm_category {
#define GM__CATEGORY_ENUM(n, s) GM_CAT_##n,
    GM_CATEGORY_LIST(GM__CATEGORY_ENUM)
#undef GM__CATEGORY_ENUM
    GM_CAT_COUNT
} gm_category;
GM_API const char *gm_category_name(int category); /* "?" if out of range */
GM_API int gm_category_from_name(const char *name); /* -1 if none */

/* Named scopes, per thread and nested (a module's forward, a user region):
 * allocations recorded in the history carry the calling thread's scope
 * path. name is copied. GM_EINVAL past GM_SCOPE_MAX_DEPTH or for an empty
 * name; pop without a push is GM_ESTATE. */
#define GM_SCOPE_MAX_DEPTH 256
GM_API int gm_scope_push(const char *name);
GM_API int gm_scope_pop(void);
GM_API int gm_scope_depth(void);
GM_API const char *gm_scope_current(void); /* innermost name, NULL outside any */
/* The scope of threads that have none open (name NULL: none), for work a
 * library runs on its own threads, e.g. autograd's backward. */
GM_API int gm_scope_set_global(const char *name);

/* The allocation history: one process-wide bounded ring of alloc / free /
 * segment / oom events of every allocator (time, device, size, stream,
 * scope, category), like torch.cuda.memory._record_memory_history.
 * enable(n > 0) starts recording into a fresh ring of n entries (the oldest
 * are dropped first once full); enable(0) stops recording and keeps what
 * was recorded for dumping. Off, an allocator operation pays one
 * predictable branch. */
GM_API int gm_history_enable(size_t max_entries);
GM_API bool gm_history_enabled(void);
/* Entries recorded since enable, held now, and dropped (oldest first). */
GM_API void gm_history_counts(uint64_t *recorded, uint64_t *held, uint64_t *dropped);
/* Category of the live allocation at ptr (gradients, optimizer state...),
 * recorded in the ring and applied to that allocation when dumped. */
GM_API int gm_history_tag(gm_devptr ptr, int category);
enum { GM_HISTORY_GMT = 0, GM_HISTORY_TORCH = 1 };
/* Write the ring as a gpumem trace (.gmt) or a torch memory snapshot pickle
 * (gzip'd if path ends in .gz) that `gpumem report/replay` and PyTorch's
 * memory viz read. Scopes become frames {name, "<gpumem scope>"}, tags
 * frames {category, "<gpumem category>"}. */
GM_API int gm_history_dump(const char *path, int format);
/* Dump to path automatically when an allocation runs out of memory (NULL:
 * stop doing so). */
GM_API int gm_history_dump_on_oom(const char *path, int format);

/* Segment events, as torch's trace names them: device memory allocated or
 * freed as a whole segment (segment_alloc / segment_free: policy:torch
 * without expandable segments, or no VMM), or mapped into / unmapped from a
 * reserved address range (segment_map / segment_unmap: policy:gpumem, or
 * expandable segments). Sizes add up to the change in reserved bytes. */
enum { GM_SEGMENT_ALLOC = 0, GM_SEGMENT_FREE = 1, GM_SEGMENT_MAP = 2, GM_SEGMENT_UNMAP = 3 };
typedef void (*gm_segment_observer)(int device, int event, gm_devptr address, uint64_t size,
                                    void *arg);
/* One process-wide observer of segment events of every allocator (NULL:
 * none; the previous one is replaced). It is called on the thread that made
 * the device call, right after the call succeeds, WITH THAT DEVICE'S LOCK
 * HELD: it must not call into gpumem, and should do no more than append to a
 * buffer (a mutex of its own is fine if it never calls gpumem while holding
 * it). Unset, a device call pays one relaxed load and a predictable branch.
 * An observer may still be running when it is replaced, so each (cb, arg)
 * set is kept for the life of the process (a few bytes a call). */
GM_API int gm_set_segment_observer(gm_segment_observer cb, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* GPUMEM_GPUMEM_H */
