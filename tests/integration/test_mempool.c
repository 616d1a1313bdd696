/* test_mempool.c — private pools (CUDA graphs, torch.cuda.MemPool; issue
 * 28, src/core/mempool.c) on the sim backend, for both policies:
 * allocations made into a pool land in its own segments; a block freed in a
 * pool is reused by that pool only; the pool's memory goes when its last
 * use and its last block go; two users share a pool; the device's stats sum
 * every pool; checkpoints; bad input (unknown pool, the id (0, 0), a
 * release with no use left, a second begin, an end without begin) is
 * refused with a clear error and changes nothing; traces keep pool ids.
 * What a capture may not do: test_mempool_capture.c. */
#include "mempool_test.h"
#include "util/idmap.h" /* gm__work_steps */

/* ---- segments by pool -------------------------------------------------- */

#define MAX_SEGS 256
typedef struct segs {
    int n;
    gm_segment_info s[MAX_SEGS];
} segs;

static int seg_cb(const gm_segment_info *s, void *arg) {
    segs *v = arg;
    if (v->n < MAX_SEGS) v->s[v->n++] = *s;
    return 0;
}

static segs walk(gm_allocator *a) {
    segs v = {0};
    OK(gm_walk_segments(a, 0, seg_cb, &v));
    return v;
}

/* The pool id of the segment holding p: 1 + id0 (0 when none holds it). */
static uint64_t pool_at(const segs *v, gm_devptr p) {
    for (int i = 0; i < v->n; i++)
        if (p >= v->s[i].address && p < v->s[i].address + v->s[i].total_size)
            return 1 + v->s[i].pool_id[0];
    return 0;
}

/* Bytes of segments of pool (id0, id1). */
static uint64_t pool_bytes(const segs *v, uint64_t id0, uint64_t id1) {
    uint64_t n = 0;
    for (int i = 0; i < v->n; i++)
        if (v->s[i].pool_id[0] == id0 && v->s[i].pool_id[1] == id1) n += v->s[i].total_size;
    return n;
}

static uint64_t all_bytes(const segs *v) {
    uint64_t n = 0;
    for (int i = 0; i < v->n; i++) n += v->s[i].total_size;
    return n;
}

/* ---- the tests --------------------------------------------------------- */

