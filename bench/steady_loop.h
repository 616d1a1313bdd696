/* steady_loop.h — the repeating part of a recorded training run, for the
 * replay benches (bench_hotpath.c, gpu_replay_bench.cpp; C and C++).
 *
 * Why: a warm pass that replays the whole trace again starts by building the
 * model anew, which no training loop does. An allocator that learns the
 * loop's step (gpumem's plan) sees the model's allocations where the step
 * should be, drops its plan and lays it out again in every pass, and after
 * a few passes stops trying (bench/RESULTS.md, 2026-12-03 fourth session).
 * Timing that measures the pass boundary, not a warm training step.
 *
 * What: the events [s, e) between two points of the trace's steady part
 * (from 30% on, past the last allocation that is never freed, up to the
 * last 5%: the run's end) where the same
 * number of blocks is live. Replayed again and again after one cold pass
 * over [0, e), they are a training loop that runs for ever:
 *  - a block allocated inside the loop and still live at e (carried out:
 *    the last step's loss, a gradient freed at the next zero_grad) is freed
 *    in the next pass where the loop frees a block allocated before s
 *    (carried in), pairing the two kinds in order of allocation;
 *  - passes alternate between two slot ranges (slot and slot + nslots), so
 *    a pass never allocates into a slot its predecessor's carried block
 *    still holds.
 * bench_loop_make fills loop->slot[p][i - s], the slot event i of the loop
 * uses in a pass of parity p (the cold pass uses the trace's own slots, and
 * the first loop pass after it has parity 1). Returns 0, or -1 when the
 * trace has no such part (or memory ran out): replay the whole trace then. */
#ifndef GPUMEM_BENCH_STEADY_LOOP_H
#define GPUMEM_BENCH_STEADY_LOOP_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct bench_loop {
    size_t s, e;        /* the loop: events [s, e) */
    uint32_t *slot[2];  /* per parity, e - s slots (0 .. 2 * nslots - 1) */
} bench_loop;

static inline void bench_loop_free(bench_loop *l) {
    free(l->slot[0]);
    free(l->slot[1]);
    l->slot[0] = l->slot[1] = NULL;
}

/* The loop's bounds: s where the fewest blocks are live in the first half of
 * the steady part (a step boundary), e the last point with as many before
 * the trace's last 5% (its end). live[i]: blocks live before event i, less
 * those never freed (perm). 0, or -1 when there is no loop of n / 10 events. */
static inline int bench_loop_bounds(size_t n, const uint32_t *live, size_t last_perm, size_t *s, size_t *e) {
    size_t from = n * 3 / 10 > last_perm ? n * 3 / 10 : last_perm, to = n - n / 20;
    *s = *e = n;
    for (size_t i = from; i < from + (to > from ? (to - from) / 2 : 0); i++)
        if (*s == n || live[i] < live[*s]) *s = i;
    for (size_t i = to; *s < n && i > *s; i--)
        if (live[i] == live[*s]) {
            *e = i;
            break;
        }
    return *s < n && *e < n && *e - *s >= n / 10 ? 0 : -1;
}

/* The renamed slots of l->slot[0..1], given the loop's bounds. in[]: births
 * (event numbers) of the blocks carried in, out[]: of those carried out;
 * born, seen: nslots entries of scratch. */
