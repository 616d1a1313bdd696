/* test_allocator.c — the allocator front end on the sim backend, for both
 * policies: request-level stats, double/foreign frees that change nothing,
 * record_stream with manually completed events, OOM and recovery, empty_cache,
 * memory fraction, stats resets, JSON and memory_summary, device errors, and a
 * short multithreaded run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef GM_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

#define KIB GM_TEST_KIB
#define MIB GM_TEST_MIB
#define GIB GM_TEST_GIB

static gm_policy_kind kind_of(void **state) { return *(gm_policy_kind *)*state; }

static void make(void **state, const char *conf, uint64_t cap, bool manual, gm_backend **b, gm_allocator **a) {
    int rc = gm_test_make(kind_of(state), conf, cap, manual, b, a);
    if (rc != GM_OK) fail_msg("gm_test_make: %s %s", gm_status_name(rc), gm_last_error_detail());
}

static void test_basic(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 0, false, &b, &a);
    gm_devptr p = 1, q;
    assert_int_equal(gm_malloc(a, 0, 0, 0, &p), GM_OK);
    assert_true(p == 0);
    assert_int_equal(gm_free(a, 0), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 1000, 0, &p), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 5 * MIB, 0, &q), GM_OK);
    assert_true(p && q && p != q);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 2);
    assert_int_equal(s.allocation[GM_POOL_SMALL].current, 1);
    assert_int_equal(s.allocation[GM_POOL_LARGE].current, 1);
    assert_int_equal(s.requested_bytes[GM_POOL_ALL].current, 1000 + 5 * MIB);
    assert_true(s.allocated_bytes[GM_POOL_SMALL].current >= 1000);
    assert_true(s.allocated_bytes[GM_POOL_LARGE].current >= (int64_t)(5 * MIB));
    assert_true(s.reserved_bytes[GM_POOL_ALL].current >= s.allocated_bytes[GM_POOL_ALL].current);
    assert_int_equal(s.max_split_size, -1);
    gm_test_check(a);
    assert_int_equal(gm_free(a, p), GM_OK);
    assert_int_equal(gm_free(a, q), GM_OK);
    s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 0);
    assert_int_equal(s.allocation[GM_POOL_ALL].peak, 2);
    assert_int_equal(s.allocation[GM_POOL_ALL].freed, 2);
    assert_int_equal(s.requested_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(s.allocated_bytes[GM_POOL_ALL].current, 0);
    gm_test_check(a);
    assert_int_equal(gm_allocator_config(a)->policy, kind_of(state));
    gm_test_destroy(b, a);
}

static void test_bad_frees(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 0, false, &b, &a);
    gm_devptr p, q;
    assert_int_equal(gm_malloc(a, 0, 512, 0, &p), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 512, 0, &q), GM_OK); /* keeps the segment alive */
    assert_int_equal(gm_free(a, p), GM_OK);
    gm_stats before = gm_test_stats(a), after;
    assert_int_equal(gm_free(a, p), GM_EDOUBLEFREE);
    assert_non_null(strstr(gm_last_error_detail(), "not a live allocation"));
    assert_int_equal(gm_free(a, q + 16), GM_EDOUBLEFREE); /* inside our memory, not a block */
    assert_int_equal(gm_free(a, 0x1000), GM_EFOREIGN);
    assert_int_equal(gm_free(a, 0xdead00000000ull), GM_EFOREIGN);
    assert_non_null(strstr(gm_last_error_detail(), "not allocated by this allocator"));
    assert_int_equal(gm_record_stream(a, 0x1000, 3), GM_EFOREIGN);
    after = gm_test_stats(a);
    assert_memory_equal(&before, &after, sizeof before);
    gm_test_check(a);
    assert_int_equal(gm_free(a, q), GM_OK);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_record_stream(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 0, true, &b, &a);
    const uint64_t sz = 4 * MIB;
    gm_devptr p, q, r;
    assert_int_equal(gm_malloc(a, 0, sz, 1, &p), GM_OK);
    assert_int_equal(gm_record_stream(a, p, 1), GM_OK); /* own stream: no-op */
    assert_int_equal(gm_record_stream(a, p, 7), GM_OK);
    assert_int_equal(gm_record_stream(a, p, 7), GM_OK); /* a set */
    assert_int_equal(gm_free(a, p), GM_OK);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 0);  /* request stats drop at once */
    assert_true(s.active_bytes[GM_POOL_ALL].current >= (int64_t)sz); /* still in use by stream 7 */
    assert_true(gm_backend_call_count(b, 0, GM_BCALL_EVENT_RECORD) == 1);
    gm_test_check(a);
    assert_int_equal(gm_free(a, p), GM_EDOUBLEFREE);
    /* not reused while stream 7's event is pending */
    assert_int_equal(gm_malloc(a, 0, sz, 1, &q), GM_OK);
    assert_true(q != p);
    gm_test_check(a);
    assert_int_equal(gm_sim_complete_events(b, 0, 7), GM_OK);
    /* the next malloc collects the completed event and reuses p's block */
    assert_int_equal(gm_malloc(a, 0, sz, 1, &r), GM_OK);
    if (kind_of(state) == GM_POLICY_TORCH) assert_true(r == p);
    assert_true(gm_backend_call_count(b, 0, GM_BCALL_EVENT_DESTROY) == 1);
    gm_test_check(a);
    assert_int_equal(gm_free(a, q), GM_OK);
    assert_int_equal(gm_free(a, r), GM_OK);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_record_stream_faults(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 0, true, &b, &a);
    gm_devptr p, q;
    assert_int_equal(gm_malloc(a, 0, 3 * MIB, 0, &p), GM_OK);
    assert_int_equal(gm_record_stream(a, p, 5), GM_OK);
    assert_int_equal(gm_record_stream(a, p, 6), GM_OK);
    /* the second event record fails: the block stays live, nothing changes */
    gm_stats before = gm_test_stats(a), after;
    assert_int_equal(gm_backend_inject_fault(b, GM_BCALL_EVENT_RECORD, 2, GM_EBACKEND), GM_OK);
    assert_int_equal(gm_free(a, p), GM_EBACKEND);
    after = gm_test_stats(a);
    assert_memory_equal(&before, &after, sizeof before);
    assert_true(gm_backend_call_count(b, 0, GM_BCALL_EVENT_DESTROY) == 1); /* the first one */
    gm_test_check(a);
    assert_int_equal(gm_free(a, p), GM_OK);
    /* an event query failing surfaces from the next malloc, which changes nothing */
    assert_int_equal(gm_backend_inject_fault(b, GM_BCALL_EVENT_QUERY, 1, GM_EBACKEND), GM_OK);
    assert_int_equal(gm_malloc(a, 0, MIB, 0, &q), GM_EBACKEND);
    gm_test_check(a);
    /* empty_cache waits for pending events, then releases everything */
    assert_int_equal(gm_empty_cache(a, 0), GM_OK);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(s.active_bytes[GM_POOL_ALL].current, 0);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_oom(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 64 * MIB, false, &b, &a);
    gm_devptr p, q;
    assert_int_equal(gm_malloc(a, 0, 100 * MIB, 0, &p), GM_ENOMEM);
    assert_true(p == 0);
    const char *d = gm_last_error_detail();
    assert_non_null(strstr(d, "Tried to allocate 100.00 MiB"));
    assert_non_null(strstr(d, "GPU 0 has a total capacity of 64.00 MiB"));
    /* larger than the whole device: say so, not "the live tensors need this memory" */
    assert_non_null(strstr(d, "The request alone exceeds the device's capacity of 64.00 MiB"));
    assert_null(strstr(d, "live tensors"));
    assert_int_equal(gm_test_stats(a).num_ooms, 1);
    gm_test_check(a);
    assert_int_equal(gm_malloc(a, 0, 40 * MIB, 0, &p), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 40 * MIB, 0, &q), GM_ENOMEM);
    assert_non_null(strstr(gm_last_error_detail(), "the live tensors need this memory"));
    assert_int_equal(gm_test_stats(a).num_ooms, 2);
    gm_test_check(a);
    assert_int_equal(gm_free(a, p), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 40 * MIB, 0, &q), GM_OK); /* works again once memory is freed */
    assert_int_equal(gm_free(a, q), GM_OK);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_fraction(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 64 * MIB, false, &b, &a);
    gm_devptr p;
    assert_int_equal(gm_set_memory_fraction(a, 0, 1.5), GM_EINVAL);
    assert_int_equal(gm_set_memory_fraction(a, 0, 0.5), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 40 * MIB, 0, &p), GM_ENOMEM);
    assert_non_null(strstr(gm_last_error_detail(), "memory fraction"));
    assert_int_equal(gm_malloc(a, 0, 20 * MIB, 0, &p), GM_OK);
    assert_int_equal(gm_free(a, p), GM_OK);
    gm_test_check(a);
    gm_test_destroy(b, a);
    /* from the config too */
    make(state, "per_process_memory_fraction:0.25", 64 * MIB, false, &b, &a);
    assert_int_equal(gm_malloc(a, 0, 20 * MIB, 0, &p), GM_ENOMEM);
    gm_test_destroy(b, a);
}

