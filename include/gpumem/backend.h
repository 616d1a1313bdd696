/* backend.h — the device backend interface: one versioned table of function
 * pointers. The core calls it only through src/backend/backend.c, which
 * counts calls per device and kind and injects faults.
 *
 * Fields are only ever appended; `version` and `size` tell the core which
 * fields a backend has. Optional entries may be NULL (then GM_ENOTSUP). */
#ifndef GPUMEM_BACKEND_H
#define GPUMEM_BACKEND_H

#include "gpumem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GM_BACKEND_VERSION 1

/* Kinds of backend call, for counting and fault injection. */
#define GM_BCALL_LIST(X)                                                       \
    X(MALLOC) X(FREE) X(MEM_INFO) X(VA_RESERVE) X(VA_RELEASE) X(PHYS_CREATE)   \
    X(PHYS_RELEASE) X(MAP) X(UNMAP) X(EVENT_RECORD) X(EVENT_QUERY)             \
    X(EVENT_SYNC) X(EVENT_DESTROY) X(HOST_ALLOC)

typedef enum gm_bcall {
#define GM__BCALL_ENUM(n) GM_BCALL_##n,
    GM_BCALL_LIST(GM__BCALL_ENUM)
#undef GM__BCALL_ENUM
    GM_BCALL_COUNT,
    GM_BCALL_ANY = 1000,
} gm_bcall;

GM_API const char *gm_bcall_name(int kind); /* "MALLOC", ... */

/* One copy of copy_many: `size` bytes between device address `dev` and host
 * memory `host`. */
typedef struct gm_backend_copy {
    gm_devptr dev;
    void *host;
    uint64_t size;
} gm_backend_copy;

typedef struct gm_backend_ops {
    uint32_t version; /* GM_BACKEND_VERSION */
    uint32_t size;    /* sizeof(gm_backend_ops) */
    const char *name; /* "sim", "cuda" */

    void (*destroy)(void *ctx);
    int (*device_count)(void *ctx, int *count);
    /* free/total bytes of the device */
    int (*mem_info)(void *ctx, int dev, uint64_t *free_bytes, uint64_t *total_bytes);

    /* plain device allocations (cudaMalloc / cuMemAlloc). Out of memory must
     * return GM_ENOMEM so the allocator can free its cache and retry. */
    int (*malloc)(void *ctx, int dev, uint64_t size, gm_devptr *out);
    int (*free)(void *ctx, int dev, gm_devptr ptr);

    /* optional: virtual memory management. granularity: bytes that sizes and
     * addresses must be multiples of. map maps a whole physical handle at
     * va (offset 0, as the driver requires) and makes it read/write for dev. */
    int (*granularity)(void *ctx, int dev, uint64_t *bytes);
    int (*va_reserve)(void *ctx, int dev, uint64_t size, gm_devptr *out);
    int (*va_release)(void *ctx, int dev, gm_devptr va, uint64_t size);
    int (*phys_create)(void *ctx, int dev, uint64_t size, gm_physmem *out);
    int (*phys_release)(void *ctx, int dev, gm_physmem h);
    int (*map)(void *ctx, int dev, gm_devptr va, uint64_t size, gm_physmem h);
    int (*unmap)(void *ctx, int dev, gm_devptr va, uint64_t size);

    /* events: record creates (or reuses) an event and records it on stream;
     * query sets *done; sync waits for it; destroy releases it. */
    int (*event_record)(void *ctx, int dev, gm_stream stream, gm_event *out);
    int (*event_query)(void *ctx, int dev, gm_event ev, bool *done);
    int (*event_sync)(void *ctx, int dev, gm_event ev);
    int (*event_destroy)(void *ctx, int dev, gm_event ev);

    /* optional (appended): synchronous copies between device memory and host
     * memory, for gm_allocator_sleep's offload. Not counted kinds. */
    int (*copy_to_host)(void *ctx, int dev, void *dst, gm_devptr src, uint64_t size);
    int (*copy_to_device)(void *ctx, int dev, gm_devptr dst, const void *src, uint64_t size);

    /* optional (appended): page-locked host memory (cuMemHostAlloc), where
     * offload keeps what it saved so copies run at the link's speed; the core
     * falls back to malloc when it is NULL or fails. host_alloc is counted
     * (HOST_ALLOC); host_free gives back what host_alloc made. */
    int (*host_alloc)(void *ctx, int dev, uint64_t size, void **out);
    int (*host_free)(void *ctx, int dev, void *ptr);
    /* optional (appended): n copies in one direction (to_device true: host to
     * device), queued together and waited for once. When it returns, failed
     * or not, no copy is still running. NULL or GM_ENOTSUP: the core calls
     * copy_to_host / copy_to_device once per copy. Not a counted kind. */
    int (*copy_many)(void *ctx, int dev, bool to_device, const gm_backend_copy *v, size_t n);
} gm_backend_ops;


/* Wrap a table and its context into a backend object (takes ownership of
 * ctx: ops->destroy(ctx) runs in gm_backend_destroy). */
GM_API int gm_backend_create(gm_backend **out, const gm_backend_ops *ops, void *ctx);
/* Number of calls of `kind` made for `dev` so far (successful or not). */
GM_API uint64_t gm_backend_call_count(const gm_backend *b, int dev, int kind);
/* Wall time spent inside the backend's op for calls of `kind` on device dev
 * (or GM_BCALL_ANY), in nanoseconds, summed since the backend was created:
 * where a first pass's time goes (a create, a map with its access setting). */
GM_API uint64_t gm_backend_call_ns(const gm_backend *b, int dev, int kind);

#ifdef __cplusplus
}
#endif
#endif /* GPUMEM_BACKEND_H */
