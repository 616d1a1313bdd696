/* test_interop.c — the pools and lifecycles others build on gpumem (issue
 * 46), on the sim backend: sleep and wake of tagged private pools (vLLM's
 * sleep mode: memory given back at stable addresses, contents offloaded and
 * restored), pools of another allocator's memory (torch.cuda.MemPool(
 * allocator=...)), use_on_oom and no_split pools, and settings changed while
 * the allocator runs (torch.cuda.memory._set_allocator_settings). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB GM_TEST_MIB
#define GIB GM_TEST_GIB

#define OK(call)                                                                                          \
    do {                                                                                                  \
        int rc_ = (call);                                                                                 \
        if (rc_ != GM_OK) fail_msg("%s: %s %s", #call, gm_status_name(rc_), gm_last_error_detail());    \
    } while (0)

static uint64_t used(gm_backend *b) {
    gm_sim_live l = {.size = sizeof l};
    OK(gm_sim_live_objects(b, 0, &l));
    return l.used_bytes;
}

/* A pool (7, 0) tagged "weights" holding three blocks filled with a pattern. */
typedef struct fixture {
    gm_backend *b;
    gm_allocator *a;
    gm_devptr p[3];
    uint64_t n[3];
} fixture;

static void fill(gm_backend *b, gm_devptr p, uint64_t n, unsigned seed) {
    unsigned char *buf = malloc(n);
    for (uint64_t i = 0; i < n; i++) buf[i] = (unsigned char)(seed + i * 7);
    OK(gm_sim_write(b, 0, p, buf, n));
    free(buf);
}

/* 1 when p holds fill(seed)'s pattern, 0 when all zeros, -1 otherwise. */
static int holds(gm_backend *b, gm_devptr p, uint64_t n, unsigned seed) {
    unsigned char *buf = malloc(n);
    OK(gm_sim_read(b, 0, p, buf, n));
    bool pat = true, zero = true;
    for (uint64_t i = 0; i < n; i++) {
        pat &= buf[i] == (unsigned char)(seed + i * 7);
        zero &= buf[i] == 0;
    }
    free(buf);
    return pat ? 1 : zero ? 0 : -1;
}

static void setup_pool(fixture *f, const char *conf) {
    OK(gm_test_make(GM_POLICY_GPUMEM, conf, 8 * GIB, false, &f->b, &f->a));
    OK(gm_pool_retain(f->a, 0, 7, 0));
    OK(gm_pool_set_tag(f->a, 0, 7, 0, "weights"));
    uint64_t sizes[3] = {3 * MIB + 4096, 40 * 1024, 17 * MIB};
    for (int i = 0; i < 3; i++) {
        f->n[i] = sizes[i];
        OK(gm_malloc_pool(f->a, 0, sizes[i], 0, 7, 0, &f->p[i]));
        fill(f->b, f->p[i], sizes[i], 11u * (unsigned)i + 1);
    }
}

static void teardown_pool(fixture *f) {
    for (int i = 0; i < 3; i++)
        if (f->p[i]) OK(gm_free(f->a, f->p[i]));
    OK(gm_pool_release(f->a, 0, 7, 0));
    gm_test_check(f->a);
    gm_test_destroy(f->b, f->a);
}

/* Sleep with offload gives the memory back and keeps every address; wake
 * maps memory at the same addresses and restores the contents. Under both
 * VMM layouts: policy:gpumem, and policy:torch with expandable segments. */
