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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(planted_fifo),
        cmocka_unit_test(shrinking_segment),
        cmocka_unit_test(truncation_never_kills_the_publisher),
        cmocka_unit_test(copies_refused),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
