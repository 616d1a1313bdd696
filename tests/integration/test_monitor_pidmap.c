/* test_monitor_pidmap.c — PIDs right inside a container (issue 27). NVML
 * numbers processes in the initial PID namespace; a reader in a container
 * sees its own numbers. A planted /proc (GPUMEM_PROC_ROOT) plays the host's
 * or a container's, a fake NVML lists the host's pids, and the collector
 * must join each published row to its NVML process: exactly through NSpid
 * in the host view, by the only plausible match inside a namespace (marked
 * inferred in every output), and never between equals. Malformed or
 * unreadable /proc entries are refused without a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "internal.h"
#include "monitor/monitor.h"
#include "shm_test.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_NS 4026531836ull /* the initial PID namespace */
#define CTR_NS 4026532777ull  /* "the container's" */
#define OTHER_NS 4026532888ull

/* ---- a fake NVML with one GPU and a settable process list ---------------- */

static struct {
    int n;
    int pid[8];
    uint64_t used[8];
} nv;

static int f_ok(void) { return 0; }
static int f_count(unsigned *c) {
    *c = 1;
    return 0;
}
static int f_handle(unsigned i, void **dev) {
    *dev = (void *)(uintptr_t)(i + 1);
    return i == 0 ? 0 : 2;
}
static int f_procs(void *dev, unsigned *count, void *infos) {
    if (*count < (unsigned)nv.n) {
        *count = (unsigned)nv.n;
        return 7;
    }
    for (int i = 0; i < nv.n; i++) {
        unsigned char *r = (unsigned char *)infos + (size_t)i * 24;
        uint32_t pid = (uint32_t)nv.pid[i];
        memcpy(r, &pid, 4);
        memcpy(r + 8, &nv.used[i], 8);
    }
    *count = (unsigned)nv.n;
    return 0;
}

/* ---- a planted /proc ------------------------------------------------------ */

static char root[256];

static void put(const char *rel, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void link_to(const char *rel, const char *target) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    put(rel, ""); /* make the folders */
    unlink(path);
    assert_int_equal(symlink(target, path), 0);
}

static void ns_link(const char *dir, unsigned long long ino) {
    char rel[128], target[64];
    snprintf(rel, sizeof rel, "%s/ns/pid", dir);
    snprintf(target, sizeof target, "pid:[%llu]", ino);
    link_to(rel, target);
}

/* Process `pid` of the planted /proc: NSpid line, namespace, comm, and its
 * descriptors (the real ones of this test process, so the reader can open
 * the publisher's memfd through it). */
static void plant_proc(int pid, const char *nspid, unsigned long long ns, const char *comm) {
    char dir[32], rel[64], text[256], fds[64];
    snprintf(dir, sizeof dir, "%d", pid);
    snprintf(rel, sizeof rel, "%s/status", dir);
    snprintf(text, sizeof text, "Name:\t%s\nPid:\t%d\nNSpid:\t%s\nUid:\t0\n", comm, pid, nspid);
    put(rel, text);
    snprintf(rel, sizeof rel, "%s/comm", dir);
    snprintf(text, sizeof text, "%s\n", comm);
    put(rel, text);
    ns_link(dir, ns);
    snprintf(rel, sizeof rel, "%s/fd", dir);
    snprintf(fds, sizeof fds, "/proc/%d/fd", (int)getpid());
    link_to(rel, fds);
}

static int setup(void **state) {
    snprintf(root, sizeof root, "/tmp/gm-pidmap-%d", (int)getpid());
    mkdir(root, 0755);
    setenv("GPUMEM_PROC_ROOT", root, 1);
    gm_test_shm_tag("pidmap");
    memset(&nv, 0, sizeof nv);
    return 0;
}

static int teardown(void **state) {
    unsetenv("GPUMEM_PROC_ROOT");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
    return 0;
}

/* A publisher (this process) with 8000 bytes reserved on device 0. The
 * real /proc while it fills its header. */
static gm_allocator *publish_8000(void) {
    unsetenv("GPUMEM_PROC_ROOT");
    gm_allocator *a = gm_test_shm_allocator(1);
    assert_int_equal(gm_allocator_publish(a, "trainer"), GM_OK);
    setenv("GPUMEM_PROC_ROOT", root, 1);
    gm_stats st = {.size = sizeof st};
    st.allocated_bytes[0].current = 2000;
    st.reserved_bytes[0].current = 8000;
    gm__publisher_update(gm__allocator_publisher(a), 0, &st);
    return a;
}

/* Write n bytes at `off` into the beacon of the publisher that calls itself
 * `pid`: what a publisher elsewhere would have recorded. */
static void poke_header(int pid, size_t off, const void *v, size_t n) {
    char path[400];
    assert_int_equal(gm_test_shm_path(pid, path, sizeof path), 1);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, v, n, (off_t)off), (ssize_t)n);
    close(fd);
}

