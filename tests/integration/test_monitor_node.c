/* test_monitor_node.c — the node agent (issue 45): a reader in node mode
 * (gm__shm_cache_all_users; `gpumem exporter --node`, `smi --all-users`)
 * sees every user's publisher, and trusts nothing a segment says before it
 * checks it. Crafted segments are planted in a folder of the test's own
 * (GPUMEM_SHM_DIR): another user's (owner, name, header and data agree),
 * and hostile ones — a link, a FIFO, a truncated or wrong-sized header, huge
 * counts, a user that disagrees, data that is a FIFO or an unsealed file, a
 * record whose seqlock never settles, a flood of names — each skipped with
 * its reason counted, never a crash or a hang. Step records (gm_step_mark)
 * are published and read back too. Runs as root for the other users'
 * segments (chown); those cases skip otherwise. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "internal.h"
#include "monitor/monitor.h"
#include "shm_test.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define OTHER_UID 4242u

static char g_dir[64];
static char g_any[80]; /* gpumem-<tag>. */

static int setup(void **state) {
    (void)state;
    gm_test_shm_tag("node");
    gm__shm_prefix_any(g_any, sizeof g_any);
    snprintf(g_dir, sizeof g_dir, "/tmp/gpumem-node-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    chmod(g_dir, 01777);
    setenv("GPUMEM_SHM_DIR", g_dir, 1);
    alarm(120); /* a blocked open would hang the test: fail it instead */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) return -1;
    unsetenv("GPUMEM_SHM_DIR");
    return 0;
}

/* A crafted publisher: a sealed memfd holding the header and records, a
 * beacon file with the same header, locked while `beacon` stays open. */
typedef struct crafted {
    char path[256];
    int beacon; /* holds the lock */
    int data;   /* the memfd */
    char *m;
    size_t size; /* of the mapping */
    gm__shm_header h;
} crafted;

