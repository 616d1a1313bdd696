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

/* Settings for the allocator created on first use: conf in
 * PYTORCH_CUDA_ALLOC_CONF syntax plus policy:torch|gpumem (NULL: env
 * GPUMEM_CONF), backend "cuda" (default) or "sim" (tests without a GPU).
 * GM_ESTATE once the allocator exists; GM_ECONFIG if conf does not parse
 * (checked now, so the error reaches the caller instead of the first alloc). */
GPUMEM_TORCH_API int gpumem_torch_configure(const char *conf, const char *backend);
/* Create the allocator now (normally done by the first allocation). */
GPUMEM_TORCH_API int gpumem_torch_init(void);
GPUMEM_TORCH_API int gpumem_torch_is_initialized(void);
/* Destroy the allocator and backend (tests only: every pointer dies). */
GPUMEM_TORCH_API void gpumem_torch_shutdown(void);

GPUMEM_TORCH_API int gpumem_torch_alloc_raw(int64_t size, int device, uint64_t stream, uint64_t *out);
GPUMEM_TORCH_API int gpumem_torch_free_raw(uint64_t ptr);
GPUMEM_TORCH_API int gpumem_torch_record_stream(uint64_t ptr, uint64_t stream);
GPUMEM_TORCH_API int gpumem_torch_empty_cache(int device);
/* gm_step_mark: one step of the training loop ended (gpumem_plan:on). */
GPUMEM_TORCH_API int gpumem_torch_step_mark(int device);
/* Record what the allocation at ptr holds (a gm_category): in its block, for
 * the OOM explanation, and in the history, for the report. */
GPUMEM_TORCH_API int gpumem_torch_tag(uint64_t ptr, int category);
GPUMEM_TORCH_API int gpumem_torch_set_memory_fraction(double fraction, int device);
GPUMEM_TORCH_API int gpumem_torch_mem_get_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);
GPUMEM_TORCH_API int gpumem_torch_device_count(int *count);
GPUMEM_TORCH_API int gpumem_torch_stats_json(int device, char *buf, size_t len);
GPUMEM_TORCH_API int gpumem_torch_reset_peak(int device);
GPUMEM_TORCH_API int gpumem_torch_reset_accumulated(int device);
GPUMEM_TORCH_API int gpumem_torch_summary(int device, int abbreviated, char *buf, size_t len);
GPUMEM_TORCH_API int gpumem_torch_check(int device, char *buf, size_t len);
/* "" after success; "gpumem: ..." after a failure on this thread. */
GPUMEM_TORCH_API const char *gpumem_torch_last_error(void);
/* Frees that failed inside gpumem_free (which must not throw). */
GPUMEM_TORCH_API uint64_t gpumem_torch_failed_frees(void);

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
/* gm_set_segment_observer: segment_alloc/free/map/unmap as they happen, for
 * the shim's torch-format trace. The callback runs under the device lock:
 * append to a buffer, never call back into gpumem. */
GPUMEM_TORCH_API int gpumem_torch_set_segment_observer(gm_segment_observer cb, void *arg);

/* GPUMEM_PROFILE=1 in the environment (read when the library loads) or
 * profile_enable(1): count alloc_raw/free_raw calls (the pluggable entry
 * points) and the CLOCK_MONOTONIC time spent inside them. profile() copies up
 * to n of the GPUMEM_TORCH_PROFILE_FIELDS counters into out and returns that
 * number: alloc calls, alloc ns, alloc max ns, alloc calls >= 10 us, then the
 * same four for free. Off: one branch per call, nothing counted.
 * profile_enable returns the previous setting. */
#define GPUMEM_TORCH_PROFILE_FIELDS 8
GPUMEM_TORCH_API int gpumem_torch_profile_enable(int on);
GPUMEM_TORCH_API void gpumem_torch_profile_reset(void);
GPUMEM_TORCH_API int gpumem_torch_profile(uint64_t *out, int n);
/* Device (backend) calls made so far for device, one counter per gm_bcall
 * kind (MALLOC, FREE, MEM_INFO, VA_RESERVE, ..., EVENT_DESTROY, see
 * gpumem/backend.h): copies up to n, returns GM_BCALL_COUNT or an error. */
GPUMEM_TORCH_API int gpumem_torch_backend_calls(int device, uint64_t *out, int n);

/* A function that throws torch's c10::OutOfMemoryError with msg (built
 * against torch's headers, see src/torch/ext/); NULL: std::runtime_error. */
typedef void (*gpumem_oom_thrower)(const char *msg);
GPUMEM_TORCH_API void gpumem_torch_set_oom_thrower(gpumem_oom_thrower fn);
gpumem_oom_thrower gpumem__torch_oom_thrower(void);
void gpumem__torch_note_failed_free(void);

#ifdef __cplusplus
}
#endif
#endif /* GPUMEM_TORCH_H */
