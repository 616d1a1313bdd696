/* test_filter.c — every cmocka test program takes GM_TEST_FILTER (run only
 * the cases matching a pattern, '*' and '?' wildcards) and GM_TEST_SKIP (skip
 * the cases matching one) from the environment, before main runs. That is how
 * tests/CMakeLists.txt splits a program into its fast cases (the default
 * test set) and its long ones (CTest label "long", run by CI and
 * `scripts/test.sh --all`), without each test's main knowing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

__attribute__((constructor)) static void gm_test_filter_from_env(void) {
    const char *only = getenv("GM_TEST_FILTER"), *skip = getenv("GM_TEST_SKIP");
    if (only && *only) cmocka_set_test_filter(only);
    if (skip && *skip) cmocka_set_skip_filter(skip);
}
