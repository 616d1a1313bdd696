/* test_config.c — the PYTORCH_CUDA_ALLOC_CONF parser: every torch key with
 * its limits, policy:, errors that name key and value, atomicity (a bad string
 * applies nothing), and format/parse round trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"

#include <math.h>
#include <string.h>

#define MIB GM_TEST_MIB

static gm_config parse_ok(const char *s) {
    gm_config c;
    gm_config_init(&c);
    char err[256];
    int rc = gm_config_parse(&c, s, err, sizeof err);
    if (rc != GM_OK) fail_msg("parse '%s': %s", s, err);
    return c;
}

/* parse must fail, leave cfg unchanged, and mention `needle` */
static void parse_bad(const char *s, const char *needle) {
    gm_config c, before;
    gm_config_init(&c);
    c.expandable_segments = true; /* something non-default to compare */
    before = c;
    char err[256] = "";
    int rc = gm_config_parse(&c, s, err, sizeof err);
    if (rc != GM_ECONFIG) fail_msg("parse '%s' gave %s, expected GM_ECONFIG", s, gm_status_name(rc));
    if (memcmp(&c, &before, sizeof c)) fail_msg("parse '%s' changed the config", s);
    if (!strstr(err, needle)) fail_msg("parse '%s': error '%s' does not mention '%s'", s, err, needle);
    if (!strstr(gm_last_error_detail(), needle)) fail_msg("last error detail '%s'", gm_last_error_detail());
}

static void test_defaults(void **state) {
    gm_config c;
    gm_config_init(&c);
    assert_int_equal(c.size, sizeof c);
    assert_int_equal(c.policy, GM_POLICY_TORCH);
    assert_true(c.max_split_size == UINT64_MAX);
    assert_true(c.max_non_split_rounding == 20 * MIB);
    assert_true(c.garbage_collection_threshold == 0.0);
    assert_false(c.expandable_segments);
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++) assert_int_equal(c.roundup_power2_divisions[i], 0);
    assert_int_equal(c.pinned_num_register_threads, 1);
    assert_true(c.per_process_memory_fraction == 1.0);
    assert_string_equal(c.backend, "native");
    char buf[64];
    assert_int_equal(gm_config_format(&c, buf, sizeof buf), GM_OK);
    assert_string_equal(buf, "");
    /* NULL and "" are no-ops */
    assert_int_equal(gm_config_parse(&c, NULL, buf, sizeof buf), GM_OK);
    assert_int_equal(gm_config_parse(&c, "", buf, sizeof buf), GM_OK);
}

static void test_every_key(void **state) {
    gm_config c = parse_ok(
        "max_split_size_mb:128, max_non_split_rounding_mb:64,garbage_collection_threshold:0.6,"
        "roundup_power2_divisions:4,expandable_segments:True,release_lock_on_cudamalloc:True,"
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
        "pinned_use_background_threads:True,graph_capture_record_stream_reuse:True,"
        "per_process_memory_fraction:0.5,backend:cudaMallocAsync,pinned_reserve_segment_size_mb:16,"
        "policy:torch");
    assert_true(c.max_split_size == 128 * MIB);
    assert_true(c.max_non_split_rounding == 64 * MIB);
    assert_true(c.garbage_collection_threshold == 0.6);
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++) assert_int_equal(c.roundup_power2_divisions[i], 4);
    assert_true(c.expandable_segments && c.release_lock_on_cudamalloc && c.pinned_use_cuda_host_register);
    assert_int_equal(c.pinned_num_register_threads, 8);
    assert_true(c.pinned_use_background_threads && c.graph_capture_record_stream_reuse);
    assert_true(c.per_process_memory_fraction == 0.5);
    assert_string_equal(c.backend, "cudaMallocAsync");
    assert_int_equal(c.policy, GM_POLICY_TORCH);
    /* ROCm spellings torch also accepts */
    c = parse_ok("release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True");
    assert_true(c.release_lock_on_cudamalloc && c.pinned_use_cuda_host_register);
    c = parse_ok("expandable_segments:False,policy:torch,max_split_size_mb:20");
    assert_false(c.expandable_segments);
    assert_true(c.max_split_size == 20 * MIB); /* torch 2.11: >= 20 */
}

static void test_roundup_list(void **state) {
    gm_config c = parse_ok("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
    /* first entry fills the intervals below it (1 MiB .. 256 MiB -> 1) */
    for (int i = 0; i <= 8; i++) assert_int_equal(c.roundup_power2_divisions[i], 1);
    assert_int_equal(c.roundup_power2_divisions[9], 2);
    /* torch's '>' fills from the last named interval on, itself included */
    for (int i = 10; i < GM_ROUNDUP_INTERVALS; i++) assert_int_equal(c.roundup_power2_divisions[i], 8);
    c = parse_ok("roundup_power2_divisions:[1:4, 64:0 ,65536:2]");
    assert_int_equal(c.roundup_power2_divisions[0], 4);
    assert_int_equal(c.roundup_power2_divisions[1], 0); /* unnamed: stays at default */
    assert_int_equal(c.roundup_power2_divisions[6], 0);
    assert_int_equal(c.roundup_power2_divisions[15], 2); /* clamped to the last interval */
    c = parse_ok("roundup_power2_divisions:[>:16]");
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++) assert_int_equal(c.roundup_power2_divisions[i], 16);
}

