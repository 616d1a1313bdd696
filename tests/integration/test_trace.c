/* test_trace.c — the trace readers and the replay compiler: a small
 * snapshot pickled by Python (committed in tests/fuzz/corpus) in every
 * protocol and gzip'd, the gmt round trip, malformed gmt, the shared real
 * traces (skipped without $GPUMEM_SHARED), replay of unknown frees, and every
 * input the fuzzers ever crashed on (tests/fuzz/regressions). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpumem/gpumem.h"
#include "report/report.h"
#include "trace/trace.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *src_path(const char *rel) {
    const char *s = getenv("GPUMEM_SOURCE");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", s ? s : ".", rel);
    return buf;
}

static gm_trace *load(const char *path) {
    gm_trace *t = NULL;
    if (gm__trace_load_file(path, &t)) fail_msg("%s: %s", path, gm_last_error_detail());
    return t;
}

/* The corpus snapshot: segment_alloc, alloc, free_requested, free_completed,
 * oom; two frames f (x.py:3) and g (x.py:9) on the first two events. */
static void check_small(gm_trace *t) {
    assert_int_equal(t->nevents, 5);
    assert_int_equal(t->ndevices, 1);
    assert_int_equal(t->events[0].action, GM_TA_SEGMENT_ALLOC);
    assert_int_equal(t->events[1].action, GM_TA_ALLOC);
    assert_int_equal(t->events[1].size, 512);
    assert_int_equal(t->events[1].addr, 4096);
    assert_int_equal(t->events[3].action, GM_TA_FREE_COMPLETED);
    assert_int_equal(t->events[4].action, GM_TA_OOM);
    assert_int_equal(t->events[4].size, (uint64_t)1 << 40);
    assert_int_equal(t->nstacks, 1);
    assert_int_equal(t->events[0].stack, 1);
    assert_int_equal(t->events[1].stack, 1);
    assert_int_equal(t->events[2].stack, 0);
    uint32_t f0 = t->stack_frames[t->stack_off[0]], f1 = t->stack_frames[t->stack_off[0] + 1];
    assert_string_equal(t->strings[t->frames[f0].name], "f");
    assert_string_equal(t->strings[t->frames[f1].filename], "x.py");
    assert_int_equal(t->frames[f1].line, 9);
    assert_int_equal(t->nsegments, 1);
    assert_true(t->segments[0].large);
    assert_int_equal(t->segments[0].nblocks, 1);
    assert_true(t->has_settings);
    assert_string_equal(t->alloc_conf, "expandable_segments:True");
}

static void test_snapshot_protocols(void **s) {
    (void)s;
    const char *files[] = {"tests/fuzz/corpus/snapshot_p2.pickle", "tests/fuzz/corpus/snapshot_p3.pickle",
                           "tests/fuzz/corpus/snapshot_p4.pickle", "tests/fuzz/corpus/snapshot_p5.pickle",
                           "tests/fuzz/corpus/snapshot.pickle.gz", "tests/fuzz/corpus/snapshot.gmt"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        gm_trace *t = load(src_path(files[i]));
        check_small(t);
        assert_string_equal(t->format, strstr(files[i], ".gmt") ? "gmt" : "pytorch-snapshot");
        gm__trace_free(t);
    }
}

static void test_gmt_roundtrip_and_corruption(void **s) {
    (void)s;
    gm_trace *t = load(src_path("tests/fuzz/corpus/snapshot_p4.pickle"));
    uint8_t *buf;
    size_t len;
    assert_int_equal(gm__trace_encode_gmt(t, &buf, &len), GM_OK);
    gm_trace *t2;
    assert_int_equal(gm__trace_decode_gmt(buf, len, &t2), GM_OK);
    check_small(t2);
    assert_memory_equal(t->events, t2->events, t->nevents * sizeof *t->events);
    gm__trace_free(t2);
    /* every truncation and a flipped byte in each position: clean errors */
    for (size_t n = 0; n < len; n++) {
        t2 = (gm_trace *)1;
        assert_int_equal(gm__trace_decode_gmt(buf, n, &t2), GM_EFORMAT);
        assert_null(t2);
    }
    for (size_t i = 0; i < len; i++) {
        buf[i] ^= 0x5A;
        if (gm__trace_decode_gmt(buf, len, &t2) == GM_OK) gm__trace_free(t2);
        buf[i] ^= 0x5A;
    }
    buf[8] = 99; /* version */
    assert_int_equal(gm__trace_decode_gmt(buf, len, &t2), GM_EFORMAT);
    assert_non_null(strstr(gm_last_error_detail(), "version"));
    free(buf);
    gm__trace_free(t);
}

