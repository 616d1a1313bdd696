/* test_policy_torch.c — the torch policy against hand-computed expectations
 * of PyTorch's CUDACachingAllocator on the sim backend: rounding and segment
 * sizes, split and merge with exact stats, best fit, max_split_size and
 * max_non_split_rounding, the garbage collection threshold (only with a
 * memory fraction), OOM -> release cache -> retry, streams, and expandable
 * segments growing and shrinking. gm_check runs after every step. And the
 * pool sets (treaps) against a sorted reference, misuse refused.
 * CUDA-like addresses, random workloads and the shared traces:
 * test_policy_torch_cudalike.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"

#include "policy/torch/tree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIB GM_TEST_KIB
#define MIB GM_TEST_MIB
#define GIB GM_TEST_GIB

static gm_allocator *g_a;
static gm_backend *g_b;

static void make(const char *conf, uint64_t cap) {
    int rc = gm_test_make(GM_POLICY_TORCH, conf, cap, false, &g_b, &g_a);
    if (rc != GM_OK) fail_msg("gm_test_make(%s): %s %s", conf ? conf : "", gm_status_name(rc),
                              gm_last_error_detail());
}

static void done(void) {
    gm_test_destroy(g_b, g_a);
    g_a = NULL;
    g_b = NULL;
}

static gm_devptr M(uint64_t size, gm_stream stream) {
    gm_devptr p = 0;
    int rc = gm_malloc(g_a, 0, size, stream, &p);
    if (rc != GM_OK) fail_msg("gm_malloc(%llu): %s %s", (unsigned long long)size, gm_status_name(rc),
                              gm_last_error_detail());
    gm_test_check(g_a);
    return p;
}

static void F(gm_devptr p) {
    assert_int_equal(gm_free(g_a, p), GM_OK);
    gm_test_check(g_a);
}

static void E(void) {
    assert_int_equal(gm_empty_cache(g_a, 0), GM_OK);
    gm_test_check(g_a);
}

#define S() gm_test_stats(g_a)

typedef struct segs {
    int n;
    uint64_t total[16];
    bool expandable[16];
} segs;

static int seg_cb(const gm_segment_info *s, void *arg) {
    segs *v = arg;
    if (v->n < 16) {
        v->total[v->n] = s->total_size;
        v->expandable[v->n] = s->expandable;
    }
    v->n++;
    return 0;
}

static segs walk(void) {
    segs v;
    memset(&v, 0, sizeof v);
    assert_int_equal(gm_walk_segments(g_a, 0, seg_cb, &v), GM_OK);
    return v;
}

/* 512-byte rounding; 2 MiB small segments, 20 MiB for 1-10 MiB, 2 MiB
 * rounding above */
static void test_rounding_and_segment_sizes(void **state) {
    (void)state;
    make(NULL, 0);
    /* 12 MiB + 512 in a 14 MiB segment leaves 2 MiB - 512: too small for 5 MiB */
    gm_devptr p1 = M(1, 0), p3 = M(12 * MIB + 1, 0), p2 = M(5 * MIB, 0);
    gm_stats s = S();
    assert_int_equal(s.allocated_bytes[GM_POOL_SMALL].current, 512);
    assert_int_equal(s.allocated_bytes[GM_POOL_LARGE].current, 5 * MIB + (12 * MIB + 512));
    assert_int_equal(s.reserved_bytes[GM_POOL_SMALL].current, 2 * MIB);
    assert_int_equal(s.reserved_bytes[GM_POOL_LARGE].current, 20 * MIB + 14 * MIB);
    assert_int_equal(s.segment[GM_POOL_ALL].current, 3);
    assert_int_equal(s.segment[GM_POOL_LARGE].current, 2);
    assert_int_equal(walk().n, 3);
    F(p1), F(p2), F(p3);
    E();
    s = S();
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(s.segment[GM_POOL_ALL].current, 0);
    done();
}

/* roundup_power2_divisions:4 -> 5 MiB + 1 rounds to 6 MiB (steps of 1 MiB
 * between 4 and 8 MiB); small sizes under 512 * 4 keep 512 rounding */
