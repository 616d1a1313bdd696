/* test_unpickle.c — the safe pickle reader on hand-made byte strings: every
 * supported opcode, memo handling, gzip input, globals that must stay opaque,
 * and malformed or truncated input (every prefix of a valid pickle) that
 * must fail with GM_EFORMAT and a byte offset, never crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpumem/gpumem.h"
#include "trace/pickle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define P(s) (const uint8_t *)(s), sizeof(s) - 1

static gm__pickle *load_ok(const uint8_t *d, size_t n) {
    gm__pickle *p = NULL;
    int rc = gm__pickle_load(d, n, NULL, &p);
    if (rc) fail_msg("load failed: %s", gm_last_error_detail());
    return p;
}

static void load_err(const uint8_t *d, size_t n, const char *needle) {
    gm__pickle *p = (gm__pickle *)1;
    int rc = gm__pickle_load(d, n, NULL, &p);
    assert_int_equal(rc, GM_EFORMAT);
    assert_null(p);
    const char *msg = gm_last_error_detail();
    if (!strstr(msg, "byte")) fail_msg("no byte offset in '%s'", msg);
    if (needle && !strstr(msg, needle)) fail_msg("'%s' not in '%s'", needle, msg);
}

static int64_t as_int(gm__pval v) {
    int64_t x = -999;
    assert_true(gm__pv_int(v, &x));
    return x;
}

static void test_ints(void **s) {
    (void)s;
    /* PROTO 2, ( K 7, M 0x1234, J -2, LONG1 2 bytes 0x80 0xff (= -128), LONG1 0, LONG4 */
    static const char pk[] = "\x80\x02(K\x07M\x34\x12J\xfe\xff\xff\xff\x8a\x02\x80\xff\x8a\x00"
                             "\x8b\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"
                             "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40l.";
    gm__pickle *p = load_ok(P(pk));
    gm__pval r = gm__pickle_root(p);
    assert_int_equal(gm__pv_type(r), GM__PT_LIST);
    assert_int_equal(gm__pv_len(r), 7);
    assert_int_equal(as_int(gm__pv_item(r, 0)), 7);
    assert_int_equal(as_int(gm__pv_item(r, 1)), 0x1234);
    assert_int_equal(as_int(gm__pv_item(r, 2)), -2);
    assert_int_equal(as_int(gm__pv_item(r, 3)), -128);
    assert_int_equal(as_int(gm__pv_item(r, 4)), 0);
    assert_int_equal(gm__pv_type(gm__pv_item(r, 5)), GM__PT_BIGINT); /* 2^64 */
    assert_int_equal(as_int(gm__pv_item(r, 6)), (int64_t)1 << 62);   /* boxed, not immediate */
    gm__pickle_free(p);
}

static void test_scalars(void **s) {
    (void)s;
    /* None True False float 1.5 str bytes(3 forms) tuple1-3 empty tuple */
    static const char pk[] = "\x80\x04\x95\x40\x00\x00\x00\x00\x00\x00\x00("
                             "N\x88\x89G\x3f\xf8\x00\x00\x00\x00\x00\x00"
                             "\x8c\x02hiX\x03\x00\x00\x00""abc\x8d\x01\x00\x00\x00\x00\x00\x00\x00z"
                             "C\x02\x00\x01""B\x01\x00\x00\x00xU\x01y"
                             "K\x01\x85K\x01K\x02\x86K\x01K\x02K\x03\x87)t.";
    gm__pickle *p = load_ok(P(pk));
    gm__pval r = gm__pickle_root(p);
    assert_int_equal(gm__pv_type(r), GM__PT_TUPLE);
    assert_int_equal(gm__pv_len(r), 14);
    assert_int_equal(gm__pv_type(gm__pv_item(r, 0)), GM__PT_NONE);
    bool b;
    assert_true(gm__pv_bool(gm__pv_item(r, 1), &b) && b);
    assert_true(gm__pv_bool(gm__pv_item(r, 2), &b) && !b);
    double f;
    assert_true(gm__pv_float(gm__pv_item(r, 3), &f));
    assert_true(f == 1.5);
    assert_string_equal(gm__pv_str(gm__pv_item(r, 4), NULL), "hi");
    assert_string_equal(gm__pv_str(gm__pv_item(r, 5), NULL), "abc");
    assert_string_equal(gm__pv_str(gm__pv_item(r, 6), NULL), "z");
    size_t n;
    const char *by = gm__pv_bytes(gm__pv_item(r, 7), &n);
    assert_int_equal(n, 2);
    assert_int_equal(by[1], 1);
    assert_string_equal(gm__pv_bytes(gm__pv_item(r, 8), NULL), "x");
    assert_string_equal(gm__pv_bytes(gm__pv_item(r, 9), NULL), "y");
    assert_int_equal(gm__pv_len(gm__pv_item(r, 10)), 1);
    assert_int_equal(gm__pv_len(gm__pv_item(r, 11)), 2);
    assert_int_equal(as_int(gm__pv_item(gm__pv_item(r, 12), 2)), 3);
    assert_int_equal(gm__pv_type(gm__pv_item(r, 13)), GM__PT_TUPLE);
    assert_null(gm__pv_str(gm__pv_item(r, 7), NULL)); /* bytes are not str */
    gm__pickle_free(p);
}

