/* test_policy_gpumem_moves.c — the `gpumem` policy moving idle memory, on
 * the sim backend: when a move waits for its stream, which idle granule
 * moves, the warm-up's end keeping what it mapped under the reserve budget,
 * and where a large block goes when it needs mapping (va.c,
 * densest_window). The rest of the policy: test_policy_gpumem.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gpumem/backend.h"
#include "gpumem/gpumem.h"
#include "gm_test.h"

#define MIB GM_TEST_MIB

typedef struct probe {
    gm_devptr p;
    bool in;
} probe;

static int holds(const gm_segment_info *s, void *arg) {
    probe *x = arg;
    x->in |= x->p >= s->address && x->p < s->address + s->total_size;
    return 0;
}

/* The next of a small linear congruential sequence *x, as an integer in [0, n). */
static uint64_t draw(uint32_t *x, uint64_t n) {
    *x = *x * 1103515245u + 12345u;
    return (*x >> 16) % n;
}

/* Whether the granule at p is mapped: inside a segment (a mapped run). */
static bool mapped_at(gm_allocator *al, gm_devptr p) {
    probe x = {.p = p, .in = false};
    assert_int_equal(gm_walk_segments(al, 0, holds, &x), GM_OK);
    return x.in;
}

/* A moved chunk waits for its stream only when work that used it may still
 * be queued: one idle since before the stream's last sync moves without a
 * new one, even after other blocks were freed (the arena is dirty), and one
 * freed after that sync still waits (a GPU would otherwise unmap memory its
 * queued kernels use). slack 0 and no plan: every placement that needs a
 * granule moves the highest idle one. */
static void test_move_syncs_only_for_recent_frees(void **state) {
    (void)state;
    gm_backend *be;
    gm_allocator *al;
    assert_int_equal(
        gm_test_make(GM_POLICY_GPUMEM, "policy:gpumem,gpumem_slack:0,gpumem_plan:off", 1024 * MIB, false, &be, &al),
        GM_OK);
    /* x raises the peak of live granules by one, so that held memory can
     * stay at that peak below: a placement then moves rather than creates */
    gm_devptr x = gm_test_alloc(al, 2 * MIB, 0), sx = gm_test_alloc(al, 2 * MIB, 0);
    gm_devptr k0 = gm_test_alloc(al, 2 * MIB, 0), s0 = gm_test_alloc(al, 2 * MIB, 0),
              a1 = gm_test_alloc(al, 2 * MIB, 0);
    gm_devptr s1 = gm_test_alloc(al, 2 * MIB, 0), a2 = gm_test_alloc(al, 2 * MIB, 0);
    gm_devptr s2 = gm_test_alloc(al, 2 * MIB, 0), a3 = gm_test_alloc(al, 2 * MIB, 0);
    gm_devptr s3 = gm_test_alloc(al, 2 * MIB, 0);
    assert_int_equal(gm_free(al, x), GM_OK);
    assert_int_equal(gm_free(al, a1), GM_OK);
    assert_int_equal(gm_free(al, a2), GM_OK);
    assert_int_equal(gm_free(al, a3), GM_OK);
    uint64_t syncs = gm_backend_call_count(be, 0, GM_BCALL_EVENT_SYNC);
    uint64_t moves = gm_backend_call_count(be, 0, GM_BCALL_UNMAP);
    int64_t waits = gm_test_stats(al).num_stream_waits;
    /* two granules past the top: a3's and a2's move, after one sync */
    gm_devptr c1 = gm_test_alloc(al, 2 * MIB + MIB / 2, 0);
    assert_int_equal(gm_backend_call_count(be, 0, GM_BCALL_UNMAP), moves + 2);
    assert_int_equal(gm_backend_call_count(be, 0, GM_BCALL_EVENT_SYNC), syncs + 1);
    assert_int_equal(gm_free(al, k0), GM_OK); /* freed after that sync */
    /* one granule more: a1's, idle since before the sync, moves without one */
    gm_devptr c2 = gm_test_alloc(al, 3 * MIB, 0);
    assert_int_equal(gm_backend_call_count(be, 0, GM_BCALL_UNMAP), moves + 3);
    assert_int_equal(gm_backend_call_count(be, 0, GM_BCALL_EVENT_SYNC), syncs + 1);
    /* one granule more: the highest idle one is k0's, whose work may still
     * run, so it waits */
    gm_devptr c3 = gm_test_alloc(al, 2 * MIB + MIB / 4, 0);
    assert_int_equal(gm_backend_call_count(be, 0, GM_BCALL_UNMAP), moves + 4);
    assert_int_equal(gm_backend_call_count(be, 0, GM_BCALL_EVENT_SYNC), syncs + 2);
    assert_int_equal(gm_test_stats(al).num_stream_waits, waits + 2); /* memory_stats' num_stream_waits: the same two */
    gm_test_check(al);
    gm_devptr keep[] = {sx, s0, s1, s2, s3, c1, c2, c3};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) assert_int_equal(gm_free(al, keep[i]), GM_OK);
    gm_test_destroy(be, al);
}