static void test_empty_cache_and_info(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, GIB, false, &b, &a);
    gm_devptr p;
    uint64_t fr, tot;
    assert_int_equal(gm_malloc(a, 0, 30 * MIB, 0, &p), GM_OK);
    assert_int_equal(gm_free(a, p), GM_OK);
    assert_int_equal(gm_mem_get_info(a, 0, &fr, &tot), GM_OK);
    assert_true(tot == GIB);
    gm_stats s = gm_test_stats(a);
    assert_true(fr == tot - (uint64_t)s.reserved_bytes[GM_POOL_ALL].current);
    assert_int_equal(gm_empty_cache(a, -1), GM_OK);
    s = gm_test_stats(a);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].current, 0);
    assert_int_equal(s.segment[GM_POOL_ALL].current, 0);
    assert_int_equal(gm_mem_get_info(a, 0, &fr, &tot), GM_OK);
    assert_true(fr == tot);
    assert_true((s.num_device_alloc >= 1 && s.num_device_alloc == s.num_device_free) ||
                s.num_phys_create == s.num_phys_release);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_stats_reset(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 64 * MIB, false, &b, &a);
    gm_devptr p, q;
    assert_int_equal(gm_malloc(a, 0, 2 * MIB, 0, &p), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 4 * MIB, 0, &q), GM_OK);
    assert_int_equal(gm_free(a, q), GM_OK);
    assert_int_equal(gm_malloc(a, 0, GIB, 0, &q), GM_ENOMEM);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].peak, 2);
    assert_int_equal(gm_reset_peak_stats(a, 0), GM_OK);
    s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].peak, 1);
    assert_int_equal(s.requested_bytes[GM_POOL_ALL].peak, 2 * MIB);
    assert_int_equal(s.reserved_bytes[GM_POOL_ALL].peak, s.reserved_bytes[GM_POOL_ALL].current);
    assert_int_equal(s.allocation[GM_POOL_ALL].allocated, 2);
    assert_int_equal(s.num_ooms, 1);
    assert_int_equal(gm_reset_accumulated_stats(a, 0), GM_OK);
    s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].allocated, 0);
    assert_int_equal(s.allocation[GM_POOL_ALL].freed, 0);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 1);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.num_device_alloc, 0);
    assert_int_equal(s.max_split_size, -1); /* a setting, kept */
    gm_test_check(a);
    assert_int_equal(gm_free(a, p), GM_OK);
    gm_test_destroy(b, a);
}