static void test_bad(void **state) {
    parse_bad("foo:1", "foo");
    parse_bad("expandable_segments:True,bogus_key:3", "bogus_key");
    parse_bad("max_split_size_mb:19", "max_split_size_mb");
    parse_bad("max_split_size_mb:abc", "abc");
    parse_bad("max_split_size_mb:-5", "-5");
    parse_bad("max_non_split_rounding_mb:10", "max_non_split_rounding_mb");
    parse_bad("garbage_collection_threshold:1.0", "1.0");
    parse_bad("garbage_collection_threshold:0", "garbage_collection_threshold");
    parse_bad("garbage_collection_threshold:x", "x");
    parse_bad("roundup_power2_divisions:3", "3");
    parse_bad("roundup_power2_divisions:[256:3]", "3");
    parse_bad("roundup_power2_divisions:[100:2]", "100");
    parse_bad("roundup_power2_divisions:[256:2", "]");
    parse_bad("expandable_segments:true", "true");
    parse_bad("expandable_segments:1", "expandable_segments");
    parse_bad("expandable_segments", "expandable_segments");
    parse_bad("expandable_segments:", "expandable_segments");
    parse_bad("pinned_num_register_threads:3", "3");
    parse_bad("pinned_num_register_threads:256", "256");
    parse_bad("per_process_memory_fraction:1.5", "1.5");
    parse_bad("backend:cuda", "cuda");
    parse_bad("policy:best", "best");
    parse_bad("pinned_reserve_segment_size_mb:0", "pinned_reserve_segment_size_mb");
    parse_bad("expandable_segments:True expandable_segments:True", "expandable_segments");
    parse_bad(",", ",");
}

static void test_atomic(void **state) {
    gm_config c;
    gm_config_init(&c);
    c.max_split_size = 256 * MIB;
    gm_config before = c;
    char err[128];
    /* good keys before the bad one are not applied either */
    assert_int_equal(gm_config_parse(&c, "expandable_segments:True,policy:gpumem,gpumem_slack:-1", err,
                                     sizeof err),
                     GM_ECONFIG);
    assert_memory_equal(&c, &before, sizeof c);
    /* parsing is on top of the existing config */
    assert_int_equal(gm_config_parse(&c, "expandable_segments:True", err, sizeof err), GM_OK);
    assert_true(c.max_split_size == 256 * MIB && c.expandable_segments);
    /* errlen 0 is fine */
    assert_int_equal(gm_config_parse(&c, "nope:1", NULL, 0), GM_ECONFIG);
}

static void roundtrip(const char *s, const char *canonical) {
    gm_config c = parse_ok(s);
    char buf[512];
    assert_int_equal(gm_config_format(&c, buf, sizeof buf), GM_OK);
    if (canonical) assert_string_equal(buf, canonical);
    gm_config c2 = parse_ok(buf);
    assert_memory_equal(&c, &c2, sizeof c);
}

static void test_format(void **state) {
    roundtrip("expandable_segments:True", "expandable_segments:True");
    roundtrip("max_split_size_mb:128,garbage_collection_threshold:0.6,policy:torch",
              "max_split_size_mb:128,garbage_collection_threshold:0.6");
    roundtrip("gpumem_chunks:granule,gpumem_slack:0.25,policy:gpumem",
              "policy:gpumem,gpumem_slack:0.25,gpumem_chunks:granule");
    roundtrip("roundup_power2_divisions:4", "roundup_power2_divisions:4");
    roundtrip("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", NULL);
    roundtrip("roundup_power2_divisions:[1:4,64:0,65536:2]", NULL);
    roundtrip("per_process_memory_fraction:0.3,backend:cudaMallocAsync,pinned_num_register_threads:16,"
              "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,"
              "pinned_use_background_threads:True,graph_capture_record_stream_reuse:True,"
              "max_non_split_rounding_mb:40",
              NULL);
    /* too small a buffer: GM_ENOSPACE, terminated, no overflow */
    gm_config c = parse_ok("expandable_segments:True,max_split_size_mb:512");
    char small[8];
    memset(small, 'x', sizeof small);
    assert_int_equal(gm_config_format(&c, small, 5), GM_ENOSPACE);
    assert_int_equal(small[4], '\0');
    assert_int_equal(small[5], 'x');
}