/* Which idle granule a placement moves (chunks.c, take_le_but and its index
 * of idle one-granule chunks): the highest of its own arena's not under the
 * placement, across words of the index; with none there, another arena's,
 * the one idle longest first. slack 0 and no plan: every placement that
 * needs a granule past the peak moves one. */
static void test_move_picks_highest_idle(void **state) {
    (void)state;
    gm_backend *be;
    gm_allocator *al;
    assert_int_equal(
        gm_test_make(GM_POLICY_GPUMEM, "policy:gpumem,gpumem_slack:0,gpumem_plan:off", 1024 * MIB, false, &be, &al),
        GM_OK);
    enum { N = 150 }; /* granules 0..149 of stream 0's arena: three words of the index */
    gm_devptr b[N];
    for (int i = 0; i < N; i++) b[i] = gm_test_alloc(al, 2 * MIB, 0);
    for (int i = 1; i < N; i++) assert_int_equal(b[i], b[0] + (uint64_t)i * 2 * MIB);
    const int freed[] = {20, 5, 130, 70, N - 1}; /* idle in this order */
    for (size_t k = 0; k < sizeof freed / sizeof *freed; k++) assert_int_equal(gm_free(al, b[freed[k]]), GM_OK);
    gm_test_check(al);
    uint64_t unmaps = (uint64_t)gm_test_stats(al).num_unmap;
    assert_int_equal(gm_test_stats(al).num_phys_release, 0);
    /* at the top, over b[N-1]'s idle granule and two unmapped ones: that
     * one stays (the placement uses it), 130's and 70's move */
    gm_devptr top = gm_test_alloc(al, 6 * MIB, 0);
    assert_int_equal(top, b[N - 1]);
    assert_int_equal(gm_test_stats(al).num_unmap, unmaps + 2);
    assert_false(mapped_at(al, b[130]));
    assert_false(mapped_at(al, b[70]));
    assert_true(mapped_at(al, b[20]) && mapped_at(al, b[5]));
    gm_test_check(al);
    /* another stream's arena has no idle granule: 20's, idle longest, moves
     * first, then 5's */
    gm_devptr s1 = gm_test_alloc(al, 2 * MIB, 1);
    assert_false(mapped_at(al, b[20]));
    assert_true(mapped_at(al, b[5]));
    gm_devptr s2 = gm_test_alloc(al, 2 * MIB, 1);
    assert_false(mapped_at(al, b[5]));
    assert_int_equal(gm_test_stats(al).num_unmap, unmaps + 4);
    assert_int_equal(gm_test_stats(al).num_phys_release, 0); /* every one moved */
    gm_test_check(al);
    for (int i = 0; i < N - 1; i++)
        if (i != 5 && i != 20 && i != 70 && i != 130) assert_int_equal(gm_free(al, b[i]), GM_OK);
    assert_int_equal(gm_free(al, top), GM_OK);
    assert_int_equal(gm_free(al, s1), GM_OK);
    assert_int_equal(gm_free(al, s2), GM_OK);
    assert_int_equal(gm_empty_cache(al, 0), GM_OK);
    gm_test_check(al);
    gm_test_destroy(be, al);
    /* the index's words summed 64 to a word: idle granules 4201 and 0, one
     * summary word apart; at the top, over 4201's and two unmapped ones,
     * one granule moves (0's) and one is made */
    assert_int_equal(
        gm_test_make(GM_POLICY_GPUMEM, "policy:gpumem,gpumem_slack:0,gpumem_plan:off", 16384 * MIB, false, &be, &al),
        GM_OK);
    gm_devptr lo = gm_test_alloc(al, 2 * MIB, 0), mid = gm_test_alloc(al, 4200 * 2 * MIB, 0),
              hi = gm_test_alloc(al, 2 * MIB, 0);
    assert_int_equal(hi, lo + 4201 * 2 * MIB);
    assert_int_equal(gm_free(al, lo), GM_OK);
    assert_int_equal(gm_free(al, hi), GM_OK);
    unmaps = (uint64_t)gm_test_stats(al).num_unmap;
    int64_t releases = gm_test_stats(al).num_phys_release;
    assert_int_equal(gm_test_alloc(al, 6 * MIB, 0), hi);
    assert_int_equal(gm_test_stats(al).num_unmap, unmaps + 1);
    assert_int_equal(gm_test_stats(al).num_phys_release, releases); /* moved, not given back */
    assert_false(mapped_at(al, lo));
    gm_test_check(al);
    assert_int_equal(gm_free(al, mid), GM_OK);
    assert_int_equal(gm_free(al, hi), GM_OK);
    gm_test_destroy(be, al);
}

