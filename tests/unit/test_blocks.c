/* test_blocks.c — gm_block_lookup and gm_walk_blocks (what the PyTorch shim's
 * snapshot and profiler reports are built from), for both policies: sizes
 * agree with the stats, freed blocks disappear, a block waiting for a
 * recorded stream shows as not live, bad pointers are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"

#include <string.h>

#define MIB GM_TEST_MIB

typedef struct walk_acc {
    int n, not_live;
    uint64_t bytes, requested;
} walk_acc;

static int acc_cb(const gm_block_info *b, void *arg) {
    walk_acc *w = arg;
    assert_int_equal(b->size_of, sizeof *b);
    assert_true(b->size >= b->requested);
    w->n++;
    w->bytes += b->size;
    w->requested += b->requested;
    if (!b->live) w->not_live++;
    return 0;
}

static int stop_cb(const gm_block_info *b, void *arg) {
    (void)b;
    (*(int *)arg)++;
    return 7;
}

static void test_blocks(void **state) {
    gm_policy_kind k = *(gm_policy_kind *)*state;
    gm_backend *be;
    gm_allocator *a;
    assert_int_equal(gm_test_make(k, NULL, 0, true, &be, &a), GM_OK);
    gm_devptr p, q;
    assert_int_equal(gm_malloc(a, 0, 1000, 0, &p), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 5 * MIB + 3, 0, &q), GM_OK);
    gm_block_info bi;
    int dev = -1;
    assert_int_equal(gm_block_lookup(a, q, &dev, &bi), GM_OK);
    assert_int_equal(dev, 0);
    assert_true(bi.address == q);
    assert_int_equal(bi.requested, 5 * MIB + 3);
    assert_true(bi.size >= bi.requested);
    assert_int_equal(bi.pool, GM_POOL_LARGE);
    assert_true(bi.live);
    assert_int_equal(gm_block_lookup(a, q + 512, NULL, &bi), GM_EFOREIGN);
    assert_int_equal(gm_block_lookup(a, 0, NULL, &bi), GM_EFOREIGN);

    walk_acc w = {0};
    assert_int_equal(gm_walk_blocks(a, -1, acc_cb, &w), GM_OK);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(w.n, 2);
    assert_int_equal(w.not_live, 0);
    assert_int_equal((int64_t)w.bytes, s.allocated_bytes[GM_POOL_ALL].current);
    assert_int_equal((int64_t)w.requested, s.requested_bytes[GM_POOL_ALL].current);
    int calls = 0;
    assert_int_equal(gm_walk_blocks(a, 0, stop_cb, &calls), 7);
    assert_int_equal(calls, 1);
    assert_int_equal(gm_walk_blocks(a, 5, acc_cb, &w), GM_EDEVICE);

    /* used on stream 9, then freed: waits for stream 9, listed as not live */
    assert_int_equal(gm_record_stream(a, q, 9), GM_OK);
    assert_int_equal(gm_free(a, q), GM_OK);
    assert_int_equal(gm_block_lookup(a, q, NULL, &bi), GM_EFOREIGN);
    memset(&w, 0, sizeof w);
    assert_int_equal(gm_walk_blocks(a, 0, acc_cb, &w), GM_OK);
    assert_int_equal(w.n, 2);
    assert_int_equal(w.not_live, 1);
    assert_int_equal(gm_sim_complete_events(be, 0, UINT64_MAX), GM_OK);
    assert_int_equal(gm_free(a, p), GM_OK);
    assert_int_equal(gm_empty_cache(a, 0), GM_OK); /* finishes the waiting free */
    memset(&w, 0, sizeof w);
    assert_int_equal(gm_walk_blocks(a, -1, acc_cb, &w), GM_OK);
    assert_int_equal(w.n, 0);
    gm_test_destroy(be, a);
}

static gm_policy_kind k_torch = GM_POLICY_TORCH, k_gpumem = GM_POLICY_GPUMEM;

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_blocks, &k_torch),
        cmocka_unit_test_prestate(test_blocks, &k_gpumem),
    };
    return cmocka_run_group_tests_name("blocks", tests, NULL, NULL);
}
