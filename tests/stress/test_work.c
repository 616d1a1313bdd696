/* test_work.c — work and memory per input byte (issue 26, defects 1, 8, 9):
 * every table fed by a file is keyed and every reader streams, so the work
 * a reader does (gm__work_steps: table probes, dict entries scanned, bytes
 * inflated; util/idmap.h) is linear in the bytes it reads whatever the
 * input. The tests feed crafted inputs (strings that share one chain under
 * the plain FNV-1a hashes the tables used, a dict shared by every event, a
 * zero bomb padded to pass a ratio check, endless garbage on a pipe) and
 * check steps per byte, never time. And whatever gpumem writes, it reads
 * back (round trips of .gmt and torch snapshots, regular and random). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpumem/gpumem.h"
#include "internal.h"
#include "report/report.h"
#include "util/idmap.h"
#include "trace/pickle.h"
#include "trace/trace.h"

#include "fnv_flood.h"
#include "pickle_buf.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

static void put_int(buf *b, uint32_t v) { /* BININT */
    put_op(b, 'J');
    for (int i = 0; i < 4; i++) put_op(b, (uint8_t)(v >> (8 * i)));
}

/* ---- defect 1: hash flooding ---------------------------------------------- */

/* 2^14 strings in one chain of the pickle reader's old intern hash (32-bit
 * FNV-1a, low 16 bits; the table has at most 2^15 slots): ~1.3e8 probes
 * then, a few per string now. */
static void test_intern_flood(void **state) {
    (void)state;
    size_t n = (size_t)1 << 14;
    buf b = {0};
    put(&b, "\x80\x04](", 4); /* PROTO 4, EMPTY_LIST, MARK */
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char s[16];
        while (!flood_string(k++, 16, false, s)) {}
        assert_int_equal(flood_fnv(s, false) & 0xFFFF, 0); /* one chain under the old hash */
        put_str(&b, s);
    }
    put(&b, "e.", 2);
    uint64_t s0 = gm__work_steps;
    gm__pickle *p;
    assert_int_equal(gm__pickle_load(b.b, b.n, NULL, &p), GM_OK);
    uint64_t steps = gm__work_steps - s0;
    assert_int_equal(gm__pv_len(gm__pickle_root(p)), n);
    gm__pickle_free(p);
    print_message("intern flood: %zu strings, %zu bytes, %llu steps\n", n, b.n, (unsigned long long)steps);
    if (steps > 4 * n) fail_msg("%llu probes for %zu strings: a probe chain was aimed at", (unsigned long long)steps, n);
    free(b.b);
}

/* A trace of n allocations, allocation i under its own gpumem scope named
 * names(i) (report's scope table keys). */
static gm_trace *scope_trace(size_t n, bool flood) {
    gm__trace_builder *b = gm__tb_new();
    assert_non_null(b);
    uint32_t file, name, fr, st;
    assert_int_equal(gm__tb_string(b, GM_TAG_SCOPE_FILE, strlen(GM_TAG_SCOPE_FILE), &file), GM_OK);
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char s[16];
        if (flood) {
            while (!flood_string(k++, 16, true, s)) {}
            assert_int_equal(flood_fnv(s, true) & 0xFFFF, 0);
        } else {
            snprintf(s, sizeof s, "m%u", (unsigned)i);
        }
        assert_int_equal(gm__tb_string(b, s, strlen(s), &name), GM_OK);
        assert_int_equal(gm__tb_frame(b, name, file, 0, &fr), GM_OK);
        assert_int_equal(gm__tb_stack(b, &fr, 1, &st), GM_OK);
        gm_trace_event e = {.addr = (uint64_t)(i + 1) << 9, .size = 512, .action = GM_TA_ALLOC,
                            .time_us = (int64_t)i, .stack = st};
        assert_int_equal(gm__tb_event(b, &e), GM_OK);
    }
    gm_trace *t;
    assert_int_equal(gm__tb_finish(b, "gmt", &t), GM_OK);
    return t;
}

/* 2^13 scope names in one chain of report's old scope-table hash (64-bit
 * FNV-1a, low 16 bits): ~3e7 probes then. */
