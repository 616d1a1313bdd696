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
#include "monitor/monitor.h"
#include "util/idmap.h"
#include "trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static char *src_path(const char *rel) {
    const char *s = getenv("GPUMEM_SOURCE");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", s ? s : ".", rel);
    return buf;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void expect_format_error(const void *data, size_t len, const char *words) {
    gm_trace *t = (gm_trace *)1;
    int rc = gm__trace_load_mem(data, len, &t);
    if (rc != GM_EFORMAT) fail_msg("want GM_EFORMAT (%s), got %s", words, gm_status_name(rc));
    assert_null(t);
    if (!strstr(gm_last_error_detail(), words))
        fail_msg("error '%s' does not say '%s'", gm_last_error_detail(), words);
}

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
    assert_int_equal(gm__replay_compile(&t, 0, &p), GM_OK);
    const char *first = NULL;
    assert_int_equal(gm__replay_prog_bad_events(p, &first), 5);
    assert_non_null(strstr(first, "address 0"));
    assert_int_equal(gm__replay_prog_ops(p), 2);
    assert_int_equal(gm__replay_prog_peak_requested(p), 10); /* not wrapped into something tiny */
    gm_replay_result r;
    assert_int_equal(gm__replay_run(p, NULL, 0, &r), GM_OK);
    assert_int_equal(r.error, 0);
    assert_false(r.oom);
    assert_int_equal(r.bad_events, 5);
    assert_int_equal(r.allocs, 1);
    assert_int_equal(r.frees, 1);
    assert_int_equal(r.unknown_frees, 0);
    gm__replay_prog_free(p);
}

/* ---- defect 2: hash flooding --------------------------------------------------- */

/* Addresses that all shared one home slot under the old fixed hash
 * ((k * C) >> 20 for any table up to 2^24 slots): k = (i << 44) * C^-1. */
static uint64_t flood_key(uint64_t i) {
    const uint64_t c = 0x9E3779B97F4A7C15ull;
    uint64_t inv = c; /* Newton: inv = c^-1 mod 2^64 */
    for (int k = 0; k < 6; k++) inv *= 2 - c * inv;
    return (i << 44) * inv;
}

static void test_hash_flooding(void **state) {
    (void)state;
    gm__idmap m = {0};
    assert_int_equal(gm__idmap_reserve(&m, (size_t)1 << 20), GM_OK);
    uint8_t *hit = calloc(m.cap, 1);
    assert_non_null(hit);
    size_t distinct = 0, n = 200000;
    for (uint64_t i = 1; i <= n; i++) {
        size_t h = gm__idmap_home(&m, flood_key(i));
        distinct += !hit[h];
        hit[h] = 1;
    }
    free(hit);
    gm__idmap_free(&m);
    /* random homes: ~91% distinct in 2^20 slots; the old hash: 1 */
    if (distinct < n / 2) fail_msg("%zu crafted keys share %zu home slots", n, distinct);
    /* the 8-byte hash, unrolled, is SipHash of the key's bytes */
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t k = flood_key(i) ^ (i * 0x9E3779B97F4A7C15ull);
        assert_true(gm__hash_u64(k) == gm__hash_bytes(&k, sizeof k));
    }

    /* and the replay compiler takes such a trace in linear time */
    size_t nev = 200000;
    gm_trace_event *ev = calloc(nev, sizeof *ev);
    assert_non_null(ev);
    for (size_t i = 0; i < nev / 2; i++) {
        ev[i] = (gm_trace_event){.addr = flood_key(i + 1), .size = 512, .action = GM_TA_ALLOC};
        ev[nev / 2 + i] = (gm_trace_event){.addr = flood_key(i + 1), .size = 512,
                                           .action = GM_TA_FREE_COMPLETED};
    }
    size_t off[2] = {0, nev};
    gm_trace t = {.events = ev, .nevents = nev, .ndevices = 1, .dev_off = off, .format = "test"};
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(&t, 0, &p), GM_OK);
    assert_int_equal(gm__replay_prog_ops(p), nev);
    assert_int_equal(gm__replay_prog_peak_requested(p), 512 * (int64_t)(nev / 2));
    gm__replay_prog_free(p);
    free(ev);
}

/* ---- defect 3: .gmt bombs and trailing data -------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A gmt file whose body is `body` (compressed), header declaring `declared`. */
static uint8_t *make_gmt(const uint8_t *body, size_t n, uint64_t declared, size_t *len) {
    uLong bound = compressBound((uLong)n);
    uint8_t *o = malloc(24 + bound);
    assert_non_null(o);
    memcpy(o, GM_TRACE_MAGIC, 8);
    put_le(o + 8, GM_TRACE_VERSION, 4);
    put_le(o + 12, 0, 4);
    put_le(o + 16, declared, 8);
    uLongf clen = bound;
    assert_int_equal(compress2(o + 24, &clen, body, (uLong)n, 9), Z_OK);
    *len = 24 + clen;
    return o;
}

