/* bench_publish.c — what monitoring costs.
 *  1. Headline: ns added per allocator operation by publishing. The same
 *     malloc/free workload on the sim backend with the publisher switched on
 *     and off, many short paired rounds in thread CPU time, order alternating;
 *     median of the paired differences with a 95% interval (issue 5's
 *     budget: 5 ns). Then the hook alone in a tight loop.
 *  2. Collector CPU at 1 sample/s with 8 devices (fake NVML) and 64 producer
 *     processes (64 segments with 8 devices each), as % of one core.
 * Reports numbers; never fails on timing. Build Release for real numbers.
 * `bench_publish [ROUNDS [OPS]]` (default 400 rounds of 20000 ops).
 *
 * Instruction counts, robust where timing is noisy (a loaded machine):
 *   bench_publish count hook N | count ops-on N | count ops-off N
 * runs one untimed piece; under `valgrind --tool=callgrind` the difference
 * of two N gives instructions per hook call, and ops-on minus ops-off over
 * N gives instructions added per allocator op, e.g.
 *   ir() { valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out "$@" \
 *          >/dev/null 2>&1; callgrind_annotate /tmp/cg.out | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}'; }
 *   echo $(( ($(ir ./bench_publish count ops-on 200000) - $(ir ./bench_publish count ops-off 200000)) / 200000 )) */
#include "internal.h"
#include "monitor/monitor.h"

#include <math.h>
#include <stdbool.h>
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

/* ops/2 frees and ops/2 mallocs of 512 B .. 1 MiB with 64 live slots, the
 * same sequence every call; returns thread CPU ns per op (other processes'
 * load does not count) or 0 when untimed. Ends with everything freed. */
static double workload(gm_allocator *a, int ops, bool timed) {
    gm_devptr live[LIVE] = {0};
    uint32_t rng = 1;
    double t0 = timed ? now_s(CLOCK_THREAD_CPUTIME_ID) : 0;
    for (int i = 0; i < ops / 2; i++) {
        rng = rng * 1664525u + 1013904223u;
        int slot = (int)(rng >> 26) % LIVE; /* 0..63 */
        if (live[slot]) gm_free(a, live[slot]);
        size_t size = 512u << ((rng >> 8) % 12); /* 512 B .. 1 MiB */
        if (gm_malloc(a, 0, size, 0, &live[slot]) != GM_OK) live[slot] = 0;
    }
    double t = timed ? now_s(CLOCK_THREAD_CPUTIME_ID) - t0 : 0;
    for (int i = 0; i < LIVE; i++)
        if (live[i]) gm_free(a, live[i]);
    return t * 1e9 / (double)ops;
}

/* The paired difference of the k-th order statistics around the median that
 * bound a 95% confidence interval for it (distribution-free: ranks
 * n/2 -+ 1.96 sqrt(n)/2 of the sorted differences). */
static void median_ci(const double *sorted, int n, double *lo, double *hi) {
    int k = (int)(0.98 * sqrt((double)n) + 0.5);
    int l = n / 2 - k, h = n / 2 + k;
    *lo = sorted[l < 0 ? 0 : l];
    *hi = sorted[h >= n ? n - 1 : h];
}

/* Publishing on vs off on one allocator: the publisher is made once and
 * switched by its pointer between rounds (what the front end tests before
 * each hook call), so a round costs no shm_open. Rounds are short and many,
 * the order inside each pair alternates so drift cancels, and the headline
 * is the median of the paired differences with its 95% interval. */