static void test_containers_memo(void **s) {
    (void)s;
    /* {'a': [1, 2, 3], 'b': 'a'(memo get), 'c': {...same list via BINGET}}
     * EMPTY_DICT MEMOIZE MARK 'a' MEMOIZE EMPTY_LIST BINPUT 5 MARK 1 2 APPENDS
     * K3 APPEND 'b' BINGET 1(? memo 1 = 'a') ... */
    static const char pk[] = "\x80\x04}\x94(\x8c\x01""a\x94]q\x05(K\x01K\x02""eK\x03""a"
                             "\x8c\x01""b\x94h\x01\x8c\x01""c\x94j\x05\x00\x00\x00u"
                             "\x8c\x01""d\x94(K\x01K\x02""dsb.";
    /* the trailing 'b' (BUILD) on a dict needs 2 values: dict and state */
    gm__pickle *p = NULL;
    int rc = gm__pickle_load(P(pk), NULL, &p);
    assert_int_equal(rc, GM_EFORMAT); /* BUILD with only the dict above the mark floor */
    static const char ok[] = "\x80\x04}\x94(\x8c\x01""a\x94]q\x05(K\x01K\x02""eK\x03""a"
                             "\x8c\x01""b\x94h\x01\x8c\x01""c\x94j\x05\x00\x00\x00u"
                             "\x8c\x01""d\x94(K\x01K\x02""ds\x8c\x01""e\x8f(K\x01\x90s"
                             "\x8c\x01""f(K\x09\x91s\x8c\x01g(K\x01K\x02\x8c\x01hK\x04""ds"
                             "\x8c\x01i(K\x05K\x06ts\x8c\x01j(K\x05K\x06ls.";
    p = load_ok(P(ok));
    gm__pval r = gm__pickle_root(p);
    assert_int_equal(gm__pv_type(r), GM__PT_DICT);
    gm__pval a = gm__pv_dict_get(r, "a");
    assert_int_equal(gm__pv_len(a), 3);
    assert_int_equal(as_int(gm__pv_item(a, 2)), 3);
    assert_string_equal(gm__pv_str(gm__pv_dict_get(r, "b"), NULL), "a");
    assert_true(gm__pv_dict_get(r, "c") == a); /* LONG_BINGET of the BINPUT list */
    gm__pval d = gm__pv_dict_get(r, "d");
    assert_int_equal(gm__pv_type(d), GM__PT_DICT);
    assert_int_equal(as_int(gm__pv_dict_val(d, 0)), 2);
    assert_int_equal(gm__pv_type(gm__pv_dict_get(r, "e")), GM__PT_SET);
    assert_int_equal(gm__pv_len(gm__pv_dict_get(r, "f")), 1);
    assert_string_equal(gm__pv_str(gm__pv_dict_key(gm__pv_dict_get(r, "g"), 1), NULL), "h");
    assert_int_equal(gm__pv_type(gm__pv_dict_get(r, "i")), GM__PT_TUPLE);
    assert_int_equal(gm__pv_type(gm__pv_dict_get(r, "j")), GM__PT_LIST);
    assert_int_equal(gm__pv_type(gm__pv_dict_get(r, "zz")), GM__PT_ABSENT);
    /* interning: both "a" strings are one object */
    assert_true(gm__pv_dict_key(r, 0) == gm__pv_dict_get(r, "b"));
    gm__pickle_free(p);
}

static void test_stack_ops(void **s) {
    (void)s;
    /* MARK K1 POP_MARK, K2 DUP TUPLE2, K3 POP ... -> (2, 2) */
    static const char pk[] = "\x80\x02(K\x01""1K\x02""2\x86K\x03""0.";
    gm__pickle *p = load_ok(P(pk));
    gm__pval r = gm__pickle_root(p);
    assert_int_equal(gm__pv_len(r), 2);
    assert_int_equal(as_int(gm__pv_item(r, 1)), 2);
    gm__pickle_free(p);
}

