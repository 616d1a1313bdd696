/* mempool_test.h — what tests/integration/test_mempool.c and test_mempool_capture.c
 * share: the includes, an allocator on the sim backend for the policy the
 * test runs under (its prestate), OK() for a call that must succeed, and
 * the main that runs a file's tests under each policy. */
#ifndef GM_MEMPOOL_TEST_H
#define GM_MEMPOOL_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"
#include "gpumem/backend.h"
#include "policy/gpumem/plan/plan.h"
#include "report/report.h"
#include "trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIB GM_TEST_KIB
#define MIB GM_TEST_MIB

static inline gm_policy_kind kind_of(void **state) { return *(gm_policy_kind *)*state; }

static inline void make(void **state, bool manual, gm_backend **b, gm_allocator **a) {
    int rc = gm_test_make(kind_of(state), NULL, 0, manual, b, a);
    if (rc != GM_OK) fail_msg("gm_test_make: %s %s", gm_status_name(rc), gm_last_error_detail());
}

#define OK(call)                                                                                          \
    do {                                                                                                  \
        int rc_ = (call);                                                                                 \
        if (rc_ != GM_OK) fail_msg("%s: %s %s", #call, gm_status_name(rc_), gm_last_error_detail());    \
    } while (0)

static gm_policy_kind k_torch = GM_POLICY_TORCH, k_gpumem = GM_POLICY_GPUMEM;

/* Run one file's tests under each policy (GM_TEST_POLICY=torch or gpumem
 * runs one only); failed is what the file's other groups already counted. */
static inline int mempool_run(int failed, const struct CMUnitTest *torch, const struct CMUnitTest *gpumem,
                              size_t n) {
    const char *only = getenv("GM_TEST_POLICY");
    if (!only || !strcmp(only, "torch")) failed += _cmocka_run_group_tests("policy torch", torch, n, NULL, NULL);
    if (!only || !strcmp(only, "gpumem")) failed += _cmocka_run_group_tests("policy gpumem", gpumem, n, NULL, NULL);
    return failed;
}

#endif
