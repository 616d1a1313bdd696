/* cuda.c — the `cuda` device backend: the CUDA driver API loaded at run time
 * with dlopen("libcuda.so.1"), so libgpumem never links against the driver
 * and loads fine on machines without a GPU (gm_cuda_create then returns
 * GM_ENODRIVER with a message saying so).
 *
 * Every call runs in the device's primary context, the one PyTorch's runtime
 * uses. PyTorch calls the allocator from threads that have no current context
 * (cuMemAlloc then fails with CUDA_ERROR_INVALID_CONTEXT), and from threads
 * whose current device differs from the one allocated on, so each call makes
 * the primary context current if it is not, and puts the previous one back
 * afterwards: the caller's notion of "current device" never changes under it.
 *
 * Events are created with timing disabled (cheaper to record and query) and
 * pooled per device: record_stream and cross-stream frees record one per
 * free, and cuEventCreate/Destroy on every free would dominate the hot path.
 *
 * The backend does not order unmaps after GPU work itself: the core records an
 * event on the block's stream at free time and waits on that event (never a
 * device-wide sync) before calling unmap / free.
 *
 * Thread safety: the driver is thread-safe; the per-device lazy set-up and
 * the event pool are guarded by a per-device mutex. */
#define _GNU_SOURCE
#include "cuda_driver.h"

#include "util/util.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EVENT_POOL_MAX 4096 /* idle events kept per device; more are destroyed */

typedef struct cuda_dev {
    pthread_mutex_t lock;
    int ready; /* primary context retained; read with __atomic_load_n */
    CUdevice cudev;
    CUcontext ctx;
    bool vmm;
    bool rdma; /* VMM memory can be made GPUDirect RDMA capable */
    uint64_t granularity;
    CUevent *pool;
    size_t npool, cap;
} cuda_dev;

typedef struct cuda_ctx {
    gm__cuda_driver drv;
    void *dl;
    int ndev;
    cuda_dev *devs;
} cuda_ctx;

/* ---- errors ------------------------------------------------------------ */

static const char *cu_name(const cuda_ctx *c, CUresult r) {
    const char *s = NULL;
    if (c->drv.cuGetErrorName && c->drv.cuGetErrorName(r, &s) == GM__CUDA_SUCCESS && s) return s;
    return "CUDA_ERROR_?";
}

static const char *cu_msg(const cuda_ctx *c, CUresult r) {
    const char *s = NULL;
    if (c->drv.cuGetErrorString && c->drv.cuGetErrorString(r, &s) == GM__CUDA_SUCCESS && s) return s;
    return "no description";
}

/* Map a failed driver call to a status with a detail naming the call. Out of
 * memory is GM_ENOMEM so the allocator frees its cache and retries. */
static int cu_fail(const cuda_ctx *c, CUresult r, const char *call, int dev, uint64_t size) {
    int st = r == GM__CUDA_ERROR_OUT_OF_MEMORY ? GM_ENOMEM : GM_EBACKEND;
    return gm__set_error(st, "cuda backend: %s on device %d (size %" PRIu64 ") failed: %s (%d: %s)", call,
                         dev, size, cu_name(c, r), r, cu_msg(c, r));
}

/* ---- devices and contexts ------------------------------------------------ */

static int dev_setup_locked(cuda_ctx *c, int dev, cuda_dev *d) {
    CUresult r = c->drv.cuDeviceGet(&d->cudev, dev);
    if (r != GM__CUDA_SUCCESS) return cu_fail(c, r, "cuDeviceGet", dev, 0);
    r = c->drv.cuDevicePrimaryCtxRetain(&d->ctx, d->cudev);
    if (r != GM__CUDA_SUCCESS) return cu_fail(c, r, "cuDevicePrimaryCtxRetain", dev, 0);
    d->vmm = c->drv.cuMemCreate != NULL;
    if (d->vmm && c->drv.cuDeviceGetAttribute) {
        int v = 0;
        if (c->drv.cuDeviceGetAttribute(&v, GM__CU_DEVICE_ATTRIBUTE_VMM_SUPPORTED, d->cudev) ==
                GM__CUDA_SUCCESS)
            d->vmm = v != 0;
        v = 0;
        if (c->drv.cuDeviceGetAttribute(&v, GM__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                        d->cudev) == GM__CUDA_SUCCESS)
            d->rdma = v != 0;
    }
    __atomic_store_n(&d->ready, 1, __ATOMIC_RELEASE);
    return GM_OK;
}

