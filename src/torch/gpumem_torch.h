/* gpumem_torch.h — the C side of libgpumem_torch.so: one process-wide
 * allocator behind PyTorch's CUDAPluggableAllocator entry points
 * (gpumem_alloc / gpumem_free in gpumem_torch_entry.cpp) and the functions
 * python/gpumem calls through ctypes. Every function returns a gm_status;
 * gpumem_torch_last_error() gives the calling thread's message. */
#ifndef GPUMEM_TORCH_H
#define GPUMEM_TORCH_H

#include <stddef.h>
#include <stdint.h>

#include "gpumem/gpumem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GPUMEM_TORCH_API __attribute__((visibility("default")))

/* Every entry point python/gpumem calls through ctypes, written once:
 * X(return type, name, parameters, ctypes signature). The declarations below
 * and the signature table the library exports (gpumem_torch_signatures, which
 * python/gpumem/_lib.py reads to set argtypes) are made from it. Signature:
 * the return, ':', then one letter per parameter: i int, q int64_t,
 * Q uint64_t, d double, z size_t, s a string or char buffer, p a pointer or
 * function, I int *, U uint64_t *; v (return only) void. */
#define GPUMEM_TORCH_CTYPES_ENTRY_POINTS(X)                                                               \
    /* Settings for the allocator created on first use: conf in                                         \
     * PYTORCH_CUDA_ALLOC_CONF syntax plus policy:torch|gpumem (NULL: env                               \
     * GPUMEM_CONF), backend "cuda" (default) or "sim" (tests without a GPU).                           \
     * GM_ESTATE once the allocator exists; GM_ECONFIG if conf does not parse                           \
     * (checked now, so the error reaches the caller instead of the first alloc). */                   \
    X(int, gpumem_torch_configure, (const char *conf, const char *backend), "i:ss")                     \
    /* Create the allocator now (normally done by the first allocation). */                             \
    X(int, gpumem_torch_init, (void), "i:")                                                             \
    X(int, gpumem_torch_is_initialized, (void), "i:")                                                   \
    /* Destroy the allocator and backend (tests only: every pointer dies). */                           \
    X(void, gpumem_torch_shutdown, (void), "v:")                                                        \
    X(int, gpumem_torch_alloc_raw, (int64_t size, int device, uint64_t stream, uint64_t *out), "i:qiQU") \
    X(int, gpumem_torch_free_raw, (uint64_t ptr), "i:Q")                                                \
    /* Private pools (CUDA graphs, torch.cuda.MemPool; gm_pool_* in gpumem.h): an                     \
     * allocation into pool (id0, id1), torch's MempoolId_t; create-or-add-a-use                        \
     * (createOrIncrefPool); begin / end allocating into it (beginAllocateToPool:                       \
     * also adds a use); drop a use (releasePool); its use count; its cache back. */                    \
    X(int, gpumem_torch_alloc_pool, (int64_t size, int device, uint64_t stream, uint64_t id0, uint64_t id1, \
                                     uint64_t *out), "i:qiQQQU")                                          \
    X(int, gpumem_torch_pool_retain, (int device, uint64_t id0, uint64_t id1), "i:iQQ")                 \
    X(int, gpumem_torch_pool_begin, (int device, uint64_t id0, uint64_t id1), "i:iQQ")                  \
    X(int, gpumem_torch_pool_end, (int device, uint64_t id0, uint64_t id1), "i:iQQ")                    \
    X(int, gpumem_torch_pool_release, (int device, uint64_t id0, uint64_t id1), "i:iQQ")                \
    X(int, gpumem_torch_pool_use_count, (int device, uint64_t id0, uint64_t id1, int *out), "i:iQQI")   \
    X(int, gpumem_torch_pool_empty_cache, (int device, uint64_t id0, uint64_t id1), "i:iQQ")            \
    /* gm_pool_checkpoint_take / _restore / _free (torch's getCheckpointState,                          \
     * setCheckpointPoolState: CUDA graph trees); free after shutdown frees only the handle. */          \
    X(int, gpumem_torch_pool_checkpoint, (int device, uint64_t id0, uint64_t id1,                       \
                                          gm_pool_checkpoint **out), "i:iQQp")                          \
    X(int, gpumem_torch_pool_restore, (gm_pool_checkpoint *c, gm_pool_restore_cb cb, void *arg), "i:ppp") \
    X(void, gpumem_torch_pool_checkpoint_free, (gm_pool_checkpoint *c), "v:p")                          \
    /* Sleep and wake (gm_allocator_sleep / _wake): name a private pool; sleep                         \
     * the pools tagged tag (NULL: every tagged pool, and the idle cache of the                         \
     * rest) on device (-1 every device), saving contents to host when offload;                         \
     * *released: bytes given back. */                                                                   \
    X(int, gpumem_torch_pool_set_tag, (int device, uint64_t id0, uint64_t id1, const char *tag), "i:iQQs") \
    X(int, gpumem_torch_sleep, (int device, const char *tag, int offload, uint64_t *released), "i:isiU") \
    X(int, gpumem_torch_wake, (int device, const char *tag), "i:is")                                    \
    /* torch.cuda.memory._set_allocator_settings: settings changed while the                             \
     * process runs (gm_allocator_set_settings; before the allocator exists, on                          \
     * top of the configured settings, every key). */                                                    \
    X(int, gpumem_torch_set_settings, (const char *conf), "i:s")                                        \
    X(int, gpumem_torch_record_stream, (uint64_t ptr, uint64_t stream), "i:QQ")                         \
    X(int, gpumem_torch_empty_cache, (int device), "i:i")                                               \
    /* gm_step_mark: one step of the training loop ended (gpumem_plan:on). */                           \
    X(int, gpumem_torch_step_mark, (int device), "i:i")                                                 \
    /* Record what the allocation at ptr holds (a gm_category): in its block, for                       \
     * the OOM explanation, and in the history, for the report. */                                      \
    X(int, gpumem_torch_tag, (uint64_t ptr, int category), "i:Qi")                                      \
    X(int, gpumem_torch_set_memory_fraction, (double fraction, int device), "i:di")                     \
    X(int, gpumem_torch_mem_get_info, (int device, uint64_t *free_bytes, uint64_t *total_bytes), "i:iUU") \
    X(int, gpumem_torch_device_count, (int *count), "i:I")                                              \
    X(int, gpumem_torch_stats_json, (int device, char *buf, size_t len), "i:isz")                       \
    X(int, gpumem_torch_reset_peak, (int device), "i:i")                                                \
    X(int, gpumem_torch_reset_accumulated, (int device), "i:i")                                         \
    X(int, gpumem_torch_summary, (int device, int abbreviated, char *buf, size_t len), "i:iisz")        \
    X(int, gpumem_torch_check, (int device, char *buf, size_t len), "i:isz")                            \
    /* "" after success; "gpumem: ..." after a failure on this thread. */                               \
    X(const char *, gpumem_torch_last_error, (void), "s:")                                              \
    /* Frees that failed inside gpumem_free (which must not throw). */                                  \
    X(uint64_t, gpumem_torch_failed_frees, (void), "Q:")                                                \
    /* GPUMEM_PROFILE=1 in the environment (read when the library loads) or                             \
     * profile_enable(1): count alloc_raw/free_raw calls (the pluggable entry                           \
     * points) and the CLOCK_MONOTONIC time spent inside them. profile() copies up                      \
     * to n of the GPUMEM_TORCH_PROFILE_FIELDS counters into out and returns that                       \
     * number: alloc calls, alloc ns, alloc max ns, alloc calls >= 10 us, then the                      \
     * same four for free. Off: one branch per call, nothing counted.                                   \
     * profile_enable returns the previous setting. */                                                   \
    X(int, gpumem_torch_profile_enable, (int on), "i:i")                                                \
    X(void, gpumem_torch_profile_reset, (void), "v:")                                                   \
    X(int, gpumem_torch_profile, (uint64_t *out, int n), "i:Ui")                                        \
    /* Device (backend) calls made so far for device, one counter per gm_bcall                          \
     * kind (MALLOC, FREE, MEM_INFO, VA_RESERVE, ..., EVENT_DESTROY, HOST_ALLOC, see                    \
     * gpumem/backend.h): copies up to n, returns GM_BCALL_COUNT or an error. */                        \
    X(int, gpumem_torch_backend_calls, (int device, uint64_t *out, int n), "i:iUi")                     \
    /* The same kinds, the wall time spent inside each (ns, gm_backend_call_ns):                        \
     * a sync's wait for the GPU apart from the driver's map and unmap calls. */                        \
    X(int, gpumem_torch_backend_ns, (int device, uint64_t *out, int n), "i:iUi")                        \
    /* The same, counting only calls made while a capture was under way on the                         \
     * device (gm_pool_capture_calls): who 0 the device's own pools, 1 private pools. */               \
    X(int, gpumem_torch_capture_calls, (int device, int who, uint64_t *out, int n), "i:iiUi")          \
    /* GM_MAX_DEVICES: devices one process publishes (python/gpumem/publish_native.py). */             \
    X(int, gpumem_torch_max_devices, (void), "i:")