static void test_lands_in_pool(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_devptr d0, p[3], d1;
    OK(gm_malloc(a, 0, 3 * MIB, 0, &d0));
    OK(gm_pool_begin(a, 0, 7, 1));
    OK(gm_malloc_pool(a, 0, 1000, 0, 7, 1, &p[0]));
    OK(gm_malloc_pool(a, 0, 5 * MIB, 0, 7, 1, &p[1]));
    OK(gm_malloc_pool(a, 0, 30 * MIB, 0, 7, 1, &p[2]));
    OK(gm_malloc(a, 0, 4 * MIB, 0, &d1)); /* a stream outside the capture: the device's own */
    OK(gm_pool_end(a, 0, 7, 1));
    segs v = walk(a);
    for (int i = 0; i < 3; i++) assert_int_equal(pool_at(&v, p[i]), 1 + 7);
    assert_int_equal(pool_at(&v, d0), 1);
    assert_int_equal(pool_at(&v, d1), 1);
    gm_block_info bi = {.size_of = sizeof bi};
    OK(gm_block_lookup(a, p[1], NULL, &bi));
    assert_true(bi.pool_id[0] == 7 && bi.pool_id[1] == 1);
    OK(gm_block_lookup(a, d1, NULL, &bi));
    assert_true(bi.pool_id[0] == 0 && bi.pool_id[1] == 0);
    gm_test_check(a);
    for (int i = 0; i < 3; i++) OK(gm_free(a, p[i]));
    OK(gm_free(a, d0));
    OK(gm_free(a, d1));
    OK(gm_pool_release(a, 0, 7, 1));
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_reuse_only_within(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_devptr x, y, z, w;
    OK(gm_pool_begin(a, 0, 3, 3));
    OK(gm_malloc_pool(a, 0, 2 * MIB, 0, 3, 3, &x));
    OK(gm_free(a, x)); /* freed inside the capture: cached in the pool */
    OK(gm_malloc(a, 0, 2 * MIB, 0, &y));
    assert_true(y != x);
    segs v = walk(a);
    assert_int_equal(pool_at(&v, y), 1);
    OK(gm_malloc_pool(a, 0, 2 * MIB, 0, 3, 3, &z));
    v = walk(a);
    assert_int_equal(pool_at(&v, z), 1 + 3); /* the pool reuses its own memory */
    OK(gm_free(a, y));
    /* the device's freed block is not taken by the pool either */
    OK(gm_malloc_pool(a, 0, 2 * MIB, 0, 3, 3, &w));
    assert_true(w != y);
    OK(gm_pool_end(a, 0, 3, 3));
    gm_test_check(a);
    OK(gm_free(a, z));
    OK(gm_free(a, w));
    OK(gm_pool_release(a, 0, 3, 3));
    gm_test_destroy(b, a);
}

static void test_release_gives_back(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_sim_live live0 = {.size = sizeof live0}, live = {.size = sizeof live};
    OK(gm_sim_live_objects(b, 0, &live0));
    gm_devptr x, y;
    OK(gm_pool_begin(a, 0, 9, 0));
    OK(gm_malloc_pool(a, 0, 8 * MIB, 0, 9, 0, &x));
    OK(gm_malloc_pool(a, 0, 100 * KIB, 0, 9, 0, &y));
    OK(gm_pool_end(a, 0, 9, 0));
    OK(gm_free(a, x));
    segs v = walk(a);
    assert_true(pool_bytes(&v, 9, 0) >= 8 * MIB);
    /* the last use goes while y is live: the pool stays for y */
    OK(gm_pool_release(a, 0, 9, 0));
    v = walk(a);
    assert_true(pool_bytes(&v, 9, 0) > 0);
    gm_test_check(a);
    OK(gm_free(a, y)); /* its last block: the pool and its memory go */
    v = walk(a);
    assert_int_equal(pool_bytes(&v, 9, 0), 0);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(s.segment[GM_POOL_ALL].current, 0);
    OK(gm_sim_live_objects(b, 0, &live));
    assert_int_equal(live.used_bytes, live0.used_bytes);
    int n;
    assert_int_equal(gm_pool_use_count(a, 0, 9, 0, &n), GM_EINVAL); /* gone */
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_shared_pool(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    int n = 0;
    gm_devptr g1, g2;
    OK(gm_pool_begin(a, 0, 5, 5)); /* graph 1 */
    OK(gm_malloc_pool(a, 0, 4 * MIB, 0, 5, 5, &g1));
    OK(gm_free(a, g1));
    OK(gm_pool_end(a, 0, 5, 5));
    OK(gm_pool_begin(a, 0, 5, 5)); /* graph 2, pool=g1.pool() */
    OK(gm_pool_use_count(a, 0, 5, 5, &n));
    assert_int_equal(n, 2);
    OK(gm_malloc_pool(a, 0, 4 * MIB, 0, 5, 5, &g2));
    assert_true(g2 == g1); /* what graph 1 freed serves graph 2 */
    OK(gm_free(a, g2));
    OK(gm_pool_end(a, 0, 5, 5));
    OK(gm_pool_retain(a, 0, 5, 5)); /* a MemPool handle too */
    OK(gm_pool_use_count(a, 0, 5, 5, &n));
    assert_int_equal(n, 3);
    uint64_t held = pool_bytes(&(segs){0}, 5, 5);
    segs v = walk(a);
    held = pool_bytes(&v, 5, 5);
    assert_true(held >= 4 * MIB);
    OK(gm_pool_release(a, 0, 5, 5));
    OK(gm_pool_release(a, 0, 5, 5));
    v = walk(a);
    assert_int_equal(pool_bytes(&v, 5, 5), held); /* one user left: kept */
    OK(gm_pool_release(a, 0, 5, 5));
    v = walk(a);
    assert_int_equal(pool_bytes(&v, 5, 5), 0);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_stats_sum(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_devptr d0, p0, q0;
    OK(gm_malloc(a, 0, 6 * MIB, 0, &d0));
    gm_stats s0 = gm_test_stats(a);
    OK(gm_pool_retain(a, 0, 1, 2));
    OK(gm_pool_retain(a, 0, 2, 1));
    OK(gm_malloc_pool(a, 0, 6 * MIB, 0, 1, 2, &p0));
    OK(gm_malloc_pool(a, 0, 512, 0, 2, 1, &q0));
    gm_stats s = gm_test_stats(a);
    segs v = walk(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, (int64_t)all_bytes(&v));
    assert_true(pool_bytes(&v, 1, 2) > 0 && pool_bytes(&v, 2, 1) > 0 && pool_bytes(&v, 0, 0) > 0);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 3);
    assert_int_equal(s.allocation[GM_POOL_SMALL].current, 1);
    assert_int_equal(s.requested_bytes[GM_POOL_ALL].current, 12 * MIB + 512);
    if (kind_of(state) == GM_POLICY_TORCH) /* gpumem's segments are chunks; the walk shows mapped runs */
        assert_int_equal(s.segment[GM_POOL_ALL].current, v.n);
    assert_true(s.reserved_bytes[GM_POOL_ALL].peak >= s.reserved_bytes[GM_POOL_ALL].current);
    assert_true(s.num_device_alloc + s.num_map > s0.num_device_alloc + s0.num_map);
    gm_test_check(a);
    OK(gm_free(a, p0));
    OK(gm_free(a, q0));
    OK(gm_pool_release(a, 0, 1, 2));
    OK(gm_pool_release(a, 0, 2, 1));
    s = gm_test_stats(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, s0.reserved_bytes[GM_POOL_ALL].current);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 1);
    gm_test_check(a);
    OK(gm_free(a, d0));
    gm_test_destroy(b, a);
}

/* A memory fraction limits the device's own pools and its private pools
 * together, as torch's one total_allocated_memory does: 80 MiB in a pool
 * and 80 MiB outside it do not fit under a 128 MiB limit, whichever comes
 * first; once the pool's memory goes, the second fits. */
static void test_fraction_sums_pools(void **state) {
    for (int pool_first = 0; pool_first < 2; pool_first++) {
        gm_backend *b;
        gm_allocator *a;
        int rc = gm_test_make(kind_of(state), NULL, 512 * MIB, false, &b, &a);
        if (rc != GM_OK) fail_msg("gm_test_make: %s %s", gm_status_name(rc), gm_last_error_detail());
        OK(gm_set_memory_fraction(a, 0, 0.25));
        OK(gm_pool_retain(a, 0, 7, 0));
        gm_devptr first, second = 0, small;
        if (pool_first) OK(gm_malloc_pool(a, 0, 80 * MIB, 0, 7, 0, &first));
        else OK(gm_malloc(a, 0, 80 * MIB, 0, &first));
        rc = pool_first ? gm_malloc(a, 0, 80 * MIB, 0, &second) : gm_malloc_pool(a, 0, 80 * MIB, 0, 7, 0, &second);
        assert_int_equal(rc, GM_ENOMEM);
        OK(pool_first ? gm_malloc(a, 0, 40 * MIB, 0, &small) : gm_malloc_pool(a, 0, 40 * MIB, 0, 7, 0, &small));
        gm_test_check(a);
        OK(gm_free(a, small));
        OK(gm_free(a, first));
        OK(gm_empty_cache(a, 0));
        OK(gm_pool_empty_cache(a, 0, 7, 0));
        OK(pool_first ? gm_malloc(a, 0, 80 * MIB, 0, &second) : gm_malloc_pool(a, 0, 80 * MIB, 0, 7, 0, &second));
        OK(gm_free(a, second));
        OK(gm_pool_release(a, 0, 7, 0));
        gm_test_check(a);
        gm_test_destroy(b, a);
    }
}

/* A released pool's last block waits for another stream's event: the pool
 * goes once it is back; a pool released during another's capture gives its
 * memory back when the capture ends. */
static void test_release_waits(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, true, &b, &a);
    gm_devptr p, x, y;
    OK(gm_pool_retain(a, 0, 3, 1));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 3, 1, &p));
    OK(gm_record_stream(a, p, 5));
    OK(gm_free(a, p)); /* pending on stream 5 */
    OK(gm_pool_release(a, 0, 3, 1));
    gm_test_check(a);
    OK(gm_sim_complete_events(b, 0, UINT64_MAX));
    OK(gm_malloc(a, 0, 512, 0, &x)); /* the pending list is processed */
    int n;
    assert_int_equal(gm_pool_use_count(a, 0, 3, 1, &n), GM_EINVAL); /* gone with its last block */
    segs v = walk(a);
    assert_int_equal(pool_bytes(&v, 3, 1), 0);
    gm_test_check(a);
    /* released while pool (4, 1) captures: kept until the capture ends */
    OK(gm_pool_retain(a, 0, 5, 1));
    OK(gm_pool_begin(a, 0, 4, 1));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 5, 1, &y));
    OK(gm_free(a, y));
    OK(gm_pool_release(a, 0, 5, 1));
    v = walk(a);
    assert_true(pool_bytes(&v, 5, 1) > 0);
    OK(gm_pool_end(a, 0, 4, 1));
    v = walk(a);
    assert_int_equal(pool_bytes(&v, 5, 1), 0);
    OK(gm_pool_release(a, 0, 4, 1));
    OK(gm_free(a, x));
    OK(gm_empty_cache(a, 0));
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    gm_test_check(a);
    gm_test_destroy(b, a);
}


