/* bench_pools.c — private pools at their most (issue 43, item 4): the time
 * to create 65,535 pools on one device (gm_pool_retain with new ids), and a
 * malloc + free of 1 MiB in the first pool and in the last, per policy, on
 * the sim backend. Before the pool index a lookup walked the pools: the last
 * pool's malloc + free cost ~100x the first's. Figures: bench/RESULTS.md.
 *
 *   build/bench/bench_pools [POOLS]      (default 65535, the most a device keeps) */
#include "gpumem/backend.h"
#include "gpumem/gpumem.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Mean microseconds of one malloc + free of 1 MiB in pool (id, 7). */
static double op_us(gm_allocator *a, uint64_t id) {
    enum { ROUNDS = 1000 };
    gm_devptr p;
    double t0 = now_s();
    for (int r = 0; r < ROUNDS; r++)
        if (gm_malloc_pool(a, 0, 1 << 20, 0, id, 7, &p) != GM_OK || gm_free(a, p) != GM_OK) return -1;
    return (now_s() - t0) * 1e6 / ROUNDS;
}

int main(int argc, char **argv) {
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 65535;
    const char *policy[] = {"policy:torch", "policy:gpumem"};
    for (int k = 0; k < 2; k++) {
        gm_sim_options o;
        gm_sim_options_init(&o);
        gm_backend *b;
        gm_allocator *a;
        gm_config c;
        gm_config_init(&c);
        if (gm_sim_create(&b, &o) != GM_OK || gm_config_parse(&c, policy[k], NULL, 0) != GM_OK ||
            gm_allocator_create(&a, b, &c) != GM_OK) {
            fprintf(stderr, "bench_pools: %s\n", gm_last_error_detail());
            return 1;
        }
        double t0 = now_s();
        for (uint64_t i = 1; i <= n; i++)
            if (gm_pool_retain(a, 0, i, 7) != GM_OK) {
                fprintf(stderr, "bench_pools: pool %llu: %s\n", (unsigned long long)i, gm_last_error_detail());
                return 1;
            }
        double create = now_s() - t0;
        op_us(a, 1); /* warm */
        op_us(a, n);
        printf("%-13s create %llu pools %.3f s; malloc+free 1 MiB: pool #1 %.3f us, pool #%llu %.3f us\n", policy[k],
               (unsigned long long)n, create, op_us(a, 1), (unsigned long long)n, op_us(a, n));
        gm_allocator_destroy(a);
        gm_backend_destroy(b);
    }
    return 0;
}