/* The default (gpumem_slack:auto) on steps whose sizes change every step
 * (no plan forms): the warm-up ends after PL_WARM allocations and keeps
 * what it mapped; the reserve budget moves it from then on. Nothing is
 * given back and made again, and the run holds within the budget. */
static void test_warmup_end_keeps_memory(void **state) {
    (void)state;
    gm_backend *be;
    gm_allocator *al;
    assert_int_equal(gm_test_make(GM_POLICY_GPUMEM, "policy:gpumem", 8192 * MIB, false, &be, &al), GM_OK);
    gm_devptr w = gm_test_alloc(al, 64 * MIB, 0); /* weights, live throughout */
    enum { P = 400, STEPS = 60 }; /* 24,000 allocations: past the warm-up */
    static gm_devptr blk[P];
    uint32_t x = 12345;
    for (int s = 0; s < STEPS; s++) {
        uint64_t len = 1 + draw(&x, 16); /* a new length every step */
        for (int k = 0; k < P; k++) blk[k] = gm_test_alloc(al, (uint64_t)(1 + k % 5) * len * 256 * 1024 + 2 * MIB, 0);
        for (int k = P - 1; k >= 0; k--) assert_int_equal(gm_free(al, blk[k]), GM_OK);
    }
    gm_test_check(al);
    gm_stats st = gm_test_stats(al);
    assert_int_equal(st.num_phys_release, 0);
    double ratio = (double)st.reserved_bytes[GM_POOL_ALL].peak / (double)st.allocated_bytes[GM_POOL_ALL].peak;
    print_message("whole run: %.4f x the peak allocated, %lld created\n", ratio, (long long)st.num_phys_create);
    assert_true(ratio <= 1.02);
    assert_int_equal(gm_free(al, w), GM_OK);
    gm_test_destroy(be, al);
}

/* Under the reserve budget, where no plan serves, a large block that needs
 * mapping goes where its free range holds the most mapped granules, not only
 * to the range's ends (va.c, densest_window). The low granules of a free
 * range moved to another stream's arena; the ones above are still mapped and
 * idle: a 95-granule block placed there needs fewer granules moved than at
 * the range's start. */
static void test_large_block_goes_over_mapped(void **state) {
    (void)state;
    gm_backend *be;
    gm_allocator *al;
    assert_int_equal(gm_test_make(GM_POLICY_GPUMEM, "policy:gpumem", 8192 * MIB, false, &be, &al), GM_OK);
    uint32_t x = 99;
    for (int i = 0; i < 17000; i++) { /* the warm-up ends (no plan: a new size each time) */
        gm_devptr p = gm_test_alloc(al, MIB + 512 * (1 + draw(&x, 1024)), 0);
        assert_int_equal(gm_free(al, p), GM_OK);
    }
    gm_devptr l = gm_test_alloc(al, 2 * MIB, 0); /* granule 0 */
    gm_devptr a = gm_test_alloc(al, 20 * MIB, 0), b = gm_test_alloc(al, 180 * MIB, 0);
    assert_int_equal(b, a + 20 * MIB);
    assert_int_equal(gm_free(al, a), GM_OK); /* idle first: the first to move to another arena */
    assert_int_equal(gm_free(al, b), GM_OK);
    gm_devptr other = gm_test_alloc(al, 20 * MIB, 1);
    assert_false(mapped_at(al, a));
    assert_true(mapped_at(al, b));
    enum { G = 200 };
    bool was[G]; /* granules 0..199 of stream 0's arena, mapped before the placement */
    for (int g = 0; g < G; g++) was[g] = mapped_at(al, l + (uint64_t)g * 2 * MIB);
    gm_devptr y = gm_test_alloc(al, 190 * MIB, 0);
    int g0 = (int)((y - l) / (2 * MIB)), at_start = 0, there = 0;
    assert_true(g0 + 95 <= G);
    for (int g = 1; g < 1 + 95; g++) at_start += !was[g];
    for (int g = g0; g < g0 + 95; g++) there += !was[g];
    print_message("at the range's start: %d granules to move; at granule %d: %d\n", at_start, g0, there);
    assert_true(there < at_start);
    gm_test_check(al);
    assert_int_equal(gm_free(al, y), GM_OK);
    assert_int_equal(gm_free(al, other), GM_OK);
    assert_int_equal(gm_free(al, l), GM_OK);
    gm_test_destroy(be, al);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_move_syncs_only_for_recent_frees),
        cmocka_unit_test(test_move_picks_highest_idle),
        cmocka_unit_test(test_warmup_end_keeps_memory),
        cmocka_unit_test(test_large_block_goes_over_mapped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