/* ---- checkpoints (CUDA graph trees) ------------------------------------- */

typedef struct restored {
    int nfreed, nallocd;
    gm_devptr freed[16], allocd[16];
} restored;

static void restore_cb(gm_devptr ptr, uint64_t size, bool allocated, void *arg) {
    restored *r = arg;
    assert_true(size > 0);
    if (allocated && r->nallocd < 16) r->allocd[r->nallocd++] = ptr;
    if (!allocated && r->nfreed < 16) r->freed[r->nfreed++] = ptr;
}

static bool has(const gm_devptr *v, int n, gm_devptr p) {
    for (int i = 0; i < n; i++)
        if (v[i] == p) return true;
    return false;
}

static void test_checkpoint_restore(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_devptr a0, a1, x, y;
    gm_pool_checkpoint *c = NULL;
    OK(gm_pool_retain(a, 0, 1, 9));
    OK(gm_malloc_pool(a, 0, 2 * MIB, 0, 1, 9, &a0));
    OK(gm_malloc_pool(a, 0, 1 * MIB, 0, 1, 9, &a1));
    OK(gm_pool_checkpoint_take(a, 0, 1, 9, &c));
    OK(gm_free(a, a1)); /* pinned by c: held, not reused */
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 1);
    OK(gm_malloc_pool(a, 0, 1 * MIB, 0, 1, 9, &x));
    assert_true(x != a1);
    gm_test_check(a);
    restored r = {0};
    OK(gm_pool_checkpoint_restore(a, c, restore_cb, &r));
    /* x (not in the checkpoint) freed; a0 freed and allocated again; a1 handed out again */
    assert_int_equal(r.nfreed, 2);
    assert_true(has(r.freed, r.nfreed, x) && has(r.freed, r.nfreed, a0));
    assert_int_equal(r.nallocd, 2);
    assert_true(has(r.allocd, r.nallocd, a0) && has(r.allocd, r.nallocd, a1));
    gm_block_info bi = {.size_of = sizeof bi};
    OK(gm_block_lookup(a, a1, NULL, &bi));
    assert_true(bi.live && bi.pool_id[0] == 1 && bi.pool_id[1] == 9);
    assert_int_equal(gm_block_lookup(a, x, NULL, &bi), GM_EFOREIGN);
    gm_test_check(a);
    /* restoring again changes nothing: both are live */
    memset(&r, 0, sizeof r);
    OK(gm_pool_checkpoint_restore(a, c, restore_cb, &r));
    assert_int_equal(r.nfreed, 2);
    assert_int_equal(r.nallocd, 2);
    OK(gm_free(a, a0));
    OK(gm_free(a, a1));
    OK(gm_pool_release(a, 0, 1, 9)); /* the last use: the pool waits for its held blocks */
    segs v = walk(a);
    assert_true(pool_bytes(&v, 1, 9) > 0);
    gm_test_check(a);
    gm_pool_checkpoint_free(a, c); /* held blocks go back; the pool goes with them */
    v = walk(a);
    assert_int_equal(pool_bytes(&v, 1, 9), 0);
    assert_int_equal(gm_pool_checkpoint_take(a, 0, 1, 9, &c), GM_EINVAL);
    assert_true(c == NULL);
    /* another allocator cannot restore it */
    OK(gm_pool_retain(a, 0, 2, 9));
    OK(gm_malloc_pool(a, 0, 1 * MIB, 0, 2, 9, &y));
    OK(gm_pool_checkpoint_take(a, 0, 2, 9, &c));
    gm_allocator *other = NULL;
    gm_backend *ob = NULL;
    make(state, false, &ob, &other);
    assert_int_equal(gm_pool_checkpoint_restore(other, c, restore_cb, &r), GM_EINVAL);
    gm_test_destroy(ob, other);
    OK(gm_free(a, y));
    OK(gm_pool_release(a, 0, 2, 9));
    gm_pool_checkpoint_free(a, c);
    assert_int_equal(gm_pool_use_count(a, 0, 2, 9, &(int){0}), GM_EINVAL);
    gm_test_check(a);
    OK(gm_empty_cache(a, 0));
    s = gm_test_stats(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    gm_test_destroy(b, a);
}

