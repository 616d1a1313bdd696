/* test_api_contract.c — the library's calling contract: gm_get_stats honours
 * out->size (an older, shorter gm_stats gets its prefix; an unset size is an
 * error that says what to do), and a call that succeeds leaves no stale
 * gm_last_error_detail() behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static void test_stats_size(void **state) {
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 1ull << 30, false, &b, &a), GM_OK);
    gm_devptr p;
    assert_int_equal(gm_malloc(a, 0, 4096, 0, &p), GM_OK);

    gm_stats s;
    memset(&s, 0, sizeof s); /* size 0: the caller forgot it */
    assert_int_equal(gm_get_stats(a, 0, &s), GM_EINVAL);
    assert_non_null(strstr(gm_last_error_detail(), "sizeof(gm_stats)"));
    s.size = sizeof s + 8; /* larger than this library knows */
    assert_int_equal(gm_get_stats(a, 0, &s), GM_EINVAL);

    /* an older caller whose gm_stats ended after allocated_bytes: only that prefix is written */
    size_t old = offsetof(gm_stats, allocated_bytes) + sizeof s.allocated_bytes;
    memset(&s, 0xAB, sizeof s);
    s.size = (uint32_t)old;
    assert_int_equal(gm_get_stats(a, 0, &s), GM_OK);
    assert_int_equal(s.size, old);
    assert_int_equal(s.allocated_bytes[GM_POOL_ALL].current, 4096);
    const unsigned char *tail = (const unsigned char *)&s + old;
    for (size_t i = 0; i < sizeof s - old; i++) assert_int_equal(tail[i], 0xAB);

    s.size = sizeof s;
    assert_int_equal(gm_get_stats(a, 0, &s), GM_OK);
    assert_int_equal(s.size, sizeof s);
    assert_int_equal(gm_free(a, p), GM_OK);
    gm_test_destroy(b, a);
}

static void test_error_cleared_on_success(void **state) {
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_GPUMEM, NULL, 1ull << 30, false, &b, &a), GM_OK);
    gm_devptr p;
    assert_int_equal(gm_malloc(a, 0, 4ull << 30, 0, &p), GM_ENOMEM); /* explained */
    assert_true(gm_last_error_detail()[0] != '\0');
    assert_int_equal(gm_malloc(a, 0, 1 << 20, 0, &p), GM_OK);
    assert_string_equal(gm_last_error_detail(), "");
    assert_int_equal(gm_free(a, 12345), GM_EFOREIGN);
    assert_true(gm_last_error_detail()[0] != '\0');
    gm_stats s = {.size = sizeof s};
    assert_int_equal(gm_get_stats(a, 0, &s), GM_OK);
    assert_string_equal(gm_last_error_detail(), "");
    gm_config c;
    gm_config_init(&c);
    char err[128];
    assert_int_equal(gm_config_parse(&c, "nope:1", err, sizeof err), GM_ECONFIG);
    assert_int_equal(gm_config_parse(&c, "expandable_segments:True", err, sizeof err), GM_OK);
    assert_string_equal(gm_last_error_detail(), "");
    assert_int_equal(gm_free(a, p), GM_OK);
    gm_test_destroy(b, a);
}

/* Details are per thread: another thread's failure and success leave this
 * one's as it was, and that thread's own success clears its own while this
 * one still holds a detail (util.h: the library counts the threads that
 * hold one). */
typedef struct detail_arg {
    gm_allocator *a;
    bool failed_had_detail, success_left_none;
} detail_arg;

static void *detail_thread(void *v) {
    detail_arg *t = v;
    gm_devptr p;
    t->failed_had_detail = gm_free(t->a, 777) == GM_EFOREIGN && gm_last_error_detail()[0] != '\0';
    t->success_left_none = gm_malloc(t->a, 0, 4096, 0, &p) == GM_OK && gm_last_error_detail()[0] == '\0' &&
                           gm_free(t->a, p) == GM_OK;
    return NULL;
}

