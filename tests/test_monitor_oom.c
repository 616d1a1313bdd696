/* test_monitor_oom.c — OOM forensics (issue 27): the verdict for three
 * planted causes on the sim backend — a request beyond what the live
 * tensors leave (capacity), free memory in pieces under the torch policy
 * (fragmentation), and memory taken by a second allocator on the same
 * device (outside the allocator) — the largest free block, the live bytes by
 * category, and the report and snapshot written in the directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "internal.h"
#include "gm_test.h"
#include "monitor/monitor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB GM_TEST_MIB
#define GIB GM_TEST_GIB

static gm_devptr must_alloc(gm_allocator *a, uint64_t size) {
    gm_devptr p = 0;
    assert_int_equal(gm_malloc(a, 0, size, 0, &p), GM_OK);
    return p;
}

static int oom_verdict_of(gm_allocator *a, uint64_t size, gm__oom_facts *f) {
    gm_devptr p = 0;
    assert_int_equal(gm_malloc(a, 0, size, 0, &p), GM_ENOMEM);
    assert_int_equal(gm__oom_gather(a, 0, size, f), GM_OK);
    uint64_t saving, shortfall;
    return gm__oom_verdict(f, &saving, &shortfall);
}

static void capacity(void **state) {
    (void)state;
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 1 * GIB, false, &b, &a), GM_OK);
    gm_devptr p = must_alloc(a, 600 * MIB);
    assert_int_equal(gm_block_set_category(a, p, GM_CAT_ACTIVATIONS), GM_OK);
    gm__oom_facts f;
    assert_int_equal(oom_verdict_of(a, 600 * MIB, &f), GM_OOM_CAPACITY);
    assert_int_equal(f.by_category[GM_CAT_ACTIVATIONS], 600 * MIB);
    assert_int_equal(f.untagged, 0);
    gm_free(a, p);
    gm_test_destroy(b, a);
}

/* On a 1 GiB device under the torch policy: one 512 MiB segment split into
 * [free 200][live 200][free 112], another live 480 MiB segment: 312 MiB
 * unallocated, 32 MiB free on the device, so a request of 300 MiB fits
 * neither piece. The two live blocks in y and z. */
static void fragment(gm_allocator *a, gm_devptr *y, gm_devptr *z) {
    gm_free(a, must_alloc(a, 512 * MIB));
    gm_devptr x = must_alloc(a, 200 * MIB);
    *y = must_alloc(a, 200 * MIB);
    *z = must_alloc(a, 480 * MIB);
    gm_free(a, x);
}

static void fragmentation(void **state) {
    (void)state;
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 1 * GIB, false, &b, &a), GM_OK);
    gm_devptr y, z;
    fragment(a, &y, &z);
    gm__oom_facts f;
    assert_int_equal(oom_verdict_of(a, 300 * MIB, &f), GM_OOM_FRAGMENTATION);
    assert_int_equal(f.reserved - f.allocated, 312 * MIB);
    assert_true(f.have_blocks);
    assert_int_equal(f.largest_free_block, 200 * MIB);
    assert_int_equal(f.untagged, 680 * MIB);
    gm_free(a, y);
    gm_free(a, z);
    gm_test_destroy(b, a);
}

/* A second allocator on the same device holds 6 of its 8 GiB. */
static void outside(void **state) {
    (void)state;
    gm_backend *b;
    gm_allocator *a, *other;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 8 * GIB, false, &b, &a), GM_OK);
    gm_config cfg;
    gm_config_init(&cfg);
    assert_int_equal(gm_allocator_create(&other, b, &cfg), GM_OK);
    gm_devptr big = must_alloc(other, 6 * GIB), mine = must_alloc(a, 1 * GIB);
    gm__oom_facts f;
    assert_int_equal(oom_verdict_of(a, 2 * GIB, &f), GM_OOM_OUTSIDE);
    uint64_t saving, shortfall;
    gm__oom_verdict(&f, &saving, &shortfall);
    assert_int_equal(shortfall, 1 * GIB);
    assert_int_equal(saving, 5 * GIB); /* 6 GiB outside, less a context's worth */
    /* with the other allocator's memory freed, the same request fits */
    gm_free(other, big);
    gm_empty_cache(other, 0);
    gm_devptr p = must_alloc(a, 2 * GIB);
    gm_free(a, p);
    gm_free(a, mine);
    gm_allocator_destroy(other);
    gm_test_destroy(b, a);
}

