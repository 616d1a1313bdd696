/* test_monitor_shm.c — shared-memory publication: what a producer publishes
 * is what discovery reads, permissions are owner-only, torn records are
 * retried or reported, dead producers' segments are cleaned. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "internal.h"
#include "monitor/monitor.h"
#include "shm_test.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void stats_with(gm_stats *s, int64_t allocated, int64_t reserved) {
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    s->allocated_bytes[GM_POOL_ALL].current = allocated;
    s->allocated_bytes[GM_POOL_ALL].peak = allocated * 2;
    s->reserved_bytes[GM_POOL_ALL].current = reserved;
    s->reserved_bytes[GM_POOL_ALL].peak = reserved * 2;
    s->requested_bytes[GM_POOL_ALL].current = allocated - 1;
    s->active_bytes[GM_POOL_ALL].current = allocated;
    s->num_ooms = 3;
    s->num_alloc_retries = 5;
    s->allocation[GM_POOL_ALL].allocated = 7;
    s->allocation[GM_POOL_ALL].freed = 6;
}

static const gm__mon_proc *find_pid(const gm__scan_result *r, int pid) {
    for (int i = 0; i < r->nprocs; i++)
        if (r->procs[i].pid == pid) return &r->procs[i];
    return NULL;
}

static int setup(void **state) {
    gm_test_shm_tag("test");
    return 0;
}

static void publish_and_read(void **state) {
    gm_allocator *a = gm_test_shm_allocator(2);
    assert_int_equal(gm_allocator_publish(a, "my \"job\""), GM_OK);
    gm_stats s;
    stats_with(&s, 1000, 4096);
    gm__publisher_update(gm__allocator_publisher(a), 1, &s);

    gm__scan_result r;
    assert_int_equal(gm__shm_scan(&r, true), GM_OK);
    const gm__mon_proc *p = find_pid(&r, getpid());
    assert_non_null(p);
    assert_string_equal(p->label, "my \"job\"");
    assert_int_equal(p->source, GM__SRC_GPUMEM);
    assert_false(p->used[0]);
    assert_true(p->used[1]);
    assert_false(p->torn[1]);
    assert_int_equal(p->v[1].allocated, 1000);
    assert_int_equal(p->v[1].reserved, 4096);
    assert_int_equal(p->v[1].peak_reserved, 8192);
    assert_int_equal(p->v[1].requested, 999);
    assert_int_equal(p->v[1].num_ooms, 3);
    assert_int_equal(p->v[1].num_alloc_retries, 5);
    assert_int_equal(p->v[1].num_allocs, 7);
    assert_int_equal(p->v[1].num_frees, 6);
    assert_int_equal(p->v[1].peak_allocated, 2000);
    assert_int_equal(p->v[1].peak_requested, 0);
    assert_true(p->v[1].update_ns > 0);

    /* owner-only, whatever the umask */
    char path[300];
    snprintf(path, sizeof path, "/dev/shm/%s", p->shm_name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    gm__scan_result_free(&r);

    gm_test_shm_allocator_free(a);
    assert_int_not_equal(stat(path, &st), 0); /* unpublish removes it */
    assert_int_equal(gm__shm_scan(&r, true), GM_OK);
    assert_null(find_pid(&r, getpid()));
    gm__scan_result_free(&r);
}

static void publish_null_is_error(void **state) {
    assert_int_equal(gm_allocator_publish(NULL, "x"), GM_EINVAL);
    gm__publisher_update(NULL, 0, NULL); /* no publisher: no-op */
}

/* A producer killed without unpublishing leaves a segment; the next scan
 * must not report its numbers and must remove it. */
