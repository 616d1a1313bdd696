/* test_monitor_nvml.c — the NVML loader through a fake function table:
 * memory info v2 (and the fallback to v1), the two per-process record sizes,
 * buffer growth, "not available" values, and the collector joining NVML
 * processes with published allocator numbers into every output format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "internal.h"
#include "monitor/monitor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the fake driver ---------------------------------------------------- */

#define NPROCS 3
static struct {
    const char *driver;
    int v2_result;            /* what GetMemoryInfo_v2 returns (0 = success) */
    unsigned last_v2_version; /* the version field the caller passed */
    int proc_record;          /* bytes per record this "driver" writes */
    unsigned procs_calls;
    int pids[NPROCS];
    uint64_t used[NPROCS];
} fake;

static int f_init(void) { return 0; }
static int f_shutdown(void) { return 0; }
static int f_driver(char *buf, unsigned len) {
    snprintf(buf, len, "%s", fake.driver);
    return 0;
}
static int f_count(unsigned *c) {
    *c = 2;
    return 0;
}
static int f_handle(unsigned i, void **dev) {
    if (i >= 2) return 2;
    *dev = (void *)(uintptr_t)(i + 1);
    return 0;
}
static int f_name(void *dev, char *buf, unsigned len) {
    snprintf(buf, len, "Fake H200 #%d", (int)(uintptr_t)dev);
    return 0;
}
static int f_uuid(void *dev, char *buf, unsigned len) {
    snprintf(buf, len, "GPU-0000000%d-fake", (int)(uintptr_t)dev);
    return 0;
}
static int f_pci(void *dev, void *pci) {
    memset(pci, 0, 68);
    snprintf((char *)pci + 36, 32, "00000000:1%d:00.0", (int)(uintptr_t)dev);
    return 0;
}
static int f_mem_v2(void *dev, void *m) {
    unsigned version;
    memcpy(&version, m, 4);
    fake.last_v2_version = version;
    if (fake.v2_result) return fake.v2_result;
    if (version != GM__NVML_MEMORY_V2_VERSION) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    unsigned long long v[4] = {1000, 100, 600, 300}; /* total, reserved, free, used */
    memcpy((char *)m + 8, v, sizeof v);
    return 0;
}
static int f_mem_v1(void *dev, void *m) {
    unsigned long long v[3] = {1000, 600, 400}; /* total, free, used */
    memcpy(m, v, sizeof v);
    return 0;
}
static int f_util(void *dev, void *u) {
    unsigned v[2] = {42, 7};
    memcpy(u, v, sizeof v);
    return 0;
}
/* Writes records the way the configured driver lays them out. Device 2 has
 * no processes; device 1 reports NPROCS and asks for room when short. */
