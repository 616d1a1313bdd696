/* gm_test.c — see gm_test.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"
#include "trace/trace.h"

#include <stdio.h>

int gm_test_make_opts(gm_policy_kind policy, const char *conf, const gm_sim_options *opts,
                      gm_backend **b, gm_allocator **a) {
    *b = NULL;
    *a = NULL;
    gm_config cfg;
    gm_config_init(&cfg);
    cfg.policy = policy;
    char err[256];
    int rc = gm_config_parse(&cfg, conf, err, sizeof err);
    if (rc != GM_OK) return rc;
    if ((rc = gm_sim_create(b, opts)) != GM_OK) return rc;
    if ((rc = gm_allocator_create(a, *b, &cfg)) != GM_OK) {
        gm_backend_destroy(*b);
        *b = NULL;
    }
    return rc;
}

int gm_test_make(gm_policy_kind policy, const char *conf, uint64_t capacity, bool manual_events,
                 gm_backend **b, gm_allocator **a) {
    gm_sim_options o;
    gm_sim_options_init(&o);
    if (capacity) o.capacity = capacity;
    o.events_manual = manual_events;
    return gm_test_make_opts(policy, conf, &o, b, a);
}

gm_devptr gm_test_alloc(gm_allocator *a, uint64_t size, gm_stream stream) {
    gm_devptr p = 0;
    int rc = gm_malloc(a, 0, size, stream, &p);
    if (rc != GM_OK) fail_msg("gm_malloc(%llu): %s %s", (unsigned long long)size, gm_status_name(rc),
                              gm_last_error_detail());
    assert_true(p != 0);
    return p;
}

void gm_test_destroy(gm_backend *b, gm_allocator *a) {
    gm_allocator_destroy(a);
    gm_backend_destroy(b);
}

void gm_test_check_at(gm_allocator *a, const char *file, int line) {
    char err[512];
    int rc = gm_check(a, -1, err, sizeof err);
    if (rc != GM_OK) {
        char msg[800];
        snprintf(msg, sizeof msg, "%s:%d: gm_check: %s (%s)", file, line, err, gm_status_name(rc));
        fail_msg("%s", msg);
    }
}

gm_stats gm_test_stats(gm_allocator *a) {
    gm_stats s = {.size = sizeof s};
    int rc = gm_get_stats(a, 0, &s);
    if (rc != GM_OK) fail_msg("gm_get_stats: %s", gm_status_name(rc));
    return s;
}

gm_replay_prog *gm_test_compile(gm__trace_builder *b) {
    gm_trace *t;
    assert_int_equal(gm__tb_finish(b, "test", &t), GM_OK);
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(t, 0, &p), GM_OK);
    gm__trace_free(t);
    return p;
}