static void dead_producer_is_cleaned(void **state) {
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        gm_allocator *a = gm_test_shm_allocator(2);
        if (gm_allocator_publish(a, "doomed") != GM_OK) _exit(1);
        gm_stats s;
        stats_with(&s, 123, 456);
        gm__publisher_update(gm__allocator_publisher(a), 0, &s);
        raise(SIGKILL);
        _exit(2);
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status));
    char path[400];
    assert_int_equal(gm_test_shm_path((int)child, path, sizeof path), 1);
    struct stat st;
    assert_int_equal(stat(path, &st), 0); /* left behind */

    gm__scan_result r;
    assert_int_equal(gm__shm_scan(&r, true), GM_OK);
    assert_null(find_pid(&r, child));
    assert_int_equal(r.cleaned, 1);
    gm__scan_result_free(&r);
    assert_int_not_equal(stat(path, &st), 0);
}

/* Issue 26, defect 4: a live publisher whose pid means nothing here (it
 * runs in another PID namespace, a sibling container's) is reported as
 * unreachable and never unlinked, whatever process has that pid here. The
 * beacon is edited to name a namespace no process here is in. */
static void foreign_namespace_never_unlinked(void **state) {
    gm_allocator *a = gm_test_shm_allocator(2);
    assert_int_equal(gm_allocator_publish(a, NULL), GM_OK);
    gm_stats s;
    stats_with(&s, 1, 2);
    gm__publisher_update(gm__allocator_publisher(a), 0, &s);
    char path[400];
    assert_int_equal(gm_test_shm_path(getpid(), path, sizeof path), 1);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint64_t ns, bogus = 1; /* no namespace has inode 1 */
    int32_t pid, one = 1;  /* pid 1 lives here, and is not the publisher */
    off_t ns_off = offsetof(gm__shm_header, pidns_ino), pid_off = offsetof(gm__shm_header, pid);
    assert_int_equal(pread(fd, &ns, sizeof ns, ns_off), sizeof ns);
    assert_int_equal(pread(fd, &pid, sizeof pid, pid_off), sizeof pid);
    assert_int_equal(pwrite(fd, &bogus, sizeof bogus, ns_off), sizeof bogus);
    assert_int_equal(pwrite(fd, &one, sizeof one, pid_off), sizeof one);
    gm__scan_result r;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(gm__shm_scan(&r, true), GM_OK);
        assert_null(find_pid(&r, getpid()));
        assert_null(find_pid(&r, 1));
        assert_int_equal(r.cleaned, 0);
        assert_int_equal(r.unreachable, 1);
        gm__scan_result_free(&r);
        struct stat st;
        assert_int_equal(stat(path, &st), 0); /* still there */
    }
    assert_int_equal(pwrite(fd, &ns, sizeof ns, ns_off), sizeof ns);
    assert_int_equal(pwrite(fd, &pid, sizeof pid, pid_off), sizeof pid);
    close(fd);
    assert_int_equal(gm__shm_scan(&r, false), GM_OK);
    assert_non_null(find_pid(&r, getpid()));
    gm__scan_result_free(&r);
    gm_test_shm_allocator_free(a);
}

/* Issue 26, defect 5: names are random, so a name planted in advance (the
 * old scheme's <prefix><pid>, by another user or anyone) blocks nothing; two
 * publishers of one process get two segments. */
static void planted_names_block_nothing(void **state) {
    char prefix[80], planted[300];
    gm__shm_prefix(prefix, sizeof prefix);
    snprintf(planted, sizeof planted, GM__SHM_DIR "/%s%d", prefix, (int)getpid());
    int fd = open(planted, O_CREAT | O_EXCL | O_WRONLY, 0644);
    assert_true(fd >= 0);
    close(fd);
    gm_allocator *a = gm_test_shm_allocator(1), *b = gm_test_shm_allocator(1);
    assert_int_equal(gm_allocator_publish(a, "one"), GM_OK);
    assert_int_equal(gm_allocator_publish(b, "two"), GM_OK);
    char path[400];
    assert_int_equal(gm_test_shm_path(getpid(), path, sizeof path), 2);
    gm_test_shm_allocator_free(a);
    gm_test_shm_allocator_free(b);
    unlink(planted);
}