/* One sample with NVML listing n processes (pids, used bytes). */
static void sample(gm__mon_sample *s, int n, const int *pids, const uint64_t *used) {
    nv.n = n;
    for (int i = 0; i < n; i++) {
        nv.pid[i] = pids[i];
        nv.used[i] = used[i];
    }
    gm__nvml_fns f = {.init = f_ok, .shutdown = f_ok, .device_count = f_count, .device_handle = f_handle,
                      .procs_v3 = f_procs};
    gm__collector *c;
    assert_int_equal(gm__collector_create(&c, &f, true), GM_OK);
    assert_int_equal(gm__collector_sample(c, s), GM_OK);
    gm__collector_destroy(c);
}

static const gm__mon_row *row_of(const gm__mon_sample *s, int pid) {
    for (int i = 0; i < s->nrows; i++)
        if (s->rows[i].pid == pid) return &s->rows[i];
    fail_msg("no row for pid %d", pid);
    return NULL;
}

static char *render(const gm__mon_sample *s, void (*fmt)(const gm__mon_sample *, gm__sbuf *)) {
    gm__sbuf b = {0};
    fmt(s, &b);
    assert_false(b.oom);
    return b.p;
}
/* The output `fmt` of s holds `needle` (want) or does not. */
static void has(const gm__mon_sample *s, void (*fmt)(const gm__mon_sample *, gm__sbuf *), const char *needle,
                bool want) {
    char *t = render(s, fmt);
    if ((strstr(t, needle) != NULL) != want) fail_msg("%s '%s' in:\n%s", want ? "no" : "unwanted", needle, t);
    free(t);
}
static void table(const gm__mon_sample *s, gm__sbuf *b) { gm__format_table(s, b); }
static void prom(const gm__mon_sample *s, gm__sbuf *b) { gm__format_prometheus(s, b); }
static void json(const gm__mon_sample *s, gm__sbuf *b) { gm__format_json(s, b, true); }
static void csv(const gm__mon_sample *s, gm__sbuf *b) { gm__format_csv(s, b); }

/* ---- the host's view: exact, through NSpid -------------------------------- */

/* The publisher runs as pid 7 of a container; the host's /proc shows it as
 * 5000001 (NSpid "5000001 7"), NVML lists 5000001. Another container's pid
 * 7 (5000002) and malformed or unreadable entries are passed over. */
static void host_view_is_exact(void **state) {
    gm_allocator *a = publish_8000();
    uint64_t ns = CTR_NS;
    int32_t seven = 7;
    poke_header(getpid(), offsetof(gm__shm_header, pidns_ino), &ns, sizeof ns);
    poke_header(getpid(), offsetof(gm__shm_header, pid), &seven, sizeof seven);
    ns_link("1", HOST_NS);
    ns_link("self", HOST_NS);
    plant_proc(5000002, "5000002\t7", OTHER_NS, "other");  /* another container's 7 */
    plant_proc(5000003, "5000003\tabc", CTR_NS, "junk");     /* malformed */
    plant_proc(5000004, "5000004\t7 x", CTR_NS, "junk2");    /* trailing junk */
    put("5000005/comm", "nostatus\n");                      /* unreadable status */
    put("notapid/status", "NSpid:\t7\n");
    plant_proc(5000001, "5000001\t7", CTR_NS, "trainer");
    int pids[] = {5000001, 5000002, 333};
    uint64_t used[] = {9000, 20000, 100};
    gm__mon_sample s;
    sample(&s, 3, pids, used);
    assert_true(s.host_view);
    assert_int_equal(s.nproducers, 1);
    const gm__mon_row *r = row_of(&s, 5000001);
    assert_true(r->have_alloc && r->have_nvml_used);
    assert_int_equal(r->ns_pid, 7);
    assert_int_equal(r->host_pid, 5000001);
    assert_int_equal(r->pid_map, GM_PIDMAP_EXACT);
    assert_int_equal(r->nvml_used, 9000);
    assert_int_equal(r->v.reserved, 8000);
    const gm__mon_row *o = row_of(&s, 5000002);
    assert_false(o->have_alloc);
    assert_int_equal(o->pid_map, GM_PIDMAP_EXACT);
    assert_string_equal(o->comm, "other"); /* the host's /proc names it */
    assert_int_equal(s.nrows, 3);

    has(&s, prom, "gpumem_process_allocator_reserved_bytes{gpu=\"0\",pid=\"5000001\"} 8000\n", true);
    has(&s, prom, "gpumem_process_info{gpu=\"0\",pid=\"5000001\",ns_pid=\"7\",uid=", true);
    has(&s, prom, "host_pid=", false); /* the same as pid here */
    has(&s, prom, "pid_map=", false);
    has(&s, json, "\"pid\":5000001,\"gpu\":0,\"ns_pid\":7,\"host_pid\":5000001,\"pid_map\":\"exact\"", true);
    has(&s, json, "\"host_view\":true", true);
    has(&s, table, "pid?", false);
    gm__sample_free(&s);
    gm_test_shm_allocator_free(a);
}

