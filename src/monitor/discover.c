/* discover.c — the reader side of publication: find this user's segments in
 * /dev/shm, verify them (type, owner, mode, size, name against header),
 * check that their producer still lives (same pid and same process start
 * time, so a reused pid is not mistaken for the producer), copy their
 * records under the seqlock, and unlink the segments of dead producers. */
#include "internal.h"
#include "monitor/monitor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm"
#define READ_TRIES 1000

/* pid from "<prefix><pid>[.<n>]"; -1 if the name is not one of ours */
static int name_pid(const char *name, const char *prefix) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0) return -1;
    char *end;
    long pid = strtol(name + pl, &end, 10);
    if (end == name + pl || pid <= 0 || pid > 0x7fffffff) return -1;
    if (*end != '\0' && *end != '.') return -1;
    return (int)pid;
}

static bool alive(int pid, uint64_t start_time) {
    uint64_t st;
    if (gm__proc_start_time(pid, &st) != GM_OK) return false;
    return st == start_time;
}

static bool pid_exists(int pid) {
    uint64_t st;
    return gm__proc_start_time(pid, &st) == GM_OK;
}

static void unlink_name(const char *name) {
    char path[300];
    snprintf(path, sizeof path, "/%s", name);
    shm_unlink(path);
}


enum { SEG_OK, SEG_SKIP, SEG_STALE };

/* Readers never trust a segment they did not verify, and never map one:
 *  - opened with O_NONBLOCK | O_NOFOLLOW (a FIFO planted under our name
 *    cannot block the open, a symlink is refused), then fstat'ed: a regular
 *    file, owned by us, mode exactly 0600, at least a header long;
 *  - its header must name the pid its file name does (a copy is refused);
 *  - it is copied with pread, never mapped: a segment truncated under us
 *    reads short (and is skipped) instead of killing us with SIGBUS. The
 *    seqlock is kept with reads of `seq` before and after the values. */

static void copy_header(gm__mon_proc *p, const gm__shm_header *h) {
    p->pid = h->pid;
    p->source = h->source;
    p->start_time = h->start_time;
    memcpy(p->comm, h->comm, sizeof p->comm);
    p->comm[sizeof p->comm - 1] = '\0';
    memcpy(p->label, h->label, sizeof p->label);
    p->label[sizeof p->label - 1] = '\0';
    memcpy(p->visible, h->visible, sizeof p->visible);
    p->visible[sizeof p->visible - 1] = '\0';
    p->ndevices = h->ndevices;
}

static bool pread_full(int fd, void *buf, size_t n, off_t off) {
    return pread(fd, buf, n, off) == (ssize_t)n;
}

/* Copy record i under its seqlock from the file: GM_OK, GM_ESTATE if torn
 * after READ_TRIES, GM_EIO if the segment shrank. `first` is the record as
 * read with the whole segment a moment ago. */
static int read_record(int fd, off_t off, const gm__shm_record *first, gm__shm_values *out) {
    gm__shm_record r = *first;
    for (int i = 0; i < READ_TRIES; i++) {
        uint32_t s2;
        if (!(r.seq & 1)) {
            if (!pread_full(fd, &s2, sizeof s2, off)) return GM_EIO;
            if (s2 == r.seq) {
                *out = r.v;
                return GM_OK;
            }
        }
        uint32_t s1;
        if (!pread_full(fd, &s1, sizeof s1, off) || !pread_full(fd, &r, sizeof r, off)) return GM_EIO;
        r.seq = s1; /* the values were read after s1: check s1 is still current */
    }
    return GM_ESTATE;
}

/* fstat an open segment: GM_OK, or SEG_SKIP / SEG_STALE. */
static int check_fd(int fd, int pid, struct stat *st) {
    if (fstat(fd, st) != 0) return SEG_SKIP;
    if (!S_ISREG(st->st_mode) || st->st_uid != getuid() || (st->st_mode & 07777) != 0600)
        return SEG_SKIP; /* not ours, or not as the publisher makes it */
    if (st->st_size < GM__SHM_HEADER_SIZE) /* an empty segment of a dead pid was never finished */
        return st->st_size == 0 && !pid_exists(pid) ? SEG_STALE : SEG_SKIP;
    return GM_OK;
}

