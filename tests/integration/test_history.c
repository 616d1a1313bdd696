/* test_history.c — scopes and the allocation history: scope nesting per
 * thread (two threads, each its own stack, errors for pop without push, too
 * deep, empty names); the ring drops the oldest entries first and counts
 * them; off records nothing; the torch-format and .gmt dumps read back
 * through gpumem's reader with the same events, scopes and tags, and the
 * report attributes a tagged allocation by its tag; an OOM dumps when
 * asked to and keeps its explanation; the segment observer sees map/unmap
 * (policy:gpumem) or alloc/free (policy:torch) adding up to reserved bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gm_test.h"
#include "gpumem/gpumem.h"
#include "report/report.h"
#include "trace/trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The scope frames of an event, innermost first, joined by '<'. */
static const char *scopes_of(const gm_trace *t, const gm_trace_event *e, char *buf, size_t len) {
    buf[0] = '\0';
    if (!e->stack) return buf;
    for (uint32_t k = t->stack_off[e->stack - 1]; k < t->stack_off[e->stack]; k++) {
        const gm_trace_frame *f = &t->frames[t->stack_frames[k]];
        if (strcmp(t->strings[f->filename], GM_TAG_SCOPE_FILE)) continue;
        if (buf[0]) strncat(buf, "<", len - strlen(buf) - 1);
        strncat(buf, t->strings[f->name], len - strlen(buf) - 1);
    }
    return buf;
}

typedef struct worker {
    gm_allocator *a;
    const char *names[4]; /* NULL-terminated */
    size_t size;
    gm_devptr p;
    int depth_seen;
    const char *current_seen;
    pthread_barrier_t *bar;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    for (int i = 0; w->names[i]; i++) assert_int_equal(gm_scope_push(w->names[i]), GM_OK);
    pthread_barrier_wait(w->bar); /* both threads are inside their scopes now */
    w->depth_seen = gm_scope_depth();
    w->current_seen = gm_scope_current();
    assert_int_equal(gm_malloc(w->a, 0, w->size, 0, &w->p), GM_OK);
    pthread_barrier_wait(w->bar);
    while (gm_scope_depth()) assert_int_equal(gm_scope_pop(), GM_OK);
    return NULL;
}

static void test_scopes_across_threads(void **s) {
    (void)s;
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 0, false, &b, &a), GM_OK);
    assert_int_equal(gm_scope_depth(), 0);
    assert_null(gm_scope_current());
    assert_int_equal(gm_scope_pop(), GM_ESTATE);
    assert_int_equal(gm_scope_push(""), GM_EINVAL);
    assert_int_equal(gm_scope_push(NULL), GM_EINVAL);
    for (int i = 0; i < GM_SCOPE_MAX_DEPTH; i++) assert_int_equal(gm_scope_push("deep"), GM_OK);
    assert_int_equal(gm_scope_push("deeper"), GM_EINVAL);
    while (gm_scope_depth()) gm_scope_pop();

    assert_int_equal(gm_history_enable(1000), GM_OK);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    worker w1 = {a, {"model", "model.h.0", "model.h.0.attn"}, 1000, 0, 0, NULL, &bar};
    worker w2 = {a, {"loader", NULL}, 3000, 0, 0, NULL, &bar};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, work, &w1);
    pthread_create(&t2, NULL, work, &w2);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_barrier_destroy(&bar);
    assert_int_equal(w1.depth_seen, 3);
    assert_string_equal(w1.current_seen, "model.h.0.attn");
    assert_int_equal(w2.depth_seen, 1);
    assert_string_equal(w2.current_seen, "loader");
    assert_int_equal(gm_scope_depth(), 0); /* this thread never pushed */

    gm_trace *t;
    uint64_t dropped = 9;
    assert_int_equal(gm__history_to_trace(&t, &dropped), GM_OK);
    assert_int_equal(dropped, 0);
    char buf[512];
    int seen = 0;
    for (size_t i = 0; i < t->nevents; i++) {
        const gm_trace_event *e = &t->events[i];
        if (e->action != GM_TA_ALLOC) continue;
        if (e->addr == w1.p) {
            assert_string_equal(scopes_of(t, e, buf, sizeof buf), "model.h.0.attn<model.h.0<model");
            seen |= 1;
        } else if (e->addr == w2.p) {
            assert_string_equal(scopes_of(t, e, buf, sizeof buf), "loader");
            seen |= 2;
        }
    }
    assert_int_equal(seen, 3);
    gm__trace_free(t);
    /* an allocation outside any scope has no frames */
    gm_devptr p, q, r;
    assert_int_equal(gm_malloc(a, 0, 512, 0, &p), GM_OK);
    assert_int_equal(gm__history_to_trace(&t, NULL), GM_OK);
    assert_int_equal(t->events[t->nevents - 1].action, GM_TA_ALLOC);
    assert_int_equal(t->events[t->nevents - 1].stack, 0);
    gm__trace_free(t);
    /* the global scope names threads with none open, not those inside one */
    assert_int_equal(gm_scope_set_global("backward"), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 512, 0, &q), GM_OK);
    assert_int_equal(gm_scope_push("mine"), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 512, 0, &r), GM_OK);
    gm_scope_pop();
    assert_int_equal(gm_scope_set_global(NULL), GM_OK);
    assert_int_equal(gm__history_to_trace(&t, NULL), GM_OK);
    for (size_t i = 0; i < t->nevents; i++) {
        if (t->events[i].action != GM_TA_ALLOC) continue;
        if (t->events[i].addr == q) assert_string_equal(scopes_of(t, &t->events[i], buf, sizeof buf), "backward");
        if (t->events[i].addr == r) assert_string_equal(scopes_of(t, &t->events[i], buf, sizeof buf), "mine");
    }
    gm__trace_free(t);
    gm_free(a, q);
    gm_free(a, r);
    gm_free(a, p);
    gm_free(a, w1.p);
    gm_free(a, w2.p);
    gm_history_enable(0);
    gm_test_destroy(b, a);
}