static int dev_get(cuda_ctx *c, int dev, cuda_dev **out) {
    *out = NULL; /* set on every path: callers read it only on GM_OK, but gcc -O2 cannot tell */
    if (dev < 0 || dev >= c->ndev)
        return gm__set_error(GM_EDEVICE, "cuda backend: device %d does not exist (%d visible)", dev, c->ndev);
    cuda_dev *d = &c->devs[dev];
    if (!__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&d->lock);
        int st = __atomic_load_n(&d->ready, __ATOMIC_ACQUIRE) ? GM_OK : dev_setup_locked(c, dev, d);
        pthread_mutex_unlock(&d->lock);
        if (st != GM_OK) return st;
    }
    *out = d;
    return GM_OK;
}

typedef struct ctx_guard {
    CUcontext prev;
    bool switched;
} ctx_guard;

/* Make dev's primary context current for the duration of one call. */
static int enter(cuda_ctx *c, int dev, cuda_dev **dout, ctx_guard *g) {
    cuda_dev *d;
    *dout = NULL; /* outputs set on every path (see dev_get) */
    g->prev = NULL;
    g->switched = false;
    int st = dev_get(c, dev, &d);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuCtxGetCurrent(&g->prev);
    if (r != GM__CUDA_SUCCESS) g->prev = NULL; /* treat as "none current" */
    if (g->prev != d->ctx) {
        r = c->drv.cuCtxSetCurrent(d->ctx);
        if (r != GM__CUDA_SUCCESS) return cu_fail(c, r, "cuCtxSetCurrent", dev, 0);
        g->switched = true;
    }
    *dout = d;
    return GM_OK;
}

static void leave(cuda_ctx *c, ctx_guard *g) {
    if (g->switched) c->drv.cuCtxSetCurrent(g->prev);
}

/* ---- plain allocations and info ----------------------------------------- */

static int cu_mem_info(void *ctx, int dev, uint64_t *free_bytes, uint64_t *total_bytes) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    size_t f = 0, t = 0;
    CUresult r = c->drv.cuMemGetInfo(&f, &t);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS) return cu_fail(c, r, "cuMemGetInfo", dev, 0);
    *free_bytes = f;
    *total_bytes = t;
    return GM_OK;
}

static int cu_malloc(void *ctx, int dev, uint64_t size, gm_devptr *out) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUdeviceptr p = 0;
    /* A cuMemAlloc while a stream is being captured is legal (the graph
     * records the new memory; replays do not allocate) but "potentially
     * unsafe" in the global and thread-local capture modes: there it fails
     * and invalidates the capture, and torch.cuda.graph captures in global
     * mode (on the H200, policy:torch's first segment of a graph's pool
     * failed so, with cudaErrorStreamCaptureInvalidated). Torch's
     * cudaMallocMaybeCapturing allocates in relaxed mode; so does this. */
    int mode = GM__CU_STREAM_CAPTURE_MODE_RELAXED;
    bool relaxed = c->drv.cuThreadExchangeStreamCaptureMode &&
                   c->drv.cuThreadExchangeStreamCaptureMode(&mode) == GM__CUDA_SUCCESS;
    CUresult r = c->drv.cuMemAlloc(&p, (size_t)size);
    if (relaxed) (void)c->drv.cuThreadExchangeStreamCaptureMode(&mode); /* back to the caller's mode */
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS) return cu_fail(c, r, "cuMemAlloc", dev, size);
    *out = p;
    return GM_OK;
}

/* At process exit the driver may already be torn down; freeing then is moot. */
static bool cu_gone(CUresult r) { return r == GM__CUDA_ERROR_DEINITIALIZED; }