static int f_procs(void *dev, unsigned *count, void *infos) {
    fake.procs_calls++;
    if ((uintptr_t)dev != 1) {
        *count = 0;
        return 0;
    }
    if (*count < NPROCS) {
        *count = NPROCS;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    for (int i = 0; i < NPROCS; i++) {
        unsigned char *r = (unsigned char *)infos + (size_t)i * fake.proc_record;
        uint32_t pid = (uint32_t)fake.pids[i];
        memcpy(r, &pid, 4);
        memcpy(r + 8, &fake.used[i], 8);
        /* gpuInstanceId/computeInstanceId (and the extra field of 535.43-86) */
        memset(r + 16, 0xff, (size_t)fake.proc_record - 16);
    }
    *count = NPROCS;
    return 0;
}

static gm__nvml_fns fake_fns(void) {
    gm__nvml_fns f = {
        .init = f_init, .shutdown = f_shutdown, .driver_version = f_driver,
        .device_count = f_count, .device_handle = f_handle, .device_name = f_name,
        .device_uuid = f_uuid, .device_pci = f_pci, .memory_v2 = f_mem_v2,
        .memory_v1 = f_mem_v1, .utilization = f_util, .procs_v3 = f_procs,
    };
    return f;
}

static int reset(void **state) {
    memset(&fake, 0, sizeof fake);
    fake.driver = "550.54.15";
    fake.proc_record = 24;
    fake.pids[0] = 111;
    fake.pids[1] = (int)getpid();
    fake.pids[2] = 333;
    fake.used[0] = 5000;
    fake.used[1] = 9000;
    fake.used[2] = GM__NVML_NOT_AVAILABLE;
    return 0;
}

/* ---- tests -------------------------------------------------------------- */

static void memory_v2(void **state) {
    gm__nvml_fns f = fake_fns();
    gm__nvml *n;
    char why[128];
    assert_int_equal(gm__nvml_open(&n, &f, why, sizeof why), GM_OK);
    gm__mon_dev d;
    assert_int_equal(gm__nvml_device(n, 0, &d), GM_OK);
    assert_int_equal(fake.last_v2_version, 0x02000028);
    assert_true(d.have_mem && d.have_reserved);
    assert_int_equal(d.total, 1000);
    assert_int_equal(d.reserved, 100);
    assert_int_equal(d.free, 600);
    assert_int_equal(d.used, 300);
    assert_int_equal(d.total, d.reserved + d.used + d.free);
    assert_string_equal(d.name, "Fake H200 #1");
    assert_string_equal(d.uuid, "GPU-00000001-fake");
    assert_string_equal(d.pci_bus_id, "00000000:11:00.0");
    assert_true(d.have_util);
    assert_int_equal(d.util_gpu, 42);
    assert_false(gm__nvml_mem_v1_fallback(n));
    gm__nvml_close(n);
}

static void memory_v1_fallback(void **state) {
    int results[] = {13 /* FUNCTION_NOT_FOUND */, 3 /* NOT_SUPPORTED */};
    for (int k = 0; k < 3; k++) {
        reset(NULL);
        gm__nvml_fns f = fake_fns();
        if (k < 2) fake.v2_result = results[k];
        else f.memory_v2 = NULL; /* symbol absent */
        gm__nvml *n;
        char why[128];
        assert_int_equal(gm__nvml_open(&n, &f, why, sizeof why), GM_OK);
        gm__mon_dev d;
        assert_int_equal(gm__nvml_device(n, 1, &d), GM_OK);
        assert_true(d.have_mem);
        assert_false(d.have_reserved);
        assert_int_equal(d.total, 1000);
        assert_int_equal(d.used, 400);
        assert_true(gm__nvml_mem_v1_fallback(n));
        gm__nvml_close(n);
    }
}

static void check_procs(const char *driver, int record, int expect_record) {
    reset(NULL);
    fake.driver = driver;
    fake.proc_record = record;
    gm__nvml_fns f = fake_fns();
    gm__nvml *n;
    char why[128];
    assert_int_equal(gm__nvml_open(&n, &f, why, sizeof why), GM_OK);
    assert_int_equal(gm__nvml_proc_record_size(n), expect_record);
    gm__nvml_proc *p;
    int c;
    assert_int_equal(gm__nvml_processes(n, 0, &p, &c), GM_OK);
    assert_int_equal(c, NPROCS);
    assert_int_equal(p[0].pid, 111);
    assert_int_equal(p[0].used, 5000);
    assert_int_equal(p[1].pid, getpid());
    assert_int_equal(p[1].used, 9000);
    assert_int_equal(p[2].pid, 333);
    assert_false(p[2].have_used);
    free(p);
    assert_int_equal(gm__nvml_processes(n, 1, &p, &c), GM_OK);
    assert_int_equal(c, 0);
    free(p);
    gm__nvml_close(n);
}

static void proc_records_24(void **state) { check_procs("550.54.15", 24, 24); }
static void proc_records_32(void **state) {
    check_procs("535.54.03", 32, 32);
    check_procs("535.43.02", 32, 32);
    check_procs("535.86.05", 32, 32);
    check_procs("535.104.05", 24, 24);
    check_procs("530.30.02", 24, 24);
}

static void no_driver(void **state) {
    gm__nvml_fns f = {0}; /* nothing resolved */
    gm__nvml *n = (gm__nvml *)1;
    char why[160];
    assert_int_equal(gm__nvml_open(&n, &f, why, sizeof why), GM_ENODRIVER);
    assert_null(n);
    assert_non_null(strstr(why, "NVML"));
    gm__collector *c;
    assert_int_equal(gm__collector_create(&c, &f, true), GM_OK);
    gm__mon_sample s;
    assert_int_equal(gm__collector_sample(c, &s), GM_OK);
    assert_false(s.nvml);
    assert_non_null(strstr(s.nvml_note, "NVML"));
    gm__sbuf b = {0};
    gm__format_json(&s, &b, true);
    assert_non_null(strstr(b.p, "\"available\":false"));
    gm__sbuf_free(&b);
    gm__sample_free(&s);
    gm__collector_destroy(c);
}

/* The collector joins NVML's per-process used bytes with the published
 * allocator numbers of the same pid and device. */
static void collector_joins(void **state) {
    char tag[64];
    snprintf(tag, sizeof tag, "nvmltest%d", (int)getpid());
    setenv("GPUMEM_SHM_TAG", tag, 1);
    gm_allocator *a = calloc(1, sizeof *a);
    a->ndevices = 1;
    pthread_mutex_init(&a->devices_lock, NULL);
    assert_int_equal(gm_allocator_publish(a, "la\"b\\el\nx"), GM_OK);
    gm_stats st = {.size = sizeof st};
    st.allocated_bytes[0].current = 2000;
    st.reserved_bytes[0].current = 8000;
    st.reserved_bytes[0].peak = 8500;
    st.num_ooms = 2;
    gm__publisher_update(gm__allocator_publisher(a), 0, &st);

    gm__nvml_fns f = fake_fns();
    gm__collector *c;
    assert_int_equal(gm__collector_create(&c, &f, true), GM_OK);
    gm__mon_sample s;
    assert_int_equal(gm__collector_sample(c, &s), GM_OK);
    assert_true(s.nvml);
    assert_int_equal(s.ndevices, 2);
    assert_int_equal(s.nproducers, 1);
    const gm__mon_row *mine = NULL;
    int nvml_only = 0;
    for (int i = 0; i < s.nrows; i++) {
        if (s.rows[i].pid == getpid()) mine = &s.rows[i];
        else if (!s.rows[i].have_alloc) nvml_only++;
    }
    assert_int_equal(nvml_only, 2); /* pids 111 and 333 */
    assert_non_null(mine);
    assert_true(mine->have_alloc && mine->have_nvml_used);
    assert_int_equal(mine->nvml_used, 9000);
    assert_int_equal(mine->v.reserved, 8000);

    gm__sbuf b = {0};
    gm__format_json(&s, &b, true);
    assert_non_null(strstr(b.p, "\"outside_allocator\":1000"));
    assert_non_null(strstr(b.p, "\"reserved_unallocated\":6000"));
    assert_non_null(strstr(b.p, "\"memory_info\":\"v2\""));
    assert_non_null(strstr(b.p, "\"label\":\"la\\\"b\\\\el\\nx\""));
    gm__sbuf_free(&b);

    gm__format_prometheus(&s, &b);
    char want[256];
    /* the series' key: gpu, UUID (dcgm-exporter's name), pid */
    snprintf(want, sizeof want, "gpumem_process_allocator_reserved_bytes{gpu=\"0\",UUID=\"GPU-00000001-fake\",pid=\"%d\"} 8000\n",
             (int)getpid());
    assert_non_null(strstr(b.p, want));
    /* who it is: once, in the info series */
    snprintf(want, sizeof want,
             "gpumem_process_info{gpu=\"0\",UUID=\"GPU-00000001-fake\",pid=\"%d\",uid=\"%u\",source=\"gpumem\","
             "comm=\"%s\",label=\"la\\\"b\\\\el\\nx\"", (int)getpid(), (unsigned)getuid(), mine->comm);
    const char *line = strstr(b.p, want); /* identity labels (the host name...) follow */
    assert_non_null(line);
    assert_true(strstr(line, "} 1\n") < strchr(line, '\n') + 1);
    assert_non_null(strstr(b.p, "# TYPE gpumem_process_allocator_ooms_total counter\n"));
    line = strstr(b.p, "gpumem_device_memory_driver_reserved_bytes{gpu=\"1\",UUID=\"GPU-00000002-fake\"");
    assert_non_null(line);
    assert_true(strstr(line, "} 100\n") && strstr(line, "} 100\n") < strchr(line, '\n'));
    /* pid 333's used memory is not available: no series rather than a wrong one */
    for (const char *l = strstr(b.p, "pid=\"333\""); l; l = strstr(l + 1, "pid=\"333\"")) {
        const char *start = l;
        while (start > b.p && start[-1] != '\n') start--;
        assert_int_equal(strncmp(start, "gpumem_process_info{", 20), 0); /* who it is, and nothing more */
    }
    gm__sbuf_free(&b);

    gm__format_csv(&s, &b);
    assert_non_null(strstr(b.p, ",\"la\"\"b\\el\nx\","));
    gm__sbuf_free(&b);
    gm__format_table(&s, &b);
    assert_non_null(strstr(b.p, "Fake H200 #1"));
    gm__sbuf_free(&b);

    gm__sample_free(&s);
    gm__collector_destroy(c);
    gm_allocator_unpublish(a);
    pthread_mutex_destroy(&a->devices_lock);
    free(a);
}

static void sampler_thread(void **state) {
    gm__nvml_fns f = fake_fns();
    gm__collector *c;
    assert_int_equal(gm__collector_create(&c, &f, true), GM_OK);
    gm__sampler *s;
    assert_int_equal(gm__sampler_start(&s, c, 0.01), GM_OK);
    gm__mon_sample a, b;
    uint64_t seq1, seq2;
    assert_int_equal(gm__sampler_latest(s, &a, &seq1, 0, 30), GM_OK);
    assert_int_equal(gm__sampler_latest(s, &b, &seq2, seq1, 30), GM_OK);
    assert_true(seq2 > seq1);
    assert_int_equal(a.ndevices, 2);
    gm__sample_free(&a);
    gm__sample_free(&b);
    gm__sampler_stop(s);
    gm__collector_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(memory_v2, reset),       cmocka_unit_test_setup(memory_v1_fallback, reset),
        cmocka_unit_test_setup(proc_records_24, reset), cmocka_unit_test_setup(proc_records_32, reset),
        cmocka_unit_test_setup(no_driver, reset),       cmocka_unit_test_setup(collector_joins, reset),
        cmocka_unit_test_setup(sampler_thread, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