/* Readers racing a writer never see a mix of two updates. */
struct race {
    gm__publisher *p;
    atomic_int stop; /* set by the test thread, read by the writer */
};
static void *writer(void *arg) {
    struct race *r = arg;
    gm_stats s;
    for (int64_t i = 1; !atomic_load_explicit(&r->stop, memory_order_relaxed); i++) {
        stats_with(&s, i, 3 * i);
        gm__publisher_update(r->p, 0, &s);
    }
    return NULL;
}

/* A writer stopped inside its update leaves an odd sequence: the reader
 * gives up after its retries and reports the record torn, not numbers. */
/* Publish a's stats (allocated 10, reserved 20 on device 0); its record. */
static gm__shm_record *published_record(gm_allocator *a) {
    assert_int_equal(gm_allocator_publish(a, NULL), GM_OK);
    gm_stats s;
    stats_with(&s, 10, 20);
    gm__publisher_update(gm__allocator_publisher(a), 0, &s);
    gm__shm_header *h = gm__publisher_header(gm__allocator_publisher(a));
    return (gm__shm_record *)((char *)h + GM__SHM_HEADER_SIZE);
}

static void torn_record_is_reported(void **state) {
    gm_allocator *a = gm_test_shm_allocator(2);
    gm__shm_record *rec = published_record(a);
    gm__shm_values v;
    assert_int_equal(gm__shm_read_record(rec, &v, 3), GM_OK);
    assert_int_equal(v.reserved, 20);
    rec->seq++; /* writer "inside" */
    assert_int_equal(gm__shm_read_record(rec, &v, 3), GM_ESTATE);
    gm__scan_result r;
    assert_int_equal(gm__shm_scan(&r, true), GM_OK);
    const gm__mon_proc *p = find_pid(&r, getpid());
    assert_non_null(p);
    assert_true(p->used[0]);
    assert_true(p->torn[0]);
    gm__scan_result_free(&r);
    rec->seq++;
    gm_test_shm_allocator_free(a);
}

/* Issue 26, defect 12: a record that keeps changing through every retry
 * (here: a writer stopped inside its update) reads as its last good copy,
 * marked held, never as a blank; and under a writer updating as fast as it
 * can, a sampling reader gets every sample (2.6% came back blank before). */
static void held_under_load(void **state) {
    gm_allocator *a = gm_test_shm_allocator(2);
    assert_int_equal(gm_allocator_publish(a, NULL), GM_OK);
    gm_stats s;
    stats_with(&s, 10, 30);
    gm__publisher_update(gm__allocator_publisher(a), 0, &s);
    gm__shm_header *h = gm__publisher_header(gm__allocator_publisher(a));
    gm__shm_record *rec = (gm__shm_record *)((char *)h + GM__SHM_HEADER_SIZE);
    gm__shm_cache *c = gm__shm_cache_create();
    gm__scan_result r;
    assert_int_equal(gm__shm_scan_cached(c, &r, false), GM_OK);
    const gm__mon_proc *p = find_pid(&r, getpid());
    assert_non_null(p);
    assert_false(p->held[0]);
    assert_int_equal(p->v[0].reserved, 30);
    gm__scan_result_free(&r);
    rec->seq++; /* writer "inside" for good */
    assert_int_equal(gm__shm_scan_cached(c, &r, false), GM_OK);
    p = find_pid(&r, getpid());
    assert_non_null(p);
    assert_false(p->torn[0]);
    assert_true(p->held[0]);
    assert_int_equal(p->v[0].reserved, 30);
    gm__scan_result_free(&r);
    rec->seq++;

    struct race race = {.p = gm__allocator_publisher(a)};
    pthread_t t;
    pthread_create(&t, NULL, writer, &race);
    int blank = 0;
    for (int i = 0; i < 2000; i++) {
        assert_int_equal(gm__shm_scan_cached(c, &r, false), GM_OK);
        p = find_pid(&r, getpid());
        assert_non_null(p);
        blank += p->torn[0];
        assert_int_equal(p->v[0].reserved, 3 * p->v[0].allocated);
        gm__scan_result_free(&r);
    }
    atomic_store(&race.stop, 1);
    pthread_join(t, NULL);
    assert_int_equal(blank, 0);
    gm__shm_cache_destroy(c);
    gm_test_shm_allocator_free(a);
}

