/* test_monitor_hostile.c — monitors never trust a segment they did not
 * verify (issue 15, defects 5 and 6): a FIFO planted under a segment name
 * must not block discovery, a segment truncated under a reader must not
 * kill it (SIGBUS), and a 0666 copy or a copy under another name must not
 * be read (it would show the process twice). And truncation never kills
 * the publisher either (issue 26, defect 3). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "internal.h"
#include "monitor/monitor.h"
#include "shm_test.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_prefix[80];

static int setup(void **state) {
    (void)state;
    gm_test_shm_tag("hostile");
    gm__shm_prefix(g_prefix, sizeof g_prefix);
    alarm(60); /* a blocked open would hang the test: fail it instead */
    return 0;
}

static int count_pid(const gm__scan_result *r, int pid) {
    int n = 0;
    for (int i = 0; i < r->nprocs; i++) n += r->procs[i].pid == pid;
    return n;
}

/* A publisher of our own, with one device's stats set. */
static gm_allocator *publish_one(char *path, size_t len) {
    gm_allocator *a = gm_test_shm_allocator(1);
    assert_int_equal(gm_allocator_publish(a, "victim"), GM_OK);
    gm_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    s.reserved_bytes[GM_POOL_ALL].current = 4096;
    gm__publisher_update(gm__allocator_publisher(a), 0, &s);
    assert_int_equal(gm_test_shm_path(getpid(), path, len), 1);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return a;
}

static void planted_fifo(void **state) {
    (void)state;
    char path[300];
    /* a FIFO under a name of the beacons' form */
    snprintf(path, sizeof path, "/dev/shm/%s00000000000000f1", g_prefix);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    char mine[300];
    gm_allocator *a = publish_one(mine, sizeof mine);
    for (int cached = 0; cached < 2; cached++) {
        gm__shm_cache *c = cached ? gm__shm_cache_create() : NULL;
        gm__scan_result r;
        assert_int_equal(gm__shm_scan_cached(c, &r, true), GM_OK); /* returns: no blocking open */
        assert_int_equal(count_pid(&r, 1), 0);
        assert_int_equal(count_pid(&r, getpid()), 1);
        assert_true(r.skipped >= 1);
        gm__scan_result_free(&r);
        gm__shm_cache_destroy(c);
    }
    unlink(path);
    gm_test_shm_allocator_free(a);
}

/* Truncating the beacon under a cached and an uncached reader: neither
 * dies; the cached one keeps the process (its data is elsewhere), the
 * uncached one skips the beacon it cannot read. The data cannot be
 * truncated at all: its seals refuse, even to its owner. */
static void shrinking_segment(void **state) {
    (void)state;
    char path[300];
    gm_allocator *a = publish_one(path, sizeof path);
    gm__shm_cache *c = gm__shm_cache_create();
    gm__scan_result r;
    assert_int_equal(gm__shm_scan_cached(c, &r, false), GM_OK); /* cached: kept open */
    assert_int_equal(count_pid(&r, getpid()), 1);
    gm__scan_result_free(&r);
    for (off_t size = GM__SHM_HEADER_SIZE + 64; size >= 0; size -= GM__SHM_HEADER_SIZE / 2 + 32) {
        assert_int_equal(truncate(path, size), 0);
        assert_int_equal(gm__shm_scan_cached(c, &r, false), GM_OK);
        assert_int_equal(count_pid(&r, getpid()), 1);
        gm__scan_result_free(&r);
        assert_int_equal(gm__shm_scan(&r, false), GM_OK);
        assert_int_equal(count_pid(&r, getpid()), size >= GM__SHM_HEADER_SIZE);
        assert_int_equal(r.cleaned, 0); /* still locked: alive */
        gm__scan_result_free(&r);
    }
    gm__shm_header *h = gm__publisher_header(gm__allocator_publisher(a));
    char data[64];
    snprintf(data, sizeof data, "/proc/self/fd/%d", h->data_fd);
    int fd = open(data, O_RDWR);
    if (fd >= 0) { /* refused outright where F_SEAL_FUTURE_WRITE exists */
        assert_int_not_equal(ftruncate(fd, 0), 0);
        close(fd);
    }
    assert_int_not_equal(truncate(data, 0), 0);
    gm__shm_cache_destroy(c);
    gm_test_shm_allocator_free(a);
}

