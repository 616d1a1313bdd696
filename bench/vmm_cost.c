/* vmm_cost.c — what each CUDA driver memory call costs on this GPU, so the
 * gpumem policy's physical-chunk design rests on measured numbers, not guesses.
 *
 * Measures (microseconds per call, median and mean over N repetitions):
 *   - cuMemCreate / cuMemMap / cuMemSetAccess / cuMemUnmap / cuMemRelease for
 *     one 2 MiB handle (the gpumem policy's granule),
 *   - the same calls for one handle of k granules (k = 8, 64, 512),
 *   - cuMemSetAccess once over a run of k separately created-and-mapped
 *     granules (does access-setting batch across handles?),
 *   - cuMemAlloc / cuMemFree of the same sizes (what PyTorch's cudaMalloc costs),
 *   - what moving k mapped granules to a new address costs, the way the reserve
 *     budget moves idle memory (unmap, map, set access): one unmap a granule
 *     against one over the whole stretch, and a new mapping made while the
 *     old one stays (an alias: no unmap before it).
 *
 * Built and run on the GPU machine by tests/gpu/vmm_cost.sh (links -lcuda);
 * not part of the CMake build (no libcuda here).
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                                  \
    do {                                                                       \
        CUresult r_ = (x);                                                     \
        if (r_ != CUDA_SUCCESS) {                                              \
            const char *s_ = "?";                                              \
            cuGetErrorName(r_, &s_);                                           \
            fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s_);  \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

enum { N = 64, MAXK = 512 };
static const size_t GRAN = 2u << 20;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void row(const char *what, size_t bytes, double *v, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    qsort(v, n, sizeof *v, cmp);
    printf("VMM %-34s %9.1f MiB  median %9.2f us  mean %9.2f us  (n=%d)\n", what, bytes / 1048576.0, v[n / 2],
           sum / n, n);
}

static CUmemAllocationProp prop;
static CUmemAccessDesc acc;

/* One handle of `bytes`: time each VMM call over n repetitions. */
static void one_handle(size_t bytes, int n) {
    double tc[N], tm[N], ta[N], tu[N], tr[N];
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    for (int i = 0; i < n; i++) {
        CUmemGenericAllocationHandle h;
        double t0 = now_us();
        CK(cuMemCreate(&h, bytes, &prop, 0));
        double t1 = now_us();
        CK(cuMemMap(va, bytes, 0, h, 0));
        double t2 = now_us();
        CK(cuMemSetAccess(va, bytes, &acc, 1));
        double t3 = now_us();
        CK(cuMemUnmap(va, bytes));
        double t4 = now_us();
        CK(cuMemRelease(h));
        double t5 = now_us();
        tc[i] = t1 - t0, tm[i] = t2 - t1, ta[i] = t3 - t2, tu[i] = t4 - t3, tr[i] = t5 - t4;
    }
    CK(cuMemAddressFree(va, bytes));
    row("cuMemCreate", bytes, tc, n);
    row("cuMemMap", bytes, tm, n);
    row("cuMemSetAccess", bytes, ta, n);
    row("cuMemUnmap", bytes, tu, n);
    row("cuMemRelease", bytes, tr, n);
}

/* k granule handles mapped side by side, access set per granule or once. */
static void granule_run(int k, int n, int batched) {
    double tc[N], tm[N], ta[N];
    static CUmemGenericAllocationHandle h[MAXK];
    size_t bytes = (size_t)k * GRAN;
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        for (int j = 0; j < k; j++) CK(cuMemCreate(&h[j], GRAN, &prop, 0));
        double t1 = now_us();
        for (int j = 0; j < k; j++) CK(cuMemMap(va + j * GRAN, GRAN, 0, h[j], 0));
        double t2 = now_us();
        if (batched) CK(cuMemSetAccess(va, bytes, &acc, 1));
        else
            for (int j = 0; j < k; j++) CK(cuMemSetAccess(va + j * GRAN, GRAN, &acc, 1));
        double t3 = now_us();
        CK(cuMemUnmap(va, bytes));
        for (int j = 0; j < k; j++) CK(cuMemRelease(h[j]));
        tc[i] = (t1 - t0), tm[i] = (t2 - t1), ta[i] = (t3 - t2);
    }
    CK(cuMemAddressFree(va, bytes));
    char name[80];
    snprintf(name, sizeof name, "run of %d granules: creates", k);
    row(name, bytes, tc, n);
    snprintf(name, sizeof name, "run of %d granules: maps", k);
    row(name, bytes, tm, n);
    snprintf(name, sizeof name, "run of %d: setaccess %s", k, batched ? "once" : "each");
    row(name, bytes, ta, n);
}