static void test_ring_drops_oldest(void **s) {
    (void)s;
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 0, false, &b, &a), GM_OK);
    gm_devptr w; /* warm up: a small segment stays cached, so no segment events below */
    assert_int_equal(gm_malloc(a, 0, 512, 7, &w), GM_OK); /* the stream the test uses */
    assert_int_equal(gm_free(a, w), GM_OK);

    assert_int_equal(gm_history_enable(3), GM_OK);
    assert_true(gm_history_enabled());
    gm_devptr p1, p2, p3;
    assert_int_equal(gm_malloc(a, 0, 1000, 7, &p1), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 2000, 7, &p2), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 3000, 7, &p3), GM_OK);
    assert_int_equal(gm_free(a, p1), GM_OK); /* free_requested + free_completed */
    uint64_t rec, held, dropped;
    gm_history_counts(&rec, &held, &dropped);
    assert_int_equal(rec, 5);
    assert_int_equal(held, 3);
    assert_int_equal(dropped, 2);
    gm_trace *t;
    assert_int_equal(gm__history_to_trace(&t, &dropped), GM_OK);
    assert_int_equal(dropped, 2);
    assert_int_equal(t->nevents, 3); /* the newest three, oldest first */
    assert_int_equal(t->events[0].action, GM_TA_ALLOC);
    assert_int_equal(t->events[0].size, 3000);
    assert_int_equal(t->events[0].stream, 7);
    assert_int_equal(t->events[1].action, GM_TA_FREE_REQUESTED);
    assert_int_equal(t->events[1].addr, p1);
    assert_int_equal(t->events[2].action, GM_TA_FREE_COMPLETED);
    assert_true(t->events[0].time_us <= t->events[2].time_us);
    gm__trace_free(t);

    /* off: nothing more is recorded, what was stays for dumping */
    assert_int_equal(gm_history_enable(0), GM_OK);
    assert_false(gm_history_enabled());
    assert_int_equal(gm_free(a, p2), GM_OK);
    gm_history_counts(&rec, &held, NULL);
    assert_int_equal(rec, 5);
    assert_int_equal(held, 3);
    /* a fresh ring starts empty */
    assert_int_equal(gm_history_enable(8), GM_OK);
    gm_history_counts(&rec, &held, &dropped);
    assert_int_equal(rec + held + dropped, 0);
    assert_int_equal(gm_history_tag(p3, GM_CAT_COUNT), GM_EINVAL);
    assert_int_equal(gm_free(a, p3), GM_OK);
    gm_history_enable(0);
    gm_test_destroy(b, a);
}

