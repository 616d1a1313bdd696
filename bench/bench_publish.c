/* bench_publish.c — what monitoring costs.
 *  1. ns added per allocator operation by publishing: the same malloc/free
 *     workload on the sim backend with and without a publisher, interleaved
 *     rounds in one run (best round of each), plus the publisher hook alone.
 *  2. collector CPU at 1 sample/s with 8 devices (fake NVML) and 64 producer
 *     processes (64 segments with 8 devices each), as % of one core.
 * Reports numbers; never fails on timing. Build Release for real numbers. */
#include "internal.h"
#include "monitor/monitor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(clockid_t clk) {
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- 1. per-operation cost ------------------------------------------------ */

#define LIVE 64

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double workload(gm_allocator *a, int ops) {
    gm_devptr live[LIVE] = {0};
    uint32_t rng = 1;
    double t0 = now_s(CLOCK_THREAD_CPUTIME_ID); /* CPU time: other processes' load does not count */
    for (int i = 0; i < ops / 2; i++) {
        rng = rng * 1664525u + 1013904223u;
        int slot = (int)(rng >> 26) % LIVE; /* 0..63 */
        if (live[slot]) gm_free(a, live[slot]);
        size_t size = 512u << ((rng >> 8) % 12); /* 512 B .. 1 MiB */
        if (gm_malloc(a, 0, size, 0, &live[slot]) != GM_OK) live[slot] = 0;
    }
    double t = now_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    for (int i = 0; i < LIVE; i++)
        if (live[i]) gm_free(a, live[i]);
    return t * 1e9 / (double)ops;
}

static void bench_ops(void) {
    gm_sim_options so;
    gm_sim_options_init(&so);
    gm_backend *b;
    gm_allocator *a;
    if (gm_sim_create(&b, &so) != GM_OK || gm_allocator_create(&a, b, NULL) != GM_OK) {
        printf("publish cost: cannot create the sim allocator\n");
        return;
    }
    const int ops = 200000;
    enum { ROUNDS = 31 };
    workload(a, ops); /* warm the cache */
    double best_off = 1e9, best_on = 1e9, diff[ROUNDS];
    int rounds = 0;
    for (; rounds < ROUNDS; rounds++) {
        double off = workload(a, ops);
        if (gm_allocator_publish(a, "bench") != GM_OK) {
            printf("publish cost: gm_allocator_publish failed: %s\n", gm_last_error_detail());
            break;
        }
        double on = workload(a, ops);
        gm_allocator_unpublish(a);
        if (off < best_off) best_off = off;
        if (on < best_on) best_on = on;
        diff[rounds] = on - off;
    }
    qsort(diff, (size_t)rounds, sizeof diff[0], cmp_double);
    printf("allocator op (sim backend, default policy), %d paired rounds of %d ops, thread CPU time:\n", rounds, ops);
    printf("  without publishing  %7.1f ns/op (best)\n  with publishing     %7.1f ns/op (best)\n", best_off, best_on);
    if (rounds)
        printf("  added: %+.2f ns/op (difference of bests), %+.2f ns/op (median of paired differences)\n",
               best_on - best_off, diff[rounds / 2]);
    gm_allocator_destroy(a);
    gm_backend_destroy(b);

    /* the hook alone: what the front end calls after each stats change */
    gm_allocator *fake = calloc(1, sizeof *fake);
    pthread_mutex_init(&fake->devices_lock, NULL);
    if (gm_allocator_publish(fake, "hook") == GM_OK) {
        gm_stats s = {.size = sizeof s};
        const int n = 50000000;
        double t0 = now_s(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < n; i++) {
            s.allocated_bytes[0].current = i; /* as after an allocation */
            s.allocation[0].allocated = i;
            gm__publisher_update(fake->publisher, 0, &s);
        }
        double ns = (now_s(CLOCK_THREAD_CPUTIME_ID) - t0) * 1e9 / n;
        printf("  gm__publisher_update alone: %.2f ns/call (%d calls)\n", ns, n);
        gm_allocator_unpublish(fake);
    }
    pthread_mutex_destroy(&fake->devices_lock);
    free(fake);
}

