/* test_sim.c — the sim backend and the backend wrapper: capacity accounting,
 * deterministic first-fit addresses, VMM misuse caught like the driver does,
 * manual events, call counting and fault injection. Drives the backend through
 * the core's own wrappers (gm__be_*) on a bare device struct. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"
#include "internal.h"

#include <string.h>

#define MIB GM_TEST_MIB
#define GIB GM_TEST_GIB

typedef struct fixture {
    gm_backend *b;
    gm__device d;
} fixture;

static fixture *make(uint64_t capacity, bool manual) {
    static fixture f;
    memset(&f, 0, sizeof f);
    gm_sim_options o;
    gm_sim_options_init(&o);
    o.capacity = capacity;
    o.events_manual = manual;
    o.device_count = 2;
    assert_int_equal(gm_sim_create(&f.b, &o), GM_OK);
    f.d.index = 0;
    f.d.backend = f.b;
    return &f;
}

static void test_defaults(void **state) {
    gm_sim_options o;
    gm_sim_options_init(&o);
    assert_int_equal(o.device_count, 1);
    assert_true(o.capacity == 141 * GIB);
    assert_true(o.granularity == 2 * MIB);
    assert_false(o.events_manual);
    gm_backend *b;
    assert_int_equal(gm_sim_create(&b, NULL), GM_OK);
    assert_string_equal(gm_backend_name(b), "sim");
    int n = 0;
    assert_int_equal(gm_backend_device_count(b, &n), GM_OK);
    assert_int_equal(n, 1);
    gm_backend_destroy(b);
    o.device_count = 0;
    assert_int_equal(gm_sim_create(&b, &o), GM_EINVAL);
    gm_sim_options_init(&o);
    o.granularity = 3 * MIB;
    assert_int_equal(gm_sim_create(&b, &o), GM_EINVAL);
}

static void test_capacity(void **state) {
    fixture *f = make(10 * MIB, false);
    uint64_t fr, tot;
    gm_devptr p1, p2, p3;
    assert_int_equal(gm__be_mem_info(&f->d, &fr, &tot), GM_OK);
    assert_true(fr == 10 * MIB && tot == 10 * MIB);
    assert_int_equal(gm__be_malloc(&f->d, 4 * MIB, &p1), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, 1, &p2), GM_OK); /* consumes one 2 MiB page */
    assert_int_equal(gm__be_mem_info(&f->d, &fr, &tot), GM_OK);
    assert_true(fr == 4 * MIB);
    assert_int_equal(gm__be_malloc(&f->d, 6 * MIB, &p3), GM_ENOMEM);
    gm_physmem h;
    assert_int_equal(gm__be_phys_create(&f->d, 6 * MIB, &h), GM_ENOMEM);
    assert_int_equal(gm__be_phys_create(&f->d, 4 * MIB, &h), GM_OK);
    assert_int_equal(gm__be_mem_info(&f->d, &fr, &tot), GM_OK);
    assert_true(fr == 0);
    assert_int_equal(gm__be_phys_release(&f->d, h), GM_OK);
    assert_int_equal(gm__be_free(&f->d, p1, 0), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, 8 * MIB, &p3), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, 0, &p3), GM_EINVAL);
    /* device 1 has its own capacity */
    gm__device d1 = {.index = 1, .backend = f->b};
    assert_int_equal(gm__be_mem_info(&d1, &fr, &tot), GM_OK);
    assert_true(fr == 10 * MIB);
    gm__device d9 = {.index = 9, .backend = f->b};
    assert_int_equal(gm__be_mem_info(&d9, &fr, &tot), GM_EDEVICE);
    gm_backend_destroy(f->b);
}

static void test_addresses(void **state) {
    fixture *f = make(GIB, false);
    gm_devptr a, b, c, d, e;
    assert_int_equal(gm__be_malloc(&f->d, 2 * MIB, &a), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, 3 * MIB, &b), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, 2 * MIB, &c), GM_OK);
    assert_true(a == 0x7f0000000000ull);
    assert_true(b == a + 2 * MIB);
    assert_true(c == b + 4 * MIB); /* 3 MiB rounds to 4 MiB */
    assert_int_equal(gm__be_free(&f->d, b, 0), GM_OK);
    /* first fit at the lowest free address: a 2 MiB request reuses b's hole */
    assert_int_equal(gm__be_malloc(&f->d, 2 * MIB, &d), GM_OK);
    assert_true(d == b);
    /* a 4 MiB one no longer fits there and goes to the end */
    assert_int_equal(gm__be_malloc(&f->d, 4 * MIB, &e), GM_OK);
    assert_true(e == c + 2 * MIB);
    /* double free and unknown pointers are rejected */
    assert_int_equal(gm__be_free(&f->d, b + 2 * MIB, 0), GM_EINVAL);
    assert_int_equal(gm__be_free(&f->d, a, 0), GM_OK);
    assert_int_equal(gm__be_free(&f->d, a, 0), GM_EINVAL);
    assert_int_equal(gm__be_free(&f->d, a + 512, 0), GM_EINVAL);
    /* device 1's addresses do not overlap device 0's */
    gm__device d1 = {.index = 1, .backend = f->b};
    gm_devptr x;
    assert_int_equal(gm__be_malloc(&d1, 2 * MIB, &x), GM_OK);
    assert_true(x >= 0x7f0000000000ull + (1ull << 40));
    gm_backend_destroy(f->b);
}