/* Issue 43, item 7: a checkpoint that outlives its pool is stale once a new
 * pool takes the id: restoring it is refused and changes nothing (it used to
 * free the new pool's live blocks), freeing it leaves the new pool's pins
 * alone (the new pool's own checkpoint then failed with GM_ESTATE). */
static void test_stale_checkpoint(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_pool_checkpoint *old = NULL, *now = NULL;
    OK(gm_pool_retain(a, 0, 4, 2));
    OK(gm_pool_checkpoint_take(a, 0, 4, 2, &old)); /* of the empty pool */
    OK(gm_pool_release(a, 0, 4, 2));               /* the pool goes; old outlives it */
    assert_int_equal(gm_pool_use_count(a, 0, 4, 2, &(int){0}), GM_EINVAL);
    OK(gm_pool_retain(a, 0, 4, 2)); /* a new pool under the same id */
    gm_devptr p[3];
    for (int i = 0; i < 3; i++) OK(gm_malloc_pool(a, 0, 1 * MIB, 0, 4, 2, &p[i]));
    OK(gm_pool_checkpoint_take(a, 0, 4, 2, &now));
    restored r = {0};
    assert_int_equal(gm_pool_checkpoint_restore(a, old, restore_cb, &r), GM_ESTATE);
    assert_non_null(strstr(gm_last_error_detail(), "taken of an earlier private pool (4, 2)"));
    assert_int_equal(r.nfreed + r.nallocd, 0);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 3);
    gm_pool_checkpoint_free(a, old); /* must not unpin the new pool's blocks */
    OK(gm_free(a, p[1]));            /* pinned by now: held */
    gm_test_check(a);
    memset(&r, 0, sizeof r);
    OK(gm_pool_checkpoint_restore(a, now, restore_cb, &r));
    assert_true(has(r.allocd, r.nallocd, p[1]));
    gm_block_info bi = {.size_of = sizeof bi};
    OK(gm_block_lookup(a, p[1], NULL, &bi));
    assert_true(bi.live);
    gm_test_check(a);
    for (int i = 0; i < 3; i++) OK(gm_free(a, p[i]));
    gm_pool_checkpoint_free(a, now);
    OK(gm_pool_release(a, 0, 4, 2));
    gm_test_check(a);
    gm_test_destroy(b, a);
}

