/* test_snapshot_stream.c — the snapshot reader streams (issue 42 item 9): a
 * device's events are converted as the pickle reader appends them and the
 * batch's dicts are released, so memory stays flat however many events
 * there are; the trace is the one a tree read gives (a list built another
 * way is read from the tree); pickles that use a released object again
 * read as a tree would, or fail with a clear error, never touch freed
 * memory (ASan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpumem/gpumem.h"
#include "trace/pickle.h"
#include "trace/trace.h"

#include "pickle_buf.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static void le32(buf *b, uint32_t v) {
    for (int i = 0; i < 4; i++) put_op(b, (uint8_t)(v >> (8 * i)));
}
static uint32_t memo_put(buf *b) { /* LONG_BINPUT */
    put_op(b, 'r');
    le32(b, b->memo);
    return b->memo++;
}
static void memo_get(buf *b, uint32_t i) { /* LONG_BINGET */
    put_op(b, 'j');
    le32(b, i);
}
static void int_(buf *b, uint32_t v) { /* BININT */
    put_op(b, 'J');
    le32(b, v);
}

/* a str written once, then named through the memo */
typedef struct sref {
    const char *s;
    int64_t memo;
} sref;
static void sstr(buf *b, sref *r) {
    if (r->memo >= 0) return memo_get(b, (uint32_t)r->memo);
    put_str(b, r->s);
    r->memo = memo_put(b);
}

enum { ST_TREE = 1, ST_FRAMES = 2, ST_AGAIN = 4, ST_MODIFY = 8, ST_MISPLACE = 16, ST_ORDER = 32 };

/* {"device_traces": [dev...], "segments": []}: n events per device, as
 * CPython's pickler lays them out (batches of 1000), or (ST_TREE) each
 * device's list built at once by LIST. ST_FRAMES: frames lists of 3 frame
 * dicts shared through the memo, every fifth event naming an earlier
 * event's list; ST_AGAIN: event 1500 names event 3's dict again; ST_MODIFY:
 * a SETITEM into event 3's dict at the end; ST_MISPLACE: device 0's list is
 * left out of device_traces; ST_ORDER: every third event has its keys in
 * another order, the next one an extra key first. */