/* The verdict's edges on planted numbers: exactly enough in pieces is
 * fragmentation; outside memory of a context's size is not blamed. */
static void verdict_edges(void **state) {
    (void)state;
    gm__oom_facts f = {.requested = 100, .device_total = 10 * GIB, .device_free = 40, .allocated = 940,
                       .reserved = 1000};
    uint64_t saving, shortfall;
    assert_int_equal(gm__oom_verdict(&f, &saving, &shortfall), GM_OOM_FRAGMENTATION); /* 60 + 40 */
    assert_int_equal(saving, 60);
    f.requested = 101;
    /* 10 GiB - 1040 bytes outside: more than a context, covers the 1 byte */
    assert_int_equal(gm__oom_verdict(&f, &saving, &shortfall), GM_OOM_OUTSIDE);
    assert_int_equal(shortfall, 1);
    f.device_total = 1000 + 40 + GIB; /* exactly a context outside */
    assert_int_equal(gm__oom_verdict(&f, &saving, &shortfall), GM_OOM_CAPACITY);
}

/* GPUMEM_OOM_REPORT=DIR: the report and the snapshot are written; the
 * allocator's own explanation is kept in the report. */
static void report_files(void **state) {
    (void)state;
    char dir[] = "/tmp/gm-oom-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[64];
    snprintf(sub, sizeof sub, "%s/reports", dir);
    setenv("GPUMEM_OOM_REPORT", sub, 1);
    assert_int_equal(gm__oom_report_setup(), GM_OK); /* makes the directory, records history */
    assert_true(gm_history_enabled());
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 1 * GIB, false, &b, &a), GM_OK);
    gm_devptr y, z, p;
    fragment(a, &y, &z);
    assert_int_equal(gm_malloc(a, 0, 300 * MIB, 0, &p), GM_ENOMEM);
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", gm_last_error_detail());
    char path[512];
    assert_int_equal(gm__oom_report_write(a, 0, 300 * MIB, sub, detail, gm_history_dump, path, sizeof path), GM_OK);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[n] = '\0';
    assert_non_null(strstr(text, "verdict: fragmentation\n"));
    assert_non_null(strstr(text, "largest free block: 200.00 MiB"));
    assert_non_null(strstr(text, "expandable_segments:True"));
    assert_non_null(strstr(text, detail));
    char snap[600];
    snprintf(snap, sizeof snap, "%.*s.pickle", (int)(strlen(path) - 4), path);
    struct stat st;
    assert_int_equal(stat(snap, &st), 0);
    assert_true(st.st_size > 0);
    assert_non_null(strstr(text, snap));
    gm_free(a, y);
    gm_free(a, z);
    gm_test_destroy(b, a);
    gm_history_enable(0);
    unsetenv("GPUMEM_OOM_REPORT");
    unlink(path);
    unlink(snap);
    rmdir(sub);
    rmdir(dir);
}

/* A path that is not a directory is refused with its name. */
static void bad_dir(void **state) {
    (void)state;
    setenv("GPUMEM_OOM_REPORT", "/dev/null", 1);
    assert_int_equal(gm__oom_report_setup(), GM_EINVAL);
    assert_non_null(strstr(gm_last_error_detail(), "/dev/null is not a directory"));
    unsetenv("GPUMEM_OOM_REPORT");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(capacity),      cmocka_unit_test(fragmentation), cmocka_unit_test(outside),
        cmocka_unit_test(verdict_edges), cmocka_unit_test(report_files),  cmocka_unit_test(bad_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