static void test_globals_opaque(void **s) {
    (void)s;
    /* GLOBAL os system, REDUCE ('ls',) -> opaque; STACK_GLOBAL + NEWOBJ; BUILD */
    static const char pk[] = "\x80\x02(cos\nsystem\n\x8c\x02ls\x85R"
                             "\x8c\x05torch\x8c\x04Size\x93)\x81}b"
                             "\x8c\x01m\x8c\x01n\x93)}\x92l.";
    gm__pickle *p = load_ok(P(pk));
    gm__pval r = gm__pickle_root(p);
    assert_int_equal(gm__pv_len(r), 3);
    assert_int_equal(gm__pv_type(gm__pv_item(r, 0)), GM__PT_OPAQUE);
    assert_string_equal(gm__pv_opaque_name(gm__pv_item(r, 0)), "os.system");
    assert_string_equal(gm__pv_opaque_name(gm__pv_item(r, 1)), "torch.Size");
    assert_string_equal(gm__pv_opaque_name(gm__pv_item(r, 2)), "m.n");
    gm__pickle_free(p);
    /* SETITEMS on an opaque (OrderedDict-style) is swallowed, not executed */
    static const char od[] = "\x80\x02\x63\x63ollections\nOrderedDict\n)R(K\x01K\x02u.";
    p = load_ok(P(od));
    assert_int_equal(gm__pv_type(gm__pickle_root(p)), GM__PT_OPAQUE);
    gm__pickle_free(p);
}

static void test_malformed(void **s) {
    (void)s;
    load_err(P("\x80\x02K\x01"), "STOP");                 /* no STOP */
    load_err(P("\x80\x09K\x01."), "protocol");            /* protocol 9 */
    load_err(P("\x80\x02\xff."), "unknown opcode");       /* bad opcode */
    load_err(P("\x80\x02."), "underflow");                /* STOP on empty stack */
    load_err(P("\x80\x02h\x03."), "memo");                /* missing memo key */
    load_err(P("\x80\x02j\xff\xff\xff\x7f."), "memo");    /* LONG_BINGET past the memo */
    load_err(P("\x80\x02K\x01\x94j\x01\x00\x00\x00."), "memo"); /* within it, never set */
    load_err(P("\x80\x02K\x01u."), "MARK");               /* SETITEMS without mark */
    load_err(P("\x80\x02](K\x01K\x02u."), "list");        /* SETITEMS on a list */
    load_err(P("\x80\x02}(K\x01u."), "odd");              /* odd items */
    load_err(P("\x80\x02X\xff\xff\xff\x7f"), "limit");    /* absurd length */
    load_err(P("\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff"), "limit");
    load_err(P("\x80\x02\x8b\xff\xff\xff\xff"), "negative");
    load_err(P("\x80\x02Q."), "not supported");           /* BINPERSID */
    load_err(P("\x80\x02I1\n."), "not supported");        /* protocol-0 INT */
    load_err(P("\x80\x02K\x01q\xff."), "memo index");     /* memo index beyond input */
    load_err(P("\x80\x02(\x86."), "underflow");           /* TUPLE2 across a MARK */
}

/* Every proper prefix of a valid pickle must fail cleanly with an offset. */
static void test_truncation(void **s) {
    (void)s;
    static const char ok[] = "\x80\x04\x95\x30\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x06""action"
                             "\x94\x8c\x05""alloc\x94\x8c\x04""addr\x94\x8a\x06\x00\x00\x20\x7f\x6b\x7f"
                             "\x8c\x04size\x94J\x00\x10\x00\x00\x8c\x01x]\x94(G\x3f\xf0\x00\x00\x00\x00"
                             "\x00\x00X\x01\x00\x00\x00qh\x01""eu.";
    gm__pickle *p = load_ok(P(ok));
    gm__pickle_free(p);
    for (size_t n = 0; n < sizeof ok - 1; n++) {
        uint8_t *cut = malloc(n ? n : 1); /* exact size: ASan catches over-reads */
        memcpy(cut, ok, n);
        p = (gm__pickle *)1;
        int rc = gm__pickle_load(cut, n, NULL, &p);
        assert_int_equal(rc, GM_EFORMAT);
        assert_non_null(strstr(gm_last_error_detail(), "byte"));
        free(cut);
    }
}