static void test_scope_flood(void **state) {
    (void)state;
    size_t n = (size_t)1 << 13;
    gm_trace *t = scope_trace(n, true);
    gm_config cfg;
    gm_config_init(&cfg);
    gm_attribution *a;
    gm_timeline *tl;
    gm_scope_series *ss;
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    assert_int_equal(gm__timeline_build(a, &cfg, 6000, &tl), GM_OK);
    uint64_t s0 = gm__work_steps;
    assert_int_equal(gm__scope_series_build(a, tl, 10, &ss), GM_OK);
    uint64_t steps = gm__work_steps - s0;
    assert_int_equal(ss->views[0].nscopes, n);
    print_message("scope flood: %zu scopes, %llu steps\n", n, (unsigned long long)steps);
    if (steps > 4 * n) fail_msg("%llu probes for %zu scopes: a probe chain was aimed at", (unsigned long long)steps, n);
    gm__scope_series_free(ss);
    gm__timeline_free(tl);
    gm__attribution_free(a);
    gm__trace_free(t);
}

/* ---- the snapshot reader's scans: one dict named by every event ------------ */

/* {"device_traces": [[d, d, ...]]}, d an event dict with `keys` extra keys,
 * named `refs` times through the memo (2 bytes each); or {"segments": [d,
 * d, ...]}. */
static buf shared_dict_snapshot(size_t keys, size_t refs, bool segments) {
    buf b = {0};
    put(&b, "\x80\x04}(", 4);
    put_str(&b, segments ? "segments" : "device_traces");
    if (segments) put(&b, "](", 2); /* [ MARK */
    else put(&b, "](](", 4); /* [ [ MARK */
    put(&b, "}(", 2);
    put_str(&b, "action");
    put_str(&b, "alloc");
    put_str(&b, "addr");
    put_int(&b, 1u << 21);
    put_str(&b, "size");
    put_int(&b, 512);
    for (size_t i = 0; i < keys; i++) {
        char s[24];
        snprintf(s, sizeof s, "k%zu", i);
        put_str(&b, s);
        put_op(&b, 'N');
    }
    put(&b, "uq\x00", 3); /* SETITEMS, BINPUT 0 */
    for (size_t i = 1; i < refs; i++) put(&b, "h\x00", 2); /* BINGET 0 */
    if (segments) put(&b, "eu.", 3); /* APPENDS, SETITEMS, STOP */
    else put(&b, "eeu.", 4); /* APPENDS, APPENDS, SETITEMS, STOP */
    return b;
}

static void test_shared_dict(void **state) {
    (void)state;
    /* segments: 4096 x 4096 scans from ~60 KB: refused within the budget */
    buf b = shared_dict_snapshot(4096, 4096, true);
    uint64_t s0 = gm__work_steps;
    gm_trace *t = NULL;
    assert_int_equal(gm__trace_load_mem(b.b, b.n, &t), GM_EFORMAT);
    uint64_t steps = gm__work_steps - s0;
    assert_null(t);
    if (!strstr(gm_last_error_detail(), "steps per byte")) fail_msg("error: %s", gm_last_error_detail());
    print_message("shared segment dict: %zu bytes, %llu steps, refused\n", b.n, (unsigned long long)steps);
    assert_true(steps <= ((uint64_t)1 << 20) + 64 * b.n + 2 * 4096 + 16 * b.n);
    free(b.b);
    /* events: the dict is read once (tagged with its event), then copied */
    b = shared_dict_snapshot(4096, 4096, false);
    s0 = gm__work_steps;
    assert_int_equal(gm__trace_load_mem(b.b, b.n, &t), GM_OK);
    steps = gm__work_steps - s0;
    assert_int_equal(t->nevents, 4096);
    print_message("shared event dict: %zu bytes, %llu steps\n", b.n, (unsigned long long)steps);
    assert_true(steps <= 4 * b.n);
    gm__trace_free(t);
    free(b.b);
    /* a few sharers of a small dict are fine */
    b = shared_dict_snapshot(3, 100, false);
    assert_int_equal(gm__trace_load_mem(b.b, b.n, &t), GM_OK);
    assert_int_equal(t->nevents, 100);
    gm__trace_free(t);
    free(b.b);
}

