/* soak_gpu.c — the soak of tests/stress/test_soak.c on a real GPU (CUDA backend),
 * with a data-integrity check: every block is filled with a pattern derived
 * from its address and a generation number when it is allocated, and the
 * whole block is copied back and compared before it is freed (by whichever
 * thread frees it). Two live blocks sharing memory, a block unmapped or
 * reused while still in use, or a free that does not wait for the stream's
 * work would all show as a mismatch.
 *
 * 16 threads x 4 streams, random sizes (some over the memory fraction, so
 * OOM happens at random points), frees of other threads' blocks, reads on
 * other streams + record_stream, empty_cache and gm_check throughout; each
 * policy in turn. The driver is loaded with dlopen, like the backend.
 *
 *   soak_gpu SECONDS_PER_POLICY [FRACTION]      (tests/gpu/soak_gpu.sh builds and runs it)
 * Prints one line per policy; exit 1 on any mismatch or broken invariant,
 * 77 without a GPU. */
#define _GNU_SOURCE
#include "gpumem/gpumem.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
} cu;

enum { THREADS = 16, STREAMS = 4, SLOTS = 256 };
#define MAX_BLOCK ((uint64_t)64 << 20)

typedef struct slot {
    gm_devptr ptr;
    uint64_t size;
    uint32_t pattern;
    CUstream stream;
} slot;

static CUcontext g_ctx;
static CUstream g_streams[THREADS * STREAMS];
static gm_allocator *g_a;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static slot g_slot[SLOTS];
static double g_deadline;
static atomic_int g_bad;
static atomic_uint_fast64_t g_ops, g_ooms, g_verified_bytes, g_blocks, g_gen;
static char g_why[512];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    pthread_mutex_lock(&g_lock);
    if (!atomic_fetch_add(&g_bad, 1)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g_why, sizeof g_why, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&g_lock);
}