static void test_not_a_snapshot(void **s) {
    (void)s;
    gm_trace *t;
    static const uint8_t list[] = "\x80\x02]\x94.";
    assert_int_equal(gm__trace_load_mem(list, sizeof list - 1, &t), GM_EFORMAT);
    assert_non_null(strstr(gm_last_error_detail(), "not a dict"));
    static const uint8_t d[] = "\x80\x02}\x94.";
    assert_int_equal(gm__trace_load_mem(d, sizeof d - 1, &t), GM_EFORMAT);
    assert_non_null(strstr(gm_last_error_detail(), "device_traces"));
    assert_int_equal(gm__trace_load_file("/nonexistent/x.pickle", &t), GM_EIO);
}

/* Events: alloc A, free of an unknown address, alloc A again while live,
 * free A: one unknown free, one double alloc, peak = both allocs. */
static void test_compile_anomalies(void **s) {
    (void)s;
    gm_trace_event ev[4] = {
        {.addr = 100, .size = 10, .action = GM_TA_ALLOC},
        {.addr = 555, .size = 1, .action = GM_TA_FREE_COMPLETED},
        {.addr = 100, .size = 20, .action = GM_TA_ALLOC},
        {.addr = 100, .size = 20, .action = GM_TA_FREE_COMPLETED},
    };
    size_t off[2] = {0, 4};
    gm_trace t = {.events = ev, .nevents = 4, .ndevices = 1, .dev_off = off, .format = "test"};
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(&t, 0, &p), GM_OK);
    assert_int_equal(gm__replay_prog_ops(p), 3);
    assert_int_equal(gm__replay_prog_peak_requested(p), 30);
    gm_replay_result r;
    assert_int_equal(gm__replay_run(p, NULL, 0, &r), GM_OK);
    assert_int_equal(r.unknown_frees, 1);
    assert_int_equal(r.double_allocs, 1);
    assert_false(r.oom);
    assert_int_equal(r.peak_requested, 30);
    gm__replay_prog_free(p);
    assert_int_equal(gm__replay_compile(&t, 1, &p), GM_EDEVICE);
    assert_null(p);
}

static void test_shared_traces(void **s) {
    (void)s;
    const char *sh = getenv("GPUMEM_SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/traces/resnet50_sgd_amp.pickle.gz", sh ? sh : "/nonexistent");
    FILE *f = fopen(path, "rb");
    if (!f) {
        print_message("skip: %s absent\n", path);
        skip();
    }
    fclose(f);
    gm_trace *t = load(path);
    assert_int_equal(t->nevents, 10961);
    size_t counts[GM_TA_COUNT] = {0};
    for (size_t i = 0; i < t->nevents; i++) counts[t->events[i].action]++;
    assert_int_equal(counts[GM_TA_ALLOC], 3618);
    assert_int_equal(counts[GM_TA_FREE_COMPLETED], 3615);
    assert_int_equal(counts[GM_TA_SEGMENT_ALLOC], 113);
    assert_int_equal(t->nsegments, 113);
    assert_true(t->nstacks > 0);
    assert_string_equal(t->alloc_conf, "");
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(t, 0, &p), GM_OK);
    assert_int_equal(gm__replay_prog_peak_requested(p), 6057040924); /* baselines.json */
    gm__replay_prog_free(p);
    gm__trace_free(t);
}

/* Every committed fuzzer crash input: must load or fail cleanly, and one
 * that loads goes through replay's compiler and the report's attribution,
 * as in the fuzz target (tests/fuzz/fuzz_trace.c). */
static void test_fuzz_regressions(void **s) {
    (void)s;
    const char *dir = src_path("tests/fuzz/regressions");
    char dpath[4096];
    snprintf(dpath, sizeof dpath, "%s", dir);
    DIR *d = opendir(dpath);
    if (!d) skip();
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dpath, e->d_name);
        gm_trace *t;
        if (gm__trace_load_file(p, &t) == GM_OK) {
            for (int dev = 0; dev < t->ndevices; dev++) {
                gm_replay_prog *pr;
                if (gm__replay_compile(t, dev, &pr) == GM_OK) gm__replay_prog_free(pr);
            }
            gm_attribution *a;
            if (gm__attribute(t, 0, &a) == GM_OK) gm__attribution_free(a);
            gm__trace_free(t);
        }
        n++;
    }
    closedir(d);
    print_message("%d regression inputs replayed\n", n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_protocols), cmocka_unit_test(test_gmt_roundtrip_and_corruption),
        cmocka_unit_test(test_not_a_snapshot),     cmocka_unit_test(test_compile_anomalies),
        cmocka_unit_test(test_shared_traces),      cmocka_unit_test(test_fuzz_regressions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