static void test_roundup_power2(void **state) {
    (void)state;
    make("roundup_power2_divisions:4", 0);
    gm_devptr p = M(5 * MIB + 1, 0), q = M(1200, 0);
    gm_stats s = S();
    assert_int_equal(s.allocated_bytes[GM_POOL_LARGE].current, 6 * MIB);
    assert_int_equal(s.allocated_bytes[GM_POOL_SMALL].current, 1536);
    F(p), F(q);
    done();
}

/* split and merge in a small segment, every stat by hand */
static void test_split_merge_stats(void **state) {
    (void)state;
    make(NULL, 0);
    gm_devptr a = M(100 * KIB, 0), b = M(200 * KIB, 0);
    assert_true(b == a + 100 * KIB); /* carved from the same segment */
    gm_stats s = S();
    assert_int_equal(s.segment[GM_POOL_SMALL].current, 1);
    assert_int_equal(s.active[GM_POOL_SMALL].current, 2);
    assert_int_equal(s.active_bytes[GM_POOL_SMALL].current, 300 * KIB);
    assert_int_equal(s.inactive_split[GM_POOL_SMALL].current, 1);
    assert_int_equal(s.inactive_split_bytes[GM_POOL_SMALL].current, 2 * MIB - 300 * KIB);
    F(a); /* cannot merge: b is in use */
    s = S();
    assert_int_equal(s.active[GM_POOL_ALL].current, 1);
    assert_int_equal(s.inactive_split[GM_POOL_SMALL].current, 2);
    assert_int_equal(s.inactive_split_bytes[GM_POOL_SMALL].current, 2 * MIB - 200 * KIB);
    /* best fit: the 100 KiB hole, not the big tail */
    gm_devptr c = M(50 * KIB, 0);
    assert_true(c == a);
    s = S();
    assert_int_equal(s.inactive_split[GM_POOL_SMALL].current, 2);
    assert_int_equal(s.inactive_split_bytes[GM_POOL_SMALL].current, 2 * MIB - 250 * KIB);
    F(c), F(b); /* everything merges back into one unsplit block */
    s = S();
    assert_int_equal(s.active[GM_POOL_ALL].current, 0);
    assert_int_equal(s.inactive_split[GM_POOL_ALL].current, 0);
    assert_int_equal(s.inactive_split_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 2 * MIB);
    assert_int_equal(s.active_bytes[GM_POOL_ALL].peak, 300 * KIB);
    E();
    assert_int_equal(S().segment[GM_POOL_ALL].current, 0);
    done();
}

/* large blocks split only when more than 1 MiB would remain */
static void test_large_split_rule(void **state) {
    (void)state;
    make(NULL, 0);
    gm_devptr a = M(19 * MIB + 512 * KIB, 0); /* 20 MiB segment, 0.5 MiB left: whole */
    assert_int_equal(S().allocated_bytes[GM_POOL_LARGE].current, 20 * MIB);
    assert_int_equal(S().inactive_split[GM_POOL_ALL].current, 0);
    gm_devptr b = M(9 * MIB, 0); /* new 20 MiB segment, 11 MiB left: split */
    gm_stats s = S();
    assert_int_equal(s.allocated_bytes[GM_POOL_LARGE].current, 29 * MIB);
    assert_int_equal(s.inactive_split_bytes[GM_POOL_LARGE].current, 11 * MIB);
    assert_int_equal(s.reserved_bytes[GM_POOL_LARGE].current, 40 * MIB);
    F(a), F(b);
    done();
}

/* blocks >= max_split_size are never split and serve only requests within
 * max_non_split_rounding of their size */
