/* cuda_driver.h — the slice of the CUDA driver API that the cuda backend
 * uses, declared by hand (no CUDA headers at build time), and the table of
 * function pointers it calls them through. The table is filled by dlsym on
 * libcuda.so.1, or by a test with fakes (tests/unit/test_cuda_backend.c).
 * Private to src/backend/cuda.c and its test; not installed. */
#ifndef GPUMEM_CUDA_DRIVER_H
#define GPUMEM_CUDA_DRIVER_H

#include "gpumem/backend.h"

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

/* Values from cuda.h (stable across CUDA 11-13). */
enum {
    GM__CUDA_SUCCESS = 0,
    GM__CUDA_ERROR_INVALID_VALUE = 1,
    GM__CUDA_ERROR_OUT_OF_MEMORY = 2,
    GM__CUDA_ERROR_NOT_INITIALIZED = 3,
    GM__CUDA_ERROR_DEINITIALIZED = 4,
    GM__CUDA_ERROR_NO_DEVICE = 100,
    GM__CUDA_ERROR_INVALID_CONTEXT = 201,
    GM__CUDA_ERROR_NOT_READY = 600,
};
#define GM__CU_EVENT_DISABLE_TIMING 0x2
#define GM__CU_MEMHOSTALLOC_PORTABLE 0x1
#define GM__CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define GM__CU_MEM_HANDLE_TYPE_NONE 0x0
#define GM__CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define GM__CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define GM__CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define GM__CU_DEVICE_ATTRIBUTE_VMM_SUPPORTED 102
#define GM__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED 116
#define GM__CU_STREAM_CAPTURE_MODE_RELAXED 2 /* CUstreamCaptureMode: GLOBAL 0, THREAD_LOCAL 1 */

/* Same layout as cuda.h's CUmemLocation / CUmemAllocationProp / CUmemAccessDesc. */
typedef struct gm__cu_mem_location {
    int type;
    int id;
} gm__cu_mem_location;
typedef struct gm__cu_alloc_prop {
    int type;
    int requested_handle_types;
    gm__cu_mem_location location;
    void *win32_handle_meta_data;
    struct {
        unsigned char compression_type;
        unsigned char gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } alloc_flags;
} gm__cu_alloc_prop;
typedef struct gm__cu_access_desc {
    gm__cu_mem_location location;
    int flags;
} gm__cu_access_desc;

/* One pointer per driver entry point; the symbol names (with _v2 where the
 * unsuffixed export is the legacy 32-bit variant) are in cuda.c. Entries
 * marked optional may be NULL. */
typedef struct gm__cuda_driver {
    CUresult (*cuInit)(unsigned flags);
    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*cuDeviceGetAttribute)(int *value, int attrib, CUdevice dev); /* optional */
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuMemAlloc)(CUdeviceptr *p, size_t size);
    CUresult (*cuMemFree)(CUdeviceptr p);
    CUresult (*cuMemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    /* VMM: all optional (all or none) */
    CUresult (*cuMemGetAllocationGranularity)(size_t *g, const gm__cu_alloc_prop *prop, int option);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags);
    CUresult (*cuMemAddressFree)(CUdeviceptr p, size_t size);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *h, size_t size, const gm__cu_alloc_prop *prop,
                            unsigned long long flags);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle h);
    CUresult (*cuMemMap)(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags);
    CUresult (*cuMemUnmap)(CUdeviceptr p, size_t size);
    CUresult (*cuMemSetAccess)(CUdeviceptr p, size_t size, const gm__cu_access_desc *desc, size_t count);
    /* events */
    CUresult (*cuEventCreate)(CUevent *ev, unsigned flags);
    CUresult (*cuEventRecord)(CUevent ev, CUstream stream);
    CUresult (*cuEventQuery)(CUevent ev);
    CUresult (*cuEventSynchronize)(CUevent ev);
    CUresult (*cuEventDestroy)(CUevent ev);
    /* optional: synchronous copies (gm_allocator_sleep's offload) */
    CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n);
    /* optional: page-locked host memory and queued copies on the legacy
     * default stream, waited for once (offload at the link's speed) */
    CUresult (*cuMemHostAlloc)(void **p, size_t size, unsigned flags);
    CUresult (*cuMemFreeHost)(void *p);
    CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream stream);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t n, CUstream stream);
    CUresult (*cuStreamSynchronize)(CUstream stream);
    /* optional: the calling thread's stream capture mode, swapped (CUDA 10.1+) */
    CUresult (*cuThreadExchangeStreamCaptureMode)(int *mode);
    /* messages: optional */
    CUresult (*cuGetErrorName)(CUresult r, const char **name);
    CUresult (*cuGetErrorString)(CUresult r, const char **msg);
} gm__cuda_driver;

/* Build the backend context over `drv` (copied): cuInit, device count.
 * On success *ops is the cuda ops table and *ctx must be released with
 * (*ops)->destroy(*ctx) (or handed to gm_backend_create). `dl` is the
 * dlopen handle to close at destroy, or NULL. */
int gm__cuda_open(const gm__cuda_driver *drv, void *dl, const gm_backend_ops **ops, void **ctx);

/* gm_cuda_create over a given driver table (tests). */
int gm__cuda_create_with_driver(gm_backend **out, const gm__cuda_driver *drv);

/* How many events sit in device `dev`'s reuse pool (tests). */
size_t gm__cuda_event_pool_size(void *ctx, int dev);

#endif /* GPUMEM_CUDA_DRIVER_H */
