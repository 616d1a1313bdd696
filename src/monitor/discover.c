/* discover.c — the reader side of publication: find this user's segments in
 * /dev/shm, check that their producer still lives (same pid and same process
 * start time, so a reused pid is not mistaken for the producer), copy their
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

static void copy_records(gm__mon_proc *p, const char *base, uint32_t record_size) {
    for (uint32_t i = 0; i < p->ndevices; i++) {
        const gm__shm_record *r =
            (const gm__shm_record *)(base + GM__SHM_HEADER_SIZE + (size_t)i * record_size);
        if (!__atomic_load_n(&r->used, __ATOMIC_ACQUIRE)) continue;
        p->used[i] = true;
        p->torn[i] = gm__shm_read_record(r, &p->v[i], READ_TRIES) != GM_OK;
        if (p->torn[i]) memset(&p->v[i], 0, sizeof p->v[i]);
    }
}

/* Validate a mapped segment and copy it into *p. */
static int read_mapped(gm__mon_proc *p, const char *m, size_t size, int name_pid_v) {
    const gm__shm_header *h = (const gm__shm_header *)m;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != GM__SHM_MAGIC)
        return pid_exists(name_pid_v) ? SEG_SKIP /* still being created */ : SEG_STALE;
    if (h->version != GM__SHM_VERSION || h->header_size != GM__SHM_HEADER_SIZE ||
        h->record_size < sizeof(gm__shm_record) || h->segment_size > size ||
        h->ndevices > GM__SHM_DEVICES ||
        GM__SHM_HEADER_SIZE + (uint64_t)h->ndevices * h->record_size > size)
        return SEG_SKIP;
    copy_header(p, h);
    copy_records(p, m, h->record_size);
    /* checked after the copy: a producer that died while we copied is gone */
    if (!alive(p->pid, p->start_time)) return SEG_STALE;
    return SEG_OK;
}

/* A mapping kept between scans: a monitor sampling every 100 ms must not map
 * and unmap every segment each time (munmap costs a TLB shootdown). */
typedef struct cache_entry {
    char name[256];
    ino_t ino;
    size_t size;
    void *map;
    bool seen;
} cache_entry;

struct gm__shm_cache {
    cache_entry *e;
    int n, cap;
};

gm__shm_cache *gm__shm_cache_create(void) { return calloc(1, sizeof(gm__shm_cache)); }

static void drop_entry(gm__shm_cache *c, int i) {
    munmap(c->e[i].map, c->e[i].size);
    c->e[i] = c->e[--c->n];
}

void gm__shm_cache_destroy(gm__shm_cache *c) {
    if (!c) return;
    while (c->n) drop_entry(c, c->n - 1);
    free(c->e);
    free(c);
}

/* Map `name`: GM_OK with *map and *size, SEG_SKIP/SEG_STALE as an int > 0. */
static int map_segment(const char *name, int pid, void **map, size_t *size, ino_t *ino) {
    char path[300];
    snprintf(path, sizeof path, "/%s", name);
    int fd = shm_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return SEG_SKIP;
    struct stat st = {0};
    if (fstat(fd, &st) != 0 || st.st_uid != getuid() || st.st_size < GM__SHM_HEADER_SIZE) {
        close(fd);
        /* an empty segment of a dead pid was never finished */
        return st.st_size == 0 && !pid_exists(pid) ? SEG_STALE : SEG_SKIP;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return SEG_SKIP;
    *map = m;
    *size = (size_t)st.st_size;
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
    if ((*why = map_segment(name, pid, &e->map, &e->size, &e->ino)) != GM_OK) return NULL;
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
        int r = read_mapped(p, e->map, e->size, pid);
        if (r == SEG_STALE) drop_entry(c, (int)(e - c->e));
        return r;
    }
    void *m;
    size_t size;
    int r = map_segment(name, pid, &m, &size, &ino);
    if (r != GM_OK) return r;
    r = read_mapped(p, m, size, pid);
    munmap(m, size);
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