static int cu_free(void *ctx, int dev, gm_devptr ptr) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemFree((CUdeviceptr)ptr);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS && !cu_gone(r)) return cu_fail(c, r, "cuMemFree", dev, 0);
    return GM_OK;
}

/* ---- virtual memory management ----------------------------------------- */

static void fill_prop(gm__cu_alloc_prop *p, const cuda_dev *d) {
    memset(p, 0, sizeof *p);
    p->type = GM__CU_MEM_ALLOCATION_TYPE_PINNED;
    p->requested_handle_types = GM__CU_MEM_HANDLE_TYPE_NONE;
    p->location.type = GM__CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = d->cudev;
    /* as torch's expandable segments and NCCL's ncclMemAlloc ask: memory a
     * NIC can register (GPUDirect RDMA), where the device supports it
     * (docs/allocator.md, "RDMA registration") */
    p->alloc_flags.gpu_direct_rdma_capable = d->rdma;
}

static int vmm_enter(cuda_ctx *c, int dev, cuda_dev **d, ctx_guard *g) {
    int st = enter(c, dev, d, g);
    if (st != GM_OK) return st;
    if (!(*d)->vmm) {
        leave(c, g);
        return gm__set_error(GM_ENOTSUP, "cuda backend: device %d or this driver has no virtual memory "
                                         "management (cuMemCreate)", dev);
    }
    return GM_OK;
}

static int cu_granularity(void *ctx, int dev, uint64_t *bytes) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = vmm_enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    if (d->granularity == 0) {
        gm__cu_alloc_prop p;
        fill_prop(&p, d);
        size_t gr = 0;
        CUresult r = c->drv.cuMemGetAllocationGranularity(&gr, &p, GM__CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r != GM__CUDA_SUCCESS || gr == 0) {
            leave(c, &g);
            return cu_fail(c, r, "cuMemGetAllocationGranularity", dev, 0);
        }
        __atomic_store_n(&d->granularity, (uint64_t)gr, __ATOMIC_RELAXED);
    }
    leave(c, &g);
    *bytes = __atomic_load_n(&d->granularity, __ATOMIC_RELAXED);
    return GM_OK;
}

static int cu_va_reserve(void *ctx, int dev, uint64_t size, gm_devptr *out) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = vmm_enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUdeviceptr p = 0;
    CUresult r = c->drv.cuMemAddressReserve(&p, (size_t)size, 0, 0, 0);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS) return cu_fail(c, r, "cuMemAddressReserve", dev, size);
    *out = p;
    return GM_OK;
}

static int cu_va_release(void *ctx, int dev, gm_devptr va, uint64_t size) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = vmm_enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemAddressFree((CUdeviceptr)va, (size_t)size);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS && !cu_gone(r)) return cu_fail(c, r, "cuMemAddressFree", dev, size);
    return GM_OK;
}

static int cu_phys_create(void *ctx, int dev, uint64_t size, gm_physmem *out) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = vmm_enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    gm__cu_alloc_prop p;
    fill_prop(&p, d);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = c->drv.cuMemCreate(&h, (size_t)size, &p, 0);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS) return cu_fail(c, r, "cuMemCreate", dev, size);
    *out = h;
    return GM_OK;
}

static int cu_phys_release(void *ctx, int dev, gm_physmem h) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = vmm_enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemRelease((CUmemGenericAllocationHandle)h);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS && !cu_gone(r)) return cu_fail(c, r, "cuMemRelease", dev, 0);
    return GM_OK;
}

/* Map the whole handle at va (offset 0, as the driver requires), then make
 * it read/write for the device; undo the map if access cannot be set. */
static int cu_map(void *ctx, int dev, gm_devptr va, uint64_t size, gm_physmem h) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = vmm_enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemMap((CUdeviceptr)va, (size_t)size, 0, (CUmemGenericAllocationHandle)h, 0);
    if (r != GM__CUDA_SUCCESS) {
        leave(c, &g);
        return cu_fail(c, r, "cuMemMap", dev, size);
    }
    gm__cu_access_desc a;
    memset(&a, 0, sizeof a);
    a.location.type = GM__CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = d->cudev;
    a.flags = GM__CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = c->drv.cuMemSetAccess((CUdeviceptr)va, (size_t)size, &a, 1);
    if (r != GM__CUDA_SUCCESS) {
        c->drv.cuMemUnmap((CUdeviceptr)va, (size_t)size);
        leave(c, &g);
        return cu_fail(c, r, "cuMemSetAccess", dev, size);
    }
    leave(c, &g);
    return GM_OK;
}