static void sleep_offload_wake(const char *conf) {
    fixture f = {0};
    setup_pool(&f, conf);
    gm_devptr own;
    OK(gm_malloc(f.a, 0, 5 * MIB, 0, &own)); /* the device's own pools: not asleep */
    fill(f.b, own, 5 * MIB, 99);
    uint64_t before = used(f.b), released = 0, again = 1;
    gm_stats s0 = gm_test_stats(f.a);
    OK(gm_allocator_sleep(f.a, 0, "weights", GM_SLEEP_OFFLOAD, &released));
    assert_true(released >= 20 * MIB);
    assert_int_equal(used(f.b), before - released); /* the device's memory is given back */
    OK(gm_allocator_sleep(f.a, 0, "weights", GM_SLEEP_OFFLOAD, &again)); /* twice: nothing more */
    assert_int_equal(again, 0);
    assert_int_equal(used(f.b), before - released);
    gm_devptr q = 1;
    assert_int_equal(gm_malloc_pool(f.a, 0, MIB, 0, 7, 0, &q), GM_ESTATE);
    assert_int_equal(q, 0);
    assert_non_null(strstr(gm_last_error_detail(), "asleep"));
    gm_devptr fresh;
    OK(gm_malloc(f.a, 0, 3 * MIB, 0, &fresh)); /* the device's own pools allocate on fresh memory */
    OK(gm_free(f.a, fresh));
    gm_test_check(f.a);
    gm_stats s1 = gm_test_stats(f.a); /* the layout is unchanged: still reserved */
    assert_int_equal(s1.allocated_bytes[GM_POOL_ALL].current, s0.allocated_bytes[GM_POOL_ALL].current);
    uint64_t asleep = used(f.b);
    OK(gm_allocator_wake(f.a, 0, "weights"));
    OK(gm_allocator_wake(f.a, 0, "weights")); /* twice: nothing */
    assert_int_equal(used(f.b), asleep + released);
    for (int i = 0; i < 3; i++) {
        gm_block_info bi = {.size_of = sizeof bi};
        OK(gm_block_lookup(f.a, f.p[i], NULL, &bi)); /* same pointer, still a live block */
        assert_int_equal(bi.pool_id[0], 7);
        assert_int_equal(holds(f.b, f.p[i], f.n[i], 11u * (unsigned)i + 1), 1);
    }
    assert_int_equal(holds(f.b, own, 5 * MIB, 99), 1);
    OK(gm_free(f.a, own));
    teardown_pool(&f);
}

static void sleep_offload_gpumem(void **state) {
    (void)state;
    sleep_offload_wake("");
}

static void sleep_offload_torch_expandable(void **state) {
    (void)state;
    sleep_offload_wake("policy:torch,expandable_segments:True");
}

/* Without offload the contents are gone (vLLM's level 2, a KV cache); a
 * block freed while asleep is fine; tag NULL also gives back idle memory of
 * the device's own pools; the allocator goes down clean while asleep. */
static void sleep_discard(void **state) {
    (void)state;
    fixture f = {0};
    setup_pool(&f, "");
    gm_devptr idle;
    OK(gm_malloc(f.a, 0, 64 * MIB, 0, &idle));
    OK(gm_free(f.a, idle)); /* cached by the device's own pools */
    uint64_t before = used(f.b), released = 0;
    OK(gm_allocator_sleep(f.a, 0, NULL, 0, &released));
    assert_true(released >= 20 * MIB + 64 * MIB);
    assert_int_equal(used(f.b), before - released);
    OK(gm_free(f.a, f.p[1])); /* freed while asleep */
    f.p[1] = 0;
    gm_test_check(f.a);
    OK(gm_allocator_wake(f.a, -1, NULL));
    assert_int_equal(holds(f.b, f.p[0], f.n[0], 1), 0); /* fresh memory */
    assert_int_equal(holds(f.b, f.p[2], f.n[2], 23), 0);
    /* asleep at the end: destroy gives everything back */
    OK(gm_allocator_sleep(f.a, 0, "weights", GM_SLEEP_OFFLOAD, NULL));
    gm_allocator_destroy(f.a);
    gm_sim_live l = {.size = sizeof l};
    OK(gm_sim_live_objects(f.b, 0, &l));
    assert_int_equal(l.phys, 0);
    assert_int_equal(l.reservations, 0);
    assert_int_equal(l.used_bytes, 0);
    gm_backend_destroy(f.b);
}