static inline int bench_loop_rename(const uint32_t *slot, const unsigned char *is_alloc, uint32_t nslots,
                                    bench_loop *l, size_t *in, size_t *out, size_t *born, unsigned char *seen) {
    size_t nin = 0, nout = 0;
    for (size_t i = 0; i < l->e; i++) {
        if (is_alloc[i]) born[slot[i]] = i;
        else if (i >= l->s && born[slot[i]] < l->s) in[nin++] = born[slot[i]];
    }
    for (uint32_t q = 0; q < nslots; q++) seen[q] = 0;
    for (size_t i = l->e; i-- > l->s;) /* born in the loop and not freed in it: live at e */
        if (!is_alloc[i]) seen[slot[i]] = 1;
        else {
            if (!seen[slot[i]]) out[nout++] = i;
            seen[slot[i]] = 0;
        }
    if (nin != nout) return -1;
    /* in[] is in order of the frees: sort by birth (insertion; a step carries few); out[] is backwards */
    for (size_t a = 1; a < nin; a++)
        for (size_t b = a; b > 0 && in[b - 1] > in[b]; b--) {
            size_t t = in[b];
            in[b] = in[b - 1];
            in[b - 1] = t;
        }
    for (size_t a = 0; a < nout / 2; a++) {
        size_t t = out[a];
        out[a] = out[nout - 1 - a];
        out[nout - 1 - a] = t;
    }
    for (int p = 0; p < 2; p++) {
        uint32_t here = p ? nslots : 0, prev = p ? 0 : nslots;
        for (size_t i = 0; i < l->e; i++) {
            if (is_alloc[i]) born[slot[i]] = i;
            if (i < l->s) continue;
            size_t b = born[slot[i]], lo = 0, hi = nin;
            if (is_alloc[i] || b >= l->s) {
                l->slot[p][i - l->s] = slot[i] + here;
                continue;
            }
            while (lo < hi) { /* carried in: the previous pass's carried-out block of the same rank */
                size_t mid = (lo + hi) / 2;
                if (in[mid] < b) lo = mid + 1;
                else hi = mid;
            }
            if (lo == nin || in[lo] != b) return -1;
            l->slot[p][i - l->s] = slot[out[lo]] + prev;
        }
    }
    return 0;
}

/* n events: slot[i] and is_alloc[i] (else a free of that slot's block);
 * slots may be reused after their block is freed. */
static inline int bench_loop_make(size_t n, const uint32_t *slot, const unsigned char *is_alloc, uint32_t nslots,
                                  bench_loop *l) {
    size_t ns = nslots ? nslots : 1, nn = n ? n : 1, last_perm = 0;
    size_t *born = (size_t *)malloc(ns * sizeof *born); /* event of the live block's alloc */
    unsigned char *seen = (unsigned char *)calloc(ns, 1);
    unsigned char *perm = (unsigned char *)calloc(nn, 1);
    uint32_t *live = (uint32_t *)malloc((n + 1) * sizeof *live);
    size_t *in = (size_t *)malloc(nn * sizeof *in), *out = (size_t *)malloc(nn * sizeof *out);
    int rc = born && seen && perm && live && in && out ? 0 : -1;
    l->slot[0] = l->slot[1] = NULL;
    for (size_t i = n; rc == 0 && i-- > 0;) { /* never freed: a free marks its slot until the alloc before it */
        if (slot[i] >= nslots) rc = -1;
        else if (!is_alloc[i]) seen[slot[i]] = 1;
        else {
            perm[i] = !seen[slot[i]];
            /* past the end of the loop's range: the last step's loss, left at exit */
            if (perm[i] && i + 1 > last_perm && i < n - n / 20) last_perm = i + 1;
            seen[slot[i]] = 0;
        }
    }
    if (rc == 0) {
        live[0] = 0;
        for (size_t i = 0; i < n; i++) live[i + 1] = live[i] + (is_alloc[i] ? !perm[i] : (uint32_t)-1);
        rc = bench_loop_bounds(n, live, last_perm, &l->s, &l->e);
    }
    if (rc == 0) {
        l->slot[0] = (uint32_t *)malloc((l->e - l->s) * sizeof(uint32_t));
        l->slot[1] = (uint32_t *)malloc((l->e - l->s) * sizeof(uint32_t));
        rc = l->slot[0] && l->slot[1] ? bench_loop_rename(slot, is_alloc, nslots, l, in, out, born, seen) : -1;
    }
    free(born);
    free(seen);
    free(perm);
    free(live);
    free(in);
    free(out);
    if (rc) bench_loop_free(l);
    return rc;
}

#endif