static int cu_unmap(void *ctx, int dev, gm_devptr va, uint64_t size) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = vmm_enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemUnmap((CUdeviceptr)va, (size_t)size);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS && !cu_gone(r)) return cu_fail(c, r, "cuMemUnmap", dev, size);
    return GM_OK;
}

static int cu_copy_to_host(void *ctx, int dev, void *dst, gm_devptr src, uint64_t size) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    if (!c->drv.cuMemcpyDtoH) return GM_ENOTSUP;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemcpyDtoH(dst, (CUdeviceptr)src, (size_t)size);
    leave(c, &g);
    return r == GM__CUDA_SUCCESS ? GM_OK : cu_fail(c, r, "cuMemcpyDtoH", dev, size);
}

static int cu_copy_to_device(void *ctx, int dev, gm_devptr dst, const void *src, uint64_t size) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    if (!c->drv.cuMemcpyHtoD) return GM_ENOTSUP;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemcpyHtoD((CUdeviceptr)dst, src, (size_t)size);
    leave(c, &g);
    return r == GM__CUDA_SUCCESS ? GM_OK : cu_fail(c, r, "cuMemcpyHtoD", dev, size);
}

/* Page-locked host memory, usable from every context (PORTABLE). */
static int cu_host_alloc(void *ctx, int dev, uint64_t size, void **out) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    if (!c->drv.cuMemHostAlloc || !c->drv.cuMemFreeHost) return GM_ENOTSUP;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemHostAlloc(out, (size_t)size, GM__CU_MEMHOSTALLOC_PORTABLE);
    leave(c, &g);
    return r == GM__CUDA_SUCCESS ? GM_OK : cu_fail(c, r, "cuMemHostAlloc", dev, size);
}

static int cu_host_free(void *ctx, int dev, void *ptr) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    if (!c->drv.cuMemFreeHost) return GM_ENOTSUP;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuMemFreeHost(ptr);
    leave(c, &g);
    return r == GM__CUDA_SUCCESS || cu_gone(r) ? GM_OK : cu_fail(c, r, "cuMemFreeHost", dev, 0);
}

/* The copies queued on the legacy default stream (ordered after the work
 * already there, as the synchronous copies are) and waited for once; the
 * wait runs after a failed queueing too, so no copy outlives the call. */
static int cu_copy_many(void *ctx, int dev, bool to_device, const gm_backend_copy *v, size_t n) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    if (!c->drv.cuMemcpyDtoHAsync || !c->drv.cuMemcpyHtoDAsync || !c->drv.cuStreamSynchronize)
        return GM_ENOTSUP;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = GM__CUDA_SUCCESS;
    size_t i = 0;
    for (; i < n && r == GM__CUDA_SUCCESS; i++)
        r = to_device ? c->drv.cuMemcpyHtoDAsync((CUdeviceptr)v[i].dev, v[i].host, (size_t)v[i].size, NULL)
                      : c->drv.cuMemcpyDtoHAsync(v[i].host, (CUdeviceptr)v[i].dev, (size_t)v[i].size, NULL);
    CUresult w = c->drv.cuStreamSynchronize(NULL);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS)
        return cu_fail(c, r, to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", dev, v[i - 1].size);
    return w == GM__CUDA_SUCCESS ? GM_OK : cu_fail(c, w, "cuStreamSynchronize", dev, 0);
}

/* ---- events ---------------------------------------------------------- */

/* Take an idle event from the pool or create one (context is current). */
static int event_take(cuda_ctx *c, int dev, cuda_dev *d, CUevent *out) {
    pthread_mutex_lock(&d->lock);
    CUevent ev = d->npool ? d->pool[--d->npool] : NULL;
    pthread_mutex_unlock(&d->lock);
    if (!ev) {
        CUresult r = c->drv.cuEventCreate(&ev, GM__CU_EVENT_DISABLE_TIMING);
        if (r != GM__CUDA_SUCCESS) return cu_fail(c, r, "cuEventCreate", dev, 0);
    }
    *out = ev;
    return GM_OK;
}