/* ---- inside the container: inferred, marked ------------------------------- */

/* The reader shares the publisher's namespace (a container's /proc: its pid
 * 1 is not the initial namespace's). NVML lists host pids: 4000001 is too
 * small to hold the 8000 reserved bytes, 333 too; 4000002 is the only
 * match. */
static void container_view_infers(void **state) {
    gm_allocator *a = publish_8000();
    int me = (int)getpid();
    char self[32];
    snprintf(self, sizeof self, "%d", me);
    ns_link("1", CTR_NS);
    unsetenv("GPUMEM_PROC_ROOT");
    uint64_t own = gm__proc_pidns(0); /* the namespace the header names */
    setenv("GPUMEM_PROC_ROOT", root, 1);
    ns_link("self", own);
    plant_proc(me, self, own, "trainer");
    /* in a container the publisher cannot know its host pid (this test may
     * run in the initial namespace, where it did): say so in its header */
    int32_t zero = 0;
    poke_header(me, offsetof(gm__shm_header, host_pid), &zero, sizeof zero);
    int pids[] = {4000001, 4000002, 333};
    uint64_t used[] = {5000, 9000, 100};
    gm__mon_sample s;
    sample(&s, 3, pids, used);
    assert_false(s.host_view);
    const gm__mon_row *r = row_of(&s, me);
    assert_true(r->have_alloc && r->have_nvml_used);
    assert_int_equal(r->host_pid, 4000002);
    assert_int_equal(r->pid_map, GM_PIDMAP_INFERRED);
    assert_int_equal(r->nvml_used, 9000);
    const gm__mon_row *o = row_of(&s, 4000001);
    assert_int_equal(o->pid_map, GM_PIDMAP_UNMAPPED);
    assert_int_equal(o->host_pid, 0);
    assert_string_equal(o->label, "?"); /* never looked up under a number that may be another process */
    assert_int_equal(s.nrows, 3);

    char want[128];
    snprintf(want, sizeof want, "gpumem_process_info{gpu=\"0\",pid=\"%d\",host_pid=\"4000002\","
                                "pid_map=\"inferred\",uid=", me);
    has(&s, prom, want, true);
    has(&s, prom, "gpumem_process_device_memory_bytes{gpu=\"0\",pid=\"4000001\"} ", true);
    has(&s, prom, "gpumem_process_info{gpu=\"0\",pid=\"4000001\",pid_map=\"unmapped\"", true);
    snprintf(want, sizeof want, "%d?", me);
    has(&s, table, want, true);
    has(&s, table, "4000001^", true);
    has(&s, table, "pid?: inside a PID namespace", true);
    has(&s, json, "\"host_pid\":4000002,\"pid_map\":\"inferred\"", true);
    has(&s, csv, ",4000002,inferred\n", true);
    gm__sample_free(&s);

    /* two processes could be ours: no guess */
    used[2] = 9500;
    sample(&s, 3, pids, used);
    r = row_of(&s, me);
    assert_false(r->have_nvml_used);
    assert_int_equal(r->pid_map, GM_PIDMAP_NONE);
    assert_int_equal(r->host_pid, 0);
    assert_int_equal(s.nrows, 4);
    gm__sample_free(&s);

    /* a translating driver lists our own number: that one, over an equal rival */
    int own_pids[] = {me, 4000002};
    uint64_t own_used[] = {9000, 9000};
    sample(&s, 2, own_pids, own_used);
    r = row_of(&s, me);
    assert_true(r->have_nvml_used);
    assert_int_equal(r->host_pid, me);
    assert_int_equal(r->pid_map, GM_PIDMAP_INFERRED);
    assert_int_equal(row_of(&s, 4000002)->pid_map, GM_PIDMAP_UNMAPPED);
    gm__sample_free(&s);
    gm_test_shm_allocator_free(a);
}

/* ---- the matcher alone ----------------------------------------------------- */

static gm__mon_row published(int pid, int host_pid, int64_t reserved) {
    gm__mon_row r = {.pid = pid, .host_pid = host_pid, .source = GM__SRC_TORCH, .have_alloc = true};
    r.v.reserved = reserved;
    return r;
}