static buf snapshot(size_t n, int ndev, int how) {
    buf b = {0};
    sref k_action = {"action", -1}, k_addr = {"addr", -1}, k_size = {"size", -1}, k_frames = {"frames", -1},
         k_name = {"name", -1}, k_file = {"filename", -1}, k_line = {"line", -1}, a_alloc = {"alloc", -1},
         a_free = {"free_completed", -1}, file = {"train.py", -1}, k_cc = {"compile_context", -1};
    int64_t frame_memo[20], list_memo[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    for (int f = 0; f < 20; f++) frame_memo[f] = -1;
    uint32_t ev3 = 0;
    put(&b, "\x80\x04}", 3);
    memo_put(&b);
    put_op(&b, '(');
    put_str(&b, "device_traces");
    memo_put(&b);
    put_op(&b, ']');
    memo_put(&b);
    if (ndev > 1) put_op(&b, '(');
    for (int d = 0; d < ndev; d++) {
        if (how & ST_TREE) put_op(&b, '(');
        else {
            put_op(&b, ']');
            memo_put(&b);
            put_op(&b, '(');
        }
        for (size_t i = 0; i < n; i++) {
            if (i && i % 1000 == 0 && !(how & ST_TREE)) put(&b, "e(", 2);
            if ((how & ST_AGAIN) && i == 1500) {
                memo_get(&b, ev3);
                continue;
            }
            put_op(&b, '}');
            uint32_t m = memo_put(&b);
            if (i == 3 && d == 0) ev3 = m;
            put_op(&b, '(');
            bool reorder = (how & ST_ORDER) && i % 3 == 1;
            if ((how & ST_ORDER) && i % 3 == 2) {
                sstr(&b, &k_cc);
                sstr(&b, &k_addr); /* a str value: a key's object, not a key here */
            }
            if (reorder) {
                sstr(&b, &k_size);
                int_(&b, 512 * (uint32_t)(1 + i % 7));
            }
            sstr(&b, &k_action);
            sstr(&b, i % 2 ? &a_free : &a_alloc);
            sstr(&b, &k_addr);
            int_(&b, (uint32_t)((i / 2) % 97 + 1) << 12);
            if (!reorder) {
                sstr(&b, &k_size);
                int_(&b, 512 * (uint32_t)(1 + i % 7));
            }
            if (how & ST_FRAMES) {
                sstr(&b, &k_frames);
                if (i % 5 == 4 && list_memo[(i + 3) % 8] >= 0) {
                    memo_get(&b, (uint32_t)list_memo[(i + 3) % 8]); /* an earlier event's list */
                } else {
                    put_op(&b, ']');
                    list_memo[i % 8] = memo_put(&b);
                    put_op(&b, '(');
                    for (size_t k = 0; k < 3; k++) {
                        size_t f = (i * 7 + k) % 20;
                        if (frame_memo[f] >= 0) {
                            memo_get(&b, (uint32_t)frame_memo[f]);
                            continue;
                        }
                        put_op(&b, '}');
                        frame_memo[f] = memo_put(&b);
                        put_op(&b, '(');
                        sstr(&b, &k_name);
                        char nm[16];
                        snprintf(nm, sizeof nm, "fn%zu", f);
                        put_str(&b, nm);
                        sstr(&b, &k_file);
                        sstr(&b, &file);
                        sstr(&b, &k_line);
                        int_(&b, (uint32_t)f);
                        put_op(&b, 'u');
                    }
                    put_op(&b, 'e');
                }
            }
            put_op(&b, 'u');
        }
        if (how & ST_TREE) {
            put_op(&b, 'l');
            memo_put(&b);
        } else {
            put_op(&b, 'e');
        }
        if ((how & ST_MISPLACE) && d == 0) put(&b, "0]", 2); /* POP the list, an empty one instead */
    }
    put_op(&b, ndev > 1 ? 'e' : 'a');
    if (how & ST_MODIFY) {
        memo_get(&b, ev3);
        put_str(&b, "late");
        put_op(&b, 'N');
        put_op(&b, 's');
        put_op(&b, '0');
    }
    put_str(&b, "segments");
    put_op(&b, ']');
    put(&b, "u.", 2);
    return b;
}

static gm_trace *load(const buf *b) {
    gm_trace *t = NULL;
    if (gm__trace_load_mem(b->b, b->n, &t)) fail_msg("%s", gm_last_error_detail());
    return t;
}

static void same_trace(const gm_trace *a, const gm_trace *b) {
    assert_int_equal(a->nevents, b->nevents);
    assert_int_equal(a->ndevices, b->ndevices);
    for (size_t i = 0; i < a->nevents; i++) {
        const gm_trace_event *x = &a->events[i], *y = &b->events[i];
        if (x->addr != y->addr || x->size != y->size || x->action != y->action || x->device != y->device ||
            x->stack != y->stack)
            fail_msg("event %zu differs", i);
    }
    assert_int_equal(a->nstacks, b->nstacks);
    assert_int_equal(a->nframes, b->nframes);
    assert_int_equal(a->nstrings, b->nstrings);
    for (uint32_t i = 0; i < a->nstrings; i++) assert_string_equal(a->strings[i], b->strings[i]);
    if (a->nstacks) {
        assert_memory_equal(a->stack_off, b->stack_off, (a->nstacks + 1) * sizeof *a->stack_off);
        assert_memory_equal(a->stack_frames, b->stack_frames, a->stack_off[a->nstacks] * sizeof *a->stack_frames);
    }
    for (uint32_t i = 0; i < a->nframes; i++) {
        assert_int_equal(a->frames[i].name, b->frames[i].name);
        assert_int_equal(a->frames[i].line, b->frames[i].line);
    }
    assert_int_equal(a->skipped, b->skipped);
}

static void test_stream_same_as_tree(void **state) {
    (void)state;
    static const int hows[] = {0, ST_FRAMES, ST_FRAMES | ST_AGAIN};
    for (size_t h = 0; h < sizeof hows / sizeof *hows; h++) {
        for (int ndev = 1; ndev <= 3; ndev++) {
            buf s = snapshot(3500, ndev, hows[h]), t = snapshot(3500, ndev, hows[h] | ST_TREE);
            gm_trace *a = load(&s), *b = load(&t);
            assert_int_equal(a->nevents, 3500 * (size_t)ndev);
            same_trace(a, b);
            if (hows[h] & ST_FRAMES) assert_true(a->nstacks > 10);
            gm__trace_free(a);
            gm__trace_free(b);
            free(s.b);
            free(t.b);
        }
    }
}

/* ---- memory: the pickle reader's arena stays flat ------------------------ */

static int claim_traces(void *ctx, gm__pickle *p, gm__pval list, gm__pval outer, gm__pval key, size_t index,
                        bool *take) {
    (void)ctx, (void)p, (void)list, (void)outer, (void)index;
    const char *k = gm__pv_str(key, NULL);
    *take = k && !strcmp(k, "device_traces");
    return GM_OK;
}
static int tag_items(void *ctx, gm__pickle *p, gm__pval list, const gm__pval *items, size_t n) {
    (void)p, (void)list;
    for (size_t i = 0; i < n; i++) gm__pv_set_tag(items[i], 1);
    *(size_t *)ctx += n;
    return GM_OK;
}

static uint64_t arena_after(size_t n, size_t *seen) {
    buf b = snapshot(n, 1, 0);
    *seen = 0;
    gm__pickle_sink sink = {seen, claim_traces, tag_items};
    gm__pickle *p = NULL;
    assert_int_equal(gm__pickle_load_sink(NULL, b.b, b.n, NULL, &sink, &p), GM_OK);
    uint64_t bytes = gm__pickle_arena_bytes(p);
    gm__pval traces = gm__pv_dict_get(gm__pickle_root(p), "device_traces");
    assert_int_equal(gm__pv_len(gm__pv_item(traces, 0)), 0); /* streamed: not stored */
    gm__pickle_free(p);
    free(b.b);
    return bytes;
}

static void test_stream_memory_flat(void **state) {
    (void)state;
    size_t seen;
    uint64_t small = arena_after(20000, &seen);
    assert_int_equal(seen, 20000);
    uint64_t big = arena_after(200000, &seen);
    assert_int_equal(seen, 200000);
    print_message("arena: %llu bytes for 20k events, %llu for 200k (a tree: ~200 bytes an event)\n",
                  (unsigned long long)small, (unsigned long long)big);
    assert_true(big == small);
    /* a load without a sink keeps them: the tree */
    buf b = snapshot(20000, 1, 0);
    gm__pickle *p = NULL;
    assert_int_equal(gm__pickle_load(b.b, b.n, NULL, &p), GM_OK);
    assert_true(gm__pickle_arena_bytes(p) > 20000 * 100);
    gm__pickle_free(p);
    free(b.b);
}

/* ---- pickles that use what was released ------------------------------------ */

static void test_stream_reuse(void **state) {
    (void)state;
    gm_trace *t = NULL;
    /* a released event changed afterwards: refused, nothing read */
    buf b = snapshot(3500, 1, ST_MODIFY);
    assert_int_equal(gm__trace_load_mem(b.b, b.n, &t), GM_EFORMAT);
    assert_null(t);
    if (!strstr(gm_last_error_detail(), "converted")) fail_msg("%s", gm_last_error_detail());
    free(b.b);
    /* streamed, then left out of device_traces */
    b = snapshot(3500, 2, ST_MISPLACE);
    assert_int_equal(gm__trace_load_mem(b.b, b.n, &t), GM_EFORMAT);
    if (!strstr(gm_last_error_detail(), "unusual")) fail_msg("%s", gm_last_error_detail());
    free(b.b);
    /* every prefix of a streamed pickle with frames: an error, never a crash */
    b = snapshot(1200, 2, ST_FRAMES | ST_AGAIN);
    for (size_t cut = 0; cut < b.n; cut += 1 + cut / 64) {
        assert_int_equal(gm__trace_load_mem(b.b, cut, &t), GM_EFORMAT);
        assert_null(t);
    }
    free(b.b);
}

/* Events whose keys come in changing orders (the reader remembers the last
 * event's order): every field lands where it belongs. */
static void test_stream_key_order(void **state) {
    (void)state;
    buf b = snapshot(3000, 1, ST_ORDER | ST_FRAMES);
    gm_trace *t = load(&b);
    assert_int_equal(t->nevents, 3000);
    for (size_t i = 0; i < t->nevents; i++) {
        const gm_trace_event *e = &t->events[i];
        assert_int_equal(e->action, i % 2 ? GM_TA_FREE_COMPLETED : GM_TA_ALLOC);
        assert_int_equal(e->addr, (uint64_t)((i / 2) % 97 + 1) << 12);
        assert_int_equal(e->size, 512 * (1 + i % 7));
    }
    gm__trace_free(t);
    free(b.b);
}

/* ---- gzip from a file: inflated by a second thread ------------------------- */

static void write_gz(const char *path, const buf *b, size_t cut, long flip) {
    uLongf n = compressBound((uLong)b->n) + 64;
    uint8_t *z = malloc(n);
    assert_non_null(z);
    z_stream s = {0};
    assert_int_equal(deflateInit2(&s, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    s.next_in = b->b;
    s.avail_in = (uInt)b->n;
    s.next_out = z;
    s.avail_out = (uInt)n;
    assert_int_equal(deflate(&s, Z_FINISH), Z_STREAM_END);
    size_t len = s.total_out;
    deflateEnd(&s);
    if (flip >= 0) z[flip] ^= 0x5a;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(z, 1, cut && cut < len ? cut : len, f), cut && cut < len ? cut : len);
    fclose(f);
    free(z);
}

static void test_stream_gzip_file(void **state) {
    (void)state;
    char path[] = "/tmp/gm_stream_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    buf b = snapshot(70000, 2, ST_FRAMES); /* several MiB: the thread's four 1 MiB blocks wrap */
    assert_true(b.n > 5 * ((size_t)1 << 20));
    gm_trace *mem = load(&b), *t = NULL;
    write_gz(path, &b, 0, -1);
    if (gm__trace_load_file(path, &t)) fail_msg("%s", gm_last_error_detail());
    same_trace(mem, t);
    gm__trace_free(t);
    /* cut anywhere, or a byte changed: a clear error, the thread stopped (no leak, no hang) */
    static const size_t cuts[] = {3, 20, 5000, 200000, 400000};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        write_gz(path, &b, cuts[i], -1);
        assert_int_equal(gm__trace_load_file(path, &t), GM_EFORMAT);
        if (!strstr(gm_last_error_detail(), "truncated")) fail_msg("cut %zu: %s", cuts[i], gm_last_error_detail());
    }
    write_gz(path, &b, 0, 100000);
    assert_int_equal(gm__trace_load_file(path, &t), GM_EFORMAT);
    if (!strstr(gm_last_error_detail(), "gzip") && !strstr(gm_last_error_detail(), "malformed"))
        fail_msg("%s", gm_last_error_detail());
    /* a pickle error early in a big file: the thread is stopped while it has blocks to give */
    b.b[40] = 0xff;
    write_gz(path, &b, 0, -1);
    assert_int_equal(gm__trace_load_file(path, &t), GM_EFORMAT);
    assert_null(t);
    unlink(path);
    gm__trace_free(mem);
    free(b.b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_same_as_tree),
        cmocka_unit_test(test_stream_memory_flat),
        cmocka_unit_test(test_stream_reuse),
        cmocka_unit_test(test_stream_gzip_file),
        cmocka_unit_test(test_stream_key_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