static void test_max_split_size(void **state) {
    (void)state;
    make("max_split_size_mb:64", 0);
    gm_devptr a = M(100 * MIB, 0);
    gm_stats s = S();
    assert_int_equal(s.oversize_segments.current, 1);
    assert_int_equal(s.oversize_allocations.current, 1);
    F(a);
    gm_devptr b = M(90 * MIB, 0); /* 100 < 90 + 20: reused whole */
    assert_true(b == a);
    s = S();
    assert_int_equal(s.allocated_bytes[GM_POOL_ALL].current, 100 * MIB);
    assert_int_equal(s.segment[GM_POOL_ALL].current, 1);
    F(b);
    gm_devptr c = M(70 * MIB, 0); /* 100 >= 70 + 20: a new segment */
    assert_true(c != a);
    assert_int_equal(S().reserved_bytes[GM_POOL_ALL].current, 170 * MIB);
    F(c);
    gm_devptr d = M(10 * MIB, 0); /* normal request: oversize blocks are not used */
    s = S();
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 180 * MIB);
    assert_int_equal(s.oversize_segments.current, 2);
    F(d);
    done();

    make("max_split_size_mb:64,max_non_split_rounding_mb:40", 0);
    a = M(100 * MIB, 0);
    F(a);
    b = M(70 * MIB, 0); /* 100 < 70 + 40: reused whole */
    assert_true(b == a);
    assert_int_equal(S().reserved_bytes[GM_POOL_ALL].current, 100 * MIB);
    F(b);
    done();
}

/* gc only with a memory fraction: old cached blocks go before a new
 * segment is made, so no retry is needed */
static void gc_scenario(const char *conf, bool fraction, int64_t want_retries) {
    make(conf, GIB);
    if (fraction) assert_int_equal(gm_set_memory_fraction(g_a, 0, 0.5), GM_OK); /* 512 MiB */
    gm_devptr a = M(200 * MIB, 0);
    F(a);
    gm_devptr b = M(300 * MIB, 0);
    F(b);
    gm_devptr c = M(400 * MIB, 0); /* 200 + 300 + 400 > 512 */
    gm_stats s = S();
    assert_int_equal(s.num_alloc_retries, want_retries);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 400 * MIB);
    assert_int_equal(s.segment[GM_POOL_ALL].current, 1);
    F(c);
    done();
}

static void test_gc_threshold(void **state) {
    (void)state;
    gc_scenario("garbage_collection_threshold:0.5", true, 0);
    gc_scenario(NULL, true, 1); /* no gc: the fraction forces release + retry */
    /* without a fraction the threshold does nothing, as in torch */
    make("garbage_collection_threshold:0.5", GIB);
    gm_devptr a = M(200 * MIB, 0);
    F(a);
    gm_devptr b = M(300 * MIB, 0);
    assert_int_equal(S().reserved_bytes[GM_POOL_ALL].current, 500 * MIB);
    F(b);
    done();
}

/* the device is full: release the cache, retry, succeed */
static void test_oom_release_retry(void **state) {
    (void)state;
    make(NULL, GIB);
    gm_devptr a = M(600 * MIB, 0);
    F(a);
    gm_devptr b = M(700 * MIB, 0);
    gm_stats s = S();
    assert_int_equal(s.num_alloc_retries, 1);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 700 * MIB);
    gm_devptr c = 0;
    assert_int_equal(gm_malloc(g_a, 0, 2 * GIB, 0, &c), GM_ENOMEM);
    gm_test_check(g_a);
    assert_int_equal(S().num_ooms, 1);
    F(b);
    c = M(900 * MIB, 0); /* works again once memory is free */
    F(c);
    done();

    /* with max_split_size, one oversize block is released first: no retry */
    make("max_split_size_mb:128", GIB);
    a = M(800 * MIB, 0);
    F(a);
    b = M(300 * MIB, 0);
    s = S();
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 300 * MIB);
    F(b);
    done();
}

/* a block freed on one stream is not reused by another */
static void test_streams(void **state) {
    (void)state;
    make(NULL, 0);
    gm_devptr a = M(4 * MIB, 1);
    F(a);
    gm_devptr b = M(4 * MIB, 2);
    assert_true(b != a);
    assert_int_equal(S().segment[GM_POOL_ALL].current, 2);
    gm_devptr c = M(4 * MIB, 1);
    assert_true(c == a);
    F(b), F(c);
    done();
}

/* expandable segments: grow by 20 MiB pages, reuse by best fit, unmap
 * whole free pages on empty_cache, no `segment` stat */