/* Issue 43, item 4: finding a pool does not walk the pools. 65535 pools (the
 * most a device keeps) used to take 16-18 s to create and a malloc + free
 * in the last cost 100x one in the first; now each costs a few probes of the
 * pool index (gm__work_steps counts them: work measured, not timed). Freed
 * slots are reused lowest first, and the next pool past the most is
 * refused. */
static void test_many_pools(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    enum { N = 65535 };
    uint64_t before = gm__work_steps;
    for (uint64_t i = 1; i <= N; i++) OK(gm_pool_retain(a, 0, i, 7));
    uint64_t create_steps = gm__work_steps - before;
    if (create_steps < N || create_steps > 8ull * N) fail_msg("%d pools took %llu steps to create", N,
                                                              (unsigned long long)create_steps);
    assert_int_equal(gm_pool_retain(a, 0, N + 1, 7), GM_ENOSPACE);
    uint64_t cost[2];
    for (int k = 0; k < 2; k++) {
        uint64_t id = k ? N : 1;
        gm_devptr p;
        before = gm__work_steps;
        OK(gm_malloc_pool(a, 0, 1 * MIB, 0, id, 7, &p));
        OK(gm_free(a, p));
        cost[k] = gm__work_steps - before;
        if (cost[k] < 1 || cost[k] > 16) fail_msg("a malloc + free in pool %llu took %llu steps",
                                                   (unsigned long long)id, (unsigned long long)cost[k]);
        gm_block_info bi = {.size_of = sizeof bi};
        assert_int_equal(gm_block_lookup(a, p, NULL, &bi), GM_EFOREIGN);
    }
    /* release three, make three: they take the freed slots, lowest first,
     * and each id still names its own pool */
    uint64_t gone[] = {30000, 5, 60000};
    for (int i = 0; i < 3; i++) OK(gm_pool_release(a, 0, gone[i], 7));
    for (int i = 0; i < 3; i++) OK(gm_pool_retain(a, 0, N + 1 + (uint64_t)i, 8));
    for (uint64_t id = N + 1; id <= N + 3; id++) {
        gm_devptr p;
        OK(gm_malloc_pool(a, 0, 1 * MIB, 0, id, 8, &p));
        gm_block_info bi = {.size_of = sizeof bi};
        OK(gm_block_lookup(a, p, NULL, &bi));
        assert_true(bi.pool_id[0] == id && bi.pool_id[1] == 8);
        OK(gm_free(a, p));
    }
    for (int i = 0; i < 3; i++) assert_int_equal(gm_pool_use_count(a, 0, gone[i], 7, &(int){0}), GM_EINVAL);
    int uses = 0;
    OK(gm_pool_use_count(a, 0, 29999, 7, &uses));
    assert_int_equal(uses, 1);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_bad_input(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_devptr x = 0, p;
    int n = -1;
    OK(gm_pool_retain(a, 0, 1, 1));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 1, 1, &p));
    gm_stats s0 = gm_test_stats(a);
    assert_int_equal(gm_malloc_pool(a, 0, 1 * MIB, 0, 8, 8, &x), GM_EINVAL);
    assert_non_null(strstr(gm_last_error_detail(), "no private pool (8, 8)"));
    assert_true(x == 0);
    assert_int_equal(gm_pool_release(a, 0, 8, 8), GM_EINVAL);
    assert_int_equal(gm_pool_end(a, 0, 8, 8), GM_EINVAL);
    assert_int_equal(gm_pool_use_count(a, 0, 8, 8, &n), GM_EINVAL);
    assert_int_equal(gm_pool_empty_cache(a, 0, 8, 8), GM_EINVAL);
    OK(gm_pool_empty_cache(a, -1, 8, 8)); /* every device that has it: none */
    assert_int_equal(gm_pool_begin(a, 0, 0, 0), GM_EINVAL); /* the device's own pools */
    assert_non_null(strstr(gm_last_error_detail(), "(0, 0)"));
    assert_int_equal(gm_malloc_pool(a, 0, 1 * MIB, 0, 0, 0, &x), GM_EINVAL);
    assert_int_equal(gm_pool_end(a, 0, 1, 1), GM_ESTATE); /* never begun */
    assert_int_equal(gm_pool_begin(a, 7, 1, 1), GM_EDEVICE);
    OK(gm_pool_begin(a, 0, 1, 1));
    assert_int_equal(gm_pool_begin(a, 0, 1, 1), GM_ESTATE); /* begun twice */
    OK(gm_pool_end(a, 0, 1, 1));
    assert_int_equal(gm_pool_end(a, 0, 1, 1), GM_ESTATE);
    OK(gm_pool_release(a, 0, 1, 1)); /* the begin's use */
    OK(gm_pool_release(a, 0, 1, 1)); /* the retain's use: released, p still out */
    assert_int_equal(gm_pool_release(a, 0, 1, 1), GM_ESTATE); /* released twice */
    assert_non_null(strstr(gm_last_error_detail(), "released twice"));
    assert_int_equal(gm_pool_retain(a, 0, 1, 1), GM_ESTATE); /* released, waiting for p */
    assert_int_equal(gm_malloc_pool(a, 0, 1 * MIB, 0, 1, 1, &x), GM_EINVAL);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, s0.reserved_bytes[GM_POOL_ALL].current);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, s0.allocation[GM_POOL_ALL].current);
    assert_int_equal(s.num_device_alloc + s.num_map, s0.num_device_alloc + s0.num_map);
    gm_test_check(a);
    /* a pointer of a pool freed twice is a double free, as anywhere */
    OK(gm_free(a, p));
    assert_int_equal(gm_free(a, p), GM_EFOREIGN); /* the pool went with p: not ours any more */
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_double_free_in_pool(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_devptr p, q;
    OK(gm_pool_retain(a, 0, 2, 2));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 2, 2, &p));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 2, 2, &q));
    OK(gm_free(a, p));
    gm_stats s0 = gm_test_stats(a);
    assert_int_equal(gm_free(a, p), GM_EDOUBLEFREE);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, s0.allocation[GM_POOL_ALL].current);
    gm_test_check(a);
    OK(gm_free(a, q));
    OK(gm_pool_release(a, 0, 2, 2));
    gm_test_destroy(b, a);
}