static void test_oversize(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, "max_split_size_mb:32", 0, false, &b, &a);
    gm_devptr p, q;
    assert_int_equal(gm_malloc(a, 0, 40 * MIB, 0, &p), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 8 * MIB, 0, &q), GM_OK);
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.oversize_allocations.current, 1);
    assert_int_equal(s.max_split_size, 32 * MIB);
    assert_int_equal(gm_free(a, p), GM_OK);
    s = gm_test_stats(a);
    assert_int_equal(s.oversize_allocations.current, 0);
    assert_int_equal(s.oversize_allocations.peak, 1);
    assert_int_equal(gm_free(a, q), GM_OK);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static void test_summary_json(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 0, false, &b, &a);
    gm_devptr p;
    assert_int_equal(gm_malloc(a, 0, 512, 0, &p), GM_OK);
    static char buf[16384];
    assert_int_equal(gm_memory_summary(a, 0, false, buf, sizeof buf), GM_OK);
    assert_non_null(strstr(buf, "|                  PyTorch CUDA memory summary, device ID 0                 |\n"));
    assert_non_null(strstr(buf, "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |\n"));
    assert_non_null(strstr(buf, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"));
    assert_non_null(strstr(buf, "| Allocated memory      |    512 B   |    512 B   |    512 B   |      0 B   |\n"));
    assert_non_null(strstr(buf, "| Requested memory      |    512 B   |    512 B   |    512 B   |      0 B   |\n"));
    assert_non_null(strstr(buf, "| Allocations           |       1    |       1    |       1    |       0    |\n"));
    assert_non_null(strstr(buf, "|       from small pool |       1    |       1    |       1    |       0    |\n"));
    assert_non_null(strstr(buf, "| Oversize GPU segments |       0    |       0    |       0    |       0    |\n"));
    /* every line is 77 characters, and there are 6 + 9*4 + 4 + 1 of them */
    int lines = 0;
    for (char *l = buf; *l; lines++) {
        char *nl = strchr(l, '\n');
        assert_non_null(nl);
        assert_int_equal(nl - l, 77);
        l = nl + 1;
    }
    assert_int_equal(lines, 6 + 9 * 4 + 4 + 1);
    size_t full = strlen(buf);
    /* abbreviated: no pool rows */
    assert_int_equal(gm_memory_summary(a, 0, true, buf, sizeof buf), GM_OK);
    assert_null(strstr(buf, "from small pool"));
    /* too small: GM_ENOSPACE, terminated inside the buffer */
    memset(buf, 'x', sizeof buf);
    assert_int_equal(gm_memory_summary(a, 0, false, buf, full), GM_ENOSPACE);
    assert_int_equal(buf[full - 1], '\0');
    assert_int_equal(buf[full], 'x');
    /* JSON */
    gm_stats s = gm_test_stats(a);
    assert_int_equal(gm_stats_to_json(&s, buf, sizeof buf), GM_OK);
    assert_non_null(strstr(buf, "\"allocation.all.current\":1,"));
    assert_non_null(strstr(buf, "\"requested_bytes.small_pool.peak\":512,"));
    assert_non_null(strstr(buf, "\"oversize_segments.freed\":0,"));
    assert_non_null(strstr(buf, "\"max_split_size\":-1"));
#ifdef GM_HAVE_CJSON
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(j), 9 * 3 * 4 + 2 * 4 + 13); /* arrays, singles, counters */
    assert_true(cJSON_GetObjectItem(j, "allocated_bytes.all.current")->valuedouble >= 512);
    cJSON_Delete(j);
#endif
    assert_int_equal(gm_stats_to_json(&s, buf, 100), GM_ENOSPACE);
    assert_int_equal(strlen(buf), 99);
    assert_int_equal(gm_free(a, p), GM_OK);
    gm_test_destroy(b, a);
}