static void test_vmm(void **state) {
    fixture *f = make(GIB, false);
    uint64_t g = 0;
    assert_int_equal(gm__be_granularity(&f->d, &g), GM_OK);
    assert_true(g == 2 * MIB);
    gm_devptr va, va2;
    assert_int_equal(gm__be_va_reserve(&f->d, 3 * MIB, &va), GM_EINVAL); /* not granular */
    assert_int_equal(gm__be_va_reserve(&f->d, 64 * MIB, &va), GM_OK);
    assert_int_equal(gm__be_va_reserve(&f->d, 8 * MIB, &va2), GM_OK);
    assert_true(va % g == 0 && va2 >= va + 64 * MIB);
    gm_physmem h1, h2, h3;
    assert_int_equal(gm__be_phys_create(&f->d, 3 * MIB, &h1), GM_EINVAL);
    assert_int_equal(gm__be_phys_create(&f->d, 4 * MIB, &h1), GM_OK);
    assert_int_equal(gm__be_phys_create(&f->d, 2 * MIB, &h2), GM_OK);
    assert_int_equal(gm__be_phys_create(&f->d, 2 * MIB, &h3), GM_OK);
    /* map: whole handle, aligned, inside a reservation */
    assert_int_equal(gm__be_map(&f->d, va, 2 * MIB, h1), GM_EINVAL);         /* size != handle */
    assert_int_equal(gm__be_map(&f->d, va + 4096, 4 * MIB, h1), GM_EINVAL);  /* unaligned */
    assert_int_equal(gm__be_map(&f->d, va + 62 * MIB, 4 * MIB, h1), GM_EINVAL); /* past the end */
    assert_int_equal(gm__be_map(&f->d, 0x1000000, 4 * MIB, h1), GM_EINVAL);  /* not reserved */
    assert_int_equal(gm__be_map(&f->d, va, 4 * MIB, h1 + (1ull << 32)), GM_EINVAL); /* stale handle */
    assert_int_equal(gm__be_map(&f->d, va, 4 * MIB, h1), GM_OK);
    assert_int_equal(gm__be_map(&f->d, va + 8 * MIB, 4 * MIB, h1), GM_EINVAL); /* already mapped */
    assert_int_equal(gm__be_map(&f->d, va + 2 * MIB, 2 * MIB, h2), GM_EINVAL); /* page taken */
    assert_int_equal(gm__be_map(&f->d, va + 4 * MIB, 2 * MIB, h2), GM_OK);
    assert_int_equal(gm__be_map(&f->d, va + 6 * MIB, 2 * MIB, h3), GM_OK);
    /* release while mapped */
    assert_int_equal(gm__be_phys_release(&f->d, h1), GM_EINVAL);
    assert_int_equal(gm__be_va_release(&f->d, va, 64 * MIB), GM_EINVAL);
    /* unmap must cover whole mappings and only mapped pages */
    assert_int_equal(gm__be_unmap(&f->d, va, 2 * MIB), GM_EINVAL);           /* half of h1 */
    assert_int_equal(gm__be_unmap(&f->d, va + 2 * MIB, 4 * MIB), GM_EINVAL); /* starts inside h1 */
    assert_int_equal(gm__be_unmap(&f->d, va + 6 * MIB, 4 * MIB), GM_EINVAL); /* 8..10 unmapped */
    /* a failed unmap changed nothing: h1 still mapped */
    assert_int_equal(gm__be_phys_release(&f->d, h1), GM_EINVAL);
    /* one unmap may cover several mappings */
    assert_int_equal(gm__be_unmap(&f->d, va + 4 * MIB, 4 * MIB), GM_OK);
    assert_int_equal(gm__be_unmap(&f->d, va, 4 * MIB), GM_OK);
    assert_int_equal(gm__be_unmap(&f->d, va, 4 * MIB), GM_EINVAL); /* twice */
    /* a handle can be mapped again elsewhere once unmapped */
    assert_int_equal(gm__be_map(&f->d, va2, 4 * MIB, h1), GM_OK);
    assert_int_equal(gm__be_unmap(&f->d, va2, 4 * MIB), GM_OK);
    assert_int_equal(gm__be_va_release(&f->d, va, 32 * MIB), GM_EINVAL); /* wrong size */
    assert_int_equal(gm__be_va_release(&f->d, va, 64 * MIB), GM_OK);
    assert_int_equal(gm__be_va_release(&f->d, va, 64 * MIB), GM_EINVAL);
    assert_int_equal(gm__be_phys_release(&f->d, h1), GM_OK);
    assert_int_equal(gm__be_phys_release(&f->d, h1), GM_EINVAL);
    assert_int_equal(gm__be_phys_release(&f->d, h2), GM_OK);
    assert_int_equal(gm__be_phys_release(&f->d, h3), GM_OK);
    uint64_t fr, tot;
    assert_int_equal(gm__be_mem_info(&f->d, &fr, &tot), GM_OK);
    assert_true(fr == tot);
    /* the freed VA range is reused first-fit */
    gm_devptr va3;
    assert_int_equal(gm__be_va_reserve(&f->d, 2 * MIB, &va3), GM_OK);
    assert_true(va3 == va);
    /* stats counters count successful calls on the device struct */
    assert_true(f->d.stats.num_map == 4 && f->d.stats.num_unmap == 3);
    assert_true(f->d.stats.num_phys_create == 3 && f->d.stats.num_phys_release == 3);
    assert_true(f->d.stats.num_va_reserve == 3 && f->d.stats.num_va_release == 1);
    gm_backend_destroy(f->b); /* leaves a reservation behind: destroy frees it */
}