static void matcher_rules(void **state) {
    int row[4], how[4];
    /* the publisher knew its host pid: exact even inside, however big the rival */
    gm__mon_row rows[] = {published(5, 9001, 100), published(6, 0, 100)};
    gm__nvml_proc np[] = {{9002, true, 500}, {9001, true, 500}};
    gm__pidmap_match(rows, 2, 0, np, 2, false, row, how);
    assert_int_equal(row[1], 0);
    assert_int_equal(how[1], GM_PIDMAP_EXACT);
    assert_int_equal(row[0], 1); /* then the only one left fits the only row left */
    assert_int_equal(how[0], GM_PIDMAP_INFERRED);
    /* host view: numbers only, no inference */
    gm__mon_row hrows[] = {published(77, 77, 100), published(78, 78, 100)};
    gm__nvml_proc hp[] = {{77, true, 50}, {79, true, 500}};
    gm__pidmap_match(hrows, 2, 0, hp, 2, true, row, how);
    assert_int_equal(row[0], 0);
    assert_int_equal(how[0], GM_PIDMAP_EXACT);
    assert_int_equal(row[1], -1);
    assert_int_equal(how[1], GM_PIDMAP_EXACT);
    /* another device's row, a row already joined, an NVML-only row: no candidates */
    gm__mon_row other[] = {published(5, 0, 10), published(6, 0, 10), {.pid = 7, .source = 0}};
    other[0].device = 1;
    other[1].have_nvml_used = true;
    gm__nvml_proc one[] = {{9003, true, 500}};
    gm__pidmap_match(other, 3, 0, one, 1, false, row, how);
    assert_int_equal(row[0], -1);
    assert_int_equal(how[0], GM_PIDMAP_UNMAPPED);
    /* nothing at all */
    gm__pidmap_match(NULL, 0, 0, NULL, 0, false, row, how);
}

/* ---- bad /proc input --------------------------------------------------------- */

static void malformed_proc_refused(void **state) {
    static const char *const bad[] = {
        "NSpid:\tabc\n", "NSpid:\t12 x\n", "NSpid:\t-5\n", "NSpid:\t0\n", "NSpid:\t99999999999\n",
        "NSpid:\n", "NSpid:\t\t\n", "Name:\tno nspid line\n", "",
    };
    int ids[GM__NSPID_MAX];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        put("6000001/status", bad[i]);
        assert_int_equal(gm__proc_nspid(6000001, ids, GM__NSPID_MAX), 0);
    }
    char longline[2048] = "NSpid:";
    for (int i = 0; i < 150; i++) strcat(longline, "\t1234567");
    strcat(longline, "\n");
    put("6000001/status", longline);
    assert_int_equal(gm__proc_nspid(6000001, ids, GM__NSPID_MAX), 0);
    put("6000001/status", "Name:\tx\nNSpid:\t10\t20 30\nTgid:\t1\n");
    assert_int_equal(gm__proc_nspid(6000001, ids, GM__NSPID_MAX), 3);
    assert_int_equal(ids[0], 10);
    assert_int_equal(ids[2], 30);
    assert_int_equal(gm__proc_nspid(6000001, ids, 2), 2); /* capped */
    assert_int_equal(gm__proc_nspid(6999999, ids, GM__NSPID_MAX), 0); /* no such process */
    assert_int_equal(gm__pid_from_ns(CTR_NS, 0), 0);

    static const char *const links[] = {"net:[5]", "pid:[12x]", "pid:[]", "pid:5", "pid:[-1]"};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
        link_to("6000001/ns/pid", links[i]);
        assert_int_equal(gm__proc_pidns(6000001), 0);
    }
    /* the publisher's own host pid: only when its /proc shows the initial namespace */
    put("self/status", "NSpid:\t4242\t7\n");
    ns_link("1", HOST_NS);
    assert_int_equal(gm__host_pid_self(), 4242);
    ns_link("1", CTR_NS);
    assert_int_equal(gm__host_pid_self(), 0);
    link_to("1/ns/pid", "garbage");
    ns_link("self", CTR_NS); /* not allowed to look at pid 1: our own namespace decides */
    assert_false(gm__procfs_is_init());
    assert_int_equal(gm__host_pid_self(), 0);
    /* no /proc at all: nothing known, nothing found, no crash */
    setenv("GPUMEM_PROC_ROOT", "/nonexistent-gpumem-proc", 1);
    assert_false(gm__procfs_is_init());
    assert_int_equal(gm__pid_from_ns(CTR_NS, 7), 0);
    assert_int_equal(gm__proc_nspid(0, ids, GM__NSPID_MAX), 0);
    gm__mon_sample s;
    sample(&s, 0, NULL, NULL);
    gm__sample_free(&s);
    setenv("GPUMEM_PROC_ROOT", "relative/not/used", 1);
    assert_string_equal(gm__proc_root(), "/proc");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(host_view_is_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(container_view_infers, setup, teardown),
        cmocka_unit_test_setup_teardown(matcher_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(malformed_proc_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
