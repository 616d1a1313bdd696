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
#include "report/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
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

/* fragment() on a new 1 GiB device (torch policy), then a 300 MiB request
 * that runs out of memory. */
static void fragmented_oom(gm_backend **b, gm_allocator **a, gm_devptr *y, gm_devptr *z) {
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 1 * GIB, false, b, a), GM_OK);
    fragment(*a, y, z);
    gm_devptr p;
    assert_int_equal(gm_malloc(*a, 0, 300 * MIB, 0, &p), GM_ENOMEM);
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
    gm_devptr y, z;
    fragmented_oom(&b, &a, &y, &z);
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", gm_last_error_detail());
    char path[512], note[512];
    assert_int_equal(gm__oom_report_write(a, 0, 300 * MIB, sub, detail, gm__history_snapshot_bytes, path, sizeof path,
                                          note, sizeof note),
                     GM_OK);
    assert_string_equal(note, "");
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

/* ---- issue 43, items 1 and 2: what others can plant in DIR ----------------
 * Each case runs one OOM through gm__oom_report_from_env (what
 * libgpumem_torch calls) with GPUMEM_OOM_REPORT=dir, stderr captured, under
 * alarm(): a hang is a failure (SIGALRM ends the program), not a stalled run. */

/* One OOM on a fragmented 1 GiB device, reported into dir; stderr in err. */
static void oom_into(const char *dir, char *err, size_t len) {
    setenv("GPUMEM_OOM_REPORT", dir, 1);
    gm_history_enable(4096);
    gm_backend *b;
    gm_allocator *a;
    gm_devptr y, z;
    fragmented_oom(&b, &a, &y, &z);
    char tmpl[] = "/tmp/gm-oom-err-XXXXXX";
    int fd = mkstemp(tmpl), saved = dup(2);
    assert_true(fd >= 0 && saved >= 0);
    fflush(stderr);
    dup2(fd, 2);
    alarm(20);
    gm__oom_report_from_env(a, 0, 300 * MIB, "detail", gm__history_snapshot_bytes);
    alarm(0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, err, len - 1, 0);
    err[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(tmpl);
    gm_free(a, y);
    gm_free(a, z);
    gm_test_destroy(b, a);
    gm_history_enable(0);
    unsetenv("GPUMEM_OOM_REPORT");
}

/* The names the report used before issue 43 (pid and sequence number), for
 * every sequence number a process may use. */
static void plant_old_names(const char *dir, int kind) {
    for (int n = 0; n <= 16; n++)
        for (int ext = 0; ext < 2; ext++) {
            char path[256];
            snprintf(path, sizeof path, "%s/gpumem-oom-%d-%d.%s", dir, (int)getpid(), n, ext ? "pickle" : "txt");
            if (kind == S_IFIFO) {
                assert_int_equal(mkfifo(path, 0666), 0);
            } else if (kind == S_IFLNK) { /* to where the report must not go */
                assert_int_equal(symlink("/tmp/gm-oom-link-target-never-written", path), 0);
            } else {
                FILE *f = fopen(path, "w");
                assert_non_null(f);
                fputs("someone else's\n", f);
                fclose(f);
            }
        }
}

/* Every entry of dir: old names keep what was planted (kind), new ones are
 * a regular report and snapshot of this process; removes them all. */
static int check_and_clean(const char *dir, int kind) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int reports = 0;
    struct dirent *e;
    char prefix[64];
    int pl = snprintf(prefix, sizeof prefix, "gpumem-oom-%d-", (int)getpid());
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        assert_int_equal(lstat(path, &st), 0);
        assert_int_equal(strncmp(e->d_name, prefix, (size_t)pl), 0);
        const char *rest = e->d_name + pl, *dash = strchr(rest, '-');
        if (!dash) { /* an old name: untouched */
            assert_int_equal(st.st_mode & S_IFMT, kind);
            if (kind == S_IFREG) assert_int_equal(st.st_size, strlen("someone else's\n"));
        } else { /* <n>-<16 hex digits>.txt|.pickle, a new regular file */
            assert_int_equal(st.st_mode & S_IFMT, S_IFREG);
            assert_true(st.st_size > 0);
            assert_int_equal(strspn(dash + 1, "0123456789abcdef"), 16);
            reports += !strcmp(dash + 17, ".txt");
        }
        unlink(path);
    }
    closedir(d);
    return reports;
}

/* Plant kind at every old name, run an OOM into the directory: the report
 * goes to a new name, the planted entries are left as they were. */
static void planted(int kind) {
    char dir[] = "/tmp/gm-oom-XXXXXX", err[4096];
    assert_non_null(mkdtemp(dir));
    plant_old_names(dir, kind);
    oom_into(dir, err, sizeof err);
    assert_non_null(strstr(err, "out-of-memory report written to"));
    assert_int_equal(check_and_clean(dir, kind), 1);
    rmdir(dir);
}

/* A FIFO at the old predictable names: the OOM used to block in open()
 * (killed after 20 s); now the report goes to a name nobody can plant. */
static void planted_fifo(void **state) {
    (void)state;
    planted(S_IFIFO);
}

/* A regular file at the old names (another container's report, pid 1 too)
 * is never replaced. */
static void existing_files_kept(void **state) {
    (void)state;
    planted(S_IFREG);
}

/* A symbolic link at the old names is neither followed nor replaced. */
static void planted_links(void **state) {
    (void)state;
    planted(S_IFLNK);
    assert_int_equal(access("/tmp/gm-oom-link-target-never-written", F_OK), -1);
}

/* A DIR that cannot take the report (gone, a 4k path): one line on stderr
 * says what was not written and why; the OOM still came back (oom_into). */
static void unwritable_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/gm-oom-XXXXXX", err[8192];
    assert_non_null(mkdtemp(dir));
    rmdir(dir);
    oom_into(dir, err, sizeof err);
    assert_non_null(strstr(err, "gpumem: out-of-memory report not written: "));
    assert_non_null(strstr(err, "No such file or directory"));
    assert_ptr_equal(strchr(err, '\n'), err + strlen(err) - 1); /* one line */
    char *longdir = malloc(4200);
    assert_non_null(longdir);
    memset(longdir, 'd', 4199);
    longdir[0] = '/';
    longdir[4199] = '\0';
    oom_into(longdir, err, sizeof err);
    assert_non_null(strstr(err, "out-of-memory report not written"));
    assert_non_null(strstr(err, "File name too long"));
    assert_ptr_equal(strchr(err, '\n'), err + strlen(err) - 1);
    free(longdir);
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
        cmocka_unit_test(planted_fifo),  cmocka_unit_test(existing_files_kept), cmocka_unit_test(unwritable_dir),
        cmocka_unit_test(planted_links),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
