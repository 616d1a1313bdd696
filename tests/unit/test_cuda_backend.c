/* test_cuda_backend.c — the cuda backend without a GPU: gm_cuda_create fails
 * cleanly with GM_ENODRIVER where libcuda.so.1 is absent, and through a fake
 * driver table the call paths that matter on the GPU are checked: making the
 * primary context current (and restoring the caller's), mapping driver
 * errors to statuses, undoing a map whose access cannot be set, event
 * pooling, and the release of everything at destroy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda_driver.h"
#include "gpumem/gpumem.h"

/* ---- the fake driver ---------------------------------------------------- */

#define NDEV 2
static struct fake {
    int ndev;
    CUresult init_result;
    int retained[NDEV], released[NDEV];
    int events_created, events_destroyed, unmaps, sets;
    CUresult alloc_result, set_access_result, query_result;
    int vmm_attr;
    int rdma_attr, rdma_flag; /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED; the flag cuMemCreate saw */
    unsigned char devmem[64]; /* what the fake copies read and write */
    int alloc_mode, exchanges; /* the capture mode cuMemAlloc ran in; mode swaps */
    unsigned host_flags;       /* what cuMemHostAlloc was asked for */
    int queued, syncs, fail_at; /* async copies queued; stream waits; the queued copy that fails (1-based) */
} F;
static _Thread_local int capture_mode; /* the thread's stream capture mode (0: global) */
static char ctx_tag[NDEV]; /* the fake contexts are the addresses of these */
static _Thread_local CUcontext cur;
static char ev_tag[64];

static CUcontext ctx_of(int dev) { return (CUcontext)(void *)&ctx_tag[dev]; }
static int cur_dev(void) {
    for (int i = 0; i < NDEV; i++)
        if (cur == ctx_of(i)) return i;
    return -1;
}