/* Verify and copy the segment open on fd into *p. */
static int read_fd(gm__mon_proc *p, int fd, int name_pid_v) {
    struct stat st;
    int rc = check_fd(fd, name_pid_v, &st);
    if (rc != GM_OK) return rc;
    /* 8.5 KiB: off the stack. Aligned for the header and records read in
     * place: a plain char array may land on any address (UBSan found it
     * misaligned in one build's TLS layout). */
    static _Thread_local _Alignas(16) char buf[GM__SHM_SIZE];
    size_t want = (size_t)st.st_size < sizeof buf ? (size_t)st.st_size : sizeof buf;
    ssize_t got = pread(fd, buf, want, 0);
    if (got < (ssize_t)GM__SHM_HEADER_SIZE) return SEG_SKIP; /* shrank since fstat */
    const gm__shm_header *h = (const gm__shm_header *)buf;
    if (h->magic != GM__SHM_MAGIC)
        return pid_exists(name_pid_v) ? SEG_SKIP /* still being created */ : SEG_STALE;
    if (h->version != GM__SHM_VERSION || h->header_size != GM__SHM_HEADER_SIZE ||
        h->record_size != GM__SHM_RECORD_SIZE || h->segment_size > (uint64_t)got ||
        h->ndevices > GM__SHM_DEVICES ||
        GM__SHM_HEADER_SIZE + (uint64_t)h->ndevices * h->record_size > (uint64_t)got)
        return SEG_SKIP;
    if (h->pid != name_pid_v || h->uid != (uint32_t)getuid())
        return SEG_SKIP; /* a copy under another name: its rows would be duplicates */
    copy_header(p, h);
    for (uint32_t i = 0; i < p->ndevices; i++) {
        off_t off = (off_t)GM__SHM_HEADER_SIZE + (off_t)i * GM__SHM_RECORD_SIZE;
        const gm__shm_record *r = (const gm__shm_record *)(buf + off);
        if (!r->used) continue;
        p->used[i] = true;
        int k = read_record(fd, off, r, &p->v[i]);
        if (k == GM_EIO) return SEG_SKIP; /* shrank while we read */
        p->torn[i] = k != GM_OK;
        if (p->torn[i]) memset(&p->v[i], 0, sizeof p->v[i]);
    }
    /* checked after the copy: a producer that died while we copied is gone */
    if (!alive(p->pid, p->start_time)) return SEG_STALE;
    return SEG_OK;
}

/* An open segment kept between scans (one open per segment, not per scan). */
typedef struct cache_entry {
    char name[256];
    ino_t ino;
    int fd;
    bool seen;
} cache_entry;

struct gm__shm_cache {
    cache_entry *e;
    int n, cap;
};

gm__shm_cache *gm__shm_cache_create(void) { return calloc(1, sizeof(gm__shm_cache)); }

static void drop_entry(gm__shm_cache *c, int i) {
    close(c->e[i].fd);
    c->e[i] = c->e[--c->n];
}

void gm__shm_cache_destroy(gm__shm_cache *c) {
    if (!c) return;
    while (c->n) drop_entry(c, c->n - 1);
    free(c->e);
    free(c);
}

/* Open `name` without blocking or following links: GM_OK with *fd and *ino,
 * SEG_SKIP/SEG_STALE as an int > 0. */
static int open_segment(const char *name, int pid, int *fd_out, ino_t *ino) {
    char path[300];
    snprintf(path, sizeof path, SHM_DIR "/%s", name);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return SEG_SKIP;
    struct stat st;
    int rc = check_fd(fd, pid, &st);
    if (rc != GM_OK) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    *ino = st.st_ino;
    return GM_OK;
}

static cache_entry *cache_get(gm__shm_cache *c, const char *name, ino_t ino, int pid, int *why) {
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->e[i].name, name)) continue;
        if (c->e[i].ino == ino) return &c->e[i];
        drop_entry(c, i); /* same name, new file: a new producer */
        break;
    }
    if (c->n == c->cap) {
        int ncap = c->cap ? 2 * c->cap : 16;
        cache_entry *ne = realloc(c->e, (size_t)ncap * sizeof *ne);
        if (!ne) {
            *why = SEG_SKIP;
            return NULL;
        }
        c->e = ne;
        c->cap = ncap;
    }
    cache_entry *e = &c->e[c->n];
    memset(e, 0, sizeof *e);
    if ((*why = open_segment(name, pid, &e->fd, &e->ino)) != GM_OK) return NULL;
    snprintf(e->name, sizeof e->name, "%s", name);
    c->n++;
    return e;
}

static int read_segment(gm__shm_cache *c, const char *name, ino_t ino, int pid, gm__mon_proc *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->shm_name, sizeof p->shm_name, "%s", name);
    if (c) {
        int why;
        cache_entry *e = cache_get(c, name, ino, pid, &why);
        if (!e) return why;
        e->seen = true;
        int r = read_fd(p, e->fd, pid);
        if (r != SEG_OK) drop_entry(c, (int)(e - c->e)); /* re-verified from scratch next time */
        return r;
    }
    int fd;
    int r = open_segment(name, pid, &fd, &ino);
    if (r != GM_OK) return r;
    r = read_fd(p, fd, pid);
    close(fd);
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
    char prefix[80];
    gm__shm_prefix(prefix, sizeof prefix);
    DIR *dir = opendir(SHM_DIR);
    if (!dir) return GM_OK; /* no /dev/shm: nobody can publish either */
    for (int i = 0; c && i < c->n; i++) c->e[i].seen = false;
    int cap = 0, rc = GM_OK;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        int pid = name_pid(e->d_name, prefix);
        if (pid < 0) continue;
        if ((rc = push(out, &cap)) != GM_OK) break;
        int r = read_segment(c, e->d_name, e->d_ino, pid, &out->procs[out->nprocs]);
        if (r == SEG_OK) out->nprocs++;
        else if (r == SEG_STALE) {
            if (clean) unlink_name(e->d_name);
            out->cleaned++;
        } else out->skipped++;
    }
    closedir(dir);
    for (int i = c ? c->n - 1 : -1; i >= 0; i--)
        if (!c->e[i].seen) drop_entry(c, i); /* unlinked by its producer */
    if (rc != GM_OK) gm__scan_result_free(out);
    return rc;
}

int gm__shm_scan(gm__scan_result *out, bool clean) { return gm__shm_scan_cached(NULL, out, clean); }

void gm__scan_result_free(gm__scan_result *r) {
    free(r->procs);
    memset(r, 0, sizeof *r);
}