static void bench_ops(int rounds, int ops) {
    gm_sim_options so;
    gm_sim_options_init(&so);
    gm_backend *b;
    gm_allocator *a;
    if (gm_sim_create(&b, &so) != GM_OK || gm_allocator_create(&a, b, NULL) != GM_OK) {
        printf("publish cost: cannot create the sim allocator\n");
        return;
    }
    if (gm_allocator_publish(a, "bench") != GM_OK) {
        printf("publish cost: gm_allocator_publish failed: %s\n", gm_last_error_detail());
        return;
    }
    gm__sink *pub = gm__sink_get(a);
    double *diff = calloc((size_t)rounds, sizeof *diff), *offs = calloc((size_t)rounds, sizeof *offs);
    double best_off = 1e9, best_on = 1e9, sum = 0, sum2 = 0;
    for (int i = 0; i < 3; i++) workload(a, ops, false); /* warm caches and pools */
    for (int r = 0; r < rounds; r++) {
        double t[2]; /* [0] off, [1] on */
        for (int k = 0; k < 2; k++) {
            int on = (r & 1) ? 1 - k : k;
            gm__sink_set(a, on ? pub : NULL); /* single-threaded: no lock needed */
            t[on] = workload(a, ops, true);
        }
        diff[r] = t[1] - t[0];
        offs[r] = t[0];
        sum += diff[r];
        sum2 += diff[r] * diff[r];
        if (t[0] < best_off) best_off = t[0];
        if (t[1] < best_on) best_on = t[1];
    }
    gm__sink_set(a, pub);
    qsort(diff, (size_t)rounds, sizeof diff[0], cmp_double);
    qsort(offs, (size_t)rounds, sizeof offs[0], cmp_double);
    double lo, hi, mean = sum / rounds, sd = sqrt(fmax(0, sum2 / rounds - mean * mean));
    median_ci(diff, rounds, &lo, &hi);
    printf("PUBLISHING ADDS %+.2f ns per allocator op (median of %d paired rounds of %d ops; "
           "95%% CI of the median [%+.2f, %+.2f]; budget 5 ns)\n", diff[rounds / 2], rounds, ops, lo, hi);
    printf("  paired differences: mean %+.2f, sd %.2f, stderr %.2f ns; quartiles [%+.2f, %+.2f]\n", mean, sd,
           sd / sqrt((double)rounds), diff[rounds / 4], diff[3 * rounds / 4]);
    printf("  allocator op (sim backend, default policy), thread CPU time: median %.1f ns without; "
           "best %.1f ns without, %.1f ns with\n", offs[rounds / 2], best_off, best_on);
    free(diff);
    free(offs);
    gm_allocator_destroy(a); /* closes the publisher */
    gm_backend_destroy(b);
}

/* The hook alone in a tight loop, right after stores to the stats it reads:
 * a worst case, not what an op pays (the headline). Its 16-byte loads of
 * fields stored 8 bytes at a time a few cycles earlier wait for those stores
 * to reach the cache (no store forwarding), which nothing else hides here;
 * inside an allocator op that wait overlaps the op's own work. */
static void bench_hook(int n) {
    gm_allocator *fake = calloc(1, sizeof *fake);
    pthread_mutex_init(&fake->devices_lock, NULL);
    if (gm_allocator_publish(fake, "hook") == GM_OK) {
        gm_stats s = {.size = sizeof s};
        double t0 = now_s(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < n; i++) {
            s.allocated_bytes[0].current = i; /* as after an allocation */
            s.allocation[0].allocated = i;
            gm__publisher_update(gm__allocator_publisher(fake), 0, &s);
        }
        double ns = (now_s(CLOCK_THREAD_CPUTIME_ID) - t0) * 1e9 / n;
        printf("  gm__publisher_update alone, tight loop right after the stats stores (worst case, not the headline): "
               "%.2f ns/call (%d calls)\n", ns, n);
        gm_allocator_unpublish(fake);
    }
    pthread_mutex_destroy(&fake->devices_lock);
    free(fake);
}

/* Untimed runs for instruction counts under callgrind (see the top). */
static int count_mode(const char *mode, int n) {
    if (!strcmp(mode, "hook")) {
        bench_hook(n);
        return 0;
    }
    bool on = !strcmp(mode, "ops-on");
    if (!on && strcmp(mode, "ops-off")) return 2;
    gm_sim_options so;
    gm_sim_options_init(&so);
    gm_backend *b;
    gm_allocator *a;
    if (gm_sim_create(&b, &so) != GM_OK || gm_allocator_create(&a, b, NULL) != GM_OK) return 1;
    if (on && gm_allocator_publish(a, "count") != GM_OK) return 1;
    workload(a, n, false);
    gm_allocator_destroy(a);
    gm_backend_destroy(b);
    return 0;
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
        for (int d = 0; d < NDEV; d++) gm__publisher_update(gm__allocator_publisher(prod[made]), d, &s);
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

int main(int argc, char **argv) {
    char tag[64];
    snprintf(tag, sizeof tag, "bench%d", (int)getpid());
    setenv("GPUMEM_SHM_TAG", tag, 1);
    if (argc == 4 && !strcmp(argv[1], "count")) return count_mode(argv[2], atoi(argv[3]));
    int rounds = argc > 1 ? atoi(argv[1]) : 400, ops = argc > 2 ? atoi(argv[2]) : 20000;
    if (rounds < 4 || ops < 2) {
        fprintf(stderr, "usage: bench_publish [ROUNDS>=4 [OPS>=2]] | count hook|ops-on|ops-off N\n");
        return 2;
    }
    bench_ops(rounds, ops);
    bench_hook(50000000);
    bench_collector();
    return 0;
}
