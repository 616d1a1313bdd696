/* blank-sample probe (issue 26, defect 12): a writer publishing as fast as it can, a cached reader sampling.
 * gcc -O2 -o p12 probe12.c -I$SRC/src -I$SRC/src/core -I$SRC/include -I$BUILD $BUILD/libgpumem.a -lpthread -ldl -lm -lz */
#include "internal.h"
#include "monitor/monitor.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static atomic_int stop;
static atomic_long updates;
static gm__publisher *P;
static void *writer(void *arg) {
    (void)arg;
    gm_stats s; memset(&s, 0, sizeof s); s.size = sizeof s;
    long n = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        s.allocated_bytes[GM_POOL_ALL].current = n;
        s.reserved_bytes[GM_POOL_ALL].current = 3 * n;
        gm__publisher_update(P, 0, &s);
        n++;
    }
    atomic_store(&updates, n);
    return NULL;
}
int main(int argc, char **argv) {
    int samples = argc > 1 ? atoi(argv[1]) : 20000;
    setenv("GPUMEM_SHM_TAG", "probe12", 1);
    gm_allocator *a = calloc(1, sizeof *a);
    a->ndevices = 1;
    pthread_mutex_init(&a->devices_lock, NULL);
    if (gm_allocator_publish(a, "probe") != 0) return 1;
    P = gm__allocator_publisher(a); /* before arch ed5a2d2: a->publisher */
    gm_stats s; memset(&s, 0, sizeof s); s.size = sizeof s;
    gm__publisher_update(P, 0, &s);
    pthread_t t; pthread_create(&t, NULL, writer, NULL);
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    gm__shm_cache *c = gm__shm_cache_create();
    int blank = 0, got = 0, bad = 0;
    for (int i = 0; i < samples; i++) {
        gm__scan_result r;
        gm__shm_scan_cached(c, &r, false);
        for (int k = 0; k < r.nprocs; k++) if (r.procs[k].pid == getpid()) {
            got++;
            if (r.procs[k].torn[0]) blank++;
            else if (r.procs[k].v[0].reserved != 3 * r.procs[k].v[0].allocated) bad++;
        }
        gm__scan_result_free(&r);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    atomic_store(&stop, 1); pthread_join(t, NULL);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("samples %d, blank %d (%.2f%%), inconsistent %d, writer %.2f M updates/s, %.1f us/sample\n", got, blank,
           100.0 * blank / (got ? got : 1), bad, (double)atomic_load(&updates) / sec / 1e6, sec / samples * 1e6);
    gm_allocator_unpublish(a);
    return 0;
}