static void same_events(const gm_trace *x, const gm_trace *y) {
    char b1[512], b2[512];
    assert_int_equal(x->nevents, y->nevents);
    for (size_t i = 0; i < x->nevents; i++) {
        const gm_trace_event *e = &x->events[i], *f = &y->events[i];
        assert_int_equal(e->action, f->action);
        assert_int_equal(e->addr, f->addr);
        assert_int_equal(e->size, f->size);
        assert_int_equal(e->stream, f->stream);
        assert_int_equal(e->time_us, f->time_us);
        assert_string_equal(scopes_of(x, e, b1, sizeof b1), scopes_of(y, f, b2, sizeof b2));
        assert_int_equal(e->stack == 0, f->stack == 0);
    }
}

static void test_dump_roundtrip(void **s) {
    (void)s;
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 0, false, &b, &a), GM_OK);
    assert_int_equal(gm_history_enable(10000), GM_OK);
    gm_devptr w, act, tmp, big;
    assert_int_equal(gm_scope_push("model"), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 4 << 20, 0, &w), GM_OK); /* a segment_alloc too */
    assert_int_equal(gm_history_tag(w, GM_CAT_PARAMETERS), GM_OK);
    assert_int_equal(gm_scope_push("model.fc"), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 1 << 20, 5, &act), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 1000, 5, &tmp), GM_OK);
    assert_int_equal(gm_free(a, tmp), GM_OK);
    gm_scope_pop();
    gm_scope_pop();
    assert_int_equal(gm_malloc(a, 0, (uint64_t)3 << 31, 0, &big), GM_OK); /* address and size > 2^31 */
    assert_int_equal(gm_free(a, big), GM_OK);
    assert_int_equal(gm_empty_cache(a, 0), GM_OK); /* segment_free */

    gm_trace *ref;
    assert_int_equal(gm__history_to_trace(&ref, NULL), GM_OK);
    bool seg = false;
    for (size_t i = 0; i < ref->nevents; i++) seg |= ref->events[i].action == GM_TA_SEGMENT_FREE;
    assert_true(seg);
    char dir[] = "/tmp/gm_histXXXXXX", path[600];
    assert_non_null(mkdtemp(dir));
    const char *names[] = {"h.pickle", "h.pickle.gz", "h.gmt"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        assert_int_equal(gm_history_dump(path, k == 2 ? GM_HISTORY_GMT : GM_HISTORY_TORCH), GM_OK);
        gm_trace *t;
        if (gm__trace_load_file(path, &t)) fail_msg("%s: %s", path, gm_last_error_detail());
        assert_string_equal(t->format, k == 2 ? "gmt" : "pytorch-snapshot");
        same_events(ref, t);
        /* the tag decides the category of w; the report reads it */
        gm_attribution *at;
        assert_int_equal(gm__attribute(t, 0, &at), GM_OK);
        assert_int_equal(at->bytes_by[GM_CAT_PARAMETERS][GM_AM_TAGGED], 4 << 20);
        gm__attribution_free(at);
        gm__trace_free(t);
        unlink(path);
    }
    assert_int_equal(gm_history_dump(path, 7), GM_EINVAL);
    rmdir(dir);
    gm__trace_free(ref);
    gm_free(a, w);
    gm_free(a, act);
    gm_history_enable(0);
    gm_test_destroy(b, a);
}