/* Move k mapped granule handles from address A to B, the way the reserve
 * budget moves idle memory: unmap (one call a granule, or unmap_once: one
 * over all k), map (one a granule), set access once over B. alias: map at B
 * while A stays mapped (A unmapped after the timing). Mapping part of a
 * larger handle (a nonzero offset) is not tried: the driver refuses it
 * (CUDA_ERROR_NOT_SUPPORTED on an H100, bench/RESULTS.md). */
static void move_run(int k, int n, int alias, int unmap_once) {
    double tu[N], tm[N], ta[N];
    static CUmemGenericAllocationHandle h[MAXK];
    size_t bytes = (size_t)k * GRAN;
    CUdeviceptr va[2];
    CK(cuMemAddressReserve(&va[0], 2 * bytes, 0, 0, 0));
    va[1] = va[0] + bytes;
    for (int j = 0; j < k; j++) CK(cuMemCreate(&h[j], GRAN, &prop, 0));
    for (int j = 0; j < k; j++) CK(cuMemMap(va[0] + j * GRAN, GRAN, 0, h[j], 0));
    CK(cuMemSetAccess(va[0], bytes, &acc, 1));
    for (int i = 0; i < n; i++) {
        CUdeviceptr from = va[i & 1], to = va[(i + 1) & 1];
        double t0 = now_us();
        if (!alias && unmap_once) CK(cuMemUnmap(from, bytes));
        else if (!alias)
            for (int j = 0; j < k; j++) CK(cuMemUnmap(from + j * GRAN, GRAN));
        double t1 = now_us();
        for (int j = 0; j < k; j++) CK(cuMemMap(to + j * GRAN, GRAN, 0, h[j], 0));
        double t2 = now_us();
        CK(cuMemSetAccess(to, bytes, &acc, 1));
        double t3 = now_us();
        if (alias)
            for (int j = 0; j < k; j++) CK(cuMemUnmap(from + j * GRAN, GRAN));
        tu[i] = t1 - t0, tm[i] = t2 - t1, ta[i] = t3 - t2;
    }
    for (int j = 0; j < k; j++) CK(cuMemUnmap(va[n & 1] + j * GRAN, GRAN));
    for (int j = 0; j < k; j++) CK(cuMemRelease(h[j]));
    CK(cuMemAddressFree(va[0], 2 * bytes));
    const char *kind = alias ? "alias" : "handles";
    char name[80];
    if (!alias) {
        snprintf(name, sizeof name, "move %d %s: unmap%s", k, kind, unmap_once ? " once" : "s");
        row(name, bytes, tu, n);
    }
    snprintf(name, sizeof name, "move %d %s: maps", k, kind);
    row(name, bytes, tm, n);
    snprintf(name, sizeof name, "move %d %s: setaccess", k, kind);
    row(name, bytes, ta, n);
}

static void plain_alloc(size_t bytes, int n) {
    double ta[N], tf[N];
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        double t0 = now_us();
        CK(cuMemAlloc(&p, bytes));
        double t1 = now_us();
        CK(cuMemFree(p));
        double t2 = now_us();
        ta[i] = t1 - t0, tf[i] = t2 - t1;
    }
    row("cuMemAlloc", bytes, ta, n);
    row("cuMemFree", bytes, tf, n);
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    plain_alloc(GRAN, 8); /* warm the driver */
    one_handle(GRAN, N);
    one_handle(8 * GRAN, 32);
    one_handle(64 * GRAN, 16);
    one_handle(512 * GRAN, 8);
    granule_run(8, 16, 0);
    granule_run(8, 16, 1);
    granule_run(64, 8, 0);
    granule_run(64, 8, 1);
    granule_run(512, 4, 1);
    for (int k = 1; k <= 64; k *= 8)
        for (int kind = 0; kind < 3; kind++) move_run(k, 16, kind == 2, kind == 1);
    plain_alloc(GRAN, N);
    plain_alloc(8 * GRAN, 32);
    plain_alloc(64 * GRAN, 16);
    plain_alloc(512 * GRAN, 8);
    CK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