/* Bad input is refused and changes nothing. */
static void sleep_bad_input(void **state) {
    (void)state;
    fixture f = {0};
    setup_pool(&f, "");
    uint64_t before = used(f.b), released = 7;
    assert_int_equal(gm_allocator_sleep(f.a, 0, "weight", 0, &released), GM_EINVAL);
    assert_non_null(strstr(gm_last_error_detail(), "no private pool is tagged 'weight'"));
    assert_int_equal(released, 0);
    assert_int_equal(gm_allocator_wake(f.a, 0, "nope"), GM_EINVAL);
    assert_int_equal(gm_allocator_sleep(f.a, 0, "", 0, NULL), GM_EINVAL);
    assert_int_equal(gm_allocator_sleep(f.a, 0, "weights", 8, NULL), GM_EINVAL);
    assert_int_equal(gm_allocator_sleep(f.a, 5, "weights", 0, NULL), GM_EDEVICE);
    assert_int_equal(gm_allocator_sleep(NULL, 0, "weights", 0, NULL), GM_EINVAL);
    assert_int_equal(gm_pool_set_tag(f.a, 0, 7, 0, "a-tag-that-is-far-too-long-to-keep"), GM_EINVAL);
    assert_int_equal(gm_pool_set_tag(f.a, 0, 8, 0, "x"), GM_EINVAL); /* no such pool */
    OK(gm_pool_begin(f.a, 0, 9, 0)); /* a capture under way: nothing may be unmapped */
    assert_int_equal(gm_allocator_sleep(f.a, 0, "weights", 0, NULL), GM_ESTATE);
    OK(gm_pool_end(f.a, 0, 9, 0));
    OK(gm_pool_release(f.a, 0, 9, 0));
    assert_int_equal(used(f.b), before);
    for (int i = 0; i < 3; i++) assert_int_equal(holds(f.b, f.p[i], f.n[i], 11u * (unsigned)i + 1), 1);
    teardown_pool(&f);
}

/* A failed unmap maps back what sleep unmapped (nothing released, contents
 * kept); a wake that runs out of memory gives back what it made and stays
 * asleep, and a later wake works. */
static void sleep_wake_faults(void **state) {
    (void)state;
    fixture f = {0};
    setup_pool(&f, "gpumem_chunks:granule");
    uint64_t before = used(f.b);
    OK(gm_backend_inject_fault(f.b, GM_BCALL_UNMAP, 3, GM_EBACKEND));
    assert_int_equal(gm_allocator_sleep(f.a, 0, "weights", GM_SLEEP_OFFLOAD, NULL), GM_EBACKEND);
    assert_int_equal(used(f.b), before);
    for (int i = 0; i < 3; i++) assert_int_equal(holds(f.b, f.p[i], f.n[i], 11u * (unsigned)i + 1), 1);
    gm_devptr q;
    OK(gm_malloc_pool(f.a, 0, MIB, 0, 7, 0, &q)); /* not asleep */
    OK(gm_free(f.a, q));
    OK(gm_allocator_sleep(f.a, 0, "weights", GM_SLEEP_OFFLOAD, NULL));
    uint64_t asleep = used(f.b);
    OK(gm_backend_inject_fault(f.b, GM_BCALL_PHYS_CREATE, 4, GM_ENOMEM));
    assert_int_equal(gm_allocator_wake(f.a, 0, "weights"), GM_ENOMEM);
    assert_non_null(strstr(gm_last_error_detail(), "stays asleep"));
    assert_int_equal(used(f.b), asleep);
    assert_int_equal(gm_malloc_pool(f.a, 0, MIB, 0, 7, 0, &q), GM_ESTATE);
    OK(gm_allocator_wake(f.a, 0, "weights"));
    assert_int_equal(used(f.b), before);
    for (int i = 0; i < 3; i++) assert_int_equal(holds(f.b, f.p[i], f.n[i], 11u * (unsigned)i + 1), 1);
    teardown_pool(&f);
}

/* Offload keeps every block's contents in one page-locked host buffer (one
 * HOST_ALLOC for the pool, not one per block). When pinning fails the sleep
 * still works, on malloc'd memory, with no stale error detail; a block freed
 * while asleep is skipped at wake and the others come back bit for bit. */