static void test_oom_dump(void **s) {
    (void)s;
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 64 * GM_TEST_MIB, false, &b, &a), GM_OK);
    char dir[] = "/tmp/gm_oomXXXXXX", path[600];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/oom.pickle.gz", dir);
    assert_int_equal(gm_history_dump_on_oom(path, 9), GM_EINVAL);
    assert_int_equal(gm_history_dump_on_oom(path, GM_HISTORY_TORCH), GM_OK);
    assert_int_equal(gm_history_enable(100), GM_OK);
    gm_devptr p;
    assert_int_equal(gm_malloc(a, 0, GM_TEST_GIB, 3, &p), GM_ENOMEM);
    assert_non_null(strstr(gm_last_error_detail(), "Out of memory"));
    gm_trace *t;
    if (gm__trace_load_file(path, &t)) fail_msg("%s: %s", path, gm_last_error_detail());
    assert_true(t->nevents >= 1);
    assert_int_equal(t->events[t->nevents - 1].action, GM_TA_OOM);
    assert_int_equal(t->events[t->nevents - 1].size, GM_TEST_GIB);
    gm__trace_free(t);
    unlink(path);
    rmdir(dir);
    gm_history_dump_on_oom(NULL, 0);
    gm_history_enable(0);
    gm_test_destroy(b, a);
}

/* ---- the segment observer ------------------------------------------------ */

typedef struct seg_log {
    int n[4];        /* events by GM_SEGMENT_* */
    int64_t bytes;   /* mapped/allocated minus unmapped/freed */
    int bad_device;
} seg_log;

static void log_seg(int device, int event, gm_devptr addr, uint64_t size, void *arg) {
    seg_log *l = arg;
    if (device != 0 || !addr || !size || event < 0 || event > 3) l->bad_device++;
    else l->n[event]++;
    l->bytes += event == GM_SEGMENT_ALLOC || event == GM_SEGMENT_MAP ? (int64_t)size : -(int64_t)size;
}

/* The observer sees every byte reserved and given back: map/unmap under
 * policy:gpumem (VMM), alloc/free under policy:torch (map/unmap with
 * expandable segments), none after it is unset. */
static void observe(gm_policy_kind policy, const char *conf, int grow, int shrink) {
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(policy, conf, 0, false, &b, &a), GM_OK);
    seg_log l = {{0}, 0, 0};
    assert_int_equal(gm_set_segment_observer(log_seg, &l), GM_OK);
    gm_devptr p[6];
    for (int i = 0; i < 5; i++) assert_int_equal(gm_malloc(a, 0, (uint64_t)(i + 1) * 7 << 20, 0, &p[i]), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 4096, 0, &p[5]), GM_OK); /* the small pool too */
    gm_stats s = gm_test_stats(a);
    assert_true(l.n[grow] > 0);
    assert_int_equal(l.n[shrink], 0);
    assert_int_equal(l.bytes, s.reserved_bytes[GM_POOL_ALL].current);
    gm_devptr keep = p[3];
    for (int i = 0; i < 6; i++)
        if (p[i] != keep) assert_int_equal(gm_free(a, p[i]), GM_OK);
    assert_int_equal(gm_empty_cache(a, 0), GM_OK);
    s = gm_test_stats(a);
    assert_true(l.n[shrink] > 0);
    assert_true(s.reserved_bytes[GM_POOL_ALL].current > 0);
    assert_int_equal(l.bytes, s.reserved_bytes[GM_POOL_ALL].current);
    assert_int_equal(l.bad_device, 0);
    /* unset: nothing more arrives */
    assert_int_equal(gm_set_segment_observer(NULL, NULL), GM_OK);
    seg_log before = l;
    assert_int_equal(gm_free(a, keep), GM_OK);
    assert_int_equal(gm_empty_cache(a, 0), GM_OK);
    assert_int_equal(gm_test_stats(a).reserved_bytes[GM_POOL_ALL].current, 0);
    assert_memory_equal(&before, &l, sizeof l);
    gm_test_destroy(b, a);
}

static void test_segment_observer(void **s) {
    (void)s;
    observe(GM_POLICY_GPUMEM, NULL, GM_SEGMENT_MAP, GM_SEGMENT_UNMAP);
    observe(GM_POLICY_TORCH, NULL, GM_SEGMENT_ALLOC, GM_SEGMENT_FREE);
    observe(GM_POLICY_TORCH, "expandable_segments:True", GM_SEGMENT_MAP, GM_SEGMENT_UNMAP);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scopes_across_threads),
        cmocka_unit_test(test_ring_drops_oldest),
        cmocka_unit_test(test_dump_roundtrip),
        cmocka_unit_test(test_oom_dump),
        cmocka_unit_test(test_segment_observer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