/* Destroying the allocator with pools in use (and blocks live) leaves nothing. */
static void test_destroy_with_pools(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, false, &b, &a);
    gm_devptr p;
    OK(gm_pool_begin(a, 0, 6, 6));
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 6, 6, &p));
    OK(gm_pool_retain(a, 0, 6, 7));
    gm_allocator_destroy(a);
    gm_sim_live live = {.size = sizeof live};
    OK(gm_sim_live_objects(b, 0, &live));
    assert_int_equal(live.used_bytes, 0);
    assert_int_equal(live.allocations + live.reservations + live.phys, 0);
    gm_test_destroy(b, NULL);
}


/* ---- traces: segment_pool_id read, written and replayed ---------------- */

#define POOL_SEG 0x7f0000000000ull
#define OWN_SEG 0x7e0000000000ull

/* A graphed program as torch records it: a graph's pool takes 2 MiB and
 * frees it inside the capture; then the program allocates 2 MiB outside
 * the graph, which torch cannot serve from the pool's memory. */
static gm_trace *pooled_trace(bool with_pool) {
    gm__trace_builder *tb = gm__tb_new();
    assert_non_null(tb);
    gm_trace_event ev[] = {
        {.action = GM_TA_SEGMENT_ALLOC, .addr = POOL_SEG, .size = 2 * MIB},
        {.action = GM_TA_ALLOC, .addr = POOL_SEG, .size = 2 * MIB},
        {.action = GM_TA_FREE_REQUESTED, .addr = POOL_SEG, .size = 2 * MIB},
        {.action = GM_TA_FREE_COMPLETED, .addr = POOL_SEG, .size = 2 * MIB},
        {.action = GM_TA_SEGMENT_ALLOC, .addr = OWN_SEG, .size = 2 * MIB},
        {.action = GM_TA_ALLOC, .addr = OWN_SEG, .size = 2 * MIB},
    };
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++) OK(gm__tb_event(tb, &ev[i]));
    gm_trace_segment pool = {.address = POOL_SEG, .total_size = 2 * MIB, .nblocks = 1, .large = true,
                             .pool_id = {with_pool ? 1 : 0, with_pool ? 3 : 0}};
    gm_trace_segment own = {.address = OWN_SEG, .total_size = 2 * MIB, .allocated_size = 2 * MIB,
                            .requested_size = 2 * MIB, .nblocks = 1, .large = true};
    OK(gm__tb_segment(tb, &pool));
    OK(gm__tb_segment(tb, &own));
    gm_trace *t = NULL;
    OK(gm__tb_finish(tb, "pytorch-snapshot", &t));
    return t;
}