static size_t gzip_buf(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    z_stream z = {0};
    assert_int_equal(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t len = cap - z.avail_out;
    deflateEnd(&z);
    return len;
}

static void test_gzip(void **s) {
    (void)s;
    /* a list of 100k ints, gzip'd: crosses many inflate windows */
    size_t n = 100000, len = 0;
    uint8_t *raw = malloc(n * 5 + 16), *gz = malloc(n * 6 + 1024);
    raw[len++] = 0x80;
    raw[len++] = 4;
    raw[len++] = ']';
    raw[len++] = '(';
    for (size_t i = 0; i < n; i++) {
        raw[len++] = 'J';
        uint32_t v = (uint32_t)(i * 7);
        memcpy(raw + len, &v, 4);
        len += 4;
    }
    raw[len++] = 'e';
    raw[len++] = '.';
    size_t gl = gzip_buf(raw, len, gz, n * 6 + 1024);
    gm__pickle *p = load_ok(gz, gl);
    gm__pval r = gm__pickle_root(p);
    assert_int_equal(gm__pv_len(r), n);
    assert_int_equal(as_int(gm__pv_item(r, n - 1)), (int64_t)(n - 1) * 7);
    assert_int_equal(gm__pickle_input_bytes(p), len);
    gm__pickle_free(p);
    /* truncated gzip: clean error */
    p = (gm__pickle *)1;
    assert_int_equal(gm__pickle_load(gz, gl / 2, NULL, &p), GM_EFORMAT);
    assert_null(p);
    /* corrupt gzip body */
    gz[gl / 2] ^= 0xFF;
    assert_int_equal(gm__pickle_load(gz, gl, NULL, &p), GM_EFORMAT);
    free(raw);
    free(gz);
}

/* BINGET and LONG_BINGET read at once when their argument is in the window
 * (pickle.c's run_ops): read from a file in windows, the first window ending
 * at every byte of the first opcodes, the list is the same as read whole. */
static void test_memo_get_window(void **s) {
    (void)s;
    size_t n = 3000, len = 0;
    uint8_t *raw = malloc(n * 5 + 64);
    static const uint8_t head[] = {0x80, 4, 'K', 7, 0x94, 'M', 0x34, 0x12, 0x94, ']', '('};
    memcpy(raw, head, sizeof head); /* memo 0: 7, memo 1: 0x1234; a list, MARK */
    len = sizeof head;
    uint32_t rng = 12345;
    for (size_t i = 0; i < n; i++) {
        rng = rng * 1103515245u + 12345u;
        int k = (int)(rng >> 16) % 3, idx = (int)(rng >> 20) & 1;
        if (k == 0) { raw[len++] = 'h'; raw[len++] = (uint8_t)idx; }
        else if (k == 1) { raw[len++] = 'j'; raw[len++] = (uint8_t)idx; memset(raw + len, 0, 3); len += 3; }
        else { raw[len++] = 'K'; raw[len++] = 9; }
    }
    raw[len++] = 'e';
    raw[len++] = '.';
    gm__pickle *whole = load_ok(raw, len);
    gm__pval w = gm__pickle_root(whole);
    assert_int_equal(gm__pv_len(w), n);
    for (size_t cut = 2; cut < 48; cut++) {
        FILE *f = tmpfile();
        assert_non_null(f);
        assert_int_equal(fwrite(raw + cut, 1, len - cut, f), len - cut);
        rewind(f);
        uint8_t *first = malloc(cut); /* exact size: ASan catches a read past the window */
        memcpy(first, raw, cut);
        gm__pickle *p = NULL;
        if (gm__pickle_load_stream(f, first, cut, NULL, &p)) fail_msg("cut %zu: %s", cut, gm_last_error_detail());
        gm__pval r = gm__pickle_root(p);
        assert_int_equal(gm__pv_len(r), n);
        for (size_t i = 0; i < n; i++) assert_int_equal(as_int(gm__pv_item(r, i)), as_int(gm__pv_item(w, i)));
        gm__pickle_free(p);
        free(first);
        fclose(f);
    }
    gm__pickle_free(whole);
    free(raw);
}

static void test_limits(void **s) {
    (void)s;
    gm__pickle_limits l;
    gm__pickle_limits_init(&l);
    l.max_memory = 1 << 20; /* 1 MiB: the first arena chunk fits, a second does not */
    size_t n = 200000, len = 0;
    uint8_t *raw = malloc(n * 2 + 16);
    raw[len++] = 0x80;
    raw[len++] = 4;
    raw[len++] = ']';
    raw[len++] = '(';
    for (size_t i = 0; i < n; i++) raw[len++] = ')'; /* 200k empty tuples */
    raw[len++] = 'e';
    raw[len++] = '.';
    gm__pickle *p;
    assert_int_equal(gm__pickle_load(raw, len, &l, &p), GM_ENOHOSTMEM);
    assert_non_null(strstr(gm_last_error_detail(), "limit"));
    free(raw);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ints),          cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_containers_memo), cmocka_unit_test(test_stack_ops),
        cmocka_unit_test(test_globals_opaque), cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncation),    cmocka_unit_test(test_gzip),
        cmocka_unit_test(test_limits),        cmocka_unit_test(test_memo_get_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