static void test_events(void **state) {
    fixture *f = make(GIB, true);
    gm_event e1, e2, e3;
    bool done = true;
    assert_int_equal(gm__be_event_record(&f->d, 7, &e1), GM_OK);
    assert_int_equal(gm__be_event_record(&f->d, 8, &e2), GM_OK);
    assert_int_equal(gm__be_event_record(&f->d, 7, &e3), GM_OK);
    assert_int_equal(gm__be_event_query(&f->d, e1, &done), GM_OK);
    assert_false(done);
    assert_int_equal(gm_sim_complete_events(f->b, 0, 7), GM_OK);
    assert_int_equal(gm__be_event_query(&f->d, e1, &done), GM_OK);
    assert_true(done);
    assert_int_equal(gm__be_event_query(&f->d, e3, &done), GM_OK);
    assert_true(done);
    assert_int_equal(gm__be_event_query(&f->d, e2, &done), GM_OK);
    assert_false(done);
    assert_int_equal(gm__be_event_sync(&f->d, e2), GM_OK);
    assert_int_equal(gm__be_event_query(&f->d, e2, &done), GM_OK);
    assert_true(done);
    assert_int_equal(gm__be_event_destroy(&f->d, e1), GM_OK);
    assert_int_equal(gm__be_event_destroy(&f->d, e1), GM_EINVAL);
    assert_int_equal(gm__be_event_query(&f->d, e1, &done), GM_EINVAL);
    assert_int_equal(gm__be_event_query(&f->d, 12345, &done), GM_EINVAL);
    assert_int_equal(gm_sim_complete_events(f->b, 5, UINT64_MAX), GM_EDEVICE);
    gm_backend_destroy(f->b);
    /* automatic mode: complete at once */
    f = make(GIB, false);
    assert_int_equal(gm__be_event_record(&f->d, 7, &e1), GM_OK);
    assert_int_equal(gm__be_event_query(&f->d, e1, &done), GM_OK);
    assert_true(done);
    gm_backend_destroy(f->b);
}

