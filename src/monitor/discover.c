/* discover.c — the reader side of publication (layout and reasons in
 * monitor.h): find this user's beacons in /dev/shm (every user's in node
 * mode), verify them (type, owner, mode, header; nothing they say is
 * trusted before it is checked), judge their publisher alive by the beacon's lock
 * alone, find the publisher's pid as this reader sees it (through the PID
 * namespaces), open its sealed data through /proc/<pid>/fd and map it
 * read-only, copy the records under their seqlocks, and unlink the beacons
 * of dead publishers (nobody holds their lock). A live beacon is never
 * unlinked, whatever its pid means here. */
#define _GNU_SOURCE /* F_GET_SEALS */
#include "internal.h"
#include "monitor/monitor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Seqlock attempts on a mapped record: each is a copy of 120 bytes (tens of
 * ns), so a record updated millions of times a second settles within a few;
 * a writer stopped inside an update (killed) costs ~1 ms. A reader's first
 * read of a record, which has no earlier copy to hold, then sleeps and
 * retries for up to FIRST_READ_WAIT_MS: the tries pass in well under a
 * millisecond, less than a writer preempted inside its update stays off
 * the CPU, and that made the first sample of a busy writer blank. Once
 * per record: a stopped writer costs it once. */
#define READ_TRIES 100000
#define FIRST_READ_WAIT_MS 200

/* Beacon names: <prefix><uid>.<16 hex digits>, where prefix is
 * gm__shm_prefix_any's; in node mode any decimal uid (no leading zero),
 * else only ours. The uid the name gives, or false. */
static bool our_name(const char *name, const char *prefix, bool all_users, uint32_t *uid) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0) return false;
    const char *p = name + pl;
    size_t nd = strspn(p, "0123456789");
    if (nd == 0 || nd > 10 || (nd > 1 && p[0] == '0') || p[nd] != '.') return false;
    unsigned long long u = strtoull(p, NULL, 10);
    if (u > UINT32_MAX || (!all_users && u != (unsigned long long)getuid())) return false;
    p += nd + 1;
    if (strlen(p) != 16 || strspn(p, "0123456789abcdef") != 16) return false;
    *uid = (uint32_t)u;
    return true;
}

/* SEG_SKIP + a GM__SKIP_* reason for a skipped segment. */
enum { SEG_OK, SEG_STALE, SEG_UNREACHABLE, SEG_SKIP };
#define SKIP(reason) (SEG_SKIP + GM__SKIP_##reason)

/* A segment as a reader holds it: the beacon open (for the lock), the
 * header read from it, the data mapped read-only, and the last good copy of
 * each record (kept between scans by the cache). */
typedef struct segment {
    char name[256];
    uint32_t uid; /* from its name; the beacon, header and data agree */
    ino_t ino;
    int fd;
    gm__shm_header h;
    int pid; /* the publisher as this reader sees it */
    const char *data;
    size_t map_len; /* the header's segment_size: GM__SHM_SIZE, or GM__SHM_SIZE_V3 */
    bool seen;
    bool good[GM__SHM_DEVICES];
    bool waited[GM__SHM_DEVICES]; /* a first read waited for the writer (once: a stopped one never finishes) */
    gm__shm_values last[GM__SHM_DEVICES];
} segment;

static void segment_close(segment *s) {
    if (s->data) munmap((void *)s->data, s->map_len);
    if (s->fd >= 0) close(s->fd);
    s->data = NULL;
    s->fd = -1;
}

/* Alive while someone holds the beacon's lock: the publisher, which takes it
 * before the beacon has a name and keeps it until it exits. */
static bool beacon_locked(int fd) {
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
        flock(fd, LOCK_UN);
        return false;
    }
    return errno == EWOULDBLOCK;
}

/* The header as publishers write it, for the user the name gives: every
 * size and count is checked before any is used. */