/* Issue 26, defect 3: a publisher whose segment another process truncates
 * keeps running (it died of SIGBUS, exit 135, before). The child publishes,
 * the parent truncates every file of the child's it can reach, the child
 * publishes again and exits 0. */
static void truncation_never_kills_the_publisher(void **state) {
    (void)state;
    int go[2], ready[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        gm_allocator *a = gm_test_shm_allocator(2);
        if (gm_allocator_publish(a, "victim") != GM_OK) _exit(2);
        gm_stats s;
        memset(&s, 0, sizeof s);
        s.size = sizeof s;
        gm__publisher_update(gm__allocator_publisher(a), 0, &s);
        int fd = (gm__publisher_header(gm__allocator_publisher(a)))->data_fd;
        if (write(ready[1], &fd, sizeof fd) != sizeof fd) _exit(3);
        char b;
        if (read(go[0], &b, 1) != 1) _exit(4);
        for (int i = 0; i < 1000; i++) {
            s.allocated_bytes[GM_POOL_ALL].current = i;
            gm__publisher_update(gm__allocator_publisher(a), i % 2, &s);
        }
        gm_test_shm_allocator_free(a);
        _exit(0);
    }
    int data_fd;
    assert_int_equal(read(ready[0], &data_fd, sizeof data_fd), sizeof data_fd);
    char path[300];
    assert_int_equal(gm_test_shm_path((int)child, path, sizeof path), 1);
    assert_int_equal(truncate(path, 0), 0);
    char data[64];
    snprintf(data, sizeof data, "/proc/%d/fd/%d", (int)child, data_fd);
    assert_int_not_equal(truncate(data, 0), 0); /* sealed */
    assert_int_equal(write(go[1], "x", 1), 1);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(go[0]);
    close(go[1]);
    close(ready[0]);
    close(ready[1]);
}

static void copy_segment(const char *from, const char *to, mode_t mode) {
    FILE *in = fopen(from, "rb");
    assert_non_null(in);
    char buf[GM__SHM_SIZE];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    unlink(to);
    int fd = open(to, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(fchmod(fd, mode), 0);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    close(fd);
}

static void copies_refused(void **state) {
    (void)state;
    char path[300], copy[320];
    gm_allocator *a = publish_one(path, sizeof path);
    /* a world-writable copy under a name of ours: not read */
    snprintf(copy, sizeof copy, "/dev/shm/%s0000000000000077", g_prefix);
    copy_segment(path, copy, 0666);
    gm__scan_result r;
    assert_int_equal(gm__shm_scan(&r, false), GM_OK);
    assert_int_equal(count_pid(&r, getpid()), 1);
    gm__scan_result_free(&r);
    unlink(copy);
    /* a 0600 copy under another name: nobody holds its lock, so it is a
     * dead publisher's, never read */
    copy_segment(path, copy, 0600);
    assert_int_equal(gm__shm_scan(&r, false), GM_OK);
    assert_int_equal(count_pid(&r, getpid()), 1);
    gm__scan_result_free(&r);
    unlink(copy);
    /* a symlink to our segment: not followed */
    assert_int_equal(symlink(path, copy), 0);
    assert_int_equal(gm__shm_scan(&r, false), GM_OK);
    assert_int_equal(count_pid(&r, getpid()), 1);
    gm__scan_result_free(&r);
    unlink(copy);
    gm_test_shm_allocator_free(a);
}

/* ---- issue 43, item 5: label values that are not UTF-8 -------------------- */

static bool valid_utf8(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = gm__utf8_len(p);
        if (!n) return false;
        p += n;
    }
    return true;
}