static void sleep_offload_host_memory(void **state) {
    (void)state;
    fixture f = {0};
    setup_pool(&f, "");
    uint64_t pins = gm_backend_call_count(f.b, 0, GM_BCALL_HOST_ALLOC);
    OK(gm_allocator_sleep(f.a, 0, "weights", GM_SLEEP_OFFLOAD, NULL));
    assert_int_equal(gm_backend_call_count(f.b, 0, GM_BCALL_HOST_ALLOC), pins + 1);
    OK(gm_allocator_wake(f.a, 0, "weights"));
    for (int i = 0; i < 3; i++) assert_int_equal(holds(f.b, f.p[i], f.n[i], 11u * (unsigned)i + 1), 1);
    OK(gm_backend_inject_fault(f.b, GM_BCALL_HOST_ALLOC, 1, GM_ENOMEM));
    OK(gm_allocator_sleep(f.a, 0, "weights", GM_SLEEP_OFFLOAD, NULL));
    assert_int_equal(gm_backend_call_count(f.b, 0, GM_BCALL_HOST_ALLOC), pins + 2);
    assert_string_equal(gm_last_error_detail(), "");
    OK(gm_free(f.a, f.p[1])); /* freed while asleep: its contents are dropped */
    f.p[1] = 0;
    OK(gm_allocator_wake(f.a, 0, "weights"));
    assert_int_equal(holds(f.b, f.p[0], f.n[0], 1), 1);
    assert_int_equal(holds(f.b, f.p[2], f.n[2], 23), 1);
    teardown_pool(&f);
}

/* A pool of plain device allocations cannot keep its addresses without its
 * memory: refused, before anything changes. */
static void sleep_plain_refused(void **state) {
    (void)state;
    gm_backend *b;
    gm_allocator *a;
    OK(gm_test_make(GM_POLICY_TORCH, NULL, 8 * GIB, false, &b, &a));
    OK(gm_pool_retain(a, 0, 3, 0));
    OK(gm_pool_set_tag(a, 0, 3, 0, "kv"));
    gm_devptr p;
    OK(gm_malloc_pool(a, 0, 30 * MIB, 0, 3, 0, &p));
    uint64_t before = used(b);
    assert_int_equal(gm_allocator_sleep(a, 0, "kv", 0, NULL), GM_ENOTSUP);
    assert_non_null(strstr(gm_last_error_detail(), "expandable_segments:True"));
    assert_int_equal(used(b), before);
    OK(gm_free(a, p));
    OK(gm_pool_release(a, 0, 3, 0));
    gm_test_destroy(b, a);
}

/* ---- another allocator's memory (torch.cuda.MemPool(allocator=...)) ----- */

typedef struct other {
    int allocs, frees;
    uint64_t live;
} other;

static int other_alloc(void *ctx, int device, uint64_t size, gm_stream stream, gm_devptr *out) {
    (void)stream;
    (void)device;
    other *o = ctx;
    gm_devptr p = 0x500000000000ull + (uint64_t)o->allocs * GIB; /* its own address range */
    o->allocs++;
    o->live += size;
    *out = p;
    return GM_OK;
}

static void other_free(void *ctx, int device, gm_devptr ptr, uint64_t size) {
    (void)device;
    (void)ptr;
    other *o = ctx;
    o->frees++;
    o->live -= size;
}

