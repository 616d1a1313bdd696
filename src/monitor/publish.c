/* publish.c — the writer side of monitoring: an allocator publishes its
 * per-device stats in a sealed memfd announced by a locked beacon in
 * /dev/shm (layout and the reasons in monitor.h) so `gpumem
 * smi/top/log/exporter` can read them from outside the process. The
 * per-operation hook is six 16-byte moves under a seqlock. */
#define _GNU_SOURCE /* memfd_create, O_TMPFILE, F_ADD_SEALS */
#include "internal.h"
#include "monitor/monitor.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct gm__publisher {
    gm__sink sink;       /* first: the allocator holds the publisher as its sink */
    gm__shm_header *hdr;
    gm__shm_record *rec; /* GM__SHM_DEVICES records after the header */
    gm__shm_step *step;  /* GM__SHM_DEVICES step records after those */
    int data_fd;         /* the sealed memfd */
    int beacon_fd;       /* holds flock(LOCK_EX) while we live */
    char path[PATH_MAX]; /* the beacon's path in /dev/shm */
    struct gm__publisher *next; /* every live publisher, for the fork handler */
    /* steps (gm_step_mark): the highest allocated bytes since the last mark
     * (kept by every update, under the device lock), and the step records'
     * writer lock (marks hold a device lock, walks none) */
    int64_t step_peak[GM__SHM_DEVICES];
    pthread_mutex_t step_mu;
    int64_t last_walk_ns; /* CLOCK_MONOTONIC; under step_mu */
};

void gm__shm_prefix_any(char *buf, size_t len) {
    const char *tag = getenv("GPUMEM_SHM_TAG");
    if (tag && *tag) snprintf(buf, len, "gpumem-%s.", tag);
    else snprintf(buf, len, "gpumem.");
}

void gm__shm_prefix(char *buf, size_t len) {
    char any[64];
    gm__shm_prefix_any(any, sizeof any);
    snprintf(buf, len, "%s%u.", any, (unsigned)getuid());
}

const char *gm__shm_dir(void) {
    const char *d = getenv("GPUMEM_SHM_DIR");
    return d && d[0] == '/' ? d : GM__SHM_DIR;
}

int gm__proc_start_time(int pid, uint64_t *out) {
    char path[PATH_MAX], buf[1024];
    gm__proc_path(path, sizeof path, pid, "stat");
    FILE *f = gm__proc_fopen(path);
    if (!f) return GM_EIO;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* comm may hold spaces and parentheses: fields restart after the last ')' */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return GM_EIO;
    p += 2;
    if (*p == 'Z' || *p == 'X') return GM_EIO; /* exited, not yet reaped */
    /* p is field 3 (state); start time is field 22 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return GM_EIO;
        p++;
    }
    *out = strtoull(p, NULL, 10);
    return GM_OK;
}

void gm__proc_comm(int pid, char *buf, size_t len) {
    char path[PATH_MAX];
    gm__proc_path(path, sizeof path, pid, "comm");
    buf[0] = '\0';
    FILE *f = gm__proc_fopen(path);
    if (!f) return;
    char raw[64]; /* the kernel cuts a name at 15 bytes, in the middle of a character if it falls there */
    if (fgets(raw, sizeof raw, f)) {
        raw[strcspn(raw, "\n")] = '\0';
        gm__utf8_copy(buf, len, raw);
    }
    fclose(f);
}

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t coarse_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* 64 random bits: names nobody can guess, and the nonce. */
static uint64_t random64(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
        v = realtime_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&v;
    return v;
}

/* ---- every live publisher of this process, for fork ------------------------
 * A child made by fork() shares the beacon's open file, so its lock, with
 * us: were it to outlive us, the segment would look alive. The child drops
 * its copy of each beacon; the lock then lives exactly as long as we do. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static gm__publisher *live;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) { pthread_mutex_lock(&live_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&live_mu); }
static void fork_child(void) {
    for (gm__publisher *p = live; p; p = p->next)
        if (p->beacon_fd >= 0) {
            close(p->beacon_fd);
            p->beacon_fd = -1;
        }
    pthread_mutex_unlock(&live_mu);
}
static void register_atfork(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static void live_add(gm__publisher *p) {
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&live_mu);
    p->next = live;
    live = p;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(gm__publisher *p) {
    pthread_mutex_lock(&live_mu);
    for (gm__publisher **pp = &live; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

/* The data: a memfd of GM__SHM_SIZE, sealed so that nobody can change its
 * size (no store of ours can ever fault), mapped for writing by us alone. */