/* gpumem_slack: a fraction >= 0 or inf; anything else names the key */
static void test_gpumem_slack(void **state) {
    gm_config c = parse_ok("policy:gpumem,gpumem_slack:0");
    assert_true(c.gpumem_slack == 0.0);
    c = parse_ok("policy:gpumem,gpumem_slack:0.05");
    assert_true(c.gpumem_slack == 0.05);
    c = parse_ok("policy:gpumem,gpumem_slack:inf");
    assert_true(isinf(c.gpumem_slack) && c.gpumem_slack > 0);
    c = parse_ok("policy:gpumem,gpumem_slack:3");
    assert_true(c.gpumem_slack == 3.0);
    parse_bad("policy:gpumem,gpumem_slack:-0.1", "gpumem_slack");
    parse_bad("policy:gpumem,gpumem_slack:x", "x");
    parse_bad("policy:gpumem,gpumem_slack:nan", "nan");
    parse_bad("policy:gpumem,gpumem_slack:-inf", "-inf");
    parse_bad("policy:gpumem,gpumem_slack:", "gpumem_slack");
    /* round trips, whatever the default is */
    roundtrip("policy:gpumem,gpumem_slack:0", NULL);
    roundtrip("policy:gpumem,gpumem_slack:0.02,policy:gpumem", NULL);
    roundtrip("policy:gpumem,gpumem_slack:inf", NULL);
    gm_config d;
    gm_config_init(&d);
    c = parse_ok(isinf(d.gpumem_slack) ? "policy:gpumem,gpumem_slack:0.01" : "policy:gpumem,gpumem_slack:inf");
    char buf[128];
    assert_int_equal(gm_config_format(&c, buf, sizeof buf), GM_OK);
    assert_non_null(strstr(buf, "gpumem_slack:"));
}

/* gpumem_chunks: auto (default), granule or run; anything else names the value */
static void test_gpumem_chunks(void **state) {
    (void)state;
    gm_config d;
    gm_config_init(&d);
    assert_int_equal(d.gpumem_chunks, GM_GPUMEM_CHUNKS_AUTO);
    gm_config c = parse_ok("policy:gpumem,gpumem_chunks:run");
    assert_int_equal(c.gpumem_chunks, GM_GPUMEM_CHUNKS_RUN);
    c = parse_ok("policy:gpumem,gpumem_chunks:granule");
    assert_int_equal(c.gpumem_chunks, GM_GPUMEM_CHUNKS_GRANULE);
    c = parse_ok("policy:gpumem,gpumem_chunks:run,gpumem_chunks:auto");
    assert_int_equal(c.gpumem_chunks, GM_GPUMEM_CHUNKS_AUTO);
    parse_bad("policy:gpumem,gpumem_chunks:runs", "runs");
    parse_bad("policy:gpumem,gpumem_chunks:1", "gpumem_chunks");
    parse_bad("policy:gpumem,gpumem_chunks:", "gpumem_chunks");
    roundtrip("policy:gpumem,gpumem_chunks:run", "policy:gpumem,gpumem_chunks:run");
    roundtrip("policy:gpumem,gpumem_chunks:granule", "policy:gpumem,gpumem_chunks:granule");
    roundtrip("policy:gpumem,gpumem_chunks:auto", "policy:gpumem"); /* the default is not written */
    roundtrip("policy:gpumem,gpumem_slack:inf,gpumem_chunks:run", NULL);
}

/* gpumem_plan: on (default) or off; anything else names the value.
 * gpumem_slack: auto (default), a number >= 0 or inf. */
static void test_gpumem_plan(void **state) {
    (void)state;
    gm_config d;
    gm_config_init(&d);
    assert_true(d.gpumem_plan);
    assert_true(d.gpumem_slack == GM_GPUMEM_SLACK_AUTO);
    roundtrip("policy:gpumem,gpumem_slack:auto", "policy:gpumem"); /* the default is not written */
    roundtrip("policy:gpumem,gpumem_slack:0", "policy:gpumem,gpumem_slack:0");
    parse_bad("policy:gpumem,gpumem_slack:-1", "-1"); /* auto's sentinel is no number a user may give */
    roundtrip("policy:gpumem,gpumem_plan:off", "policy:gpumem,gpumem_plan:off");
    gm_config c = parse_ok("policy:gpumem,gpumem_plan:on");
    assert_true(c.gpumem_plan);
    c = parse_ok("policy:gpumem,gpumem_plan:on,gpumem_plan:off");
    assert_false(c.gpumem_plan);
    parse_bad("policy:gpumem,gpumem_plan:True", "True");
    parse_bad("policy:gpumem,gpumem_plan:", "gpumem_plan");
    roundtrip("policy:gpumem,gpumem_plan:on", "policy:gpumem"); /* the default is not written */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpumem_plan),
        cmocka_unit_test(test_defaults), cmocka_unit_test(test_every_key), cmocka_unit_test(test_roundup_list),
        cmocka_unit_test(test_bad),      cmocka_unit_test(test_atomic),    cmocka_unit_test(test_format), cmocka_unit_test(test_gpumem_slack),
        cmocka_unit_test(test_gpumem_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
