/* test_replay_steady.c — replay's steady-state figures: on a trace that
 * warms up with a large block and then repeats one step, the steady peak
 * requested is the step's (not the warm-up's), the whole-trace peaks are
 * unchanged by the split, the default gpumem policy makes no device call in
 * the steady state, and a bad fraction is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"
#include "trace/trace.h"

#define MB (1ull << 20)

static gm_replay_prog *warmup_then_steps(void) {
    gm__trace_builder *b = gm__tb_new();
    assert_non_null(b);
    gm_trace_event e = {.addr = 0x7f0000000000ull, .size = 300 * MB, .action = GM_TA_ALLOC};
    assert_int_equal(gm__tb_event(b, &e), GM_OK); /* warm-up: a big block, freed */
    e.action = GM_TA_FREE_COMPLETED;
    assert_int_equal(gm__tb_event(b, &e), GM_OK);
    for (int step = 0; step < 20; step++) {
        gm_trace_event a1 = {.addr = 0x100000000ull, .size = 100 * MB, .action = GM_TA_ALLOC};
        gm_trace_event a2 = {.addr = 0x200000000ull, .size = 50 * MB, .action = GM_TA_ALLOC};
        assert_int_equal(gm__tb_event(b, &a1), GM_OK);
        assert_int_equal(gm__tb_event(b, &a2), GM_OK);
        a1.action = a2.action = GM_TA_FREE_COMPLETED;
        assert_int_equal(gm__tb_event(b, &a2), GM_OK);
        assert_int_equal(gm__tb_event(b, &a1), GM_OK);
    }
    return gm_test_compile(b);
}

static void test_steady(void **state) {
    gm_replay_prog *p = warmup_then_steps();
    for (int k = 0; k < 2; k++) {
        gm_config c;
        gm_config_init(&c);
        c.policy = k ? GM_POLICY_GPUMEM : GM_POLICY_TORCH;
        gm_replay_result r;
        assert_int_equal(gm__replay_run(p, &c, 0, &r), GM_OK);
        assert_false(r.oom);
        assert_true(r.steady_started);
        assert_int_equal(r.peak_requested, 300 * MB);
        assert_int_equal(r.steady_peak_requested, 150 * MB);
        assert_true(r.steady_peak_reserved >= r.steady_peak_requested);
        assert_true(r.steady_peak_reserved <= r.peak_reserved);
        if (k) assert_int_equal(r.steady_device_calls, 0); /* gpumem default: warm steps make none */
        int64_t sum = 0;
        for (int i = 0; i < GM_REPLAY_CALL_KINDS; i++) sum += r.steady_calls[i];
        assert_int_equal(sum, r.steady_device_calls);
        /* the same whole-trace result whatever the split */
        gm_replay_result r0;
        assert_int_equal(gm__replay_run_steady(p, &c, 0, 0.0, &r0), GM_OK);
        assert_int_equal(r0.peak_reserved, r.peak_reserved);
        assert_int_equal(r0.steady_peak_requested, 300 * MB); /* from the start: the warm-up counts */
    }
    gm_replay_result r;
    assert_int_equal(gm__replay_run_steady(p, NULL, 0, 1.0, &r), GM_EINVAL);
    assert_int_equal(gm__replay_run_steady(p, NULL, 0, -0.1, &r), GM_EINVAL);
    gm__replay_prog_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_steady)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