static void make_data(crafted *c, size_t size) {
    c->data = memfd_create("crafted", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(c->data >= 0);
    assert_int_equal(ftruncate(c->data, (off_t)size), 0);
    assert_int_equal(fcntl(c->data, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    c->m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, c->data, 0);
    assert_true(c->m != MAP_FAILED);
    c->size = size;
}

/* A valid version-4 segment of `uid` with one device record in use. */
static void craft(crafted *c, uint32_t uid, const char *hex) {
    memset(c, 0, sizeof *c);
    make_data(c, GM__SHM_SIZE);
    gm__shm_header *h = &c->h;
    h->magic = GM__SHM_MAGIC;
    h->version = GM__SHM_VERSION;
    h->header_size = GM__SHM_HEADER_SIZE;
    h->segment_size = GM__SHM_SIZE;
    h->record_size = GM__SHM_RECORD_SIZE;
    h->ndevices = 1;
    h->pid = getpid();
    h->uid = uid;
    h->data_fd = c->data;
    h->nonce = 0x1234567890abcdefull;
    h->pidns_ino = gm__proc_pidns(0);
    h->source = GM__SRC_GPUMEM;
    snprintf(h->label, sizeof h->label, "crafted-%u", uid);
    snprintf(h->run_id, sizeof h->run_id, "job-%s", hex);
    h->rank = h->local_rank = h->world_size = -1;
    gm__shm_record *r = (gm__shm_record *)(c->m + GM__SHM_HEADER_SIZE);
    r->used = 1;
    r->v.allocated = 1000;
    r->v.reserved = 4096;
    snprintf(c->path, sizeof c->path, "%s/%s%u.%s", g_dir, g_any, uid, hex);
}

/* Write the beacon (mode 0600, owned by `owner`), lock it, and copy the
 * header into the data. */
static void plant(crafted *c, uint32_t owner) {
    memcpy(c->m, &c->h, sizeof c->h);
    unlink(c->path);
    c->beacon = open(c->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(c->beacon >= 0);
    assert_int_equal(fchmod(c->beacon, 0600), 0);
    assert_int_equal(pwrite(c->beacon, &c->h, sizeof c->h, 0), (ssize_t)sizeof c->h);
    assert_int_equal(flock(c->beacon, LOCK_EX | LOCK_NB), 0);
    if (owner != getuid()) {
        assert_int_equal(fchown(c->beacon, owner, (gid_t)-1), 0);
        assert_int_equal(fchown(c->data, owner, (gid_t)-1), 0);
    }
}

static void unplant(crafted *c) {
    unlink(c->path);
    if (c->beacon > 0) close(c->beacon);
    munmap(c->m, c->size);
    close(c->data);
}

static void do_scan(gm__scan_result *r, bool all) {
    gm__shm_cache *c = gm__shm_cache_create();
    gm__shm_cache_all_users(c, all);
    assert_int_equal(gm__shm_scan_cached(c, r, true), GM_OK);
    gm__shm_cache_destroy(c);
}

static const gm__mon_proc *find(const gm__scan_result *r, const char *label) {
    for (int i = 0; i < r->nprocs; i++)
        if (!strcmp(r->procs[i].label, label)) return &r->procs[i];
    return NULL;
}

static bool root(void) { return getuid() == 0; }

/* Another user's publisher: invisible to a reader of its own uid, seen in
 * node mode with its uid. */
static void node_sees_other_user(void **state) {
    (void)state;
    if (!root()) skip();
    crafted c;
    craft(&c, OTHER_UID, "00000000000000a1");
    plant(&c, OTHER_UID);
    gm__scan_result r;
    do_scan(&r, false);
    assert_null(find(&r, "crafted-4242"));
    gm__scan_result_free(&r);
    do_scan(&r, true);
    const gm__mon_proc *p = find(&r, "crafted-4242");
    assert_non_null(p);
    assert_int_equal(p->uid, OTHER_UID);
    assert_int_equal(p->pid, getpid());
    assert_true(p->used[0]);
    assert_int_equal(p->v[0].allocated, 1000);
    assert_string_equal(p->id.run_id, "job-00000000000000a1");
    assert_int_equal(r.skipped, 0);
    gm__scan_result_free(&r);
    /* unlocked (its publisher gone): counted stale, but a node agent
     * removes no other user's file */
    flock(c.beacon, LOCK_UN);
    do_scan(&r, true);
    assert_int_equal(r.cleaned, 1);
    assert_int_equal(access(c.path, F_OK), 0);
    gm__scan_result_free(&r);
    unplant(&c);
}

/* One hostile segment next to a good one: the good one is read, the
 * hostile one skipped for `reason` (by a reader of our own uid too, unless
 * the segment's name gives another user's: that reader never looks). */
static void expect_skip_as(int reason, bool own_too) {
    crafted good;
    craft(&good, (uint32_t)getuid(), "00000000000000f0");
    plant(&good, (uint32_t)getuid());
    gm__scan_result r;
    for (int all = own_too ? 0 : 1; all < 2; all++) {
        do_scan(&r, all);
        assert_non_null(find(&r, good.h.label));
        assert_int_equal(r.nprocs, 1);
        assert_int_equal(r.skipped, 1);
        if (r.skipped_by[reason] != 1) {
            for (int i = 0; i < GM__SKIP_COUNT; i++) print_error("skipped_by[%d] = %d\n", i, r.skipped_by[i]);
            fail_msg("expected reason %d", reason);
        }
        gm__scan_result_free(&r);
    }
    unplant(&good);
}

static void expect_skip(int reason) { expect_skip_as(reason, true); }

static void hostile_header(void **state) {
    (void)state;
    /* each mutation of an otherwise valid header of our own uid */
    for (int k = 0; k < 7; k++) {
        crafted c;
        craft(&c, (uint32_t)getuid(), "00000000000000b1");
        switch (k) {
        case 0: c.h.magic ^= 1; break;
        case 1: c.h.version = 99; break;
        case 2: c.h.ndevices = 1000000; break; /* huge counts */
        case 3: c.h.segment_size = (uint64_t)1 << 40; break;
        case 4: c.h.record_size = 64; break;
        case 5: c.h.pid = -5; break;
        case 6: c.h.version = GM__SHM_VERSION_V3; break; /* v3 with v4's size */
        }
        plant(&c, (uint32_t)getuid());
        expect_skip(GM__SKIP_HEADER);
        unplant(&c);
    }
}

static void hostile_files(void **state) {
    (void)state;
    char path[256];
    /* a link to a good beacon: never followed */
    crafted target;
    craft(&target, (uint32_t)getuid(), "00000000000000c0");
    snprintf(target.path, sizeof target.path, "%s/not-a-beacon", g_dir);
    plant(&target, (uint32_t)getuid());
    snprintf(path, sizeof path, "%s/%s%u.00000000000000c1", g_dir, g_any, (unsigned)getuid());
    assert_int_equal(symlink(target.path, path), 0);
    expect_skip(GM__SKIP_OPEN);
    unlink(path);
    unplant(&target);
    /* a FIFO: no blocking open */
    assert_int_equal(mkfifo(path, 0600), 0);
    expect_skip(GM__SKIP_TYPE);
    unlink(path);
    /* truncated: shorter than a header */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "GMEMSHM1", 8), 8);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    expect_skip(GM__SKIP_SHORT);
    /* mode 0644 */
    fchmod(fd, 0644);
    expect_skip(GM__SKIP_MODE);
    close(fd);
    unlink(path);
}

static void hostile_users(void **state) {
    (void)state;
    if (!root()) skip();
    crafted c;
    /* the name says 4242, the file is ours */
    craft(&c, OTHER_UID, "00000000000000d1");
    plant(&c, (uint32_t)getuid());
    expect_skip_as(GM__SKIP_OWNER, false);
    unplant(&c);
    /* name and owner 4242, the header says root */
    craft(&c, OTHER_UID, "00000000000000d2");
    c.h.uid = 0;
    plant(&c, OTHER_UID);
    expect_skip_as(GM__SKIP_OWNER, false);
    unplant(&c);
    /* the beacon is 4242's, its data root's */
    craft(&c, OTHER_UID, "00000000000000d3");
    plant(&c, OTHER_UID);
    assert_int_equal(fchown(c.data, 0, (gid_t)-1), 0);
    gm__scan_result r;
    do_scan(&r, true);
    assert_int_equal(r.nprocs, 0);
    assert_int_equal(r.skipped_by[GM__SKIP_DATA], 1);
    gm__scan_result_free(&r);
    unplant(&c);
}

/* The data descriptor a header names is a FIFO, or a plain file without
 * seals: skipped, and opening it blocks nothing. */
static void hostile_data(void **state) {
    (void)state;
    char fifo[256];
    snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    int ff = open(fifo, O_RDWR | O_NONBLOCK); /* held open: /proc/self/fd/N leads to it */
    assert_true(ff >= 0);
    crafted c;
    craft(&c, (uint32_t)getuid(), "00000000000000e1");
    c.h.data_fd = ff;
    plant(&c, (uint32_t)getuid());
    expect_skip(GM__SKIP_DATA);
    unplant(&c);
    close(ff);
    unlink(fifo);
    /* an unsealed regular file of the right size */
    char plain[256];
    snprintf(plain, sizeof plain, "%s/plain", g_dir);
    int pf = open(plain, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(pf >= 0);
    assert_int_equal(ftruncate(pf, GM__SHM_SIZE), 0);
    craft(&c, (uint32_t)getuid(), "00000000000000e2");
    assert_int_equal(pwrite(pf, &c.h, sizeof c.h, 0), (ssize_t)sizeof c.h);
    c.h.data_fd = pf;
    plant(&c, (uint32_t)getuid());
    expect_skip(GM__SKIP_DATA);
    unplant(&c);
    close(pf);
    unlink(plain);
}

/* A record whose seqlock stays odd (a writer stopped inside, or garbage):
 * reported torn, read in bounded time; a version-3 segment is read, with no
 * step records. */
static void torn_and_v3(void **state) {
    (void)state;
    crafted c;
    craft(&c, (uint32_t)getuid(), "00000000000000f1");
    ((gm__shm_record *)(c.m + GM__SHM_HEADER_SIZE))->seq = 7;
    plant(&c, (uint32_t)getuid());
    gm__scan_result r;
    do_scan(&r, true);
    assert_int_equal(r.nprocs, 1);
    assert_true(r.procs[0].torn[0]);
    gm__scan_result_free(&r);
    unplant(&c);
    memset(&c, 0, sizeof c);
    craft(&c, (uint32_t)getuid(), "00000000000000f2");
    munmap(c.m, c.size);
    close(c.data);
    make_data(&c, GM__SHM_SIZE_V3);
    c.h.version = GM__SHM_VERSION_V3;
    c.h.segment_size = GM__SHM_SIZE_V3;
    c.h.data_fd = c.data;
    gm__shm_record *rec = (gm__shm_record *)(c.m + GM__SHM_HEADER_SIZE);
    rec->used = 1;
    rec->v.allocated = 77;
    plant(&c, (uint32_t)getuid());
    do_scan(&r, false);
    assert_int_equal(r.nprocs, 1);
    assert_int_equal(r.procs[0].v[0].allocated, 77);
    assert_false(r.procs[0].have_step[0]);
    gm__scan_result_free(&r);
    unplant(&c);
}

/* A flood of names: at most GM__SHM_SCAN_MAX are opened per scan. */
static void name_flood(void **state) {
    (void)state;
    if (!root()) skip(); /* files owned by us under another uid's names: OWNER, never unlinked */
    int n = GM__SHM_SCAN_MAX + 5;
    char path[256];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s%u.%016x", g_dir, g_any, OTHER_UID, 0x10000000 | i);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        close(fd);
    }
    gm__scan_result r;
    do_scan(&r, true);
    assert_int_equal(r.skipped, n);
    assert_int_equal(r.skipped_by[GM__SKIP_LIMIT], 5);
    assert_int_equal(r.skipped_by[GM__SKIP_OWNER], GM__SHM_SCAN_MAX);
    gm__scan_result_free(&r);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s%u.%016x", g_dir, g_any, OTHER_UID, 0x10000000 | i);
        unlink(path);
    }
}