/* Return an event to the pool (context is current). */
static void event_put(cuda_ctx *c, cuda_dev *d, CUevent ev) {
    pthread_mutex_lock(&d->lock);
    if (d->npool == d->cap && d->cap < EVENT_POOL_MAX) {
        size_t ncap = d->cap ? d->cap * 2 : 64;
        CUevent *np = realloc(d->pool, ncap * sizeof *np);
        if (np) {
            d->pool = np;
            d->cap = ncap;
        }
    }
    bool kept = d->npool < d->cap;
    if (kept) d->pool[d->npool++] = ev;
    pthread_mutex_unlock(&d->lock);
    if (!kept) c->drv.cuEventDestroy(ev);
}

static int cu_event_record(void *ctx, int dev, gm_stream stream, gm_event *out) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUevent ev = NULL;
    st = event_take(c, dev, d, &ev);
    if (st == GM_OK) {
        CUresult r = c->drv.cuEventRecord(ev, (CUstream)(uintptr_t)stream);
        if (r != GM__CUDA_SUCCESS) {
            event_put(c, d, ev);
            st = cu_fail(c, r, "cuEventRecord", dev, 0);
        } else {
            *out = (gm_event)(uintptr_t)ev;
        }
    }
    leave(c, &g);
    return st;
}

static int cu_event_query(void *ctx, int dev, gm_event ev, bool *done) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuEventQuery((CUevent)(uintptr_t)ev);
    leave(c, &g);
    if (r == GM__CUDA_SUCCESS || r == GM__CUDA_ERROR_NOT_READY) {
        *done = r == GM__CUDA_SUCCESS;
        return GM_OK;
    }
    return cu_fail(c, r, "cuEventQuery", dev, 0);
}

static int cu_event_sync(void *ctx, int dev, gm_event ev) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    ctx_guard g;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    CUresult r = c->drv.cuEventSynchronize((CUevent)(uintptr_t)ev);
    leave(c, &g);
    if (r != GM__CUDA_SUCCESS && !cu_gone(r)) return cu_fail(c, r, "cuEventSynchronize", dev, 0);
    return GM_OK;
}

/* The core is done with the event: keep it for the next record. */
static int cu_event_destroy(void *ctx, int dev, gm_event ev) {
    cuda_ctx *c = ctx;
    cuda_dev *d;
    if (!ev) return gm__set_error(GM_EINVAL, "cuda backend: event_destroy of a null event");
    /* Pooling needs no context, but destroying (pool full) does. */
    ctx_guard g;
    int st = enter(c, dev, &d, &g);
    if (st != GM_OK) return st;
    event_put(c, d, (CUevent)(uintptr_t)ev);
    leave(c, &g);
    return GM_OK;
}

/* ---- lifetime ---------------------------------------------------------- */

static int cu_device_count(void *ctx, int *count) {
    *count = ((cuda_ctx *)ctx)->ndev;
    return GM_OK;
}

static void cu_destroy(void *ctx) {
    cuda_ctx *c = ctx;
    if (!c) return;
    for (int i = 0; i < c->ndev; i++) {
        cuda_dev *d = &c->devs[i];
        if (d->ready) {
            ctx_guard g;
            cuda_dev *dd;
            if (d->npool && enter(c, i, &dd, &g) == GM_OK) {
                for (size_t k = 0; k < d->npool; k++) c->drv.cuEventDestroy(d->pool[k]);
                leave(c, &g);
            }
            c->drv.cuDevicePrimaryCtxRelease(d->cudev);
        }
        free(d->pool);
        pthread_mutex_destroy(&d->lock);
    }
    free(c->devs);
    if (c->dl) dlclose(c->dl);
    free(c);
}