static void seqlock_never_torn(void **state) {
    gm_allocator *a = gm_test_shm_allocator(2);
    assert_int_equal(gm_allocator_publish(a, NULL), GM_OK);
    gm__shm_header *h = gm__publisher_header(gm__allocator_publisher(a));
    gm__shm_record *rec = (gm__shm_record *)((char *)h + GM__SHM_HEADER_SIZE);
    struct race race = {.p = gm__allocator_publisher(a)};
    pthread_t t;
    pthread_create(&t, NULL, writer, &race);
    int ok = 0;
    for (int i = 0; i < 20000; i++) {
        gm__shm_values v;
        if (gm__shm_read_record(rec, &v, 1000000) != GM_OK) continue;
        assert_int_equal(v.reserved, 3 * v.allocated);
        assert_int_equal(v.peak_allocated, 2 * v.allocated);
        assert_int_equal(v.requested, v.allocated - (v.allocated ? 1 : 0));
        ok++;
    }
    atomic_store(&race.stop, 1);
    pthread_join(t, NULL);
    assert_true(ok > 0);
    gm_test_shm_allocator_free(a);
}

/* Every update publishes exact values; only the clock is coarse: it is
 * stamped on the first publication and then every GM__SHM_TIME_EVERY. */
static void values_exact_clock_every_n(void **state) {
    gm_allocator *a = gm_test_shm_allocator(2);
    assert_int_equal(gm_allocator_publish(a, NULL), GM_OK);
    gm__shm_header *h = gm__publisher_header(gm__allocator_publisher(a));
    gm__shm_record *rec = (gm__shm_record *)((char *)h + GM__SHM_HEADER_SIZE);
    gm_stats s;
    stats_with(&s, 1, 1);
    gm__publisher_update(gm__allocator_publisher(a), 0, &s);
    assert_int_equal(rec->used, 1);
    assert_true(rec->v.update_ns > 1);
    rec->v.update_ns = 1; /* a marker the writer overwrites only when it stamps */
    for (int i = 2; i <= GM__SHM_TIME_EVERY; i++) {
        stats_with(&s, i, 5 * i);
        s.num_ooms = i;
        gm__publisher_update(gm__allocator_publisher(a), 0, &s);
        gm__shm_values v;
        assert_int_equal(gm__shm_read_record(rec, &v, 3), GM_OK);
        assert_int_equal(v.allocated, i);
        assert_int_equal(v.peak_allocated, 2 * i);
        assert_int_equal(v.reserved, 5 * i);
        assert_int_equal(v.peak_reserved, 10 * i);
        assert_int_equal(v.requested, i - 1);
        assert_int_equal(v.active, i);
        assert_int_equal(v.num_ooms, i);
        assert_int_equal(v.num_alloc_retries, 5);
        assert_int_equal(v.update_ns, 1);
    }
    assert_int_equal(rec->seq, 2 * GM__SHM_TIME_EVERY);
    gm__publisher_update(gm__allocator_publisher(a), 0, &s);
    assert_true(rec->v.update_ns > 1);
    assert_int_equal(rec->seq % 2, 0);
    gm_test_shm_allocator_free(a);
}

/* Issue 27: rank, local rank, world size and run id from torchrun's
 * variables (SLURM's as the fallback), read back by discovery. */