static CUresult f_init(unsigned fl) { return F.init_result; }
static CUresult f_count(int *n) { *n = F.ndev; return 0; }
static CUresult f_get(CUdevice *d, int i) { *d = i; return i < F.ndev ? 0 : 101; }
static CUresult f_attr(int *v, int a, CUdevice d) {
    *v = a == GM__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED ? F.rdma_attr : F.vmm_attr;
    return 0;
}
static CUresult f_retain(CUcontext *c, CUdevice d) { F.retained[d]++; *c = ctx_of(d); return 0; }
static CUresult f_release(CUdevice d) { F.released[d]++; return 0; }
static CUresult f_getcur(CUcontext *c) { *c = cur; return 0; }
static CUresult f_setcur(CUcontext c) { cur = c; F.sets++; return 0; }
/* Like the real driver: device calls need a current context. */
static CUresult f_alloc(CUdeviceptr *p, size_t s) {
    if (cur_dev() < 0) return GM__CUDA_ERROR_INVALID_CONTEXT;
    F.alloc_mode = capture_mode;
    if (F.alloc_result) return F.alloc_result;
    *p = 0x7f0000000000ull + (uint64_t)cur_dev() * 0x100000000ull;
    return 0;
}
static CUresult f_exchange(int *mode) {
    int was = capture_mode;
    capture_mode = *mode;
    *mode = was;
    F.exchanges++;
    return 0;
}
static CUresult f_free(CUdeviceptr p) { return cur_dev() < 0 ? GM__CUDA_ERROR_INVALID_CONTEXT : 0; }
static CUresult f_info(size_t *f, size_t *t) {
    if (cur_dev() < 0) return GM__CUDA_ERROR_INVALID_CONTEXT;
    *f = 100 + (size_t)cur_dev();
    *t = 1000;
    return 0;
}
static CUresult f_gran(size_t *g, const gm__cu_alloc_prop *p, int o) {
    /* the prop must name a pinned allocation on the device */
    if (p->type != 1 || p->location.type != 1) return GM__CUDA_ERROR_INVALID_VALUE;
    *g = 2u << 20;
    return 0;
}
static CUresult f_reserve(CUdeviceptr *p, size_t s, size_t a, CUdeviceptr addr, unsigned long long fl) {
    *p = 0x600000000000ull;
    return 0;
}
static CUresult f_afree(CUdeviceptr p, size_t s) { return 0; }
static CUresult f_create(CUmemGenericAllocationHandle *h, size_t s, const gm__cu_alloc_prop *p,
                         unsigned long long fl) {
    F.rdma_flag = p->alloc_flags.gpu_direct_rdma_capable;
    *h = 42;
    return 0;
}
static CUresult f_mrelease(CUmemGenericAllocationHandle h) { return 0; }
static CUresult f_map(CUdeviceptr p, size_t s, size_t off, CUmemGenericAllocationHandle h,
                      unsigned long long fl) {
    return off == 0 ? 0 : GM__CUDA_ERROR_INVALID_VALUE;
}
static CUresult f_unmap(CUdeviceptr p, size_t s) { F.unmaps++; return 0; }
static CUresult f_access(CUdeviceptr p, size_t s, const gm__cu_access_desc *d, size_t n) {
    if (n != 1 || d->flags != 3) return GM__CUDA_ERROR_INVALID_VALUE;
    return F.set_access_result;
}
static CUresult f_ev_create(CUevent *e, unsigned fl) {
    if (cur_dev() < 0) return GM__CUDA_ERROR_INVALID_CONTEXT;
    *e = (CUevent)(void *)&ev_tag[F.events_created++ % 64];
    return 0;
}
static CUresult f_dtoh(void *dst, CUdeviceptr src, size_t n) {
    if (cur_dev() < 0) return GM__CUDA_ERROR_INVALID_CONTEXT;
    memcpy(dst, F.devmem + (src - 0x600000000000ull), n);
    return 0;
}
static CUresult f_htod(CUdeviceptr dst, const void *src, size_t n) {
    if (cur_dev() < 0) return GM__CUDA_ERROR_INVALID_CONTEXT;
    memcpy(F.devmem + (dst - 0x600000000000ull), src, n);
    return 0;
}
static CUresult f_host_alloc(void **p, size_t n, unsigned fl) {
    if (cur_dev() < 0) return GM__CUDA_ERROR_INVALID_CONTEXT;
    F.host_flags = fl;
    return (*p = malloc(n)) ? 0 : GM__CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_free_host(void *p) {
    free(p);
    return 0;
}
static CUresult f_dtoh_async(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    if (s || ++F.queued == F.fail_at) return GM__CUDA_ERROR_INVALID_VALUE; /* the legacy stream only */
    return f_dtoh(dst, src, n);
}
static CUresult f_htod_async(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    if (s || ++F.queued == F.fail_at) return GM__CUDA_ERROR_INVALID_VALUE;
    return f_htod(dst, src, n);
}
static CUresult f_stream_sync(CUstream s) {
    F.syncs++;
    return s || cur_dev() < 0 ? GM__CUDA_ERROR_INVALID_CONTEXT : 0;
}
static CUresult f_ev_record(CUevent e, CUstream s) { return 0; }
static CUresult f_ev_query(CUevent e) { return F.query_result; }
static CUresult f_ev_sync(CUevent e) { return 0; }
static CUresult f_ev_destroy(CUevent e) { F.events_destroyed++; return 0; }
static CUresult f_errname(CUresult r, const char **s) {
    *s = r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
    return 0;
}

static gm__cuda_driver fake_driver(void) {
    gm__cuda_driver d = {
        .cuInit = f_init, .cuDeviceGetCount = f_count, .cuDeviceGet = f_get,
        .cuDeviceGetAttribute = f_attr, .cuDevicePrimaryCtxRetain = f_retain,
        .cuDevicePrimaryCtxRelease = f_release, .cuCtxGetCurrent = f_getcur,
        .cuCtxSetCurrent = f_setcur, .cuMemAlloc = f_alloc, .cuMemFree = f_free,
        .cuMemGetInfo = f_info, .cuMemGetAllocationGranularity = f_gran,
        .cuMemAddressReserve = f_reserve, .cuMemAddressFree = f_afree, .cuMemCreate = f_create,
        .cuMemRelease = f_mrelease, .cuMemMap = f_map, .cuMemUnmap = f_unmap,
        .cuMemSetAccess = f_access, .cuEventCreate = f_ev_create, .cuEventRecord = f_ev_record,
        .cuEventQuery = f_ev_query, .cuEventSynchronize = f_ev_sync, .cuEventDestroy = f_ev_destroy,
        .cuGetErrorName = f_errname, .cuThreadExchangeStreamCaptureMode = f_exchange,
        .cuMemcpyDtoH = f_dtoh, .cuMemcpyHtoD = f_htod, .cuMemHostAlloc = f_host_alloc,
        .cuMemFreeHost = f_free_host, .cuMemcpyDtoHAsync = f_dtoh_async, .cuMemcpyHtoDAsync = f_htod_async,
        .cuStreamSynchronize = f_stream_sync,
    };
    return d;
}

static int setup(void **state) {
    memset(&F, 0, sizeof F);
    F.ndev = NDEV;
    F.vmm_attr = 1;
    cur = NULL;
    return 0;
}

static void open_fake(const gm__cuda_driver *d, const gm_backend_ops **ops, void **ctx) {
    assert_int_equal(gm__cuda_open(d, NULL, ops, ctx), GM_OK);
    assert_string_equal((*ops)->name, "cuda");
}

/* ---- tests -------------------------------------------------------------- */

static void no_driver_is_clean(void **state) {
    gm_backend *b = (gm_backend *)0x1;
    int st = gm_cuda_create(&b);
    if (st == GM_OK) { /* a real GPU machine: nothing to check here */
        gm_backend_destroy(b);
        skip();
    }
    assert_int_equal(st, GM_ENODRIVER);
    assert_null(b);
    assert_non_null(strstr(gm_last_error_detail(), "libcuda.so.1"));
    assert_int_equal(gm_cuda_create(NULL), GM_EINVAL);
}

static void incomplete_driver_is_enodriver(void **state) {
    gm__cuda_driver d = fake_driver();
    d.cuEventQuery = NULL;
    const gm_backend_ops *ops;
    void *ctx;
    assert_int_equal(gm__cuda_open(&d, NULL, &ops, &ctx), GM_ENODRIVER);
    assert_non_null(strstr(gm_last_error_detail(), "cuEventQuery"));
}

static void no_gpu_is_enodriver(void **state) {
    gm__cuda_driver d = fake_driver();
    F.init_result = GM__CUDA_ERROR_NO_DEVICE;
    const gm_backend_ops *ops;
    void *ctx;
    assert_int_equal(gm__cuda_open(&d, NULL, &ops, &ctx), GM_ENODRIVER);
    F.init_result = 0;
    F.ndev = 0;
    assert_int_equal(gm__cuda_open(&d, NULL, &ops, &ctx), GM_ENODRIVER);
}

/* A thread with no current context (PyTorch's allocation threads) gets the
 * primary context for the call and is left as it was. */
static void primary_context_made_current_and_restored(void **state) {
    gm__cuda_driver d = fake_driver();
    const gm_backend_ops *ops;
    void *ctx;
    open_fake(&d, &ops, &ctx);
    int n = 0;
    assert_int_equal(ops->device_count(ctx, &n), GM_OK);
    assert_int_equal(n, NDEV);
    assert_int_equal(F.retained[0] + F.retained[1], 0); /* lazy: nothing retained yet */

    gm_devptr p = 0;
    assert_int_equal(ops->malloc(ctx, 1, 4096, &p), GM_OK);
    assert_true(p != 0);
    assert_null(cur);
    assert_int_equal(F.retained[1], 1);
    assert_int_equal(F.retained[0], 0);

    /* caller is on device 0: a device-1 call must not leave device 1 current */
    cur = ctx_of(0);
    assert_int_equal(ops->free(ctx, 1, p), GM_OK);
    assert_ptr_equal(cur, ctx_of(0));
    /* already on the right context: no switch at all */
    cur = ctx_of(1);
    F.sets = 0;
    uint64_t fr, tot;
    assert_int_equal(ops->mem_info(ctx, 1, &fr, &tot), GM_OK);
    assert_int_equal(fr, 101);
    assert_int_equal(tot, 1000);
    assert_int_equal(F.sets, 0);
    assert_int_equal(F.retained[1], 1); /* retained once */

    assert_int_equal(ops->malloc(ctx, 2, 4096, &p), GM_EDEVICE);
    assert_int_equal(ops->malloc(ctx, -1, 4096, &p), GM_EDEVICE);
    ops->destroy(ctx);
    assert_int_equal(F.released[1], 1);
    assert_int_equal(F.released[0], 0);
}

static void oom_is_enomem_with_detail(void **state) {
    gm__cuda_driver d = fake_driver();
    const gm_backend_ops *ops;
    void *ctx;
    open_fake(&d, &ops, &ctx);
    F.alloc_result = GM__CUDA_ERROR_OUT_OF_MEMORY;
    gm_devptr p = 0;
    assert_int_equal(ops->malloc(ctx, 0, 1u << 30, &p), GM_ENOMEM);
    assert_non_null(strstr(gm_last_error_detail(), "cuMemAlloc"));
    assert_non_null(strstr(gm_last_error_detail(), "CUDA_ERROR_OUT_OF_MEMORY"));
    F.alloc_result = GM__CUDA_ERROR_INVALID_VALUE;
    assert_int_equal(ops->malloc(ctx, 0, 1, &p), GM_EBACKEND);
    assert_null(cur);
    ops->destroy(ctx);
}

/* cuMemAlloc runs in relaxed capture mode, as torch's
 * cudaMallocMaybeCapturing: in global mode (torch.cuda.graph's) it would
 * fail and invalidate the capture. The thread's mode is given back, on
 * failure too; without the driver entry it allocates as before. */
static void malloc_relaxed_capture_mode(void **state) {
    gm__cuda_driver d = fake_driver();
    const gm_backend_ops *ops;
    void *ctx;
    open_fake(&d, &ops, &ctx);
    gm_devptr p = 0;
    capture_mode = 0; /* global */
    assert_int_equal(ops->malloc(ctx, 0, 4096, &p), GM_OK);
    assert_int_equal(F.alloc_mode, GM__CU_STREAM_CAPTURE_MODE_RELAXED);
    assert_int_equal(capture_mode, 0);
    assert_int_equal(F.exchanges, 2);
    capture_mode = 1; /* thread-local */
    F.alloc_result = GM__CUDA_ERROR_OUT_OF_MEMORY;
    assert_int_equal(ops->malloc(ctx, 0, 4096, &p), GM_ENOMEM);
    assert_int_equal(F.alloc_mode, GM__CU_STREAM_CAPTURE_MODE_RELAXED);
    assert_int_equal(capture_mode, 1);
    ops->destroy(ctx);
    capture_mode = 0;
    F.alloc_result = 0;
    d.cuThreadExchangeStreamCaptureMode = NULL; /* an old driver */
    open_fake(&d, &ops, &ctx);
    assert_int_equal(ops->malloc(ctx, 0, 4096, &p), GM_OK);
    assert_int_equal(F.alloc_mode, 0);
    assert_int_equal(F.exchanges, 4);
    ops->destroy(ctx);
}

static void vmm_paths(void **state) {
    gm__cuda_driver d = fake_driver();
    const gm_backend_ops *ops;
    void *ctx;
    open_fake(&d, &ops, &ctx);
    uint64_t g = 0;
    assert_int_equal(ops->granularity(ctx, 0, &g), GM_OK);
    assert_int_equal(g, 2u << 20);
    gm_devptr va = 0;
    gm_physmem h = 0;
    assert_int_equal(ops->va_reserve(ctx, 0, 8u << 20, &va), GM_OK);
    assert_int_equal(ops->phys_create(ctx, 0, 2u << 20, &h), GM_OK);
    assert_int_equal(ops->map(ctx, 0, va, 2u << 20, h), GM_OK);
    assert_int_equal(F.unmaps, 0);
    /* access cannot be set: the map is undone, the caller sees an error */
    F.set_access_result = GM__CUDA_ERROR_INVALID_VALUE;
    assert_int_equal(ops->map(ctx, 0, va + (2u << 20), 2u << 20, h), GM_EBACKEND);
    assert_int_equal(F.unmaps, 1);
    assert_non_null(strstr(gm_last_error_detail(), "cuMemSetAccess"));
    assert_int_equal(ops->unmap(ctx, 0, va, 2u << 20), GM_OK);
    assert_int_equal(ops->phys_release(ctx, 0, h), GM_OK);
    assert_int_equal(ops->va_release(ctx, 0, va, 8u << 20), GM_OK);
    ops->destroy(ctx);

    /* device without VMM support */
    F.vmm_attr = 0;
    open_fake(&d, &ops, &ctx);
    assert_int_equal(ops->granularity(ctx, 0, &g), GM_ENOTSUP);
    assert_int_equal(ops->va_reserve(ctx, 0, 8u << 20, &va), GM_ENOTSUP);
    assert_null(cur);
    ops->destroy(ctx);

    /* driver without the VMM entry points (partial table = none) */
    F.vmm_attr = 1;
    d.cuMemSetAccess = NULL;
    open_fake(&d, &ops, &ctx);
    assert_int_equal(ops->granularity(ctx, 0, &g), GM_ENOTSUP);
    ops->destroy(ctx);
}

/* Issue 46: VMM memory a NIC can register where the device supports it
 * (as torch's expandable segments and NCCL's ncclMemAlloc ask), and the
 * synchronous copies sleep's offload uses, in the device's context. */
static void rdma_flag_and_copies(void **state) {
    gm__cuda_driver d = fake_driver();
    const gm_backend_ops *ops;
    void *ctx;
    gm_physmem h;
    for (int attr = 0; attr < 2; attr++) {
        F.rdma_attr = attr;
        F.rdma_flag = -1;
        open_fake(&d, &ops, &ctx);
        assert_int_equal(ops->phys_create(ctx, 0, 2u << 20, &h), GM_OK);
        assert_int_equal(F.rdma_flag, attr);
        ops->destroy(ctx);
    }
    open_fake(&d, &ops, &ctx);
    char in[8] = "gpumem!", out[8] = {0};
    assert_int_equal(ops->copy_to_device(ctx, 1, 0x600000000000ull + 8, in, sizeof in), GM_OK);
    assert_int_equal(ops->copy_to_host(ctx, 1, out, 0x600000000000ull + 8, sizeof out), GM_OK);
    assert_string_equal(out, "gpumem!");
    assert_null(cur); /* the caller's context is back */
    ops->destroy(ctx);
    d.cuMemcpyDtoH = NULL; /* an old driver: no offload */
    open_fake(&d, &ops, &ctx);
    assert_int_equal(ops->copy_to_host(ctx, 0, out, 0x600000000000ull, 1), GM_ENOTSUP);
    ops->destroy(ctx);
}

/* Issue 46: sleep's offload keeps its copy in page-locked host memory and
 * queues the copies of all blocks, then waits once; a copy that cannot be
 * queued still waits for those queued before it. */
static void pinned_host_and_queued_copies(void **state) {
    gm__cuda_driver d = fake_driver();
    const gm_backend_ops *ops;
    void *ctx;
    open_fake(&d, &ops, &ctx);
    void *host = NULL;
    assert_int_equal(ops->host_alloc(ctx, 1, 24, &host), GM_OK);
    assert_non_null(host);
    assert_int_equal(F.host_flags, GM__CU_MEMHOSTALLOC_PORTABLE);
    memcpy(host, "abcdefghijklmnopqrstuvw", 24);
    gm_backend_copy v[3];
    for (int i = 0; i < 3; i++) v[i] = (gm_backend_copy){0x600000000000ull + 16u * (unsigned)i, (char *)host + 8 * i, 8};
    assert_int_equal(ops->copy_many(ctx, 1, true, v, 3), GM_OK);
    assert_int_equal(F.queued, 3);
    assert_int_equal(F.syncs, 1);
    assert_memory_equal(F.devmem + 16, "ijklmnop", 8);
    memset(host, 0, 24);
    assert_int_equal(ops->copy_many(ctx, 1, false, v, 3), GM_OK);
    assert_int_equal(F.syncs, 2);
    assert_memory_equal(host, "abcdefghijklmnopqrstuvw", 24);
    F.fail_at = F.queued + 2;
    assert_int_equal(ops->copy_many(ctx, 1, false, v, 3), GM_EBACKEND);
    assert_non_null(strstr(gm_last_error_detail(), "cuMemcpyDtoHAsync"));
    assert_int_equal(F.queued, 8); /* stopped at the failure */
    assert_int_equal(F.syncs, 3);  /* and waited for the first */
    assert_null(cur);
    assert_int_equal(ops->host_free(ctx, 1, host), GM_OK);
    ops->destroy(ctx);
    d.cuStreamSynchronize = NULL; /* an old driver: the core copies one by one, into malloc'd memory */
    d.cuMemHostAlloc = NULL;
    open_fake(&d, &ops, &ctx);
    assert_int_equal(ops->copy_many(ctx, 0, false, v, 1), GM_ENOTSUP);
    assert_int_equal(ops->host_alloc(ctx, 0, 8, &host), GM_ENOTSUP);
    ops->destroy(ctx);
}

static void events_are_pooled(void **state) {
    gm__cuda_driver d = fake_driver();
    const gm_backend_ops *ops;
    void *ctx;
    open_fake(&d, &ops, &ctx);
    gm_event e1 = 0, e2 = 0;
    assert_int_equal(ops->event_record(ctx, 0, 0x1234, &e1), GM_OK);
    assert_true(e1 != 0);
    assert_int_equal(F.events_created, 1);
    bool done = false;
    assert_int_equal(ops->event_query(ctx, 0, e1, &done), GM_OK);
    assert_true(done);
    F.query_result = GM__CUDA_ERROR_NOT_READY;
    assert_int_equal(ops->event_query(ctx, 0, e1, &done), GM_OK);
    assert_false(done);
    F.query_result = GM__CUDA_ERROR_INVALID_VALUE;
    assert_int_equal(ops->event_query(ctx, 0, e1, &done), GM_EBACKEND);
    F.query_result = 0;
    assert_int_equal(ops->event_sync(ctx, 0, e1), GM_OK);
    assert_int_equal(ops->event_destroy(ctx, 0, e1), GM_OK);
    assert_int_equal(gm__cuda_event_pool_size(ctx, 0), 1);
    assert_int_equal(F.events_destroyed, 0);
    /* the next record reuses it instead of creating one */
    assert_int_equal(ops->event_record(ctx, 0, 0, &e2), GM_OK);
    assert_int_equal(e2, e1);
    assert_int_equal(F.events_created, 1);
    assert_int_equal(gm__cuda_event_pool_size(ctx, 0), 0);
    assert_int_equal(ops->event_destroy(ctx, 0, e2), GM_OK);
    assert_int_equal(ops->event_destroy(ctx, 0, 0), GM_EINVAL);
    assert_null(cur);
    ops->destroy(ctx); /* destroys the pooled event */
    assert_int_equal(F.events_destroyed, 1);
}

static void backend_object_wraps_ops(void **state) {
    gm__cuda_driver d = fake_driver();
    gm_backend *b = NULL;
    assert_int_equal(gm__cuda_create_with_driver(&b, &d), GM_OK);
    assert_string_equal(gm_backend_name(b), "cuda");
    int n = 0;
    assert_int_equal(gm_backend_device_count(b, &n), GM_OK);
    assert_int_equal(n, NDEV);
    gm_backend_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(no_driver_is_clean, setup),
        cmocka_unit_test_setup(incomplete_driver_is_enodriver, setup),
        cmocka_unit_test_setup(no_gpu_is_enodriver, setup),
        cmocka_unit_test_setup(primary_context_made_current_and_restored, setup),
        cmocka_unit_test_setup(oom_is_enomem_with_detail, setup),
        cmocka_unit_test_setup(malloc_relaxed_capture_mode, setup),
        cmocka_unit_test_setup(vmm_paths, setup),
        cmocka_unit_test_setup(rdma_flag_and_copies, setup),
        cmocka_unit_test_setup(pinned_host_and_queued_copies, setup),
        cmocka_unit_test_setup(events_are_pooled, setup),
        cmocka_unit_test_setup(backend_object_wraps_ops, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