/* ---- defect 9: limits bypassed by padding; endless input -------------------- */

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A .gmt of `body` (declared as its length), then `pad` zero bytes. */
static buf gmt_file(const uint8_t *body, size_t n, size_t pad) {
    uLong bound = compressBound((uLong)n);
    buf b = {malloc(24 + bound + pad), 0, 24 + bound + pad, 0};
    assert_non_null(b.b);
    memcpy(b.b, GM_TRACE_MAGIC, 8);
    put_le(b.b + 8, GM_TRACE_VERSION, 4);
    put_le(b.b + 12, 0, 4);
    put_le(b.b + 16, n, 8);
    uLongf clen = bound;
    assert_int_equal(compress2(b.b + 24, &clen, body, (uLong)n, 9), Z_OK);
    memset(b.b + 24 + clen, 0, pad);
    b.n = 24 + clen + pad;
    return b;
}

static void test_padded_gmt(void **state) {
    (void)state;
    /* 32 MiB of zeros (~32 KB compressed) padded with 1 MiB of zeros: the
     * header's 32 MiB passed the old ratio check against the file's size,
     * and the body was allocated and inflated whole before the refusal.
     * Now the decoder stops at body byte 7, having inflated one window. */
    size_t n = (size_t)32 << 20;
    uint8_t *zeros = calloc(n, 1);
    assert_non_null(zeros);
    buf f = gmt_file(zeros, n, (size_t)1 << 20);
    free(zeros);
    uint64_t s0 = gm__work_steps;
    gm_trace *t = NULL;
    assert_int_equal(gm__trace_load_mem(f.b, f.n, &t), GM_EFORMAT);
    uint64_t steps = gm__work_steps - s0;
    if (!strstr(gm_last_error_detail(), "body byte 7: data after the trailer"))
        fail_msg("error: %s", gm_last_error_detail());
    print_message("padded bomb: %zu bytes, %llu steps\n", f.n, (unsigned long long)steps);
    assert_true(steps <= (uint64_t)1 << 20);
    free(f.b);
    /* a good trace with zeros after its zlib stream: refused */
    uint8_t empty[7] = {0};
    f = gmt_file(empty, sizeof empty, 4096);
    assert_int_equal(gm__trace_load_mem(f.b, f.n, &t), GM_EFORMAT);
    if (!strstr(gm_last_error_detail(), "after its compressed body")) fail_msg("error: %s", gm_last_error_detail());
    /* and from a file, where the padding is read, not held */
    char path[] = "/tmp/gm_test_work_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, f.b, f.n), (ssize_t)f.n);
    close(fd);
    assert_int_equal(gm__trace_load_file(path, &t), GM_EFORMAT);
    if (!strstr(gm_last_error_detail(), "after its compressed body")) fail_msg("error: %s", gm_last_error_detail());
    unlink(path);
    free(f.b);
}

/* Endless input: /dev/zero and `yes |` were read to 4 GiB before parsing. */
static void test_endless_input(void **state) {
    (void)state;
    gm_trace *t = NULL;
    uint64_t s0 = gm__work_steps;
    assert_int_equal(gm__trace_load_file("/dev/zero", &t), GM_EFORMAT);
    if (!strstr(gm_last_error_detail(), "at byte 0")) fail_msg("error: %s", gm_last_error_detail());
    assert_true(gm__work_steps - s0 <= (uint64_t)1 << 20);

    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* yes */
        close(pfd[0]);
        signal(SIGPIPE, SIG_DFL);
        static const char y[4096] = {[0 ... 4095] = 'y'};
        for (;;)
            if (write(pfd[1], y, sizeof y) < 0) _exit(0);
    }
    close(pfd[1]);
    int saved = dup(0);
    assert_true(saved >= 0);
    assert_int_equal(dup2(pfd[0], 0), 0);
    close(pfd[0]);
    clearerr(stdin);
    int rc = gm__trace_load_file("-", &t);
    dup2(saved, 0); /* closes the pipe: the writer ends */
    close(saved);
    clearerr(stdin);
    int st;
    waitpid(pid, &st, 0);
    assert_int_equal(rc, GM_EFORMAT);
    if (!strstr(gm_last_error_detail(), "at byte 0")) fail_msg("error: %s", gm_last_error_detail());
}

/* ---- defect 8: whatever gpumem writes, gpumem reads ------------------------- */