static void test_gmt_bomb(void **state) {
    (void)state;
    /* 64 MiB of zeros (~65 KB compressed): an empty trace followed by
     * nothing but zeros; was inflated whole and accepted as 0 events. The
     * body is decoded as it is inflated (issue 26), so it is refused at
     * body byte 7, one window inflated (tests/stress/test_work.c counts it). */
    size_t n = (size_t)64 << 20, len;
    uint8_t *zeros = calloc(n, 1);
    assert_non_null(zeros);
    uint8_t *f = make_gmt(zeros, n, n, &len);
    free(zeros);
    expect_format_error(f, len, "body byte 7: data after the trailer");
    free(f);
    /* a small body with bytes after its trailer */
    uint8_t body[64] = {0}; /* counts 0..0, trailer 0, then 40 zero bytes */
    f = make_gmt(body, sizeof body, sizeof body, &len);
    expect_format_error(f, len, "after the trailer");
    free(f);
    /* exactly the empty trace: fine */
    f = make_gmt(body, 7, 7, &len);
    gm_trace *t;
    assert_int_equal(gm__trace_load_mem(f, len, &t), GM_OK);
    assert_int_equal(t->nevents, 0);
    gm__trace_free(t);
    /* bytes after the compressed stream */
    uint8_t *g = realloc(f, len + 3);
    assert_non_null(g);
    memcpy(g + len, "xyz", 3);
    expect_format_error(g, len + 3, "after its compressed body");
    free(g);
}

/* ---- defect 4: times that overflow a signed difference ------------------------------ */

static void test_gmt_extreme_times(void **state) {
    (void)state;
    const int64_t times[] = {INT64_MIN, INT64_MAX, 0, -5, INT64_MAX, INT64_MIN + 1, 42};
    size_t n = sizeof times / sizeof *times;
    gm__trace_builder *b = gm__tb_new();
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) {
        gm_trace_event e = {.addr = i % 2 ? UINT64_MAX : 0, .size = UINT64_MAX - i,
                            .time_us = times[i], .action = GM_TA_SEGMENT_FREE};
        assert_int_equal(gm__tb_event(b, &e), GM_OK);
    }
    gm_trace *t;
    assert_int_equal(gm__tb_finish(b, "test", &t), GM_OK);
    uint8_t *buf;
    size_t len;
    assert_int_equal(gm__trace_encode_gmt(t, &buf, &len), GM_OK); /* UBSan: no overflow */
    gm_trace *t2;
    assert_int_equal(gm__trace_decode_gmt(buf, len, &t2), GM_OK);
    assert_int_equal(t2->nevents, n);
    for (size_t i = 0; i < n; i++) {
        assert_true(t2->events[i].time_us == times[i]);
        assert_true(t2->events[i].size == UINT64_MAX - i);
    }
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(t2, 0, &p), GM_OK);
    gm__replay_prog_free(p);
    free(buf);
    gm__trace_free(t2);
    gm__trace_free(t);
}

/* ---- defect 10: inputs that must be errors --------------------------------------------- */

static void test_snapshot_not_events(void **state) {
    (void)state;
    /* {'device_traces': [[R(), R()]], 'segments': []}, R.__reduce__ -> (print, ('x',)) */
    static const uint8_t pk[] =
        "\x80\x02\x7d\x71\x00\x28\x58\x0d\x00\x00\x00\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61"
        "\x63\x65\x73\x71\x01\x5d\x71\x02\x5d\x71\x03\x28\x63\x5f\x5f\x62\x75\x69\x6c\x74\x69"
        "\x6e\x5f\x5f\x0a\x70\x72\x69\x6e\x74\x0a\x71\x04\x58\x01\x00\x00\x00\x78\x71\x05\x85"
        "\x71\x06\x52\x71\x07\x68\x04\x68\x06\x52\x71\x08\x65\x61\x58\x08\x00\x00\x00\x73\x65"
        "\x67\x6d\x65\x6e\x74\x73\x71\x09\x5d\x71\x0a\x75\x2e";
    expect_format_error(pk, sizeof pk - 1, "none is an allocator event");
    /* and bytes after STOP */
    uint8_t more[sizeof pk + 1];
    memcpy(more, pk, sizeof pk - 1);
    more[sizeof pk - 1] = '.';
    expect_format_error(more, sizeof pk, "after the pickle's STOP");
}

