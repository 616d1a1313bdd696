/* test_hostile.c — regression tests for the defects a hostile probe found
 * (issue 15): sizes that wrap when rounded, trace events no device could
 * have made, and hostile trace files (hash flooding, length bombs,
 * overflowing times and sizes, non-events, bad gzip trailers). Each test
 * fails on the code before its fix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpumem/gpumem.h"
#include "internal.h"
#include "trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- defect 1: size wrap ---------------------------------------------------- */

static void check_refuses_huge(const char *conf) {
    gm_backend *be;
    assert_int_equal(gm_sim_create(&be, NULL), GM_OK);
    gm_config cfg;
    gm_config_init(&cfg);
    assert_int_equal(gm_config_parse(&cfg, conf, NULL, 0), GM_OK);
    gm_allocator *a;
    assert_int_equal(gm_allocator_create(&a, be, &cfg), GM_OK);
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 510, SIZE_MAX - ((size_t)1 << 20) + 1,
                           (size_t)1 << 63, (size_t)GM_LIMIT_ALLOC_BYTES + 1};
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
        gm_devptr p = 123;
        int rc = gm_malloc(a, 0, huge[i], 0, &p);
        if (rc != GM_ENOMEM)
            fail_msg("%s: gm_malloc(%zu) = %s, want GM_ENOMEM", conf, huge[i], gm_status_name(rc));
        assert_int_equal(p, 0);
        char err[256];
        if (gm_check(a, 0, err, sizeof err) != GM_OK) fail_msg("%s: gm_check: %s", conf, err);
    }
    /* the next allocations get distinct addresses */
    gm_devptr p1 = 0, p2 = 0;
    assert_int_equal(gm_malloc(a, 0, 1 << 20, 0, &p1), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 1 << 20, 0, &p2), GM_OK);
    assert_true(p1 && p2 && p1 != p2);
    char err[256];
    if (gm_check(a, 0, err, sizeof err) != GM_OK) fail_msg("%s: gm_check: %s", conf, err);
    gm_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    assert_int_equal(gm_get_stats(a, 0, &s), GM_OK);
    assert_int_equal(s.num_ooms, 5);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 2);
    assert_int_equal(gm_free(a, p1), GM_OK);
    assert_int_equal(gm_free(a, p2), GM_OK);
    gm_allocator_destroy(a);
    gm_backend_destroy(be);
}

static void test_size_wrap(void **state) {
    (void)state;
    check_refuses_huge("policy:torch");
    check_refuses_huge("policy:torch,roundup_power2_divisions:4");
    check_refuses_huge("policy:torch,expandable_segments:True");
    check_refuses_huge("policy:gpumem");
}

/* ---- replay: events no device could have made --------------------------------- */

static void test_replay_bad_events(void **state) {
    (void)state;
    gm_trace_event ev[] = {
        {.addr = 0, .size = 4 << 20, .action = GM_TA_SEGMENT_ALLOC},          /* address 0 */
        {.addr = 4096, .size = 4 << 20, .action = GM_TA_SEGMENT_ALLOC},       /* misaligned */
        {.addr = 2 << 20, .size = UINT64_MAX, .action = GM_TA_SEGMENT_ALLOC}, /* size -1 */
        {.addr = 2 << 20, .size = 2 << 20, .action = GM_TA_SEGMENT_ALLOC},    /* fine */
        {.addr = 100, .size = UINT64_MAX, .action = GM_TA_ALLOC},              /* SIZE_MAX */
        {.addr = 300, .size = UINT64_MAX - 510, .action = GM_TA_ALLOC},
        {.addr = 200, .size = 10, .action = GM_TA_ALLOC},
        {.addr = 100, .size = UINT64_MAX, .action = GM_TA_FREE_COMPLETED},
        {.addr = 300, .size = UINT64_MAX - 510, .action = GM_TA_FREE_COMPLETED},
        {.addr = 200, .size = 10, .action = GM_TA_FREE_COMPLETED},
    };
    size_t n = sizeof ev / sizeof *ev;
    size_t off[2] = {0, n};
    gm_trace t = {.events = ev, .nevents = n, .ndevices = 1, .dev_off = off, .format = "test"};
    gm_replay_prog *p;
    assert_int_equal(gm_replay_compile(&t, 0, &p), GM_OK);
    const char *first = NULL;
    assert_int_equal(gm_replay_prog_bad_events(p, &first), 5);
    assert_non_null(strstr(first, "address 0"));
    assert_int_equal(gm_replay_prog_ops(p), 2);
    assert_int_equal(gm_replay_prog_peak_requested(p), 10); /* not wrapped into something tiny */
    gm_replay_result r;
    assert_int_equal(gm_replay_run(p, NULL, 0, &r), GM_OK);
    assert_int_equal(r.error, 0);
    assert_false(r.oom);
    assert_int_equal(r.bad_events, 5);
    assert_int_equal(r.allocs, 1);
    assert_int_equal(r.frees, 1);
    assert_int_equal(r.unknown_frees, 0);
    gm_replay_prog_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_wrap),
        cmocka_unit_test(test_replay_bad_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