static void test_trace_pool_ids(void **state) {
    (void)state;
    gm_trace *t = pooled_trace(true), *back = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    OK(gm__trace_encode_snapshot(t, &buf, &len)); /* segment_pool_id as torch pickles it: a pair */
    OK(gm__trace_from_snapshot(buf, len, &back));
    assert_int_equal(back->nsegments, 2);
    assert_true(back->segments[0].pool_id[0] == 1 && back->segments[0].pool_id[1] == 3);
    assert_true(back->segments[1].pool_id[0] == 0 && back->segments[1].pool_id[1] == 0);
    free(buf);
    gm__trace_free(back);
    OK(gm__trace_encode_gmt(t, &buf, &len));
    OK(gm__trace_decode_gmt(buf, len, &back));
    assert_true(back->segments[0].pool_id[0] == 1 && back->segments[0].pool_id[1] == 3);
    assert_true(back->segments[1].pool_id[0] == 0 && back->segments[1].pool_id[1] == 0);
    free(buf);
    gm__trace_free(back);
    gm__trace_free(t);
}

static gm_replay_result replay(gm_trace *t, gm_policy_kind kind, uint32_t *npools) {
    gm_replay_prog *p = NULL;
    OK(gm__replay_compile(t, 0, &p));
    *npools = gm__replay_prog_pools(p);
    gm_config c;
    gm_config_init(&c);
    c.policy = kind;
    gm_replay_result r;
    OK(gm__replay_run(p, &c, 0, &r));
    gm__replay_prog_free(p);
    return r;
}