static void test_gzip_trailer(void **state) {
    (void)state;
    size_t len;
    uint8_t *gz = read_all(src_path("tests/fuzz/corpus/snapshot.pickle.gz"), &len);
    gm_trace *t;
    assert_int_equal(gm__trace_load_mem(gz, len, &t), GM_OK);
    gm__trace_free(t);
    gz[len - 6] ^= 0x55; /* CRC-32 (bytes len-8..len-5) */
    expect_format_error(gz, len, "gzip stream is corrupt");
    gz[len - 6] ^= 0x55;
    gz[len - 2] ^= 0x01; /* ISIZE */
    expect_format_error(gz, len, "gzip stream is corrupt");
    gz[len - 2] ^= 0x01;
    expect_format_error(gz, len - 4, "gzip stream ends early");
    expect_format_error(gz, len / 2, "gzip stream ends early");
    free(gz);
}

/* ---- defect 10: the exporter's request targets -------------------------------------- */

static void test_http_targets(void **state) {
    (void)state;
    struct { const char *method, *target; int page; const char *decoded; } cases[] = {
        {"GET", "/metrics", GM_HTTP_METRICS, "/metrics"},
        {"HEAD", "/metrics", GM_HTTP_METRICS, "/metrics"},
        {"GET", "/%6detrics", GM_HTTP_METRICS, "/metrics"},
        {"GET", "/metrics%00", GM_HTTP_NOT_FOUND, "/metrics%00"},
        {"GET", "/metrics%00/x", GM_HTTP_NOT_FOUND, "/metrics%00/x"},
        {"GET", "/metrics%2", GM_HTTP_NOT_FOUND, "/metrics%2"},
        {"GET", "/metrics/", GM_HTTP_NOT_FOUND, "/metrics/"},
        {"GET", "/", GM_HTTP_INDEX, "/"},
        {"POST", "/metrics", GM_HTTP_BAD_METHOD, "/metrics"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", cases[i].target);
        size_t n = gm__http_unescape(buf);
        assert_int_equal(n, strlen(buf));
        assert_string_equal(buf, cases[i].decoded);
        if (gm__http_route(cases[i].method, buf) != cases[i].page)
            fail_msg("%s %s: page %d, want %d", cases[i].method, cases[i].target,
                     gm__http_route(cases[i].method, buf), cases[i].page);
    }
}

/* ---- limits: a trace file over the limit is refused before it is read ---------------- */

static void test_trace_file_limit(void **state) {
    (void)state;
    char path[] = "/tmp/gm_hostile_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    /* sparse: costs no disk, and must not be read */
    assert_int_equal(ftruncate(fd, (off_t)GM_LIMIT_TRACE_FILE_BYTES + 1), 0);
    close(fd);
    gm_trace *t = (gm_trace *)1;
    assert_int_equal(gm__trace_load_file(path, &t), GM_EFORMAT);
    assert_null(t);
    assert_non_null(strstr(gm_last_error_detail(), "GM_LIMIT_TRACE_FILE_BYTES"));
    unlink(path);
}

/* ---- replay: segment hints a trace cannot turn into quadratic work ------------------ */

static void test_hint_flood(void **state) {
    (void)state;
    /* 50k segment_alloc hints of one size at one address (all but the first
     * blocked once it is taken) and 50k of sizes never asked for, then 20k
     * allocs of that size: each malloc used to walk every blocked hint */
    size_t n = 50000, k = 0;
    gm_trace_event *ev = calloc(4 * n, sizeof *ev);
    assert_non_null(ev);
    for (size_t i = 0; i < n; i++) {
        ev[k++] = (gm_trace_event){.addr = 2 << 20, .size = 4 << 20, .action = GM_TA_SEGMENT_ALLOC};
        ev[k++] = (gm_trace_event){.addr = (uint64_t)(i + 8) << 21, .size = (uint64_t)(i + 1) << 21 | 4096,
                                   .action = GM_TA_SEGMENT_ALLOC};
    }
    size_t nalloc = 20000; /* 80 GiB: fits the default 141 GiB */
    for (size_t i = 0; i < nalloc; i++)
        ev[k++] = (gm_trace_event){.addr = 4096 * (i + 1), .size = 4 << 20, .action = GM_TA_ALLOC};
    size_t off[2] = {0, k};
    gm_trace t = {.events = ev, .nevents = k, .ndevices = 1, .dev_off = off, .format = "test"};
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(&t, 0, &p), GM_OK);
    gm_replay_result r;
    assert_int_equal(gm__replay_run(p, NULL, 0, &r), GM_OK);
    assert_int_equal(r.error, 0);
    assert_false(r.oom);
    assert_int_equal(r.allocs, nalloc);
    gm__replay_prog_free(p);
    free(ev);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hint_flood),
        cmocka_unit_test(test_trace_file_limit),
        cmocka_unit_test(test_http_targets),
        cmocka_unit_test(test_hash_flooding),
        cmocka_unit_test(test_gmt_bomb),
        cmocka_unit_test(test_gmt_extreme_times),
        cmocka_unit_test(test_snapshot_not_events),
        cmocka_unit_test(test_gzip_trailer),
        cmocka_unit_test(test_size_wrap),
        cmocka_unit_test(test_replay_bad_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