static void identity_published(void **state) {
    setenv("RANK", "3", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("TORCHELASTIC_RUN_ID", "job-42", 1);
    unsetenv("GPUMEM_RUN_ID");
    gm_allocator *a = gm_test_shm_allocator(1);
    assert_int_equal(gm_allocator_publish(a, NULL), GM_OK);
    unsetenv("RANK");
    setenv("SLURM_PROCID", "5", 1);
    setenv("LOCAL_RANK", "not-a-number", 1);
    unsetenv("TORCHELASTIC_RUN_ID");
    setenv("SLURM_JOB_ID", "777", 1);
    gm_allocator *b = gm_test_shm_allocator(1);
    assert_int_equal(gm_allocator_publish(b, NULL), GM_OK);
    gm_stats s;
    stats_with(&s, 1, 2);
    gm__publisher_update(gm__allocator_publisher(a), 0, &s);
    gm__publisher_update(gm__allocator_publisher(b), 0, &s);
    gm__scan_result r;
    assert_int_equal(gm__shm_scan(&r, false), GM_OK);
    int seen = 0;
    for (int i = 0; i < r.nprocs; i++) {
        const gm__mon_ident *id = &r.procs[i].id;
        if (r.procs[i].pid != getpid()) continue;
        assert_int_equal(r.procs[i].ns_pid, getpid());
        assert_int_equal(id->world_size, 8);
        if (!strcmp(id->run_id, "job-42")) {
            assert_int_equal(id->rank, 3);
            assert_int_equal(id->local_rank, 1);
            seen |= 1;
        } else {
            assert_string_equal(id->run_id, "777");
            assert_int_equal(id->rank, 5);
            assert_int_equal(id->local_rank, -1); /* not a number: unknown, not a guess */
            seen |= 2;
        }
    }
    assert_int_equal(seen, 3);
    gm__scan_result_free(&r);
    for (const char *const *v = (const char *const[]){"SLURM_PROCID", "LOCAL_RANK", "WORLD_SIZE", "SLURM_JOB_ID", NULL};
         *v; v++)
        unsetenv(*v);
    gm_test_shm_allocator_free(a);
    gm_test_shm_allocator_free(b);
}

static void env_publish(void **state) {
    gm_allocator *a = gm_test_shm_allocator(2);
    unsetenv("GPUMEM_PUBLISH");
    assert_int_equal(gm__publish_from_env(a), GM_OK);
    assert_null(gm__allocator_publisher(a));
    setenv("GPUMEM_PUBLISH", "1", 1);
    setenv("GPUMEM_PUBLISH_LABEL", "from-env", 1);
    assert_int_equal(gm__publish_from_env(a), GM_OK);
    assert_non_null(gm__allocator_publisher(a));
    gm__shm_header *h = gm__publisher_header(gm__allocator_publisher(a));
    assert_string_equal(h->label, "from-env");
    unsetenv("GPUMEM_PUBLISH");
    gm_test_shm_allocator_free(a);
}

/* #26 defect 7: gm_allocator_publish stores the allocator's sink while other
 * threads allocate, and every malloc/free reads it. Both sides must be
 * atomic, or TSan (.ci/run runs this file under it) reports a data race.
 * Here: two threads allocate and free on two devices (the second made
 * lazily, so a device's total is published while the sink changes) while
 * this thread publishes and unpublishes. Whatever the interleaving, every
 * operation succeeds and a final publication shows the final stats. */
struct churn {
    gm_allocator *a;
    int device;
    int fails;
};
static void *churn_thread(void *arg) {
    struct churn *c = arg;
    for (int i = 0; i < 4000; i++) {
        gm_devptr p = 0;
        if (gm_malloc(c->a, c->device, (size_t)(1 + i % 64) << 12, 0, &p) != GM_OK || !p) {
            c->fails++;
            continue;
        }
        if (gm_free(c->a, p) != GM_OK) c->fails++;
    }
    return NULL;
}

static void publish_while_allocating(void **state) {
    gm_sim_options o;
    gm_sim_options_init(&o);
    o.device_count = 2;
    gm_backend *be = NULL;
    gm_allocator *a = NULL;
    assert_int_equal(gm_sim_create(&be, &o), GM_OK);
    assert_int_equal(gm_allocator_create(&a, be, NULL), GM_OK);
    struct churn c[2] = {{a, 0, 0}, {a, 1, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, churn_thread, &c[i]), 0);
    for (int i = 0; i < 50; i++) {
        assert_int_equal(gm_allocator_publish(a, "churn"), GM_OK);
        gm_allocator_unpublish(a);
    }
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(c[0].fails + c[1].fails, 0);
    assert_int_equal(gm_allocator_publish(a, "churn"), GM_OK);
    gm__shm_header *h = gm__publisher_header(gm__allocator_publisher(a));
    assert_non_null(h);
    gm_stats s = {.size = sizeof s};
    for (int d = 0; d < 2; d++) {
        const gm__shm_record *rec = (const gm__shm_record *)((char *)h + GM__SHM_HEADER_SIZE) + d;
        gm__shm_values v;
        assert_int_equal(gm__shm_read_record(rec, &v, 1000000), GM_OK);
        assert_int_equal(gm_get_stats(a, d, &s), GM_OK);
        assert_int_equal(v.allocated, s.allocated_bytes[GM_POOL_ALL].current);
        assert_int_equal(v.num_allocs, s.allocation[GM_POOL_ALL].allocated);
        assert_int_equal(v.num_allocs, 4000);
        assert_true(v.device_total > 0);
    }
    gm_allocator_destroy(a);
    gm_backend_destroy(be);
}

/* Issue 43, item 10: a writer preempted inside its update (an odd
 * sequence) when a reader takes its first sample of the record made that
 * sample blank (torn: no earlier copy to hold), 2 of 36,625 rows of a
 * flat-out writer. Now a first read waits for the writer: here the
 * "writer" finishes its update only once the reader has started waiting
 * (gm__shm_read_waits), so the test does not depend on timing. */
struct late_writer {
    gm__shm_record *rec;
    unsigned long waits0;
    atomic_int done;
};

static void *finish_update(void *arg) {
    struct late_writer *w = arg;
    while (!atomic_load(&w->done) && __atomic_load_n(&gm__shm_read_waits, __ATOMIC_RELAXED) == w->waits0)
        sched_yield();
    __atomic_store_n(&w->rec->v.reserved, 40, __ATOMIC_RELAXED);
    __atomic_store_n(&w->rec->seq, __atomic_load_n(&w->rec->seq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
    return NULL;
}

static void first_sample_waits_for_writer(void **state) {
    (void)state;
    gm_allocator *a = gm_test_shm_allocator(1);
    gm__shm_record *rec = published_record(a);
    __atomic_store_n(&rec->seq, rec->seq + 1, __ATOMIC_RELAXED); /* the writer, preempted inside */
    struct late_writer w = {.rec = rec, .waits0 = __atomic_load_n(&gm__shm_read_waits, __ATOMIC_RELAXED)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, finish_update, &w), 0);
    gm__scan_result r;
    assert_int_equal(gm__shm_scan(&r, true), GM_OK); /* a fresh reader: its first sample */
    atomic_store(&w.done, 1);
    pthread_join(t, NULL);
    const gm__mon_proc *p = find_pid(&r, getpid());
    assert_non_null(p);
    assert_true(p->used[0]);
    assert_false(p->torn[0]);
    assert_int_equal(p->v[0].reserved, 40);
    gm__scan_result_free(&r);
    gm_test_shm_allocator_free(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(publish_and_read),      cmocka_unit_test(publish_null_is_error),
        cmocka_unit_test(dead_producer_is_cleaned), cmocka_unit_test(foreign_namespace_never_unlinked),
        cmocka_unit_test(planted_names_block_nothing), cmocka_unit_test(held_under_load),
        cmocka_unit_test(identity_published),
        cmocka_unit_test(torn_record_is_reported), cmocka_unit_test(seqlock_never_torn),
        cmocka_unit_test(first_sample_waits_for_writer),
        cmocka_unit_test(values_exact_clock_every_n), cmocka_unit_test(env_publish),
        cmocka_unit_test(publish_while_allocating),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
