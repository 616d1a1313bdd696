/* bench_history.c — what the allocation history (gm_history_enable) costs
 * per allocator operation: a trace's alloc/free stream replayed through
 * gm_malloc / gm_free on a warm allocator (sim backend, torch policy), in
 * paired rounds with the history off and on (order alternating each round;
 * the ring is smaller than a pass, so it wraps and drops as in a long run).
 * Prints ns/op off and on per round, and the median of the paired
 * differences. Target: < 20 ns/op (issue 13); results in bench/RESULTS.md.
 *
 * Usage: bench_history [--rounds N] [--passes N] [--ring N] [TRACE]
 *        (default TRACE: $GPUMEM_SHARED/traces/gpt2_small_adamw_bf16.pickle.gz,
 *        else examples/gpt2_small_train_bf16.pickle.gz)
 * Reports only; never fails on timing. */
#include "gpumem/gpumem.h"
#include "report/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct op {
    uint64_t size; /* 0 = free */
    uint32_t slot;
} op;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* ns per operation over `passes` passes */
static double run(gm_allocator *a, const op *ops, size_t n, gm_devptr *ptr, int passes) {
    uint64_t count = 0;
    double t0 = now_s();
    for (int p = 0; p < passes; p++)
        for (size_t i = 0; i < n; i++) {
            if (ops[i].size) gm_malloc(a, 0, ops[i].size, 0, &ptr[ops[i].slot]);
            else gm_free(a, ptr[ops[i].slot]), ptr[ops[i].slot] = 0;
            count++;
        }
    return (now_s() - t0) * 1e9 / (double)count;
}

int main(int argc, char **argv) {
    int rounds = 15, passes = 5;
    size_t ring = 20000;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ring") && i + 1 < argc) ring = (size_t)atol(argv[++i]);
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: bench_history [--rounds N] [--passes N] [--ring N] [TRACE]\n");
            return 2;
        } else path = argv[i];
    }
    char def[4096];
    if (!path) {
        const char *sh = getenv("GPUMEM_SHARED");
        snprintf(def, sizeof def, "%s/traces/gpt2_small_adamw_bf16.pickle.gz", sh ? sh : "../shared");
        path = access(def, R_OK) == 0 ? def : "examples/gpt2_small_train_bf16.pickle.gz";
    }
    gm_trace *t;
    gm_attribution *at;
    if (gm__trace_load_file(path, &t) || gm__attribute(t, 0, &at)) {
        fprintf(stderr, "bench_history: %s: %s\n", path, gm_last_error_detail());
        return 1;
    }
    /* the alloc/free stream, every block freed by the end of a pass */
    op *ops = malloc(2 * (at->nallocs + 1) * sizeof *ops);
    uint32_t *at_ev = malloc((at->nevents + 1) * sizeof *at_ev);
    gm_devptr *ptr = calloc(at->nallocs + 1, sizeof *ptr);
    size_t n = 0;
    for (size_t i = 0; i < at->nevents; i++) at_ev[i] = UINT32_MAX;
    for (size_t k = 0; k < at->nallocs; k++) {
        at_ev[at->allocs[k].ev] = (uint32_t)k;
        if (at->allocs[k].end != GM_ATTR_ALIVE) at_ev[at->allocs[k].end] = (uint32_t)k | 0x80000000u;
    }
    for (size_t i = 0; i < at->nevents; i++) {
        if (at_ev[i] == UINT32_MAX) continue;
        uint32_t k = at_ev[i] & 0x7fffffffu;
        if (!at->allocs[k].size) continue;
        ops[n++] = (op){at_ev[i] & 0x80000000u ? 0 : at->allocs[k].size, k};
    }
    for (size_t k = 0; k < at->nallocs; k++)
        if (at->allocs[k].end == GM_ATTR_ALIVE && at->allocs[k].size) ops[n++] = (op){0, (uint32_t)k};
    gm_backend *be;
    gm_allocator *a;
    if (gm_sim_create(&be, NULL) || gm_allocator_create(&a, be, NULL)) {
        fprintf(stderr, "bench_history: %s\n", gm_last_error_detail());
        return 1;
    }
    run(a, ops, n, ptr, 1); /* cold pass: segments made */
    double *off = malloc(rounds * sizeof *off), *on = malloc(rounds * sizeof *on),
           *diff = malloc(rounds * sizeof *diff);
    printf("trace %s: %zu ops a pass, %d passes a measurement, ring %zu entries\n", path, n, passes, ring);
    printf("round   off ns/op   on ns/op   on-off\n");
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            bool hist = (k == 0) == (r % 2 == 0);
            gm_history_enable(hist ? ring : 0);
            double v = run(a, ops, n, ptr, passes);
            if (hist) on[r] = v;
            else off[r] = v;
        }
        diff[r] = on[r] - off[r];
        printf("%5d %11.2f %10.2f %8.2f\n", r, off[r], on[r], diff[r]);
    }
    gm_history_enable(0);
    uint64_t rec, held, dropped;
    gm_history_counts(&rec, &held, &dropped);
    qsort(off, rounds, sizeof *off, cmp_d);
    qsort(on, rounds, sizeof *on, cmp_d);
    qsort(diff, rounds, sizeof *diff, cmp_d);
    printf("median: off %.2f ns/op, on %.2f ns/op, paired difference %.2f ns/op (last ring: %llu recorded, "
           "%llu dropped)\n",
           off[rounds / 2], on[rounds / 2], diff[rounds / 2], (unsigned long long)rec,
           (unsigned long long)dropped);
    free(off);
    free(on);
    free(diff);
    free(ops);
    free(at_ev);
    free(ptr);
    gm_allocator_destroy(a);
    gm_backend_destroy(be);
    gm__attribution_free(at);
    gm__trace_free(t);
    return 0;
}
