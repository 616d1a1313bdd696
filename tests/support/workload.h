/* workload.h — the randomized workload shared by the property, stress and
 * fault-injection tests: a seeded RNG (so every failure can be replayed from
 * its seed), realistic allocation-size mixtures, and a model of the caller's
 * live allocations (an interval set of returned pointers) with a checker that
 * compares the model against the allocator's stats, its segments and the sim
 * backend's accounting.
 *
 * Everything here uses only the public API (gpumem.h, backend.h): the tests
 * must hold any policy to the same contract. */
#ifndef GM_TEST_WORKLOAD_H
#define GM_TEST_WORKLOAD_H

#include "gpumem/backend.h"
#include "gpumem/gpumem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WL_KIB ((uint64_t)1024)
#define WL_MIB (WL_KIB * 1024)
#define WL_GIB (WL_MIB * 1024)

/* ---- RNG: splitmix64, small and identical on every platform ------------- */

typedef struct wl_rng {
    uint64_t s;
} wl_rng;

void wl_seed(wl_rng *r, uint64_t seed);
uint64_t wl_next(wl_rng *r);
uint64_t wl_below(wl_rng *r, uint64_t n);            /* [0, n); 0 if n == 0 */
uint64_t wl_range(wl_rng *r, uint64_t lo, uint64_t hi); /* [lo, hi] */
double wl_unit(wl_rng *r);                           /* [0, 1) */
bool wl_chance(wl_rng *r, double p);

/* Seed from the environment variable `name` (decimal or 0x hex) when set,
 * else `dflt`: how a failing seed printed by a test is replayed. */
uint64_t wl_env_u64(const char *name, uint64_t dflt);

/* ---- size mixtures ------------------------------------------------------ */

/* Shares of small (< 1 MiB), medium (1 MiB .. 20 MiB) and large (20 MiB ..
 * large_max) requests; half of the requests repeat a "tensor shape" from a
 * palette drawn once per seed, as training steps do (that is what exercises
 * the cache), the rest are fresh log-uniform sizes. */
typedef struct wl_mix {
    double small, medium, large; /* relative weights */
    uint64_t large_max;          /* bytes */
    double repeat;               /* share of requests taken from the palette */
    uint64_t palette[64];
    int npalette;
} wl_mix;

void wl_mix_init(wl_mix *m, wl_rng *r, double small, double medium, double large,
                 uint64_t large_max);
uint64_t wl_size(wl_rng *r, const wl_mix *m);

/* ---- model of live allocations ------------------------------------------ */

typedef struct wl_block {
    gm_devptr ptr;
    uint64_t size; /* requested bytes */
    gm_stream stream;
    uint32_t recorded; /* test_property: bit s set after record_stream(ptr, s) */
} wl_block;

typedef struct wl_model {
    wl_block *live; /* sorted by ptr, never overlapping */
    size_t n, cap;
    uint64_t requested; /* sum of live sizes */
    gm_stats prev;      /* last stats seen, for peak monotonicity */
    bool have_prev;
    bool torch_pools;   /* check torch's rule: pool small iff size <= 1 MiB */
    int64_t ooms;       /* GM_ENOMEM returned to the caller so far */
} wl_model;

void wl_model_init(wl_model *m);
void wl_model_free(wl_model *m);
/* Insert a block the allocator returned. -1 (message in err) if it overlaps
 * a live block or ptr is 0 with size > 0. */
int wl_model_add(wl_model *m, gm_devptr ptr, uint64_t size, gm_stream stream, char *err,
                 size_t errlen);
/* Remove the block at index i (into live[]). */
void wl_model_remove_at(wl_model *m, size_t i, wl_block *out);
/* Index of the live block starting at ptr, or -1. */
long wl_model_find(const wl_model *m, gm_devptr ptr);

/* ---- invariant checks ---------------------------------------------------- */

enum {
    WL_CHECK_SIM_USED = 1, /* reserved == sim's total - free (skip while faults are armed) */
    WL_CHECK_PEAKS = 2,    /* peaks monotone since the last call / reset */
    WL_CHECK_SEGMENTS = 4, /* walk segments: no overlap, live blocks inside, sums */
    WL_CHECK_ALL = 7,
    /* with WL_CHECK_SEGMENTS: reserved may exceed the segments' mapped bytes
     * (memory held unmapped: gpumem's loose chunks, which a backend that
     * keeps refusing to release them leaves behind) */
    WL_CHECK_LOOSE = 8,
};

/* Every invariant the tests hold the allocator to, on device 0:
 *  - gm_check passes (the policy's own recount);
 *  - allocation.current == live count, requested_bytes.current == sum of
 *    live sizes (all pools; per pool through the segments the blocks lie in);
 *  - reserved >= allocated >= requested, per pool, and all == small + large;
 *  - current <= peak, peak monotone, allocated - freed == current;
 *  - num_ooms == the OOMs the caller saw;
 *  - segments disjoint, each live block inside one segment, sum of segment
 *    allocated_size == allocated_bytes, sum of mapped_size == reserved_bytes;
 *  - reserved_bytes == bytes the sim says are in use (total - free).
 * Returns 0, or -1 with the first broken invariant in err. */
int wl_check(gm_allocator *a, wl_model *m, unsigned flags, char *err, size_t errlen);
/* After gm_reset_peak_stats: every peak must equal its current value. */
int wl_check_peaks_reset(gm_allocator *a, wl_model *m, char *err, size_t errlen);

/* Free every live block of the model (through gm_free); -1 on a failed free. */
int wl_free_all(gm_allocator *a, wl_model *m, char *err, size_t errlen);

#endif /* GM_TEST_WORKLOAD_H */
