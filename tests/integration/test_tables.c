/* test_tables.c — the policy and settings tables are the one source for
 * config, replay and tune: a policy added to the table (here, in the test
 * only) is accepted by the config parser, runs under replay and appears in
 * tune's ranking; every setting's default reads back as the table says;
 * keys of another policy are refused instead of ignored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"
#include "internal.h"
#include "policy/torch/torch.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>

/* A policy that is torch's under another name, with one tune setting. */
static const char *const dummy_tune[] = {"", NULL};
static gm__policy_desc dummy = {"dummy", &gm__policy_torch, "torch's placement under a test name", dummy_tune};

static gm_replay_prog *small_program(void) {
    gm__trace_builder *b = gm__tb_new();
    assert_non_null(b);
    for (uint64_t i = 0; i < 8; i++) {
        gm_trace_event e = {.addr = 0x100000 * (i + 1), .size = (i + 1) << 20, .action = GM_TA_ALLOC};
        assert_int_equal(gm__tb_event(b, &e), GM_OK);
    }
    for (uint64_t i = 0; i < 8; i += 2) {
        gm_trace_event e = {.addr = 0x100000 * (i + 1), .size = (i + 1) << 20, .action = GM_TA_FREE_COMPLETED};
        assert_int_equal(gm__tb_event(b, &e), GM_OK);
    }
    return gm_test_compile(b);
}

static void test_dummy_policy(void **state) {
    int kind = gm__policy_register(&dummy);
    assert_true(kind >= 2);
    assert_int_equal(gm_policy_find("dummy"), kind);
    assert_string_equal(gm_policy_name(kind), "dummy");

    /* config: accepted, formatted, and its name appears in the parser's error text */
    gm_config c;
    gm_config_init(&c);
    char err[256], buf[256];
    assert_int_equal(gm_config_parse(&c, "policy:dummy", err, sizeof err), GM_OK);
    assert_int_equal((int)c.policy, kind);
    assert_int_equal(gm_config_format(&c, buf, sizeof buf), GM_OK);
    assert_string_equal(buf, "policy:dummy");
    assert_int_equal(gm_config_parse(&c, "policy:nope", err, sizeof err), GM_ECONFIG);
    assert_non_null(strstr(err, "dummy"));

    /* replay: the same placements as torch's policy, since it is torch's ops */
    gm_replay_prog *p = small_program();
    gm_replay_result rd, rt;
    gm_config torch;
    gm_config_init(&torch);
    assert_int_equal(gm__replay_run(p, &c, 0, &rd), GM_OK);
    assert_int_equal(gm__replay_run(p, &torch, 0, &rt), GM_OK);
    assert_false(rd.oom);
    assert_true(rd.peak_reserved > 0 && rd.peak_reserved == rt.peak_reserved);

    /* tune: the dummy's setting is in the ranking, under its name */
    gm_tune_entry *e;
    int n;
    assert_int_equal(gm__tune_run(p, 1ull << 34, 2, &e, &n), GM_OK);
    bool found = false;
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].conf, "policy:dummy")) {
            found = true;
            assert_int_equal(e[i].rc, GM_OK);
            assert_true(e[i].r.peak_reserved == rt.peak_reserved);
        }
    assert_true(found);
    for (int i = 1; i < n; i++) /* ranked: those that fit by peak reserved */
        if (!gm__tune_failed(&e[i])) assert_true(e[i - 1].r.peak_reserved <= e[i].r.peak_reserved);
    free(e);
    gm__replay_prog_free(p);
    gm__policy_unregister_last();
    assert_int_equal(gm_policy_find("dummy"), -1);
}

static void test_setting_defaults(void **state) {
    gm_config c;
    gm_config_init(&c);
    assert_true(gm_setting_count() > 10);
    for (int i = 0; i < gm_setting_count(); i++) {
        gm_setting_desc s;
        char v[128];
        assert_int_equal(gm_setting_info(i, &s), GM_OK);
        assert_non_null(s.key);
        assert_non_null(s.doc);
        assert_int_equal(gm_config_get(&c, s.key, v, sizeof v), GM_OK);
        if (strcmp(v, s.def)) fail_msg("%s: default is '%s', the table says '%s'", s.key, v, s.def);
        if (s.alias) assert_int_equal(gm_config_get(&c, s.alias, v, sizeof v), GM_OK);
    }
    assert_int_equal(gm_setting_info(gm_setting_count(), &(gm_setting_desc){0}), GM_EINVAL);
    char v[8];
    assert_int_equal(gm_config_get(&c, "nope", v, sizeof v), GM_EINVAL);
}

/* Every key round-trips through get: set a non-default value, read it back. */
static void test_get_after_parse(void **state) {
    gm_config c;
    gm_config_init(&c);
    char err[200], v[128];
    assert_int_equal(gm_config_parse(&c, "policy:gpumem,gpumem_slack:0.5,gpumem_chunks:run", err, sizeof err),
                     GM_OK);
    assert_int_equal(gm_config_get(&c, "gpumem_slack", v, sizeof v), GM_OK);
    assert_string_equal(v, "0.5");
    assert_int_equal(gm_config_get(&c, "gpumem_chunks", v, sizeof v), GM_OK);
    assert_string_equal(v, "run");
    assert_int_equal(gm_config_get(&c, "policy", v, sizeof v), GM_OK);
    assert_string_equal(v, "gpumem");
}

static void test_cross_policy_keys(void **state) {
    gm_config c;
    gm_config_init(&c);
    char err[256];
    /* a gpumem key under the torch policy would be ignored: refused */
    assert_int_equal(gm_config_parse(&c, "gpumem_slack:0", err, sizeof err), GM_ECONFIG);
    assert_non_null(strstr(err, "policy:gpumem"));
    /* and a torch-only key under the gpumem policy */
    assert_int_equal(gm_config_parse(&c, "policy:gpumem,expandable_segments:True", err, sizeof err), GM_ECONFIG);
    assert_non_null(strstr(err, "expandable_segments"));
    /* keys of every policy are fine under either */
    assert_int_equal(gm_config_parse(&c, "policy:gpumem,per_process_memory_fraction:0.5", err, sizeof err), GM_OK);
    assert_int_equal(gm_config_parse(&c, "gpumem_slack:0,policy:gpumem", err, sizeof err), GM_OK);
    /* found by fuzz_config: more repeated keys than there are settings hid a later
     * key of the other policy from the check (and the canonical form then failed) */
    char many[1024] = "";
    for (int i = 0; i < 20; i++) strcat(many, "policy:gpumem,");
    strcat(many, "roundup_power2_divisions:4");
    assert_int_equal(gm_config_parse(&c, many, err, sizeof err), GM_ECONFIG);
    assert_non_null(strstr(err, "roundup_power2_divisions"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dummy_policy),
        cmocka_unit_test(test_setting_defaults),
        cmocka_unit_test(test_get_after_parse),
        cmocka_unit_test(test_cross_policy_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