/* gm_step_mark publishes the step record: the step count, the baseline at
 * the step's start, the step's peak, and (first mark, then at most once a
 * second) the largest free block and live bytes by category. */
static void step_records(void **state) {
    (void)state;
    gm_sim_options o;
    gm_sim_options_init(&o);
    o.device_count = 1;
    gm_backend *be = NULL;
    gm_allocator *a = NULL;
    assert_int_equal(gm_sim_create(&be, &o), GM_OK);
    assert_int_equal(gm_allocator_create(&a, be, NULL), GM_OK);
    assert_int_equal(gm_allocator_publish(a, "stepper"), GM_OK);
    gm_devptr keep, tmp, leak;
    assert_int_equal(gm_malloc(a, 0, 8 << 20, 0, &keep), GM_OK);
    assert_int_equal(gm_block_set_category(a, keep, GM_CAT_PARAMETERS), GM_OK);
    assert_int_equal(gm_malloc(a, 0, 32 << 20, 0, &tmp), GM_OK); /* the step's activations */
    assert_int_equal(gm_free(a, tmp), GM_OK);
    assert_int_equal(gm_step_mark(a, -1), GM_OK);
    gm__scan_result r;
    do_scan(&r, false);
    const gm__mon_proc *p = find(&r, "stepper");
    assert_non_null(p);
    assert_true(p->have_step[0]);
    const gm__shm_step_values *t = &p->step[0];
    assert_int_equal(t->step, 1);
    assert_int_equal(t->start_allocated, 8 << 20);
    assert_int_equal(t->peak_allocated, 40 << 20);
    assert_true(t->start_reserved >= 40 << 20);
    assert_int_equal(t->walk_step, 1);
    assert_true(t->largest_free_block >= 32 << 20);
    assert_int_equal(t->category[GM_CAT_PARAMETERS], 8 << 20);
    assert_int_equal(t->untagged, 0);
    assert_true(t->mark_ns > 0);
    gm__scan_result_free(&r);
    /* a step that keeps 1 MiB more: the baseline grows (a leak); its peak
     * was lower; the walk waits for the next second */
    assert_int_equal(gm_malloc(a, 0, 1 << 20, 0, &leak), GM_OK);
    assert_int_equal(gm_step_mark(a, 0), GM_OK);
    do_scan(&r, false);
    p = find(&r, "stepper");
    t = &p->step[0];
    assert_int_equal(t->step, 2);
    assert_int_equal(t->start_allocated, 9 << 20);
    assert_int_equal(t->peak_allocated, 9 << 20);
    assert_int_equal(t->walk_step, 1);
    gm__scan_result_free(&r);
    gm_free(a, leak);
    gm_free(a, keep);
    gm_allocator_destroy(a);
    gm_backend_destroy(be);
}