static const gm_backend_ops cuda_ops = {
    .version = GM_BACKEND_VERSION,
    .size = sizeof(gm_backend_ops),
    .name = "cuda",
    .destroy = cu_destroy,
    .device_count = cu_device_count,
    .mem_info = cu_mem_info,
    .malloc = cu_malloc,
    .free = cu_free,
    .granularity = cu_granularity,
    .va_reserve = cu_va_reserve,
    .va_release = cu_va_release,
    .phys_create = cu_phys_create,
    .phys_release = cu_phys_release,
    .map = cu_map,
    .unmap = cu_unmap,
    .event_record = cu_event_record,
    .event_query = cu_event_query,
    .event_sync = cu_event_sync,
    .event_destroy = cu_event_destroy,
    .copy_to_host = cu_copy_to_host,
    .copy_to_device = cu_copy_to_device,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .copy_many = cu_copy_many,
};

static bool drv_complete(const gm__cuda_driver *d, const char **missing) {
#define REQ(f)                                                                                     \
    if (!d->f) {                                                                                   \
        *missing = #f;                                                                             \
        return false;                                                                              \
    }
    REQ(cuInit) REQ(cuDeviceGetCount) REQ(cuDeviceGet) REQ(cuDevicePrimaryCtxRetain)
    REQ(cuDevicePrimaryCtxRelease) REQ(cuCtxGetCurrent) REQ(cuCtxSetCurrent) REQ(cuMemAlloc)
    REQ(cuMemFree) REQ(cuMemGetInfo) REQ(cuEventCreate) REQ(cuEventRecord) REQ(cuEventQuery)
    REQ(cuEventSynchronize) REQ(cuEventDestroy)
#undef REQ
    return true;
}

/* VMM is all or nothing: a partial table is treated as no VMM. */
static void drv_trim_vmm(gm__cuda_driver *d) {
    if (!d->cuMemGetAllocationGranularity || !d->cuMemAddressReserve || !d->cuMemAddressFree ||
        !d->cuMemCreate || !d->cuMemRelease || !d->cuMemMap || !d->cuMemUnmap || !d->cuMemSetAccess) {
        d->cuMemGetAllocationGranularity = NULL;
        d->cuMemAddressReserve = NULL;
        d->cuMemAddressFree = NULL;
        d->cuMemCreate = NULL;
        d->cuMemRelease = NULL;
        d->cuMemMap = NULL;
        d->cuMemUnmap = NULL;
        d->cuMemSetAccess = NULL;
    }
}

int gm__cuda_open(const gm__cuda_driver *drv, void *dl, const gm_backend_ops **ops, void **ctx) {
    const char *missing = NULL;
    if (!drv || !ops || !ctx) return gm__set_error(GM_EINVAL, "cuda backend: null argument");
    if (!drv_complete(drv, &missing))
        return gm__set_error(GM_ENODRIVER, "cuda backend: the CUDA driver lacks %s (driver too old?)", missing);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return gm__set_error(GM_ENOHOSTMEM, "cuda backend: out of host memory");
    c->drv = *drv;
    drv_trim_vmm(&c->drv);
    CUresult r = c->drv.cuInit(0);
    int n = 0;
    if (r == GM__CUDA_SUCCESS) r = c->drv.cuDeviceGetCount(&n);
    if (r != GM__CUDA_SUCCESS || n <= 0) {
        int st = gm__set_error(GM_ENODRIVER,
                               "cuda backend: the CUDA driver is loaded but has no usable GPU: %s (%d: %s)",
                               r ? cu_name(c, r) : "0 devices", r, r ? cu_msg(c, r) : "device count is 0");
        free(c);
        return st;
    }
    if (n > GM_MAX_DEVICES) n = GM_MAX_DEVICES;
    c->devs = calloc((size_t)n, sizeof *c->devs);
    if (!c->devs) {
        free(c);
        return gm__set_error(GM_ENOHOSTMEM, "cuda backend: out of host memory");
    }
    c->ndev = n;
    for (int i = 0; i < n; i++) pthread_mutex_init(&c->devs[i].lock, NULL);
    c->dl = dl;
    *ops = &cuda_ops;
    *ctx = c;
    return GM_OK;
}