static bool header_ok(const gm__shm_header *h, uint32_t uid) {
    bool v4 = h->version == GM__SHM_VERSION && h->segment_size == GM__SHM_SIZE;
    bool v3 = h->version == GM__SHM_VERSION_V3 && h->segment_size == GM__SHM_SIZE_V3;
    return h->magic == GM__SHM_MAGIC && (v4 || v3) && h->header_size == GM__SHM_HEADER_SIZE &&
           h->record_size == GM__SHM_RECORD_SIZE && h->ndevices <= GM__SHM_DEVICES && h->uid == uid && h->pid > 0 &&
           h->data_fd >= 0;
}

/* Open and verify the beacon: a regular file owned by the user its name
 * gives, mode 0600, never blocking on a planted FIFO, never following a
 * link. */
static int open_beacon(segment *s) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", gm__shm_dir(), s->name);
    s->fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (s->fd < 0) return SKIP(OPEN);
    struct stat st;
    if (fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode)) return SKIP(TYPE);
    if (st.st_uid != s->uid) return SKIP(OWNER); /* another user's file under this user's name */
    if ((st.st_mode & 07777) != 0600) return SKIP(MODE);
    s->ino = st.st_ino;
    /* unlocked: its publisher is gone (a live one locked it before naming it) */
    if (!beacon_locked(s->fd)) return SEG_STALE;
    if (pread(s->fd, &s->h, sizeof s->h, 0) != (ssize_t)sizeof s->h) return SKIP(SHORT); /* truncated */
    if (!header_ok(&s->h, s->uid)) return s->h.magic == GM__SHM_MAGIC && s->h.uid != s->uid ? SKIP(OWNER) : SKIP(HEADER);
    s->map_len = s->h.segment_size;
    return SEG_OK;
}

/* The publisher's data descriptor, opened for reading only if it is a
 * regular file of the segment's user: /proc/<pid>/fd/N is first opened
 * O_PATH (no driver's open runs, nothing blocks, whatever the descriptor
 * is: a FIFO, a device, a socket), checked, then reopened through our own
 * descriptor, so the file checked is the file read. -1 with *why. */
static int open_data_fd(const segment *s, int *why) {
    char path[PATH_MAX], fdname[32];
    snprintf(fdname, sizeof fdname, "fd/%d", s->h.data_fd);
    gm__proc_path(path, sizeof path, s->pid, fdname);
    int pfd = open(path, O_PATH | O_CLOEXEC);
    if (pfd < 0) {
        *why = SEG_UNREACHABLE;
        return -1;
    }
    struct stat st, st2;
    if (fstat(pfd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != s->uid || st.st_size < (off_t)s->map_len) {
        close(pfd);
        *why = SKIP(DATA);
        return -1;
    }
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", pfd);
    int fd = open(self, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    close(pfd);
    if (fd >= 0 && (fstat(fd, &st2) != 0 || st2.st_ino != st.st_ino || st2.st_dev != st.st_dev)) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) *why = SKIP(DATA);
    return fd;
}

/* Map the publisher's data read-only: its pid as we see it, its memfd
 * through /proc, sealed against shrinking (so our loads cannot fault), and
 * the same nonce as the beacon (the descriptor number was not reused). */
static int map_data(segment *s, uint64_t own_ns) {
    s->pid = s->h.pidns_ino == own_ns ? s->h.pid : gm__pid_from_ns(s->h.pidns_ino, s->h.pid);
    if (s->pid <= 0) return SEG_UNREACHABLE;
    int why = SEG_OK;
    int fd = open_data_fd(s, &why);
    if (fd < 0) return why;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        close(fd);
        return SKIP(DATA);
    }
    void *m = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return SKIP(DATA);
    s->data = m;
    const gm__shm_header *dh = (const gm__shm_header *)m;
    if (__atomic_load_n(&dh->magic, __ATOMIC_ACQUIRE) != GM__SHM_MAGIC || dh->nonce != s->h.nonce) return SKIP(DATA);
    return SEG_OK;
}

static void copy_identity(gm__mon_ident *id, const gm__shm_header *h) {
#define GM__COPY_STR(n)                              \
    memcpy(id->n, h->n, sizeof id->n);               \
    id->n[sizeof id->n - 1] = '\0';
#define GM__COPY_INT(n) id->n = h->n;
#define GM__COPY(name, kind, help) GM__COPY_##kind(name)
    GM_MON_IDENTITY(GM__COPY)
#undef GM__COPY
#undef GM__COPY_STR
#undef GM__COPY_INT
}