/* torch's own allocator's steps (gpumem run --native): the record without a
 * walk; bad arguments are refused with a reason and change nothing. */
static void native_steps(void **state) {
    (void)state;
    gm_native_publisher *np;
    assert_int_equal(gm_native_publisher_open("native", &np), GM_OK);
    assert_int_equal(gm_native_publisher_step(NULL, 0, 1, 1, -1), GM_EINVAL);
    assert_int_equal(gm_native_publisher_step(np, GM__SHM_DEVICES, 1, 1, -1), GM_EINVAL);
    assert_int_equal(gm_native_publisher_step(np, 0, -1, 1, -1), GM_EINVAL);
    assert_non_null(strstr(gm_last_error_detail(), "gm_native_publisher_step"));
    gm__scan_result r;
    do_scan(&r, false);
    assert_false(find(&r, "native")->have_step[0]);
    gm__scan_result_free(&r);
    assert_int_equal(gm_native_publisher_step(np, 0, 5 << 20, 8 << 20, -1), GM_OK);
    do_scan(&r, false);
    const gm__mon_proc *p = find(&r, "native");
    assert_true(p->have_step[0]);
    assert_int_equal(p->step[0].step, 1);
    assert_int_equal(p->step[0].start_allocated, 5 << 20);
    assert_int_equal(p->step[0].peak_allocated, -1);
    assert_int_equal(p->step[0].walk_step, -1);
    gm__scan_result_free(&r);
    gm_native_publisher_close(np);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(node_sees_other_user), cmocka_unit_test(hostile_header), cmocka_unit_test(hostile_files),
        cmocka_unit_test(hostile_users),        cmocka_unit_test(hostile_data),   cmocka_unit_test(torn_and_v3),
        cmocka_unit_test(name_flood),           cmocka_unit_test(step_records),   cmocka_unit_test(native_steps),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