static void test_expandable(void **state) {
    (void)state;
    make("expandable_segments:True", 4 * GIB);
    gm_devptr a = M(30 * MIB, 0); /* maps 2 pages */
    gm_stats s = S();
    assert_int_equal(s.reserved_bytes[GM_POOL_LARGE].current, 40 * MIB);
    assert_int_equal(s.segment[GM_POOL_ALL].current, 0);
    assert_int_equal(s.allocated_bytes[GM_POOL_LARGE].current, 30 * MIB);
    gm_devptr b = M(15 * MIB, 0); /* 10 MiB free + one more page */
    assert_true(b == a + 30 * MIB);
    assert_int_equal(S().reserved_bytes[GM_POOL_LARGE].current, 60 * MIB);
    assert_int_equal(gm_backend_call_count(g_b, 0, GM_BCALL_MAP), 3);
    assert_int_equal(gm_backend_call_count(g_b, 0, GM_BCALL_VA_RESERVE), 1);
    segs v = walk();
    assert_int_equal(v.n, 1);
    assert_int_equal(v.total[0], 60 * MIB);
    assert_true(v.expandable[0]);
    gm_devptr c = M(1000, 0); /* small pool: its own segment of 2 MiB pages */
    assert_int_equal(S().reserved_bytes[GM_POOL_SMALL].current, 2 * MIB);
    F(a);
    E(); /* a's first page is whole and free: unmapped; page 2 is shared */
    s = S();
    assert_int_equal(s.reserved_bytes[GM_POOL_LARGE].current, 40 * MIB);
    assert_int_equal(gm_backend_call_count(g_b, 0, GM_BCALL_UNMAP), 1);
    gm_devptr d = M(20 * MIB, 0); /* fills the hole at the lowest address */
    assert_true(d == a);
    assert_int_equal(S().reserved_bytes[GM_POOL_LARGE].current, 60 * MIB);
    F(b), F(c), F(d);
    E();
    s = S();
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(gm_backend_call_count(g_b, 0, GM_BCALL_VA_RELEASE), 2);
    uint64_t fr = 0, tot = 0;
    assert_int_equal(gm_mem_get_info(g_a, 0, &fr, &tot), GM_OK);
    assert_int_equal(fr, tot);
    done();
}

/* exact allocated == requested rounded to 512 with expandable segments:
 * any remainder of 512 bytes or more is split off */
static void test_expandable_split(void **state) {
    (void)state;
    make("expandable_segments:True", 4 * GIB);
    gm_devptr a = M(3 * MIB + 1000, 0), b = M(3 * MIB + 1000, 0);
    assert_true(b == a + 3 * MIB + 1024);
    assert_int_equal(S().allocated_bytes[GM_POOL_LARGE].current, 2 * (3 * MIB + 1024));
    assert_int_equal(S().inactive_split[GM_POOL_ALL].current, 0); /* not counted for expandable */
    F(a), F(b);
    done();
}

/* ---- the pool sets themselves -------------------------------------------
 * Regression: a split() that walked into the wrong child (an edit of the
 * branch-free descents) left the treap out of key order; an erase then
 * missed its block, which stayed linked, was inserted again and closed a
 * cycle, and the next descent spun forever (gpumem demo --oom-every, and the
 * GPU test and replay bench). The small hand-computed tests above never held
 * enough free blocks to notice. Here: thousands of random inserts and
 * erases against a sorted reference, keys with shared streams and sizes and
 * addresses in no particular order, both kinds of set; and misuse is
 * refused and counted instead of corrupting the tree. */

#define TR_N 400

static const gm_stream tr_streams[] = {0, 0x55d0c0ffee00ull, 0x55d0c0ffef80ull, 0x7f12dead0010ull};

static int tr_by_addr;
static int tr_cmp(const void *x, const void *y) {
    const tp_block *a = *(tp_block *const *)x, *b = *(tp_block *const *)y;
    if (a->h.stream != b->h.stream) return a->h.stream < b->h.stream ? -1 : 1;
    if (!tr_by_addr && a->h.size != b->h.size) return a->h.size < b->h.size ? -1 : 1;
    return a->h.ptr < b->h.ptr ? -1 : a->h.ptr > b->h.ptr;
}