#define GPUMEM_TORCH__DECLARE(ret, name, params, sig) GPUMEM_TORCH_API ret name params;
GPUMEM_TORCH_CTYPES_ENTRY_POINTS(GPUMEM_TORCH__DECLARE)
#undef GPUMEM_TORCH__DECLARE

/* The public gm_* functions (gpumem.h) python/gpumem calls through ctypes,
 * with their signatures (letters as above; b bool). */
#define GPUMEM_TORCH_CTYPES_GM_FUNCTIONS(X)                                    \
    X(gm_status_name, "s:i")                                                   \
    X(gm_bcall_name, "s:i")                                                    \
    X(gm_last_error_detail, "s:")                                              \
    X(gm_scope_push, "i:s")                                                    \
    X(gm_scope_pop, "i:")                                                      \
    X(gm_scope_depth, "i:")                                                    \
    X(gm_scope_current, "s:")                                                  \
    X(gm_scope_set_global, "i:s")                                              \
    X(gm_history_enable, "i:z")                                                \
    X(gm_history_enabled, "b:")                                                \
    X(gm_history_counts, "v:UUU")                                              \
    X(gm_history_tag, "i:Qi")                                                  \
    X(gm_history_dump, "i:si")                                                 \
    X(gm_history_dump_on_oom, "i:si")