static uint64_t rnd(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Copy the block back on its stream and compare every word. */
static void verify(const slot *s, uint32_t *host) {
    size_t words = s->size / 4;
    if (cu.cuMemcpyDtoHAsync(host, s->ptr, words * 4, s->stream) || cu.cuStreamSynchronize(s->stream)) {
        fail("copy back of 0x%llx (%llu bytes) failed", (unsigned long long)s->ptr, (unsigned long long)s->size);
        return;
    }
    for (size_t i = 0; i < words; i++)
        if (host[i] != s->pattern) {
            fail("block 0x%llx of %llu bytes: word %zu is 0x%08x, wrote 0x%08x (memory shared with "
                 "another live block, or reused too early)", (unsigned long long)s->ptr,
                 (unsigned long long)s->size, i, host[i], s->pattern);
            return;
        }
    atomic_fetch_add(&g_verified_bytes, words * 4);
}

static void release(slot *s, uint32_t *host, uint64_t *rng) {
    if (rnd(rng) % 10 < 3) { /* read it on another stream too, as record_stream says */
        CUstream other = g_streams[rnd(rng) % (THREADS * STREAMS)];
        if (other != s->stream) {
            if (cu.cuMemcpyDtoHAsync(host, s->ptr, s->size < 4096 ? s->size : 4096, other))
                fail("read on another stream failed");
            int rc = gm_record_stream(g_a, s->ptr, (gm_stream)(uintptr_t)other);
            if (rc != GM_OK) fail("gm_record_stream = %s", gm_status_name(rc));
            cu.cuStreamSynchronize(other); /* the host buffer is reused at once */
        }
    }
    verify(s, host);
    int rc = gm_free(g_a, s->ptr);
    if (rc != GM_OK) fail("gm_free = %s", gm_status_name(rc));
}

static void *worker(void *arg) {
    int tid = (int)(intptr_t)arg;
    uint64_t rng = 0x5eed + (uint64_t)tid * 7919;
    cu.cuCtxSetCurrent(g_ctx);
    uint32_t *host = malloc(MAX_BLOCK);
    if (!host) {
        fail("no host buffer");
        return NULL;
    }
    while (!atomic_load(&g_bad) && now_s() < g_deadline) {
        atomic_fetch_add(&g_ops, 1);
        unsigned what = (unsigned)(rnd(&rng) % 1000);
        int k = (int)(rnd(&rng) % SLOTS);
        CUstream stream = g_streams[tid * STREAMS + (int)(rnd(&rng) % STREAMS)];
        if (what < 480) {
            uint64_t r = rnd(&rng) % 100, size;
            if (r < 60) size = 4 + rnd(&rng) % (1 << 20);                       /* small */
            else if (r < 90) size = (1 << 20) + rnd(&rng) % (20 << 20);         /* medium */
            else if (r < 98) size = (20 << 20) + rnd(&rng) % (MAX_BLOCK - (20 << 20)); /* large */
            else size = (uint64_t)(200 + rnd(&rng) % 800) << 30;                /* OOM */
            size &= ~(uint64_t)3;
            gm_devptr ptr = 0;
            int rc = gm_malloc(g_a, 0, size, (gm_stream)(uintptr_t)stream, &ptr);
            if (rc == GM_ENOMEM) {
                atomic_fetch_add(&g_ooms, 1);
                continue;
            }
            if (rc != GM_OK) {
                fail("gm_malloc(%llu) = %s: %s", (unsigned long long)size, gm_status_name(rc), gm_last_error_detail());
                break;
            }
            slot s = {ptr, size, (uint32_t)(ptr >> 8) ^ (uint32_t)atomic_fetch_add(&g_gen, 1) * 2654435761u, stream};
            if (cu.cuMemsetD32Async(ptr, s.pattern, size / 4, stream)) fail("fill of 0x%llx failed", (unsigned long long)ptr);
            atomic_fetch_add(&g_blocks, 1);
            pthread_mutex_lock(&g_lock);
            slot old = g_slot[k];
            g_slot[k] = s;
            pthread_mutex_unlock(&g_lock);
            if (old.ptr) release(&old, host, &rng);
        } else if (what < 900) {
            pthread_mutex_lock(&g_lock);
            slot s = g_slot[k];
            g_slot[k].ptr = 0;
            pthread_mutex_unlock(&g_lock);
            if (s.ptr) release(&s, host, &rng);
        } else if (what < 960) {
            int rc = gm_empty_cache(g_a, 0);
            if (rc != GM_OK) fail("gm_empty_cache = %s", gm_status_name(rc));
        } else {
            char err[512];
            if (gm_check(g_a, 0, err, sizeof err) != GM_OK) fail("gm_check: %s", err);
        }
    }
    free(host);
    return NULL;
}

static int soak(gm_backend *be, const char *conf, double seconds, double fraction) {
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256];
    if (gm_config_parse(&cfg, conf, err, sizeof err) != GM_OK) {
        fprintf(stderr, "soak_gpu: %s: %s\n", conf, err);
        return 1;
    }
    if (gm_allocator_create(&g_a, be, &cfg) != GM_OK || gm_set_memory_fraction(g_a, 0, fraction) != GM_OK) {
        fprintf(stderr, "soak_gpu: %s: %s\n", conf, gm_last_error_detail());
        return 1;
    }
    atomic_store(&g_ops, 0);
    atomic_store(&g_ooms, 0);
    atomic_store(&g_verified_bytes, 0);
    atomic_store(&g_blocks, 0);
    g_deadline = now_s() + seconds;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    uint32_t *host = malloc(MAX_BLOCK);
    uint64_t rng = 1;
    for (int k = 0; k < SLOTS && host; k++)
        if (g_slot[k].ptr) {
            release(&g_slot[k], host, &rng);
            g_slot[k].ptr = 0;
        }
    free(host);
    if (gm_empty_cache(g_a, 0) != GM_OK) fail("final empty_cache failed");
    char cerr[512];
    if (gm_check(g_a, 0, cerr, sizeof cerr) != GM_OK) fail("final gm_check: %s", cerr);
    gm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    gm_get_stats(g_a, 0, &st);
    if (st.allocation[GM_POOL_ALL].current != 0 || st.reserved_bytes[GM_POOL_ALL].current != 0)
        fail("after freeing everything: %" PRId64 " blocks live, %" PRId64 " bytes reserved",
             st.allocation[GM_POOL_ALL].current, st.reserved_bytes[GM_POOL_ALL].current);
    gm_allocator_destroy(g_a);
    printf("%-40s %5.0f s %9" PRIu64 " ops %8" PRIu64 " blocks %7" PRIu64 " OOMs %9.1f GiB verified "
           "peak reserved %6.2f GiB  %s\n",
           conf, seconds, (uint64_t)g_ops, (uint64_t)g_blocks, (uint64_t)g_ooms,
           (double)g_verified_bytes / (1u << 30), (double)st.reserved_bytes[GM_POOL_ALL].peak / (1u << 30),
           atomic_load(&g_bad) ? "FAIL" : "ok");
    fflush(stdout);
    return atomic_load(&g_bad) ? 1 : 0;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 20;
    double fraction = argc > 2 ? atof(argv[2]) : 0.05;
    void *dl = dlopen("libcuda.so.1", RTLD_NOW);
    if (!dl) {
        printf("soak_gpu: no libcuda.so.1: skipped\n");
        return 77;
    }
#define LOAD(f, name)                                                          \
    if (!(*(void **)&cu.f = dlsym(dl, name))) {                                \
        printf("soak_gpu: %s missing\n", name);                                \
        return 1;                                                              \
    }
    LOAD(cuInit, "cuInit") LOAD(cuDeviceGet, "cuDeviceGet")
    LOAD(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
    LOAD(cuCtxSetCurrent, "cuCtxSetCurrent") LOAD(cuStreamCreate, "cuStreamCreate")
    LOAD(cuStreamSynchronize, "cuStreamSynchronize") LOAD(cuMemsetD32Async, "cuMemsetD32Async")
    LOAD(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
    CUdevice dev;
    if (cu.cuInit(0) || cu.cuDeviceGet(&dev, 0) || cu.cuDevicePrimaryCtxRetain(&g_ctx, dev) ||
        cu.cuCtxSetCurrent(g_ctx)) {
        printf("soak_gpu: no usable GPU: skipped\n");
        return 77;
    }
    for (int i = 0; i < THREADS * STREAMS; i++)
        if (cu.cuStreamCreate(&g_streams[i], 1 /* non-blocking */)) {
            printf("soak_gpu: cuStreamCreate failed\n");
            return 1;
        }
    gm_backend *be;
    if (gm_cuda_create(&be) != GM_OK) {
        printf("soak_gpu: %s: skipped\n", gm_last_error_detail());
        return 77;
    }
    printf("soak_gpu: %d threads x %d streams, %.0f s per policy, memory fraction %.3f\n", THREADS,
           STREAMS, seconds, fraction);
    const char *confs[] = {"policy:torch", "policy:torch,expandable_segments:True", "policy:gpumem"};
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) rc = soak(be, confs[i], seconds, fraction);
    if (rc) printf("soak_gpu: FAILED: %s\n", g_why);
    gm_backend_destroy(be);
    return rc;
}