size_t gm__cuda_event_pool_size(void *ctx, int dev) {
    cuda_ctx *c = ctx;
    if (!c || dev < 0 || dev >= c->ndev) return 0;
    pthread_mutex_lock(&c->devs[dev].lock);
    size_t n = c->devs[dev].npool;
    pthread_mutex_unlock(&c->devs[dev].lock);
    return n;
}

/* gm_backend_create does not take ctx on failure: release it here. */
static int wrap(gm_backend **out, const gm_backend_ops *ops, void *ctx) {
    int st = gm_backend_create(out, ops, ctx);
    if (st != GM_OK) ops->destroy(ctx);
    return st;
}

int gm__cuda_create_with_driver(gm_backend **out, const gm__cuda_driver *drv) {
    if (!out) return gm__set_error(GM_EINVAL, "gm_cuda_create: out is NULL");
    *out = NULL;
    const gm_backend_ops *ops;
    void *ctx;
    int st = gm__cuda_open(drv, NULL, &ops, &ctx);
    if (st != GM_OK) return st;
    return wrap(out, ops, ctx);
}

/* dlsym every entry point; the unsuffixed names of the _v2 functions are
 * legacy 32-bit-size variants kept for old binaries, so the _v2 ones are
 * looked up explicitly. */
static void drv_load(void *dl, gm__cuda_driver *d) {
#define LOAD(field, sym) *(void **)(&d->field) = dlsym(dl, sym)
    LOAD(cuInit, "cuInit");
    LOAD(cuDeviceGetCount, "cuDeviceGetCount");
    LOAD(cuDeviceGet, "cuDeviceGet");
    LOAD(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    LOAD(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    if (!d->cuDevicePrimaryCtxRelease) LOAD(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
    LOAD(cuCtxGetCurrent, "cuCtxGetCurrent");
    LOAD(cuCtxSetCurrent, "cuCtxSetCurrent");
    LOAD(cuMemAlloc, "cuMemAlloc_v2");
    LOAD(cuMemFree, "cuMemFree_v2");
    LOAD(cuMemGetInfo, "cuMemGetInfo_v2");
    LOAD(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    LOAD(cuMemAddressReserve, "cuMemAddressReserve");
    LOAD(cuMemAddressFree, "cuMemAddressFree");
    LOAD(cuMemCreate, "cuMemCreate");
    LOAD(cuMemRelease, "cuMemRelease");
    LOAD(cuMemMap, "cuMemMap");
    LOAD(cuMemUnmap, "cuMemUnmap");
    LOAD(cuMemSetAccess, "cuMemSetAccess");
    LOAD(cuEventCreate, "cuEventCreate");
    LOAD(cuEventRecord, "cuEventRecord");
    LOAD(cuEventQuery, "cuEventQuery");
    LOAD(cuEventSynchronize, "cuEventSynchronize");
    LOAD(cuEventDestroy, "cuEventDestroy_v2");
    LOAD(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    LOAD(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    LOAD(cuMemHostAlloc, "cuMemHostAlloc");
    LOAD(cuMemFreeHost, "cuMemFreeHost");
    LOAD(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    LOAD(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    LOAD(cuStreamSynchronize, "cuStreamSynchronize");
    LOAD(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    LOAD(cuGetErrorName, "cuGetErrorName");
    LOAD(cuGetErrorString, "cuGetErrorString");
#undef LOAD
}

int gm_cuda_create(gm_backend **out) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!out) return gm__set_error(GM_EINVAL, "gm_cuda_create: out is NULL");
    *out = NULL;
    void *dl = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        return gm__set_error(GM_ENODRIVER,
                             "no CUDA driver: libcuda.so.1 could not be loaded (%s); is the NVIDIA driver "
                             "installed and this a GPU machine?",
                             why ? why : "unknown reason");
    }
    gm__cuda_driver d;
    memset(&d, 0, sizeof d);
    drv_load(dl, &d);
    const gm_backend_ops *ops;
    void *ctx;
    int st = gm__cuda_open(&d, dl, &ops, &ctx);
    if (st != GM_OK) {
        dlclose(dl);
        return st;
    }
    return wrap(out, ops, ctx);
}