static void test_replay_pools(void **state) {
    gm_trace *pooled = pooled_trace(true), *plain = pooled_trace(false);
    uint32_t np = 0, np0 = 0;
    gm_replay_result r = replay(pooled, kind_of(state), &np);
    gm_replay_result r0 = replay(plain, kind_of(state), &np0);
    assert_int_equal(np, 1);
    assert_int_equal(np0, 0);
    assert_int_equal(r.error, 0);
    assert_false(r.oom);
    assert_int_equal(r.allocs, 2);
    /* the pool's freed memory is not reused outside it, as on the device */
    assert_true(r.peak_reserved >= (int64_t)(4 * MIB));
    assert_true(r0.peak_reserved < r.peak_reserved);
    if (kind_of(state) == GM_POLICY_TORCH) {
        assert_int_equal(r.segments, 2); /* the device's two segments */
        assert_int_equal(r0.segments, 1);
    }
    gm__trace_free(pooled);
    gm__trace_free(plain);
}

#define TESTS(k)                                                                                          \
    {                                                                                                     \
        cmocka_unit_test_prestate(test_lands_in_pool, &k), cmocka_unit_test_prestate(test_reuse_only_within, &k), \
        cmocka_unit_test_prestate(test_release_gives_back, &k), cmocka_unit_test_prestate(test_shared_pool, &k), \
        cmocka_unit_test_prestate(test_stats_sum, &k), cmocka_unit_test_prestate(test_fraction_sums_pools, &k), \
        cmocka_unit_test_prestate(test_bad_input, &k), cmocka_unit_test_prestate(test_double_free_in_pool, &k), \
        cmocka_unit_test_prestate(test_destroy_with_pools, &k), cmocka_unit_test_prestate(test_replay_pools, &k), \
        cmocka_unit_test_prestate(test_release_waits, &k), \
        cmocka_unit_test_prestate(test_checkpoint_restore, &k), \
        cmocka_unit_test_prestate(test_stale_checkpoint, &k), cmocka_unit_test_prestate(test_many_pools, &k), \
    }

/* GM_TEST_POLICY=torch or gpumem runs one policy only */
int main(void) {
    const struct CMUnitTest torch[] = TESTS(k_torch);
    const struct CMUnitTest gpumem[] = TESTS(k_gpumem);
    const struct CMUnitTest traces[] = {cmocka_unit_test(test_trace_pool_ids)};
    int failed = cmocka_run_group_tests_name("traces", traces, NULL, NULL);
    return mempool_run(failed, torch, gpumem, sizeof torch / sizeof torch[0]);
}