/* The report of a verified, mapped segment: its header, then each used
 * record under its seqlock. A record that kept changing through every try
 * is the last good copy, marked held; torn when there never was one. */
static void report(segment *s, gm__mon_proc *p) {
    const gm__shm_header *h = &s->h;
    p->pid = s->pid;
    p->ns_pid = h->pid;
    p->host_pid = h->host_pid > 0 ? h->host_pid : 0;
    p->source = h->source;
    p->start_time = h->start_time;
    memcpy(p->comm, h->comm, sizeof p->comm);
    p->comm[sizeof p->comm - 1] = '\0';
    memcpy(p->label, h->label, sizeof p->label);
    p->label[sizeof p->label - 1] = '\0';
    memcpy(p->visible, h->visible, sizeof p->visible);
    p->visible[sizeof p->visible - 1] = '\0';
    p->ndevices = h->ndevices;
    p->uid = s->uid;
    copy_identity(&p->id, h);
    const gm__shm_record *rec = (const gm__shm_record *)(s->data + GM__SHM_HEADER_SIZE);
    for (uint32_t i = 0; i < p->ndevices; i++) {
        if (!__atomic_load_n(&rec[i].used, __ATOMIC_RELAXED)) continue;
        p->used[i] = true;
        /* no good copy yet (a first sample): wait for a writer stopped inside
         * its update, once per record, rather than report it blank */
        int wait_ms = s->good[i] || s->waited[i] ? 0 : FIRST_READ_WAIT_MS;
        s->waited[i] = s->waited[i] || wait_ms;
        if (gm__shm_read_record_wait(&rec[i], &p->v[i], READ_TRIES, wait_ms) == GM_OK) {
            s->last[i] = p->v[i];
            s->good[i] = true;
        } else if (s->good[i]) {
            p->v[i] = s->last[i];
            p->held[i] = true;
        } else {
            p->torn[i] = true;
            memset(&p->v[i], 0, sizeof p->v[i]);
        }
    }
    if (s->map_len < GM__SHM_SIZE) return; /* version 3: no step records */
    const gm__shm_step *st = (const gm__shm_step *)(s->data + GM__SHM_STEP_OFFSET);
    for (uint32_t i = 0; i < p->ndevices; i++)
        if (__atomic_load_n(&st[i].used, __ATOMIC_RELAXED))
            p->have_step[i] = gm__shm_read_step(&st[i], &p->step[i], READ_TRIES) == GM_OK;
}

/* Open, verify and map the segment `name` into s (fd -1, uid set on entry). */
static int open_segment(segment *s, uint64_t own_ns) {
    int r = open_beacon(s);
    if (r == SEG_OK) r = map_data(s, own_ns);
    if (r != SEG_OK) segment_close(s);
    return r;
}

/* ---- the cache: segments kept open and mapped between scans -------------- */

struct gm__shm_cache {
    segment **e;
    int n, cap;
    bool all_users;
};

gm__shm_cache *gm__shm_cache_create(void) { return calloc(1, sizeof(gm__shm_cache)); }
void gm__shm_cache_all_users(gm__shm_cache *c, bool on) {
    if (c) c->all_users = on;
}

static void drop_entry(gm__shm_cache *c, int i) {
    segment_close(c->e[i]);
    free(c->e[i]);
    c->e[i] = c->e[--c->n];
}

void gm__shm_cache_destroy(gm__shm_cache *c) {
    if (!c) return;
    while (c->n) drop_entry(c, c->n - 1);
    free(c->e);
    free(c);
}

/* The cached segment for (name, ino), opened and verified if new: SEG_OK
 * with *out, else why not. */