static void same_trace(const gm_trace *a, const gm_trace *b, bool frames) {
    assert_int_equal(a->nevents, b->nevents);
    for (size_t i = 0; i < a->nevents; i++) {
        const gm_trace_event *x = &a->events[i], *y = &b->events[i];
        if (x->addr != y->addr || x->size != y->size || x->stream != y->stream || x->time_us != y->time_us ||
            x->action != y->action || x->device != y->device || (frames && x->stack != y->stack))
            fail_msg("event %zu differs after the round trip", i);
    }
    if (!frames) return;
    assert_int_equal(a->nstrings, b->nstrings);
    for (uint32_t i = 0; i < a->nstrings; i++) assert_string_equal(a->strings[i], b->strings[i]);
    assert_int_equal(a->nframes, b->nframes);
    assert_memory_equal(a->frames, b->frames, a->nframes * sizeof *a->frames);
    assert_int_equal(a->nstacks, b->nstacks);
    if (a->nstacks) assert_memory_equal(a->stack_off, b->stack_off, (a->nstacks + 1) * sizeof *a->stack_off);
    assert_int_equal(a->nsegments, b->nsegments);
    assert_int_equal(a->has_settings, b->has_settings);
    if (a->alloc_conf || b->alloc_conf) assert_string_equal(a->alloc_conf ? a->alloc_conf : "", b->alloc_conf);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

enum { T_REGULAR, T_RANDOM, T_LONG_CONF, T_DEEP, T_KINDS };

static gm_trace *make_trace(int kind, size_t n) {
    gm__trace_builder *b = gm__tb_new();
    assert_non_null(b);
    uint32_t fr[GM_LIMIT_STACK_DEPTH], nfr = 0, id, st = 0;
    if (kind != T_REGULAR) {
        size_t depth = kind == T_DEEP ? GM_LIMIT_STACK_DEPTH : 8;
        for (size_t i = 0; i < depth; i++) {
            char s[64];
            uint32_t nm;
            snprintf(s, sizeof s, "fn_%zu\xff\xfe", i); /* not UTF-8: bytes are kept as they are */
            assert_int_equal(gm__tb_string(b, s, strlen(s), &nm), GM_OK);
            assert_int_equal(gm__tb_frame(b, nm, nm, (int32_t)(rnd() % 100000) - 50, &fr[nfr++]), GM_OK);
        }
        assert_int_equal(gm__tb_stack(b, fr, nfr, &st), GM_OK);
    }
    for (size_t i = 0; i < n; i++) {
        gm_trace_event e = {.addr = 1u << 21, .size = 512, .action = (uint8_t)(i & 1 ? GM_TA_FREE_COMPLETED : GM_TA_ALLOC),
                            .time_us = (int64_t)i * 10, .stack = st};
        if (kind == T_RANDOM) {
            e.addr = rnd();
            e.size = rnd() >> (rnd() % 64);
            e.stream = rnd() % 3;
            e.time_us = (int64_t)rnd();
            e.action = (uint8_t)(rnd() % GM_TA_COUNT);
            e.device = (uint8_t)(rnd() % 3);
            e.stack = (uint32_t)(rnd() % 2 ? st : 0);
        }
        assert_int_equal(gm__tb_event(b, &e), GM_OK);
    }
    if (kind == T_LONG_CONF) { /* a 100 KB settings string came back as "bad allocator conf string" */
        size_t cn = 100 << 10;
        char *c = malloc(cn + 1);
        assert_non_null(c);
        for (size_t i = 0; i < cn; i++) c[i] = "abc:1,"[i % 6];
        c[cn] = '\0';
        assert_int_equal(gm__tb_conf(b, c), GM_OK);
        free(c);
    }
    gm_trace_segment g = {.address = 1u << 21, .total_size = 2u << 20, .nblocks = 1, .large = true};
    assert_int_equal(gm__tb_segment(b, &g), GM_OK);
    (void)id;
    gm_trace *t;
    assert_int_equal(gm__tb_finish(b, "gmt", &t), GM_OK);
    return t;
}

static void test_round_trip(void **state) {
    (void)state;
    static const char *names[] = {"regular", "random", "100 KB conf", "4096-deep stack"};
    for (int kind = 0; kind < T_KINDS; kind++) {
        /* regular: 300k events of one pattern (a 1.5 MB body), ~500x
         * compressed; the old ratio limit (64x) refused what convert wrote */
        size_t n = kind == T_REGULAR ? 300000 : 20000;
        gm_trace *t = make_trace(kind, n);
        uint8_t *g;
        size_t glen;
        assert_int_equal(gm__trace_encode_gmt(t, &g, &glen), GM_OK);
        gm_trace *u = NULL;
        if (gm__trace_load_mem(g, glen, &u) != GM_OK)
            fail_msg("%s trace: gpumem wrote a .gmt (%zu bytes) it refuses: %s", names[kind], glen, gm_last_error_detail());
        same_trace(t, u, true);
        gm__trace_free(u);
        free(g);
        /* the torch snapshot writer (report --snapshot) too: events and stacks survive */
        uint8_t *p;
        size_t plen;
        assert_int_equal(gm__trace_encode_snapshot(t, &p, &plen), GM_OK);
        if (gm__trace_load_mem(p, plen, &u) != GM_OK)
            fail_msg("%s trace: gpumem wrote a snapshot it refuses: %s", names[kind], gm_last_error_detail());
        same_trace(t, u, false);
        gm__trace_free(u);
        free(p);
        gm__trace_free(t);
    }
}

/* ---- the property: steps per byte stay bounded as inputs grow --------------- */

static void test_steps_per_byte(void **state) {
    (void)state;
    /* per decompressed byte, for every input shape and size: a linear reader
     * stays under a constant; the old tables grew with the input's size */
    for (int lg = 10; lg <= 14; lg++) {
        size_t n = (size_t)1 << lg;
        for (int shape = 0; shape < 3; shape++) {
            buf b = {0};
            if (shape == 2) {
                b = shared_dict_snapshot(n, n, lg % 2);
            } else {
                put(&b, "\x80\x04](", 4);
                uint64_t k = 0;
                for (size_t i = 0; i < n; i++) {
                    char s[16];
                    if (shape == 0) while (!flood_string(k++, lg + 2, false, s)) {}
                    else snprintf(s, sizeof s, "c%u", (unsigned)i);
                    put_str(&b, s);
                }
                put(&b, "e.", 2);
            }
            uint64_t s0 = gm__work_steps;
            gm_trace *t = NULL;
            int rc = gm__trace_load_mem(b.b, b.n, &t); /* a list: not a snapshot, after parsing it */
            assert_true(rc == GM_EFORMAT || rc == GM_OK);
            gm__trace_free(t);
            uint64_t steps = gm__work_steps - s0, free_steps = (uint64_t)1 << 20; /* snapshot.c's STEPS_FREE */
            double per = (double)(steps > free_steps ? steps - free_steps : 0) / (double)b.n;
            if (per > 72) fail_msg("shape %d, 2^%d: %.1f steps per byte", shape, lg, per);
            free(b.b);
        }
    }
}

/* ---- issue 43 item 4: replay compile, linear in private-pool segments ------ */

/* A trace of nseg segments of 2 MiB in npools pools (segment i in pool
 * i % npools, or none for every seventh), one allocation in each. */
static gm_trace *pool_trace(size_t nseg, uint32_t npools) {
    gm__trace_builder *b = gm__tb_new();
    assert_non_null(b);
    for (size_t i = 0; i < nseg; i++) {
        uint64_t base = (uint64_t)(i + 1) << 21;
        gm_trace_segment s = {.address = base, .total_size = (uint64_t)1 << 21, .large = true};
        if (i % 7) {
            s.pool_id[0] = 1 + i % npools;
            s.pool_id[1] = 3;
        }
        assert_int_equal(gm__tb_segment(b, &s), GM_OK);
        gm_trace_event e = {.addr = base + 512, .size = 512, .action = GM_TA_ALLOC, .time_us = (int64_t)i};
        assert_int_equal(gm__tb_event(b, &e), GM_OK);
    }
    gm_trace *t;
    assert_int_equal(gm__tb_finish(b, "gmt", &t), GM_OK);
    return t;
}

static void test_pool_segments(void **state) {
    (void)state;
    /* 8192 pool segments and allocations: a scan of every segment per
     * allocation was ~3e7 steps (101-122 s for a 130 KB trace); an index
     * is a few dozen steps per segment and allocation */
    size_t n = 8192;
    gm_trace *t = pool_trace(n, 64);
    uint64_t s0 = gm__work_steps;
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(t, 0, &p), GM_OK);
    uint64_t steps = gm__work_steps - s0;
    print_message("pool segments: %zu segments and allocations, %llu steps\n", n, (unsigned long long)steps);
    if (steps > 64 * 2 * n) fail_msg("%llu steps to compile %zu pool segments: not linear", (unsigned long long)steps, n);
    assert_int_equal(gm__replay_prog_pools(p), 64);
    uint32_t number[65] = {0}, np = 0; /* pools are numbered in the order of their first segment */
    for (size_t i = 0; i < n; i++) {
        uint32_t want = 0;
        if (i % 7) want = number[1 + i % 64] ? number[1 + i % 64] : (number[1 + i % 64] = ++np);
        assert_int_equal(gm__replay_op_pool(p, i), want);
    }
    gm__replay_prog_free(p);
    gm__trace_free(t);
}