static void test_error_detail_per_thread(void **state) {
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_GPUMEM, NULL, 1ull << 30, false, &b, &a), GM_OK);
    assert_int_equal(gm_free(a, 12345), GM_EFOREIGN); /* this thread holds a detail */
    char mine[256];
    snprintf(mine, sizeof mine, "%s", gm_last_error_detail());
    assert_true(mine[0] != '\0');
    for (int round = 0; round < 2; round++) {
        detail_arg t = {.a = a};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, detail_thread, &t), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        assert_true(t.failed_had_detail);
        assert_true(t.success_left_none);
        assert_string_equal(gm_last_error_detail(), mine); /* untouched by the other thread */
    }
    gm_devptr p;
    assert_int_equal(gm_malloc(a, 0, 4096, 0, &p), GM_OK);
    assert_string_equal(gm_last_error_detail(), "");
    assert_int_equal(gm_free(a, p), GM_OK);
    gm_test_destroy(b, a);
}

/* The OOM text names the policy in use and never advises switching to it. */
static void test_oom_names_policy(void **state) {
    for (int k = 0; k < 2; k++) {
        gm_backend *b;
        gm_allocator *a;
        assert_int_equal(gm_test_make(k ? GM_POLICY_GPUMEM : GM_POLICY_TORCH, NULL, 1ull << 30, false, &b, &a), GM_OK);
        gm_devptr p[8], big;
        for (int i = 0; i < 8; i++) assert_int_equal(gm_malloc(a, 0, 100ull << 20, 0, &p[i]), GM_OK);
        for (int i = 0; i < 8; i += 2) assert_int_equal(gm_free(a, p[i]), GM_OK); /* holes */
        assert_int_equal(gm_malloc(a, 0, 700ull << 20, 0, &big), GM_ENOMEM);
        const char *msg = gm_last_error_detail();
        assert_non_null(strstr(msg, k ? "policy gpumem" : "policy torch"));
        if (k) assert_null(strstr(msg, "GPUMEM_CONF=policy:gpumem"));
        assert_non_null(strstr(msg, "Tried to allocate"));
        for (int i = 1; i < 8; i += 2) assert_int_equal(gm_free(a, p[i]), GM_OK);
        gm_test_destroy(b, a);
    }
}

/* With categories set on live blocks the OOM text says what holds the memory
 * and which changes would have made the allocation fit, with their savings. */
static void test_oom_categories(void **state) {
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_GPUMEM, NULL, 1ull << 30, false, &b, &a), GM_OK);
    gm_devptr w, s1, s2, act, big;
    assert_int_equal(gm_malloc(a, 0, 100ull << 20, 0, &w), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 100ull << 20, 0, &s1), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 100ull << 20, 0, &s2), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 500ull << 20, 0, &act), GM_OK);
    assert_int_equal(gm_block_set_category(a, w, GM_CAT_PARAMETERS), GM_OK);
    assert_int_equal(gm_block_set_category(a, s1, GM_CAT_OPTIMIZER), GM_OK);
    assert_int_equal(gm_block_set_category(a, s2, GM_CAT_OPTIMIZER), GM_OK);
    assert_int_equal(gm_block_set_category(a, 12345, GM_CAT_OPTIMIZER), GM_EFOREIGN);
    assert_int_equal(gm_block_set_category(a, w, GM_CAT_COUNT), GM_EINVAL);
    assert_int_equal(gm_malloc(a, 0, 300ull << 20, 0, &big), GM_ENOMEM);
    const char *msg = gm_last_error_detail();
    assert_non_null(strstr(msg, "Tried to allocate"));
    assert_non_null(strstr(msg, "Held by category"));
    assert_non_null(strstr(msg, "optimizer_state 200.00 MiB"));
    assert_non_null(strstr(msg, "Changes that would have made it fit"));
    assert_non_null(strstr(msg, "checkpointing"));
    gm_devptr all[] = {w, s1, s2, act};
    for (int i = 0; i < 4; i++) assert_int_equal(gm_free(a, all[i]), GM_OK);
    gm_test_destroy(b, a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_size),
        cmocka_unit_test(test_error_cleared_on_success),
        cmocka_unit_test(test_error_detail_per_thread),
        cmocka_unit_test(test_oom_names_policy),
        cmocka_unit_test(test_oom_categories),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