/* "name=signature" of every function of both lists, one a line:
 * python/gpumem/_lib.py sets its ctypes argtypes from it. */
GPUMEM_TORCH_API const char *gpumem_torch_signatures(void);

#define GPUMEM_TORCH_PROFILE_FIELDS 8

/* For the C++ shim (python/csrc/gpumem_shim.cpp), which resolves these with
 * dlsym from the same library the ctypes side loaded, so both see one
 * allocator: stats as a struct, one live block by address, every segment and
 * block of a device (callbacks run under the device lock and must not call
 * back), the settings in effect, and the failed-free counter. */
GPUMEM_TORCH_API int gpumem_torch_get_stats(int device, gm_stats *out);
GPUMEM_TORCH_API int gpumem_torch_block(uint64_t ptr, int *device, gm_block_info *out);
GPUMEM_TORCH_API int gpumem_torch_walk_segments(int device, gm_segment_cb cb, void *arg);
GPUMEM_TORCH_API int gpumem_torch_walk_blocks(int device, gm_block_cb cb, void *arg);
GPUMEM_TORCH_API int gpumem_torch_config(gm_config *out, char *conf_str, size_t len);
GPUMEM_TORCH_API void gpumem_torch_note_failed_free(void);
/* gm_pool_set_options for torch.cuda.MemPool(allocator=..., use_on_oom=...,
 * no_split=...): the shim passes the other allocator's calls. */
GPUMEM_TORCH_API int gpumem_torch_pool_set_options(int device, uint64_t id0, uint64_t id1, const gm_pool_options *o);
/* gm_set_segment_observer: segment_alloc/free/map/unmap as they happen, for
 * the shim's torch-format trace. The callback runs under the device lock:
 * append to a buffer, never call back into gpumem. */
GPUMEM_TORCH_API int gpumem_torch_set_segment_observer(gm_segment_observer cb, void *arg);

void gpumem__torch_note_failed_free(void);

#ifdef __cplusplus
}
#endif
#endif /* GPUMEM_TORCH_H */