/* ---- 2. collector CPU ------------------------------------------------------ */

#define NDEV 8
#define NPROC 64

static int f_ok(void) { return 0; }
static int f_driver(char *b, unsigned l) {
    snprintf(b, l, "550.54.15");
    return 0;
}
static int f_count(unsigned *c) {
    *c = NDEV;
    return 0;
}
static int f_handle(unsigned i, void **d) {
    *d = (void *)(uintptr_t)(i + 1);
    return 0;
}
static int f_name(void *d, char *b, unsigned l) {
    snprintf(b, l, "Simulated GPU");
    return 0;
}
static int f_uuid(void *d, char *b, unsigned l) {
    snprintf(b, l, "GPU-%08d", (int)(uintptr_t)d);
    return 0;
}
static int f_mem(void *d, void *m) {
    unsigned long long v[4] = {150ull << 30, 1ull << 30, 100ull << 30, 49ull << 30};
    memcpy((char *)m + 8, v, sizeof v);
    return 0;
}
static int f_util(void *d, void *u) {
    memset(u, 0, 8);
    return 0;
}
static int f_procs(void *d, unsigned *count, void *infos) {
    if (*count < NPROC) {
        *count = NPROC;
        return 7;
    }
    for (int i = 0; i < NPROC; i++) {
        uint32_t pid = (uint32_t)getpid();
        uint64_t used = 1ull << 30;
        memcpy((char *)infos + i * 24, &pid, 4);
        memcpy((char *)infos + i * 24 + 8, &used, 8);
    }
    *count = NPROC;
    return 0;
}

static void bench_collector(void) {
    gm__nvml_fns f = {.init = f_ok, .shutdown = f_ok, .driver_version = f_driver, .device_count = f_count,
                      .device_handle = f_handle, .device_name = f_name, .device_uuid = f_uuid,
                      .memory_v2 = f_mem, .utilization = f_util, .procs_v3 = f_procs};
    gm_allocator *prod[NPROC];
    gm_stats s = {.size = sizeof s};
    s.allocated_bytes[0].current = 1 << 20;
    int made = 0;
    for (; made < NPROC; made++) {
        prod[made] = calloc(1, sizeof *prod[made]);
        pthread_mutex_init(&prod[made]->devices_lock, NULL);
        if (gm_allocator_publish(prod[made], "producer") != GM_OK) break;
        for (int d = 0; d < NDEV; d++) gm__publisher_update(prod[made]->publisher, d, &s);
    }
    gm__collector *c;
    gm__collector_create(&c, &f, true);
    const int samples = 50;
    int rows = 0;
    double cpu0 = now_s(CLOCK_PROCESS_CPUTIME_ID), wall0 = now_s(CLOCK_MONOTONIC);
    for (int i = 0; i < samples; i++) {
        gm__mon_sample m;
        if (gm__collector_sample(c, &m) == GM_OK) {
            rows = m.nrows;
            gm__sbuf b = {0}; /* what the exporter does with each sample */
            gm__format_prometheus(&m, &b);
            gm__sbuf_free(&b);
            gm__sample_free(&m);
        }
    }
    double cpu = (now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0) / samples;
    double wall = (now_s(CLOCK_MONOTONIC) - wall0) / samples;
    printf("collector: %d producers x %d devices, %d NVML devices, %d rows per sample\n", made, NDEV, NDEV, rows);
    printf("  %.3f ms CPU per sample (%.3f ms wall) -> %.3f%% of a core at 1 sample/s, %.2f%% at 10/s\n",
           cpu * 1e3, wall * 1e3, cpu * 100.0, cpu * 1000.0);
    gm__collector_destroy(c);
    for (int i = 0; i < made; i++) {
        gm_allocator_unpublish(prod[i]);
        pthread_mutex_destroy(&prod[i]->devices_lock);
        free(prod[i]);
    }
    if (made < NPROC) free(prod[made]);
}

int main(void) {
    char tag[64];
    snprintf(tag, sizeof tag, "bench%d", (int)getpid());
    setenv("GPUMEM_SHM_TAG", tag, 1);
    bench_ops();
    bench_collector();
    return 0;
}