/* Run cmd with text on its stdin; its exit status (-1 when it cannot run). */
static int pipe_to(const char *cmd, const char *text) {
    FILE *f = popen(cmd, "w");
    if (!f) return -1;
    fputs(text, f);
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A run id of 100 'é' is cut on a character boundary when published (63
 * of them, 126 bytes, not 63 and a half); a label, command name and run id
 * holding invalid bytes (an older or foreign publisher's header) come out
 * of every format as valid UTF-8, U+FFFD in their place: promtool accepts
 * the scrape, python's json the smi/log JSON. */
static void labels_not_utf8(void **state) {
    (void)state;
    char run[201] = "";
    for (int i = 0; i < 100; i++) strcat(run, "\xc3\xa9");
    setenv("GPUMEM_RUN_ID", run, 1);
    gm__shm_header h;
    memset(&h, 0, sizeof h);
    gm__identity_fill(&h);
    unsetenv("GPUMEM_RUN_ID");
    assert_int_equal(strlen(h.run_id), 126);
    assert_true(valid_utf8(h.run_id));
    assert_int_equal(memcmp(h.run_id, run, 126), 0);

    gm__mon_dev dev = {.index = 0, .have_mem = true, .total = 1 << 30, .uuid = "GPU-\xff-uuid"};
    gm__mon_row row = {.pid = 42, .device = 0, .have_alloc = true, .source = GM__SRC_GPUMEM};
    gm__ident_unknown(&row.id);
    memset(row.id.run_id, 'r', sizeof row.id.run_id - 2);
    row.id.run_id[sizeof row.id.run_id - 2] = '\xc3'; /* cut in the middle of an 'é' */
    snprintf(row.id.hostname, sizeof row.id.hostname, "host\xed\xa0\x80"); /* a surrogate */
    snprintf(row.comm, sizeof row.comm, "py\xe2\x82");                    /* cut '€' */
    snprintf(row.label, sizeof row.label, "job \"q\"\\\n\x01\xff\xfe end");
    gm__mon_sample smp = {.time_ns = 1, .ndevices = 1, .devs = &dev, .nrows = 1, .rows = &row};
    gm__sbuf out[4] = {{0}};
    gm__format_prometheus(&smp, &out[0]);
    gm__format_json(&smp, &out[1], true);
    gm__format_csv(&smp, &out[2]);
    gm__format_table(&smp, &out[3]);
    for (int i = 0; i < 4; i++) {
        assert_false(out[i].oom);
        if (!valid_utf8(out[i].p)) fail_msg("format %d is not UTF-8:\n%s", i, out[i].p);
    }
    assert_non_null(strstr(out[0].p, "label=\"job \\\"q\\\"\\\\\\n\x01\xef\xbf\xbd\xef\xbf\xbd end\""));
    assert_non_null(strstr(out[0].p, "comm=\"py\xef\xbf\xbd\xef\xbf\xbd\""));
    assert_non_null(strstr(out[1].p, "\"label\":\"job \\\"q\\\"\\\\\\n\\u0001\xef\xbf\xbd\xef\xbf\xbd end\""));
    if (system("command -v promtool >/dev/null 2>&1") == 0)
        assert_int_equal(pipe_to("promtool check metrics >/dev/null", out[0].p), 0);
    if (system("command -v python3 >/dev/null 2>&1") == 0)
        assert_int_equal(pipe_to("python3 -c 'import json,sys; json.loads(sys.stdin.buffer.read().decode(\"utf-8\"))'",
                                 out[1].p), 0);
    for (int i = 0; i < 4; i++) gm__sbuf_free(&out[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(planted_fifo),
        cmocka_unit_test(shrinking_segment),
        cmocka_unit_test(truncation_never_kills_the_publisher),
        cmocka_unit_test(copies_refused),
        cmocka_unit_test(labels_not_utf8),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