/* Overlapping segments (a hostile trace; torch never writes them), other
 * devices, pool 0: the pool of an address is that of the first segment in
 * the trace's order that holds it, as a scan finds it. */
static void test_pool_overlaps(void **state) {
    (void)state;
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 50; round++) {
        gm__trace_builder *b = gm__tb_new();
        assert_non_null(b);
        size_t nseg = 1 + (size_t)(x % 40), nev = 200;
        gm_trace_segment segs[40];
        for (size_t i = 0; i < nseg; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            gm_trace_segment s = {.address = (x % 64) << 12, .total_size = ((x >> 8) % 24) << 12,
                                  .device = (uint8_t)((x >> 20) % 5 == 0)};
            if ((x >> 24) % 4) s.pool_id[0] = 1 + (x >> 28) % 5, s.pool_id[1] = (x >> 32) % 2;
            if (round == 0 && i == 0) s.address = UINT64_MAX - 4095, s.total_size = 8192; /* wraps */
            segs[i] = s;
            assert_int_equal(gm__tb_segment(b, &s), GM_OK);
        }
        uint64_t addrs[200];
        for (size_t i = 0; i < nev; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            addrs[i] = round == 0 && i < 10 ? UINT64_MAX - i * 1000 : (x % (100 << 12)) + 1;
            gm_trace_event e = {.addr = addrs[i], .size = 512, .action = GM_TA_ALLOC};
            assert_int_equal(gm__tb_event(b, &e), GM_OK);
        }
        gm_trace *t;
        assert_int_equal(gm__tb_finish(b, "gmt", &t), GM_OK);
        gm_replay_prog *p;
        assert_int_equal(gm__replay_compile(t, 0, &p), GM_OK);
        /* the pools, numbered by first segment; then each address by scan */
        uint64_t ids[40][2];
        uint32_t np = 0;
        for (size_t i = 0; i < nseg; i++) {
            if (segs[i].device || (!segs[i].pool_id[0] && !segs[i].pool_id[1])) continue;
            uint32_t k = 0;
            while (k < np && (ids[k][0] != segs[i].pool_id[0] || ids[k][1] != segs[i].pool_id[1])) k++;
            if (k == np) ids[np][0] = segs[i].pool_id[0], ids[np++][1] = segs[i].pool_id[1];
        }
        assert_int_equal(gm__replay_prog_pools(p), np);
        for (size_t e = 0; e < nev; e++) {
            uint32_t want = 0;
            for (size_t i = 0; i < nseg && !want; i++) {
                const gm_trace_segment *s = &segs[i];
                if (s->device || (!s->pool_id[0] && !s->pool_id[1])) continue;
                if (addrs[e] < s->address || addrs[e] - s->address >= s->total_size) continue;
                for (uint32_t k = 0; k < np; k++)
                    if (ids[k][0] == s->pool_id[0] && ids[k][1] == s->pool_id[1]) want = k + 1;
            }
            if (gm__replay_op_pool(p, e) != want)
                fail_msg("round %d, address 0x%llx: pool %u, a scan finds %u", round, (unsigned long long)addrs[e],
                         gm__replay_op_pool(p, e), want);
        }
        gm__replay_prog_free(p);
        gm__trace_free(t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intern_flood),     cmocka_unit_test(test_scope_flood),
        cmocka_unit_test(test_shared_dict),      cmocka_unit_test(test_padded_gmt),
        cmocka_unit_test(test_endless_input),    cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_steps_per_byte),   cmocka_unit_test(test_pool_segments),
        cmocka_unit_test(test_pool_overlaps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