static int create_data(gm__publisher *p) {
    int fd = memfd_create("gpumem-stats", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return gm__set_error(GM_EIO, "publishing: memfd_create: %s", strerror(errno));
    fchmod(fd, 0600);
    int seals = F_SEAL_SHRINK | F_SEAL_GROW;
    if (ftruncate(fd, GM__SHM_SIZE) != 0 || fcntl(fd, F_ADD_SEALS, seals) != 0) {
        int e = errno;
        close(fd);
        return gm__set_error(GM_EIO, "publishing: sizing and sealing the memfd: %s", strerror(e));
    }
    void *m = mmap(NULL, GM__SHM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        return gm__set_error(GM_EIO, "publishing: mmap of the memfd: %s", strerror(e));
    }
#ifdef F_SEAL_FUTURE_WRITE
    seals = F_SEAL_FUTURE_WRITE; /* no new writable mapping or write(): our own mapping stays */
    (void)fcntl(fd, F_ADD_SEALS, seals);
#endif
    (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL);
    p->data_fd = fd;
    p->hdr = m;
    p->rec = (gm__shm_record *)((char *)m + GM__SHM_HEADER_SIZE);
    p->step = (gm__shm_step *)((char *)m + GM__SHM_STEP_OFFSET);
    return GM_OK;
}

/* Link the locked, complete beacon open on fd under a fresh random name;
 * a name that exists (planted or not) is passed over for another. */
static int link_beacon(gm__publisher *p, int fd) {
    char prefix[80], self[64];
    gm__shm_prefix(prefix, sizeof prefix);
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    for (int tries = 0; tries < 16; tries++) {
        snprintf(p->path, sizeof p->path, "%s/%s%016llx", gm__shm_dir(), prefix, (unsigned long long)random64());
        if (linkat(AT_FDCWD, self, AT_FDCWD, p->path, AT_SYMLINK_FOLLOW) == 0) return GM_OK;
        if (errno != EEXIST && linkat(fd, "", AT_FDCWD, p->path, AT_EMPTY_PATH) == 0) return GM_OK;
        if (errno != EEXIST) return gm__set_error(GM_EIO, "publishing: linking %s: %s", p->path, strerror(errno));
    }
    return gm__set_error(GM_EIO, "publishing: 16 random names under %s all taken", gm__shm_dir());
}

/* The beacon: an unnamed file in /dev/shm, locked, the header written into
 * it, then linked under its name, so no reader ever sees it unlocked or
 * half written. */
static int create_beacon(gm__publisher *p) {
    int fd = open(gm__shm_dir(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return gm__set_error(GM_EIO, "publishing: an unnamed file in %s: %s", gm__shm_dir(), strerror(errno));
    fchmod(fd, 0600); /* whatever the umask */
    int rc = GM_OK;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        rc = gm__set_error(GM_EIO, "publishing: locking the beacon: %s", strerror(errno));
    else if (pwrite(fd, p->hdr, GM__SHM_HEADER_SIZE, 0) != GM__SHM_HEADER_SIZE)
        rc = gm__set_error(GM_EIO, "publishing: writing the beacon: %s", strerror(errno));
    else rc = link_beacon(p, fd);
    if (rc != GM_OK) {
        close(fd);
        return rc;
    }
    p->beacon_fd = fd;
    return GM_OK;
}

static void fill_header(gm__publisher *p, const char *label, uint32_t source) {
    gm__shm_header *h = p->hdr;
    h->version = GM__SHM_VERSION;
    h->header_size = GM__SHM_HEADER_SIZE;
    h->segment_size = GM__SHM_SIZE;
    h->record_size = GM__SHM_RECORD_SIZE;
    h->ndevices = GM__SHM_DEVICES;
    h->pid = (int32_t)getpid();
    h->uid = (uint32_t)getuid();
    uint64_t st = 0;
    gm__proc_start_time(0, &st);
    h->start_time = st;
    h->created_ns = realtime_ns();
    h->source = source;
    h->data_fd = p->data_fd;
    h->nonce = random64();
    h->pidns_ino = gm__proc_pidns(0);
    h->host_pid = gm__host_pid_self(); /* 0 inside a container: readers outside map it, inside infer it */
    gm__proc_comm(0, h->comm, sizeof h->comm);
    gm__utf8_copy(h->label, sizeof h->label, label && *label ? label : h->comm);
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(h->visible, sizeof h->visible, "%s", vis ? vis : "");
    gm__identity_fill(h);
    /* the magic last: a reader that sees it sees everything above */
    __atomic_store_n(&h->magic, GM__SHM_MAGIC, __ATOMIC_RELEASE);
}

/* Publish the current stats of devices that already exist, so a reader sees
 * them before the next allocator operation. */
static void publish_existing(gm_allocator *a, gm__publisher *p) {
    for (int i = 0; i < a->ndevices && i < GM_MAX_DEVICES; i++) {
        /* created concurrently (released under devices_lock): load it so */
        gm__device *d = __atomic_load_n(&a->devices[i], __ATOMIC_ACQUIRE);
        if (!d) continue;
        gm__devlock_lock(&d->lock);
        gm__publisher_set_total(p, i, d->total_memory);
        gm__publisher_update(p, i, &d->stats);
        gm__devlock_unlock(&d->lock);
    }
}

static void sink_update(gm__sink *s, int device, const gm_stats *st) {
    gm__publisher_update((gm__publisher *)s, device, st);
}
static void sink_set_total(gm__sink *s, int device, uint64_t total) {
    gm__publisher_set_total((gm__publisher *)s, device, total);
}
static void sink_close(gm__sink *s) { gm__publisher_close((gm__publisher *)s); }
static void sink_step(gm__sink *s, int device, const gm_stats *st) { gm__publisher_step((gm__publisher *)s, device, st); }
static void sink_step_walk(gm__sink *s, gm_allocator *a, int device) {
    gm__publisher_step_walk((gm__publisher *)s, a, device);
}
static const gm__sink_ops sink_ops = {sink_update, sink_set_total, sink_close, sink_step, sink_step_walk};

gm__publisher *gm__allocator_publisher(gm_allocator *a) { return (gm__publisher *)gm__sink_get(a); }
gm__shm_header *gm__publisher_header(gm__publisher *p) { return p ? p->hdr : NULL; }

/* A new segment with its header filled, for either kind of publisher. */
static int new_publisher(const char *label, uint32_t source, gm__publisher **out) {
    gm__publisher *p = calloc(1, sizeof *p);
    if (!p) return gm__set_error(GM_ENOHOSTMEM, "publishing: out of host memory");
    p->sink.ops = &sink_ops;
    p->data_fd = p->beacon_fd = -1;
    pthread_mutex_init(&p->step_mu, NULL);
    int rc = create_data(p);
    if (rc == GM_OK) {
        fill_header(p, label, source);
        rc = create_beacon(p);
    }
    if (rc != GM_OK) {
        if (p->hdr) munmap(p->hdr, GM__SHM_SIZE);
        if (p->data_fd >= 0) close(p->data_fd);
        pthread_mutex_destroy(&p->step_mu);
        free(p);
        return rc;
    }
    live_add(p);
    *out = p;
    return GM_OK;
}

int gm_allocator_publish(gm_allocator *a, const char *label) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "gm_allocator_publish: allocator is NULL");
    if (gm__sink_get(a)) return GM_OK;
    gm__publisher *p;
    int rc = new_publisher(label, GM__SRC_GPUMEM, &p);
    if (rc != GM_OK) return rc;
    /* the front end reads the sink under each device lock, while this runs:
     * gm__sink_set's release store makes the mapped, filled segment visible
     * with the pointer (and pairs with gm__sink_get's acquire load) */
    pthread_mutex_lock(&a->devices_lock);
    gm__sink_set(a, &p->sink);
    pthread_mutex_unlock(&a->devices_lock);
    publish_existing(a, p);
    return GM_OK;
}

void gm_allocator_unpublish(gm_allocator *a) {
    if (!a || !gm__sink_get(a)) return;
    gm__publisher *p = gm__allocator_publisher(a);
    /* take every device lock so no update is inside the mapping we remove */
    pthread_mutex_lock(&a->devices_lock);
    for (int i = 0; i < a->ndevices && i < GM_MAX_DEVICES; i++)
        if (a->devices[i]) gm__devlock_lock(&a->devices[i]->lock);
    gm__sink_set(a, NULL);
    for (int i = 0; i < a->ndevices && i < GM_MAX_DEVICES; i++)
        if (a->devices[i]) gm__devlock_unlock(&a->devices[i]->lock);
    pthread_mutex_unlock(&a->devices_lock);
    gm__publisher_close(p);
}

/* Moving the published numbers in pairs: gm_stat keeps (current, peak) and
 * (allocated, freed) side by side, and the record keeps them in the same
 * order (monitor.h). Each word is a relaxed atomic store: readers load the
 * same words atomically under the seqlock, so a plain (or 16-byte vector)
 * store racing their loads is a data race by the C11 model, which TSan
 * reported; on x86-64 and aarch64 a relaxed 8-byte store is a plain mov/str,
 * so this costs nothing over the vector move it replaces. */
_Static_assert(offsetof(gm_stat, peak) == offsetof(gm_stat, current) + 8 &&
                   offsetof(gm_stat, freed) == offsetof(gm_stat, allocated) + 8 &&
                   offsetof(gm_stats, num_ooms) == offsetof(gm_stats, num_alloc_retries) + 8,
               "gm_stat pairs the publisher moves together");
#define MOVE_PAIR(dst, src)                                                    \
    do {                                                                       \
        __atomic_store_n(&(dst), (src), __ATOMIC_RELAXED);                     \
        __atomic_store_n(&(dst) + 1, (&(src))[1], __ATOMIC_RELAXED);           \
    } while (0)

/* The rare end of an update, out of line so the common path needs no stack
 * frame: the coarse clock, `used`, and the closing sequence store. */
__attribute__((noinline, cold)) static void stamp_and_close(gm__shm_record *r, uint32_t seq) {
    __atomic_store_n(&r->v.update_ns, (int64_t)coarse_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(&r->used, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&r->seq, seq + 2, __ATOMIC_RELEASE);
}

/* Called by the front end with the device lock held after every stats
 * change, so on every gm_malloc/gm_free: 6 pair moves between the seqlock
 * stores and the step's peak, no frame, no branch taken in the common case
 * (bench/RESULTS.md, "publishing with the step peak", counts what it adds
 * per op).
 *
 * Seqlock: seq made odd; a release fence (later stores cannot pass it; free
 * on x86); the values; seq made even by a release store (earlier stores
 * cannot pass it). Readers (gm__shm_read_record) retry while seq is odd or
 * changed, so they never accept a mix of two updates, and never block us.
 * Every update publishes the exact current values: when the process stops
 * allocating, what readers see is its final stats.
 *
 * Why not store only the fields that changed (peaks, reserved, ooms and
 * retries change rarely): deciding costs a load and a compare per field,
 * more than a pair store, and mispredicts while peaks climb. Why not a
 * timestamp per update: a clock read costs more than the rest together. */
void gm__publisher_update(gm__publisher *p, int device, const gm_stats *s) {
    if (!p || (unsigned)device >= GM__SHM_DEVICES) return;
    gm__shm_record *r = &p->rec[device];
    /* one writer per record (the device lock), so a plain read of seq is ours */
    uint32_t seq = __atomic_load_n(&r->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&r->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    MOVE_PAIR(r->v.allocated, s->allocated_bytes[GM_POOL_ALL].current);
    MOVE_PAIR(r->v.requested, s->requested_bytes[GM_POOL_ALL].current);
    MOVE_PAIR(r->v.active, s->active_bytes[GM_POOL_ALL].current);
    MOVE_PAIR(r->v.num_allocs, s->allocation[GM_POOL_ALL].allocated);
    MOVE_PAIR(r->v.reserved, s->reserved_bytes[GM_POOL_ALL].current);
    MOVE_PAIR(r->v.num_alloc_retries, s->num_alloc_retries);
    /* the step's peak, private (published at the next mark): a compare and
     * a conditional move */
    int64_t cur = s->allocated_bytes[GM_POOL_ALL].current, *pk = &p->step_peak[device];
    *pk = cur > *pk ? cur : *pk;
    /* seq advances by 2: this is true on the first publication (seq 0, used
     * still 0) and every GM__SHM_TIME_EVERY-th after */
    if (__builtin_expect((seq & (2 * GM__SHM_TIME_EVERY - 1)) == 0, 0)) {
        stamp_and_close(r, seq);
        return;
    }
    __atomic_store_n(&r->seq, seq + 2, __ATOMIC_RELEASE);
}

void gm__publisher_set_total(gm__publisher *p, int device, uint64_t total) {
    if (!p || (unsigned)device >= GM__SHM_DEVICES) return;
    /* outside the seqlock: one aligned 8-byte store a reader sees whole */
    __atomic_store_n(&p->rec[device].v.device_total, (int64_t)total, __ATOMIC_RELAXED);
}

void gm__publisher_close(gm__publisher *p) {
    if (!p) return;
    live_remove(p);
    /* our beacon only: the name still leads to the file we hold */
    struct stat mine, there;
    if (p->beacon_fd >= 0 && fstat(p->beacon_fd, &mine) == 0 && lstat(p->path, &there) == 0 &&
        mine.st_ino == there.st_ino && mine.st_dev == there.st_dev)
        unlink(p->path);
    if (p->beacon_fd >= 0) close(p->beacon_fd);
    munmap(p->hdr, GM__SHM_SIZE);
    close(p->data_fd);
    pthread_mutex_destroy(&p->step_mu);
    free(p);
}

/* ---- step records ------------------------------------------------------------
 * Written at step marks only, by one writer at a time (step_mu), under the
 * record's seqlock like the device records. */

static void step_begin(gm__shm_step *r, uint32_t *seq) {
    *seq = __atomic_load_n(&r->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&r->seq, *seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void step_end(gm__shm_step *r, uint32_t seq) {
    __atomic_store_n(&r->used, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&r->seq, seq + 2, __ATOMIC_RELEASE);
}

#define STEP_SET(r, field, val) __atomic_store_n(&(r)->v.field, (int64_t)(val), __ATOMIC_RELAXED)

/* The step record of a mark: one more step, its start's allocated and
 * reserved bytes, the peak of the step that ended (-1 unknown). */
static void step_write(gm__publisher *p, int device, int64_t alloc, int64_t reserved, int64_t peak) {
    gm__shm_step *r = &p->step[device];
    pthread_mutex_lock(&p->step_mu);
    bool first = !__atomic_load_n(&r->used, __ATOMIC_RELAXED);
    uint32_t seq;
    step_begin(r, &seq);
    STEP_SET(r, step, r->v.step + 1);
    STEP_SET(r, mark_ns, realtime_ns());
    STEP_SET(r, start_allocated, alloc);
    STEP_SET(r, start_reserved, reserved);
    STEP_SET(r, peak_allocated, peak);
    if (first) {
        STEP_SET(r, largest_free_block, -1);
        STEP_SET(r, walk_step, -1);
    }
    step_end(r, seq);
    pthread_mutex_unlock(&p->step_mu);
}

void gm__publisher_step(gm__publisher *p, int device, const gm_stats *s) {
    if (!p || (unsigned)device >= GM__SHM_DEVICES) return;
    int64_t alloc = s->allocated_bytes[GM_POOL_ALL].current;
    int64_t peak = p->step_peak[device] > alloc ? p->step_peak[device] : alloc;
    p->step_peak[device] = alloc; /* the next step starts here */
    step_write(p, device, alloc, s->reserved_bytes[GM_POOL_ALL].current, peak);
}

int gm_native_publisher_step(gm_native_publisher *np, int device, int64_t allocated, int64_t reserved,
                             int64_t step_peak) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    gm__publisher *p = (gm__publisher *)np;
    if (!p || (unsigned)device >= GM__SHM_DEVICES || allocated < 0 || reserved < 0)
        return gm__set_error(GM_EINVAL, "gm_native_publisher_step: bad publisher, device %d or sizes", device);
    step_write(p, device, allocated, reserved, step_peak < 0 ? -1 : step_peak);
    return GM_OK;
}

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* The block walk of one device into its step record. */
static void walk_device(gm__publisher *p, gm_allocator *a, int device) {
    if (!__atomic_load_n(&p->step[device].used, __ATOMIC_ACQUIRE)) return;
    gm__oom_facts f;
    if (gm__oom_gather(a, device, 0, &f) != GM_OK || !f.have_blocks) return;
    gm__shm_step *r = &p->step[device];
    pthread_mutex_lock(&p->step_mu);
    uint32_t seq;
    step_begin(r, &seq);
    STEP_SET(r, largest_free_block, f.largest_free_block);
    STEP_SET(r, walk_step, r->v.step);
    for (int c = 0; c < GM_CAT_COUNT; c++) __atomic_store_n(&r->v.category[c], f.by_category[c], __ATOMIC_RELAXED);
    STEP_SET(r, untagged, f.untagged);
    step_end(r, seq);
    pthread_mutex_unlock(&p->step_mu);
}

void gm__publisher_step_walk(gm__publisher *p, gm_allocator *a, int device) {
    if (!p || !a) return;
    int64_t now = monotonic_ns();
    pthread_mutex_lock(&p->step_mu);
    bool due = p->last_walk_ns == 0 || now - p->last_walk_ns >= GM__SHM_WALK_EVERY_NS;
    if (due) p->last_walk_ns = now;
    pthread_mutex_unlock(&p->step_mu);
    if (!due) return;
    int lo = device < 0 ? 0 : device, hi = device < 0 ? GM__SHM_DEVICES : device + 1;
    for (int d = lo; d < hi && d < GM__SHM_DEVICES; d++) walk_device(p, a, d);
}

int gm__publish_from_env(gm_allocator *a) {
    const char *e = getenv("GPUMEM_PUBLISH");
    if (!e || strcmp(e, "1") != 0) return GM_OK;
    return gm_allocator_publish(a, getenv("GPUMEM_PUBLISH_LABEL"));
}

/* ---- publishing another allocator's statistics (PyTorch's own) -----------
 * The same segment, marked source torch, whose records are filled from
 * torch.cuda.memory_stats() values: gpumem.publish_native and
 * `gpumem run --native`. The keys come from GM_MON_STATS, matched to the
 * record's fields by name, so no list of them exists outside monitor.h. */

static const struct { const char *name; size_t offset; } shm_fields[] = {
#define GM__SHM_FIELD_ENTRY(n) {#n, offsetof(gm__shm_values, n)},
    GM__SHM_FIELDS(GM__SHM_FIELD_ENTRY)
#undef GM__SHM_FIELD_ENTRY
};
static const struct { const char *name, *torch; } mon_stats[] = {
#define GM__MON_ENTRY(name, val, torch, ...) {#name, torch},
    GM_MON_STATS(GM__MON_ENTRY)
#undef GM__MON_ENTRY
};
#define NSHM (sizeof shm_fields / sizeof shm_fields[0])

/* The torch key of record field i, or NULL (update_ns: the time). */
static const char *torch_key_of(size_t i) {
    for (size_t j = 0; j < sizeof mon_stats / sizeof mon_stats[0]; j++)
        if (!strcmp(mon_stats[j].name, shm_fields[i].name)) return mon_stats[j].torch;
    return NULL;
}

const char *gm_native_publisher_key(int i) {
    int k = 0;
    for (size_t f = 0; f < NSHM; f++) {
        const char *key = torch_key_of(f);
        if (key && k++ == i) return key;
    }
    return NULL;
}

int gm_native_publisher_open(const char *label, gm_native_publisher **out) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!out) return gm__set_error(GM_EINVAL, "gm_native_publisher_open: out is NULL");
    *out = NULL;
    gm__publisher *p;
    int rc = new_publisher(label, GM__SRC_TORCH, &p);
    if (rc == GM_OK) *out = (gm_native_publisher *)p;
    return rc;
}

int gm_native_publisher_update(gm_native_publisher *np, int device, const int64_t *values, int n) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    gm__publisher *p = (gm__publisher *)np;
    if (!p || !values || (unsigned)device >= GM__SHM_DEVICES)
        return gm__set_error(GM_EINVAL, "gm_native_publisher_update: bad publisher, values or device %d", device);
    int want = 0;
    while (gm_native_publisher_key(want)) want++;
    if (n != want)
        return gm__set_error(GM_EINVAL, "gm_native_publisher_update: %d values, expected %d (gm_native_publisher_key)",
                             n, want);
    gm__shm_record *r = &p->rec[device];
    uint32_t seq = __atomic_load_n(&r->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&r->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    int k = 0;
    for (size_t f = 0; f < NSHM; f++) {
        int64_t *field = (int64_t *)((char *)&r->v + shm_fields[f].offset);
        if (torch_key_of(f)) __atomic_store_n(field, values[k++], __ATOMIC_RELAXED);
        else if (!strcmp(shm_fields[f].name, "update_ns"))
            __atomic_store_n(field, (int64_t)realtime_ns(), __ATOMIC_RELAXED);
    }
    __atomic_store_n(&r->used, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&r->seq, seq + 2, __ATOMIC_RELEASE);
    return GM_OK;
}

void gm_native_publisher_close(gm_native_publisher *p) { gm__publisher_close((gm__publisher *)p); }

/* Copy n 8-byte words guarded by the seqlock `seq`: GM_OK once a copy was
 * taken while seq stayed even and unchanged, GM_ESTATE after max_tries. */
static int seqlock_copy(const uint32_t *seq, const int64_t *from, int64_t *to, size_t n, int max_tries) {
    for (int i = 0; i < max_tries; i++) {
        uint32_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) continue;
        for (size_t k = 0; k < n; k++) to[k] = __atomic_load_n(&from[k], __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(seq, __ATOMIC_RELAXED) == s1) return GM_OK;
    }
    return GM_ESTATE;
}

_Static_assert(sizeof(gm__shm_values) % 8 == 0 && sizeof(gm__shm_step_values) % 8 == 0, "records of int64 words");

int gm__shm_read_step(const gm__shm_step *r, gm__shm_step_values *out, int max_tries) {
    return seqlock_copy(&r->seq, (const int64_t *)&r->v, (int64_t *)out, sizeof *out / 8, max_tries);
}

int gm__shm_read_record(const gm__shm_record *r, gm__shm_values *out, int max_tries) {
    return seqlock_copy(&r->seq, (const int64_t *)&r->v, (int64_t *)out, sizeof *out / 8, max_tries);
}

unsigned long gm__shm_read_waits;

int gm__shm_read_record_wait(const gm__shm_record *r, gm__shm_values *out, int max_tries, int wait_ms) {
    int rc = gm__shm_read_record(r, out, max_tries);
    /* the writer was descheduled inside its update (a 28-instruction window,
     * but a loaded host preempts it there now and then): let it run */
    for (long k = 0; rc != GM_OK && k < 10L * wait_ms; k++) {
        __atomic_fetch_add(&gm__shm_read_waits, 1, __ATOMIC_RELAXED);
        nanosleep(&(struct timespec){0, 100000}, NULL);
        rc = gm__shm_read_record(r, out, 1000);
    }
    return rc;
}