static void test_devices_and_args(void **state) {
    gm_sim_options o;
    gm_sim_options_init(&o);
    o.device_count = 2;
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make_opts(kind_of(state), NULL, &o, &b, &a), GM_OK);
    gm_devptr p0, p1;
    gm_stats s = {.size = sizeof s};
    assert_int_equal(gm_malloc(a, 2, 512, 0, &p0), GM_EDEVICE);
    assert_int_equal(gm_malloc(a, -1, 512, 0, &p0), GM_EDEVICE);
    assert_int_equal(gm_get_stats(a, 2, &s), GM_EDEVICE);
    assert_int_equal(gm_get_stats(a, 1, &s), GM_OK); /* unused device: zeros */
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 0);
    assert_int_equal(gm_malloc(a, 0, 512, 0, &p0), GM_OK);
    assert_int_equal(gm_malloc(a, 1, 512, 0, &p1), GM_OK);
    assert_true(p0 != p1);
    /* free finds the device from the pointer alone */
    assert_int_equal(gm_free(a, p1), GM_OK);
    assert_int_equal(gm_get_stats(a, 1, &s), GM_OK);
    assert_int_equal(s.allocation[GM_POOL_ALL].freed, 1);
    assert_int_equal(gm_get_stats(a, 0, &s), GM_OK);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 1);
    assert_int_equal(gm_free(a, p1), GM_EDOUBLEFREE);
    assert_int_equal(gm_free(a, p0), GM_OK);
    gm_test_check(a);
    gm_test_destroy(b, a);
    /* bad arguments */
    assert_int_equal(gm_sim_create(&b, NULL), GM_OK);
    gm_config c;
    gm_config_init(&c);
    c.max_split_size = MIB;
    assert_int_equal(gm_allocator_create(&a, b, &c), GM_ECONFIG);
    assert_null(a);
    gm_config_init(&c);
    c.policy = (gm_policy_kind)7;
    assert_int_equal(gm_allocator_create(&a, b, &c), GM_ECONFIG);
    assert_int_equal(gm_allocator_create(&a, NULL, NULL), GM_EINVAL);
    assert_int_equal(gm_malloc(NULL, 0, 1, 0, &p0), GM_EINVAL);
    assert_int_equal(gm_free(NULL, 1), GM_EINVAL);
    gm_backend_destroy(b);
}