static void test_counts_and_faults(void **state) {
    fixture *f = make(GIB, false);
    gm_devptr p;
    assert_int_equal(gm__be_malloc(&f->d, MIB, &p), GM_OK);
    assert_int_equal(gm__be_free(&f->d, p, 0), GM_OK);
    assert_true(gm_backend_call_count(f->b, 0, GM_BCALL_MALLOC) == 1);
    assert_true(gm_backend_call_count(f->b, 0, GM_BCALL_FREE) == 1);
    assert_true(gm_backend_call_count(f->b, 1, GM_BCALL_MALLOC) == 0);
    /* time inside ops: only for kinds that ran, ANY is their sum, nonsense is 0 */
    assert_true(gm_backend_call_ns(f->b, 0, GM_BCALL_MAP) == 0);
    assert_true(gm_backend_call_ns(f->b, 1, GM_BCALL_MALLOC) == 0);
    assert_true(gm_backend_call_ns(f->b, 0, GM_BCALL_ANY) ==
                gm_backend_call_ns(f->b, 0, GM_BCALL_MALLOC) + gm_backend_call_ns(f->b, 0, GM_BCALL_FREE));
    assert_true(gm_backend_call_ns(f->b, 0, 999) == 0 && gm_backend_call_ns(NULL, 0, GM_BCALL_ANY) == 0);
    assert_true(gm_backend_call_ns(f->b, -1, GM_BCALL_MALLOC) == 0);
    /* the 2nd malloc from now fails, once */
    assert_int_equal(gm_backend_inject_fault(f->b, GM_BCALL_MALLOC, 2, GM_EBACKEND), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, MIB, &p), GM_OK);
    assert_int_equal(gm__be_free(&f->d, p, 0), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, MIB, &p), GM_EBACKEND);
    assert_int_equal(gm__be_malloc(&f->d, MIB, &p), GM_OK);
    assert_int_equal(gm__be_free(&f->d, p, 0), GM_OK);
    assert_true(gm_backend_call_count(f->b, 0, GM_BCALL_MALLOC) == 4); /* failures count */
    assert_true(f->d.stats.num_device_alloc == 3);                      /* stats: successes */
    /* the injected failure did not reach the sim: nothing was allocated */
    uint64_t fr, tot;
    assert_int_equal(gm__be_mem_info(&f->d, &fr, &tot), GM_OK);
    assert_true(fr == tot);
    /* ANY counts every kind */
    assert_int_equal(gm_backend_inject_fault(f->b, GM_BCALL_ANY, 2, GM_ENOMEM), GM_OK);
    assert_int_equal(gm__be_mem_info(&f->d, &fr, &tot), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, MIB, &p), GM_ENOMEM);
    /* disarm */
    assert_int_equal(gm_backend_inject_fault(f->b, GM_BCALL_FREE, 1, GM_EBACKEND), GM_OK);
    assert_int_equal(gm_backend_inject_fault(f->b, GM_BCALL_FREE, 0, 0), GM_OK);
    assert_int_equal(gm__be_malloc(&f->d, MIB, &p), GM_OK);
    assert_int_equal(gm__be_free(&f->d, p, 0), GM_OK);
    assert_int_equal(gm_backend_inject_fault(f->b, 99, 1, GM_EBACKEND), GM_EINVAL);
    assert_int_equal(gm_backend_inject_fault(f->b, GM_BCALL_MAP, 1, GM_OK), GM_EINVAL);
    assert_string_equal(gm_bcall_name(GM_BCALL_PHYS_CREATE), "PHYS_CREATE");
    assert_string_equal(gm_bcall_name(GM_BCALL_ANY), "ANY");
    gm_backend_destroy(f->b);
}

/* A backend table without VMM or events: the wrapper answers GM_ENOTSUP. */
static int tiny_count(void *ctx, int *n) {
    *n = 1;
    return GM_OK;
}
static void test_missing_ops(void **state) {
    gm_backend_ops ops = {.version = GM_BACKEND_VERSION, .size = sizeof ops, .name = "tiny",
                          .device_count = tiny_count};
    gm_backend *b;
    assert_int_equal(gm_backend_create(&b, &ops, NULL), GM_OK);
    gm__device d = {.index = 0, .backend = b};
    gm_devptr p;
    uint64_t g;
    assert_int_equal(gm__be_malloc(&d, MIB, &p), GM_ENOTSUP);
    assert_int_equal(gm__be_granularity(&d, &g), GM_ENOTSUP);
    assert_int_equal(gm__be_va_reserve(&d, 2 * MIB, &p), GM_ENOTSUP);
    assert_true(gm_backend_call_count(b, 0, GM_BCALL_VA_RESERVE) == 1);
    assert_int_equal(gm_sim_complete_events(b, 0, 0), GM_EINVAL); /* not a sim */
    gm_backend_destroy(b);
    ops.version = 0;
    assert_int_equal(gm_backend_create(&b, &ops, NULL), GM_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),   cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_addresses),  cmocka_unit_test(test_vmm),
        cmocka_unit_test(test_events),     cmocka_unit_test(test_counts_and_faults),
        cmocka_unit_test(test_missing_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