static void pool_of_other_allocator(void **state) {
    gm_policy_kind kind = *(gm_policy_kind *)*state;
    gm_backend *b;
    gm_allocator *a;
    OK(gm_test_make(kind, NULL, 8 * GIB, false, &b, &a));
    other o = {0};
    gm_pool_options opt = {.size = sizeof opt, .seg_alloc = other_alloc, .seg_free = other_free, .seg_ctx = &o};
    OK(gm_pool_retain(a, 0, 1, 0));
    OK(gm_pool_set_options(a, 0, 1, 0, &opt));
    gm_stats s0 = gm_test_stats(a);
    gm_devptr p, q;
    OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 1, 0, &p));
    OK(gm_malloc_pool(a, 0, 512, 0, 1, 0, &q));
    assert_true(p >= 0x500000000000ull && q >= 0x500000000000ull); /* the other allocator's memory */
    assert_true(o.allocs >= 1);
    gm_stats s1 = gm_test_stats(a); /* counted as gpumem's */
    assert_int_equal(s1.reserved_bytes[GM_POOL_ALL].current - s0.reserved_bytes[GM_POOL_ALL].current,
                     (int64_t)o.live);
    assert_int_equal(s1.requested_bytes[GM_POOL_ALL].current - s0.requested_bytes[GM_POOL_ALL].current,
                     (int64_t)(3 * MIB + 512));
    assert_int_equal(used(b), 0); /* nothing from the backend */
    gm_test_check(a);
    /* its source is fixed once it holds memory */
    gm_pool_options plain = {.size = sizeof plain};
    assert_int_equal(gm_pool_set_options(a, 0, 1, 0, &plain), GM_ESTATE);
    OK(gm_free(a, p));
    OK(gm_free(a, q));
    OK(gm_pool_release(a, 0, 1, 0)); /* the last use: its memory goes back to the other allocator */
    assert_int_equal(o.live, 0);
    assert_int_equal(o.frees, o.allocs);
    gm_test_check(a);
    gm_stats s2 = gm_test_stats(a);
    assert_int_equal(s2.reserved_bytes[GM_POOL_ALL].current, s0.reserved_bytes[GM_POOL_ALL].current);
    gm_pool_options half = {.size = sizeof half, .seg_alloc = other_alloc};
    OK(gm_pool_retain(a, 0, 2, 0));
    assert_int_equal(gm_pool_set_options(a, 0, 2, 0, &half), GM_EINVAL);
    assert_int_equal(gm_pool_set_options(a, 0, 2, 0, NULL), GM_EINVAL);
    OK(gm_pool_release(a, 0, 2, 0));
    gm_test_destroy(b, a);
}

/* no_split: every allocation a device allocation of its own. */
static void pool_no_split(void **state) {
    gm_policy_kind kind = *(gm_policy_kind *)*state;
    gm_backend *b;
    gm_allocator *a;
    OK(gm_test_make(kind, NULL, 8 * GIB, false, &b, &a));
    gm_pool_options opt = {.size = sizeof opt, .no_split = true};
    OK(gm_pool_retain(a, 0, 4, 0));
    OK(gm_pool_set_options(a, 0, 4, 0, &opt));
    gm_devptr p[4];
    for (int i = 0; i < 4; i++) OK(gm_malloc_pool(a, 0, 3 * MIB, 0, 4, 0, &p[i]));
    gm_sim_live l = {.size = sizeof l};
    OK(gm_sim_live_objects(b, 0, &l));
    assert_int_equal(l.allocations, 4); /* one plain allocation each */
    for (int i = 0; i < 4; i++) OK(gm_free(a, p[i]));
    OK(gm_pool_release(a, 0, 4, 0));
    gm_test_check(a);
    gm_test_destroy(b, a);
}

/* use_on_oom: an allocation the device's own pools cannot place takes the
 * pool's cached memory (torch's use_on_oom), and goes back to that pool. */
static void pool_use_on_oom(void **state) {
    gm_policy_kind kind = *(gm_policy_kind *)*state;
    gm_backend *b;
    gm_allocator *a;
    OK(gm_test_make(kind, NULL, 512 * MIB, false, &b, &a));
    OK(gm_pool_retain(a, 0, 5, 0));
    gm_devptr big, fill, p;
    OK(gm_malloc_pool(a, 0, 200 * MIB, 0, 5, 0, &big));
    OK(gm_free(a, big)); /* cached in the pool (slack inf) */
    OK(gm_malloc(a, 0, 300 * MIB, 0, &fill));
    assert_int_equal(gm_malloc(a, 0, 150 * MIB, 0, &p), GM_ENOMEM); /* not a use_on_oom pool */
    gm_pool_options opt = {.size = sizeof opt, .use_on_oom = true};
    OK(gm_pool_set_options(a, 0, 5, 0, &opt)); /* holds memory: use_on_oom may still change */
    OK(gm_malloc(a, 0, 150 * MIB, 0, &p));
    gm_block_info bi = {.size_of = sizeof bi};
    OK(gm_block_lookup(a, p, NULL, &bi));
    assert_int_equal(bi.pool_id[0], 5);
    gm_test_check(a);
    OK(gm_free(a, p));
    OK(gm_free(a, fill));
    OK(gm_pool_release(a, 0, 5, 0));
    gm_test_check(a);
    gm_test_destroy(b, a);
}