/* live blocks and pending blocks at destroy are released (ASan checks) */
static void test_destroy_with_live(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 0, true, &b, &a);
    gm_devptr p, q;
    assert_int_equal(gm_malloc(a, 0, 3 * MIB, 0, &p), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 700, 0, &q), GM_OK);
    assert_int_equal(gm_record_stream(a, p, 9), GM_OK);
    assert_int_equal(gm_record_stream(a, q, 9), GM_OK);
    assert_int_equal(gm_free(a, p), GM_OK); /* pending */
    gm_allocator_destroy(a);               /* q still live, with uses */
    gm_backend_destroy(b);
}

typedef struct thr {
    gm_allocator *a;
    int id;
    int errors;
} thr;

static void *worker(void *arg) {
    thr *t = arg;
    gm_devptr ptrs[16] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(t->id + 1);
    for (int i = 0; i < 3000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % 16);
        if (ptrs[k]) {
            if (gm_free(t->a, ptrs[k]) != GM_OK) t->errors++;
            ptrs[k] = 0;
        } else {
            size_t sz = (x >> 8) % 4 == 0 ? (size_t)((x >> 16) % (8 * MIB)) + 1 : (size_t)((x >> 16) % 4096) + 1;
            if (gm_malloc(t->a, 0, sz, (gm_stream)(t->id % 3), &ptrs[k]) != GM_OK) t->errors++;
        }
    }
    for (int k = 0; k < 16; k++)
        if (ptrs[k] && gm_free(t->a, ptrs[k]) != GM_OK) t->errors++;
    return NULL;
}

static void test_threads(void **state) {
    gm_backend *b;
    gm_allocator *a;
    make(state, NULL, 0, false, &b, &a);
    pthread_t th[4];
    thr t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (thr){a, i, 0};
        pthread_create(&th[i], NULL, worker, &t[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].errors, 0);
    }
    gm_stats s = gm_test_stats(a);
    assert_int_equal(s.allocation[GM_POOL_ALL].current, 0);
    assert_int_equal(s.allocation[GM_POOL_ALL].allocated, s.allocation[GM_POOL_ALL].freed);
    gm_test_check(a);
    gm_test_destroy(b, a);
}

static gm_policy_kind k_torch = GM_POLICY_TORCH, k_gpumem = GM_POLICY_GPUMEM;

#define TESTS(k)                                                               \
    {                                                                          \
        cmocka_unit_test_prestate(test_basic, &k), cmocka_unit_test_prestate(test_bad_frees, &k),           \
        cmocka_unit_test_prestate(test_record_stream, &k),                     \
        cmocka_unit_test_prestate(test_record_stream_faults, &k), cmocka_unit_test_prestate(test_oom, &k), \
        cmocka_unit_test_prestate(test_fraction, &k),                          \
        cmocka_unit_test_prestate(test_empty_cache_and_info, &k),              \
        cmocka_unit_test_prestate(test_stats_reset, &k), cmocka_unit_test_prestate(test_oversize, &k),     \
        cmocka_unit_test_prestate(test_summary_json, &k),                      \
        cmocka_unit_test_prestate(test_devices_and_args, &k),                  \
        cmocka_unit_test_prestate(test_destroy_with_live, &k), cmocka_unit_test_prestate(test_threads, &k), \
    }

/* GM_TEST_POLICY=torch or gpumem runs one policy only */
int main(void) {
    const char *only = getenv("GM_TEST_POLICY");
    const struct CMUnitTest torch[] = TESTS(k_torch);
    const struct CMUnitTest gpumem[] = TESTS(k_gpumem);
    int failed = 0;
    if (!only || !strcmp(only, "torch")) failed += cmocka_run_group_tests_name("policy torch", torch, NULL, NULL);
    if (!only || !strcmp(only, "gpumem")) failed += cmocka_run_group_tests_name("policy gpumem", gpumem, NULL, NULL);
    return failed;
}
