/* test_monitor_hostile.c — monitors never trust a segment they did not
 * verify (issue 15, defects 5 and 6): a FIFO planted under a segment name
 * must not block discovery, a segment truncated under a reader must not
 * kill it (SIGBUS), and a 0666 copy or a copy under another pid's name must
 * not be read (it would show the process twice). */
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
    /* its name: the first publisher of a process is <prefix><pid>, later ones .<n> */
    gm__scan_result r;
    assert_int_equal(gm__shm_scan(&r, false), GM_OK);
    const char *name = NULL;
    for (int i = 0; i < r.nprocs; i++)
        if (r.procs[i].pid == getpid()) name = r.procs[i].shm_name;
    assert_non_null(name);
    snprintf(path, len, "/dev/shm/%s", name);
    gm__scan_result_free(&r);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return a;
}

static void planted_fifo(void **state) {
    (void)state;
    char path[300];
    /* pid 1 always exists: the FIFO is not cleaned as a dead producer's */
    snprintf(path, sizeof path, "/dev/shm/%s1", g_prefix);
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

static void shrinking_segment(void **state) {
    (void)state;
    char path[300];
    gm_allocator *a = publish_one(path, sizeof path);
    gm__shm_cache *c = gm__shm_cache_create();
    gm__scan_result r;
    assert_int_equal(gm__shm_scan_cached(c, &r, false), GM_OK); /* cached: kept open */
    assert_int_equal(count_pid(&r, getpid()), 1);
    gm__scan_result_free(&r);
    /* truncate it under the cached reader: a mapped reader dies of SIGBUS */
    for (off_t size = GM__SHM_HEADER_SIZE + 64; size >= 0; size -= GM__SHM_HEADER_SIZE / 2 + 32) {
        assert_int_equal(truncate(path, size), 0);
        assert_int_equal(gm__shm_scan_cached(c, &r, false), GM_OK);
        assert_int_equal(count_pid(&r, getpid()), 0);
        gm__scan_result_free(&r);
    }
    gm__shm_cache_destroy(c);
    gm_test_shm_allocator_free(a);
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
    /* a world-writable copy under a name of ours (.7): not read */
    snprintf(copy, sizeof copy, "/dev/shm/%s%d.77", g_prefix, (int)getpid());
    copy_segment(path, copy, 0666);
    gm__scan_result r;
    assert_int_equal(gm__shm_scan(&r, false), GM_OK);
    assert_int_equal(count_pid(&r, getpid()), 1);
    gm__scan_result_free(&r);
    unlink(copy);
    /* a 0600 copy under another live pid's name (1): the header names us */
    snprintf(copy, sizeof copy, "/dev/shm/%s1", g_prefix);
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
        cmocka_unit_test(copies_refused),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