/* ---- settings while running (torch.cuda.memory._set_allocator_settings) - */

static void settings_live(void **state) {
    (void)state;
    gm_backend *b;
    gm_allocator *a;
    OK(gm_test_make(GM_POLICY_TORCH, NULL, 8 * GIB, false, &b, &a));
    gm_devptr p;
    OK(gm_malloc(a, 0, 1000, 0, &p)); /* a device exists */
    OK(gm_allocator_set_settings(a, "roundup_power2_divisions:4,garbage_collection_threshold:0.7"));
    char v[64];
    OK(gm_config_get(gm_allocator_config(a), "roundup_power2_divisions", v, sizeof v));
    assert_string_equal(v, "4");
    gm_devptr q;
    OK(gm_malloc(a, 0, 5 * MIB + 1, 0, &q)); /* rounded to a quarter of a power of two */
    gm_block_info bi = {.size_of = sizeof bi};
    OK(gm_block_lookup(a, q, NULL, &bi));
    assert_int_equal(bi.size, 6 * MIB);
    OK(gm_free(a, q));
    /* refused, each naming the key, and nothing of the string applies */
    assert_int_equal(gm_allocator_set_settings(a, "roundup_power2_divisions:8,max_split_size_mb:64"), GM_ECONFIG);
    assert_non_null(strstr(gm_last_error_detail(), "max_split_size_mb cannot change"));
    assert_int_equal(gm_allocator_set_settings(a, "roundup_power2_divisions:8,policy:gpumem"), GM_ECONFIG);
    assert_int_equal(gm_allocator_set_settings(a, "roundup_power2_divisions:8,bogus_key:1"), GM_ECONFIG);
    assert_non_null(strstr(gm_last_error_detail(), "bogus_key"));
    assert_int_equal(gm_allocator_set_settings(a, "gpumem_slack:0"), GM_ECONFIG); /* the other policy's key */
    OK(gm_config_get(gm_allocator_config(a), "roundup_power2_divisions", v, sizeof v));
    assert_string_equal(v, "4");
    OK(gm_allocator_set_settings(a, "per_process_memory_fraction:0.5"));
    assert_int_equal(gm_malloc(a, 0, 5 * GIB, 0, &q), GM_ENOMEM); /* the fraction applies at once */
    OK(gm_set_memory_fraction(a, 0, 0.25)); /* set apart from the settings: a later string keeps it */
    OK(gm_allocator_set_settings(a, "garbage_collection_threshold:0.6"));
    assert_int_equal(gm_malloc(a, 0, 3 * GIB, 0, &q), GM_ENOMEM);
    OK(gm_allocator_set_settings(a, "per_process_memory_fraction:1"));
    OK(gm_allocator_set_settings(a, "expandable_segments:True"));
    OK(gm_malloc(a, 0, 30 * MIB, 0, &q)); /* a new expandable segment */
    gm_test_check(a);
    OK(gm_free(a, q));
    OK(gm_free(a, p));
    assert_int_equal(gm_allocator_set_settings(NULL, ""), GM_EINVAL);
    gm_test_destroy(b, a);
}

int main(void) {
    static gm_policy_kind torch = GM_POLICY_TORCH, gpumem = GM_POLICY_GPUMEM;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sleep_offload_gpumem),
        cmocka_unit_test(sleep_offload_torch_expandable),
        cmocka_unit_test(sleep_discard),
        cmocka_unit_test(sleep_bad_input),
        cmocka_unit_test(sleep_wake_faults),
        cmocka_unit_test(sleep_offload_host_memory),
        cmocka_unit_test(sleep_plain_refused),
        cmocka_unit_test_prestate(pool_of_other_allocator, &torch),
        cmocka_unit_test_prestate(pool_of_other_allocator, &gpumem),
        cmocka_unit_test_prestate(pool_no_split, &torch),
        cmocka_unit_test_prestate(pool_no_split, &gpumem),
        cmocka_unit_test_prestate(pool_use_on_oom, &torch),
        cmocka_unit_test_prestate(pool_use_on_oom, &gpumem),
        cmocka_unit_test(settings_live),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