static int cache_get(gm__shm_cache *c, const char *name, uint32_t uid, ino_t ino, uint64_t own_ns, segment **out) {
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->e[i]->name, name)) continue;
        if (c->e[i]->ino == ino) {
            /* the publisher may have died since: its lock says */
            if (!beacon_locked(c->e[i]->fd)) {
                drop_entry(c, i);
                return SEG_STALE;
            }
            *out = c->e[i];
            return SEG_OK;
        }
        drop_entry(c, i); /* same name, another file */
        break;
    }
    if (c->n == c->cap) {
        int ncap = c->cap ? 2 * c->cap : 16;
        segment **ne = realloc(c->e, (size_t)ncap * sizeof *ne);
        if (!ne) return SKIP(OPEN);
        c->e = ne;
        c->cap = ncap;
    }
    segment *s = calloc(1, sizeof *s);
    if (!s) return SKIP(OPEN);
    s->fd = -1;
    s->uid = uid;
    snprintf(s->name, sizeof s->name, "%s", name);
    int r = open_segment(s, own_ns);
    if (r != SEG_OK) {
        free(s);
        return r;
    }
    c->e[c->n++] = s;
    *out = s;
    return SEG_OK;
}

static int read_segment(gm__shm_cache *c, const char *name, uint32_t uid, ino_t ino, uint64_t own_ns,
                        gm__mon_proc *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->shm_name, sizeof p->shm_name, "%s", name);
    if (c) {
        segment *s;
        int r = cache_get(c, name, uid, ino, own_ns, &s);
        if (r != SEG_OK) return r;
        s->seen = true;
        report(s, p);
        return SEG_OK;
    }
    segment *s = calloc(1, sizeof *s); /* 8 KiB of last values: off the stack */
    if (!s) return SKIP(OPEN);
    s->fd = -1;
    s->uid = uid;
    snprintf(s->name, sizeof s->name, "%s", name);
    int r = open_segment(s, own_ns);
    if (r == SEG_OK) report(s, p);
    segment_close(s);
    free(s);
    return r;
}

static int push(gm__scan_result *out, int *cap) {
    if (out->nprocs < *cap) return GM_OK;
    int ncap = *cap ? *cap * 2 : 16;
    gm__mon_proc *np = realloc(out->procs, (size_t)ncap * sizeof *np);
    if (!np) return GM_ENOHOSTMEM;
    out->procs = np;
    *cap = ncap;
    return GM_OK;
}

int gm__shm_scan_cached(gm__shm_cache *c, gm__scan_result *out, bool clean) {
    memset(out, 0, sizeof *out);
    bool all = c && c->all_users;
    char prefix[80];
    gm__shm_prefix_any(prefix, sizeof prefix);
    DIR *dir = opendir(gm__shm_dir());
    if (!dir) return GM_OK; /* no /dev/shm: nobody can publish either */
    uint64_t own_ns = gm__proc_pidns(0);
    for (int i = 0; c && i < c->n; i++) c->e[i]->seen = false;
    int cap = 0, rc = GM_OK, looked = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        uint32_t uid;
        if (!our_name(e->d_name, prefix, all, &uid)) continue;
        int r;
        if (++looked > GM__SHM_SCAN_MAX) r = SKIP(LIMIT); /* a flood of names costs one readdir each */
        else {
            if ((rc = push(out, &cap)) != GM_OK) break;
            r = read_segment(c, e->d_name, uid, e->d_ino, own_ns, &out->procs[out->nprocs]);
        }
        if (r == SEG_OK) out->nprocs++;
        else if (r == SEG_STALE) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", gm__shm_dir(), e->d_name);
            /* a node agent removes no other user's files */
            if (clean && uid == (uint32_t)getuid()) unlink(path);
            out->cleaned++;
        } else if (r == SEG_UNREACHABLE) out->unreachable++;
        else {
            out->skipped++;
            out->skipped_by[r - SEG_SKIP]++;
        }
    }
    closedir(dir);
    for (int i = c ? c->n - 1 : -1; i >= 0; i--)
        if (!c->e[i]->seen) drop_entry(c, i); /* unlinked by its publisher */
    if (rc != GM_OK) gm__scan_result_free(out);
    return rc;
}

int gm__shm_scan(gm__scan_result *out, bool clean) { return gm__shm_scan_cached(NULL, out, clean); }

void gm__scan_result_free(gm__scan_result *r) {
    free(r->procs);
    memset(r, 0, sizeof *r);
}