static void tr_verify(tp_set *set, tp_block **ref, size_t n, uint64_t *r) {
    assert_int_equal(set->count, n);
    qsort(ref, n, sizeof *ref, tr_cmp);
    tp_block *b = tp_set_first(set);
    for (size_t i = 0; i < n; i++, b = tp_set_next(set, b)) assert_ptr_equal(b, ref[i]);
    assert_null(b);
    for (int q = 0; q < 8; q++) { /* lower_bound and below of random keys */
        *r = *r * 6364136223846793005ull + 1442695040888963407ull;
        tp_block key = {0};
        key.h.stream = tr_streams[(*r >> 60) % 4];
        key.h.size = 512 * ((*r >> 40) % 64);
        key.h.ptr = 0x7f1234400000ull + 512 * ((*r >> 8) % 4096);
        size_t lo = 0;
        while (lo < n && tr_cmp(&ref[lo], &(tp_block *){&key}) < 0) lo++;
        assert_ptr_equal(tp_set_lower_bound(set, key.h.stream, key.h.size, key.h.ptr),
                         lo < n ? ref[lo] : NULL);
        assert_ptr_equal(tp_set_below(set, key.h.stream, key.h.size, key.h.ptr),
                         lo ? ref[lo - 1] : NULL);
    }
}

static void test_pool_set_against_reference(void **state) {
    (void)state;
    static tp_block blk[TR_N];
    tp_block *ref[TR_N];
    for (tr_by_addr = 0; tr_by_addr < 2; tr_by_addr++) {
        tp_state st;
        memset(&st, 0, sizeof st);
        st.rng = 0x9e3779b9u;
        tp_set set;
        tp_set_init(&set, tr_by_addr);
        uint64_t r = 12345;
        memset(blk, 0, sizeof blk);
        for (int i = 0; i < TR_N; i++) { /* distinct addresses, shuffled */
            blk[i].h.ptr = 0x7f1234400000ull + 512 * (uint64_t)((i * 2654435761u) % 4096);
            blk[i].h.size = 512 * (1 + (uint64_t)(i * 7919 % 37));
            blk[i].h.stream = tr_streams[i % 4];
        }
        size_t n = 0;
        for (int op = 0; op < 6000; op++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            tp_block *b = &blk[(r >> 33) % TR_N];
            if (b->in_set) {
                assert_int_equal(tp_set_erase(&set, b), GM_OK);
                assert_int_equal(b->in_set, TP_SET_NONE);
            } else {
                assert_int_equal(tp_set_insert(&st, &set, b), GM_OK);
                assert_int_equal(b->in_set, tr_by_addr ? TP_SET_UNMAPPED : TP_SET_BLOCKS);
            }
            n = 0;
            for (int i = 0; i < TR_N; i++)
                if (blk[i].in_set) ref[n++] = &blk[i];
            if (op % 7 == 0 || op > 5900) tr_verify(&set, ref, n, &r);
        }
        /* misuse changes nothing and is counted */
        tp_block *in = tp_set_first(&set), *out = NULL;
        for (int i = 0; i < TR_N && !out; i++)
            if (!blk[i].in_set) out = &blk[i];
        assert_non_null(in);
        assert_non_null(out);
        assert_int_equal(tp_set_insert(&st, &set, in), GM_ESTATE);
        assert_int_equal(tp_set_erase(&set, out), GM_ESTATE);
        out->in_set = in->in_set; /* claims to be in the set, is not linked */
        assert_int_equal(tp_set_erase(&set, out), GM_ESTATE);
        out->in_set = TP_SET_NONE;
        assert_int_equal(set.misuse, 3);
        tr_verify(&set, ref, n, &r);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding_and_segment_sizes),
        cmocka_unit_test(test_roundup_power2),
        cmocka_unit_test(test_split_merge_stats),
        cmocka_unit_test(test_large_split_rule),
        cmocka_unit_test(test_max_split_size),
        cmocka_unit_test(test_gc_threshold),
        cmocka_unit_test(test_oom_release_retry),
        cmocka_unit_test(test_streams),
        cmocka_unit_test(test_expandable),
        cmocka_unit_test(test_expandable_split),
        cmocka_unit_test(test_pool_set_against_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
