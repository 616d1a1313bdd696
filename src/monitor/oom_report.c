/* oom_report.c — OOM forensics: when an allocation runs out of
 * memory under `gpumem run --oom-report DIR` (GPUMEM_OOM_REPORT=DIR), the
 * process leaves in DIR a text report and a snapshot (a torch memory
 * snapshot pickle of the allocation history, which `gpumem report` and
 * pytorch.org/memory_viz read), then raises as it always does.
 *
 * The report gives a verdict, from the numbers at the moment of failure:
 *   S  bytes asked for;         F  device memory free (the driver's figure);
 *   R  reserved by this allocator, A of it allocated, U = R - A unallocated;
 *   O  = total - F - R: device memory held outside this allocator (the CUDA
 *      context, cuBLAS/cuDNN workspaces, NCCL buffers, other allocators,
 *      other processes).
 *  - fragmentation: S <= U + F. The bytes existed (in this allocator's cache
 *    and on the device) but not in one piece; the allocator had already
 *    released what it could. Fix: expandable segments / the gpumem policy,
 *    predicted saving U.
 *  - outside the allocator: otherwise, when O beyond a CUDA context's worth
 *    (GM_OOM_CONTEXT_BYTES) covers the shortfall S - (U + F). Fix: free it
 *    (NCCL_BUFFSIZE, the other allocator's empty_cache, the other process),
 *    predicted saving O - GM_OOM_CONTEXT_BYTES.
 *  - out of capacity: otherwise. The live tensors need the memory; the
 *    report gives the live bytes by category (gpumem.torch.track() tags
 *    them) and the allocator's own ranked changes (checkpointing, a smaller
 *    batch...; src/estimate/oom_explain.c), and the shortfall they must free.
 * The largest free block is the largest gap between live blocks inside the
 * allocator's segments. Everything is read through the public API after the
 * allocator has returned (no lock held), so this runs only on the failing
 * thread, at most GM_OOM_REPORTS_MAX times per process. */
#define _GNU_SOURCE
#include "internal.h"
#include "monitor/monitor.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A CUDA context with cuBLAS and cuDNN loaded holds under 1 GiB on an H200
 * (bench/RESULTS.md, "training memory estimator", measured the memory outside
 * the allocator):
 * memory outside the allocator beyond this much is counted as taken. */
#define GM_OOM_CONTEXT_BYTES ((uint64_t)1 << 30)
#define GM_OOM_REPORTS_MAX 16
#define GM_OOM_HISTORY_ENTRIES 262144

/* ---- the largest free block: gaps between live blocks in segments -------- */

typedef struct span {
    uint64_t lo, hi;
} span;

typedef struct spans {
    span *s;
    size_t n, cap;
    int64_t by_cat[GM_CAT_COUNT];
    int64_t untagged;
} spans;

static int push_span(spans *v, uint64_t lo, uint64_t hi) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? 2 * v->cap : 256;
        span *ns = realloc(v->s, nc * sizeof *ns);
        if (!ns) return 1;
        v->s = ns;
        v->cap = nc;
    }
    v->s[v->n++] = (span){lo, hi};
    return 0;
}

static int on_segment(const gm_segment_info *seg, void *arg) {
    return push_span(arg, seg->address, seg->address + seg->mapped_size);
}

static int on_block(const gm_block_info *b, void *arg) {
    spans *v = arg;
    int cat = b->category;
    if (cat >= 0 && cat < GM_CAT_COUNT) v->by_cat[cat] += (int64_t)b->size;
    else v->untagged += (int64_t)b->size;
    return push_span(v, b->address, b->address + b->size);
}

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The largest run inside a segment not covered by a block. Segments and
 * blocks are sorted together; a segment opens a window that blocks cover. */
static uint64_t largest_gap(span *seg, size_t nseg, span *blk, size_t nblk) {
    qsort(seg, nseg, sizeof *seg, span_cmp);
    qsort(blk, nblk, sizeof *blk, span_cmp);
    uint64_t best = 0;
    size_t j = 0;
    for (size_t i = 0; i < nseg; i++) {
        uint64_t at = seg[i].lo;
        while (j < nblk && blk[j].hi <= seg[i].lo) j++;
        for (size_t k = j; k < nblk && blk[k].lo < seg[i].hi; k++) {
            if (blk[k].lo > at && blk[k].lo - at > best) best = blk[k].lo - at;
            if (blk[k].hi > at) at = blk[k].hi;
        }
        if (seg[i].hi > at && seg[i].hi - at > best) best = seg[i].hi - at;
    }
    return best;
}

int gm__oom_gather(gm_allocator *a, int device, uint64_t size, gm__oom_facts *f) {
    memset(f, 0, sizeof *f);
    f->device = device;
    f->requested = size;
    gm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    if (gm_get_stats(a, device, &st) != GM_OK) return GM_EINVAL;
    f->allocated = st.allocated_bytes[GM_POOL_ALL].current;
    f->reserved = st.reserved_bytes[GM_POOL_ALL].current;
    gm_mem_get_info(a, device, &f->device_free, &f->device_total);
    const gm_config *c = gm_allocator_config(a);
    f->policy = c ? (int)c->policy : -1;
    f->expandable = c && c->expandable_segments;
    spans segs = {0}, blks = {0};
    if (gm_walk_segments(a, device, on_segment, &segs) == GM_OK && gm_walk_blocks(a, device, on_block, &blks) == GM_OK) {
        f->largest_free_block = largest_gap(segs.s, segs.n, blks.s, blks.n);
        f->have_blocks = true;
        memcpy(f->by_category, blks.by_cat, sizeof f->by_category);
        f->untagged = blks.untagged;
    }
    free(segs.s);
    free(blks.s);
    return GM_OK;
}

/* ---- the verdict ----------------------------------------------------------- */

static const char *const verdict_names[] = {"out of capacity", "fragmentation", "memory outside the allocator"};

const char *gm__oom_verdict_name(int v) { return v >= 0 && v < 3 ? verdict_names[v] : "?"; }

int gm__oom_verdict(const gm__oom_facts *f, uint64_t *saving, uint64_t *shortfall) {
    uint64_t R = f->reserved > 0 ? (uint64_t)f->reserved : 0, A = f->allocated > 0 ? (uint64_t)f->allocated : 0;
    uint64_t U = R > A ? R - A : 0, F = f->device_free, S = f->requested;
    uint64_t held = f->device_total > F ? f->device_total - F : 0;
    uint64_t O = held > R ? held - R : 0;
    *shortfall = S > U + F ? S - (U + F) : 0;
    if (!*shortfall) {
        *saving = U;
        return GM_OOM_FRAGMENTATION;
    }
    if (O > GM_OOM_CONTEXT_BYTES && O - GM_OOM_CONTEXT_BYTES >= *shortfall) {
        *saving = O - GM_OOM_CONTEXT_BYTES;
        return GM_OOM_OUTSIDE;
    }
    *saving = 0;
    return GM_OOM_CAPACITY;
}

/* ---- the text -------------------------------------------------------------- */

static const char *sz(int64_t v, char *buf) { return gm__format_bytes(v, buf, 32); }

/* The setting that addresses fragmentation under the policy in use. */
static const char *defrag_setting(const gm__oom_facts *f) {
    if (f->policy == GM_POLICY_TORCH && !f->expandable)
        return "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or GPUMEM_CONF=policy:gpumem)";
    if (f->policy == GM_POLICY_TORCH) return "GPUMEM_CONF=policy:gpumem";
    return "GPUMEM_CONF=gpumem_slack:0 (the gpumem policy then moves idle memory instead of holding it), "
           "or torch.cuda.empty_cache() before the large allocation";
}

void gm__oom_report_text(const gm__oom_facts *f, const gm__shm_header *who, const char *detail, const char *snapshot,
                         gm__sbuf *b) {
    char s1[32], s2[32], s3[32], s4[32], s5[32];
    uint64_t saving, shortfall;
    int v = gm__oom_verdict(f, &saving, &shortfall);
    int64_t U = f->reserved - f->allocated;
    uint64_t held = f->device_total > f->device_free ? f->device_total - f->device_free : 0;
    int64_t O = (int64_t)held - f->reserved;
    gm__sbuf_printf(b, "gpumem out-of-memory report\nverdict: %s\n\n", gm__oom_verdict_name(v));
    gm__sbuf_printf(b, "process: pid %d (%s)", who->pid, who->comm);
    if (who->run_id[0]) gm__sbuf_printf(b, ", run %s", who->run_id);
    if (who->rank >= 0) gm__sbuf_printf(b, ", rank %d", who->rank);
    if (who->world_size > 0) gm__sbuf_printf(b, " of %d", who->world_size);
    if (who->local_rank >= 0) gm__sbuf_printf(b, ", local rank %d", who->local_rank);
    gm__sbuf_printf(b, ", host %s\n", who->hostname);
    gm__sbuf_printf(b, "request: %s on device %d\n", sz((int64_t)f->requested, s1), f->device);
    gm__sbuf_printf(b, "device: %s total, %s free\n", sz((int64_t)f->device_total, s1), sz((int64_t)f->device_free, s2));
    const char *pol = gm_policy_name(f->policy);
    gm__sbuf_printf(b, "allocator (policy %s%s): %s reserved, %s allocated, %s reserved but unallocated\n",
                    pol ? pol : "?", f->expandable ? ", expandable segments" : "", sz(f->reserved, s1),
                    sz(f->allocated, s2), sz(U, s3));
    if (f->have_blocks) gm__sbuf_printf(b, "largest free block: %s\n", sz((int64_t)f->largest_free_block, s1));
    gm__sbuf_printf(b, "outside the allocator: %s (context, libraries, NCCL, other allocators and processes)\n",
                    sz(O > 0 ? O : 0, s1));
    if (f->have_blocks) {
        gm__sbuf_printf(b, "live bytes by category:");
        for (int k = 0; k < GM_CAT_COUNT; k++)
            if (f->by_category[k] > 0) gm__sbuf_printf(b, " %s %s;", gm_category_name(k), sz(f->by_category[k], s1));
        gm__sbuf_printf(b, " untagged %s%s\n", sz(f->untagged, s1),
                        f->untagged == f->allocated ? " (gpumem.torch.track(model, optimizer) tags parameters, "
                                                      "gradients and optimizer state)" : "");
    }
    gm__sbuf_printf(b, "\n");
    if (v == GM_OOM_FRAGMENTATION)
        gm__sbuf_printf(b, "why: %s were asked for; %s were free on the device and %s sat unused in this allocator's "
                           "segments, but no free piece was that large.\nwhat would have made it fit: %s: predicted "
                           "saving up to %s (enough: the allocation needed %s beyond the device's free memory).\n",
                        sz((int64_t)f->requested, s1), sz((int64_t)f->device_free, s2), sz(U, s3), defrag_setting(f),
                        sz((int64_t)saving, s4),
                        sz((int64_t)(f->requested > f->device_free ? f->requested - f->device_free : 0), s5));
    else if (v == GM_OOM_OUTSIDE)
        gm__sbuf_printf(b, "why: %s of the device is held outside this allocator, %s more than a CUDA context "
                           "needs; the allocation was short of %s.\nwhat would have made it fit: free the memory "
                           "held outside the allocator (another allocator in this process: its empty_cache(); NCCL: "
                           "NCCL_BUFFSIZE or fewer channels; another process on this GPU): predicted saving up to %s "
                           "(enough).\n",
                        sz(O, s1), sz((int64_t)saving, s2), sz((int64_t)shortfall, s3), sz((int64_t)saving, s4));
    else
        gm__sbuf_printf(b, "why: the live allocations need the memory: even without fragmentation and with only a "
                           "context outside the allocator, %s were missing.\nwhat would have made it fit: free %s "
                           "of live memory: a smaller batch ('gpumem estimate --fit batch' predicts the largest "
                           "that fits), activation checkpointing, lower precision; the allocator's ranked changes "
                           "follow.\n",
                        sz((int64_t)shortfall, s1), sz((int64_t)shortfall, s2));
    if (detail && *detail) gm__sbuf_printf(b, "\nthe allocator's explanation:\n%s\n", detail);
    if (snapshot) gm__sbuf_printf(b, "\nsnapshot: %s (torch memory snapshot: gpumem report, pytorch.org/memory_viz)\n",
                                  snapshot);
    else gm__sbuf_printf(b, "\nsnapshot: none (allocation history was not recorded)\n");
}

/* ---- files -----------------------------------------------------------------
 * DIR may be shared (two containers, both pid 1) and writable by others: a
 * name there is never predictable (pid, sequence number and 64 random bits),
 * never reused (O_CREAT|O_EXCL: an existing file, FIFO or link at the name is
 * left alone and another name tried), never followed (O_NOFOLLOW) and never
 * waited on (O_NONBLOCK). What could not be written is said on stderr by the
 * caller; the out-of-memory error goes back to the program either way. */

#define GM_OOM_NAME_TRIES 8

static int write_all(int fd, const void *p, size_t len) {
    const char *c = p;
    while (len) {
        ssize_t n = write(fd, c, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n < 0 ? errno : EIO;
        c += n;
        len -= (size_t)n;
    }
    return 0;
}

static int create_new(const char *path) {
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
}

static uint64_t name_bits(void) {
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) return r;
    struct timespec ts; /* no entropy yet (early boot): still unlikely to be guessed */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 32);
}

/* Create base.txt (and base.pickle when snap) as new files under a fresh
 * base name in dir; the paths in txt and pickle. GM_EIO with the reason. */
static int open_pair(const char *dir, int n, bool snap, char *txt, char *pickle, size_t len, int *fd_txt,
                     int *fd_snap, int *snap_errno) {
    int e = EEXIST;
    for (int t = 0; t < GM_OOM_NAME_TRIES && e == EEXIST; t++) {
        char base[PATH_MAX];
        int bl = snprintf(base, sizeof base, "%s/gpumem-oom-%d-%d-%016llx", dir, (int)getpid(), n,
                          (unsigned long long)name_bits());
        if (bl < 0 || (size_t)bl + 8 > len)
            return gm__set_error(GM_EIO, "the directory's path is too long for a report's name (%s)",
                                 strerror(ENAMETOOLONG));
        snprintf(txt, len, "%s.txt", base);
        snprintf(pickle, len, "%s.pickle", base);
        if ((*fd_txt = create_new(txt)) < 0) {
            e = errno;
            continue;
        }
        if (!snap || (*fd_snap = create_new(pickle)) >= 0) return GM_OK;
        if ((e = errno) != EEXIST) { /* the report is still written, without its snapshot */
            *snap_errno = e;
            return GM_OK;
        }
        close(*fd_txt);
        unlink(txt);
    }
    return gm__set_error(GM_EIO, "%s: %s", txt, strerror(e));
}

/* The snapshot into fd; on failure the file is removed and why goes to note. */
static bool write_snapshot(int fd, const char *path, gm__snapshot_fn snapshot, char *note, size_t len) {
    uint8_t *buf = NULL;
    size_t n = 0;
    int rc = snapshot(&buf, &n), e = rc ? 0 : write_all(fd, buf, n);
    free(buf);
    if (close(fd) != 0 && !rc && !e) e = errno;
    if (!rc && !e) return true;
    snprintf(note, len, "%s: %s", path, rc ? gm_last_error_detail() : strerror(e));
    unlink(path);
    return false;
}

int gm__oom_report_write(gm_allocator *a, int device, uint64_t size, const char *dir, const char *detail,
                         gm__snapshot_fn snapshot, char *path, size_t len, char *snap_note, size_t note_len) {
    static int seq;
    if (len) path[0] = '\0';
    if (note_len) snap_note[0] = '\0';
    int n = __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED);
    if (n >= GM_OOM_REPORTS_MAX) return GM_OK; /* enough evidence: a loop catching OOMs must not fill the disk */
    gm__oom_facts f;
    if (gm__oom_gather(a, device, size, &f) != GM_OK) return GM_EINVAL;
    gm__shm_header who;
    memset(&who, 0, sizeof who);
    who.pid = (int32_t)getpid();
    gm__proc_comm(0, who.comm, sizeof who.comm);
    gm__identity_fill(&who);
    char snap[PATH_MAX + 64];
    int fd = -1, fd_snap = -1;
    bool want_snap = snapshot && gm_history_enabled();
    int snap_errno = 0;
    int rc = open_pair(dir, n, want_snap, path, snap, len < sizeof snap ? len : sizeof snap, &fd, &fd_snap,
                       &snap_errno);
    if (rc != GM_OK) {
        if (len) path[0] = '\0';
        return rc;
    }
    if (snap_errno) snprintf(snap_note, note_len, "%s: %s", snap, strerror(snap_errno));
    bool have_snap = fd_snap >= 0 && write_snapshot(fd_snap, snap, snapshot, snap_note, note_len);
    gm__sbuf b = {0};
    gm__oom_report_text(&f, &who, detail, have_snap ? snap : NULL, &b);
    int e = b.oom ? ENOMEM : write_all(fd, b.p, b.len);
    gm__sbuf_free(&b);
    if (close(fd) != 0 && !e) e = errno;
    if (!e) return GM_OK;
    unlink(path); /* ours, and not whole */
    return gm__set_error(GM_EIO, "%s: %s", path, strerror(e));
}

int gm__oom_report_setup(void) {
    const char *dir = getenv("GPUMEM_OOM_REPORT");
    if (!dir || !*dir) return GM_OK;
    struct stat st;
    if (stat(dir, &st) != 0 && mkdir(dir, 0755) != 0 && errno != EEXIST)
        return gm__set_error(GM_EIO, "GPUMEM_OOM_REPORT=%s: cannot create it: %s", dir, strerror(errno));
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return gm__set_error(GM_EINVAL, "GPUMEM_OOM_REPORT=%s is not a directory", dir);
    /* the snapshot is the allocation history: record it from the start */
    return gm_history_enabled() ? GM_OK : gm_history_enable(GM_OOM_HISTORY_ENTRIES);
}

void gm__oom_report_from_env(gm_allocator *a, int device, uint64_t size, const char *detail,
                             gm__snapshot_fn snapshot) {
    const char *dir = getenv("GPUMEM_OOM_REPORT");
    if (!dir || !*dir || !a) return;
    char path[PATH_MAX + 64], note[PATH_MAX + 256];
    int rc = gm__oom_report_write(a, device, size, dir, detail, snapshot, path, sizeof path, note, sizeof note);
    if (note[0]) fprintf(stderr, "gpumem: out-of-memory snapshot not written: %s\n", note);
    if (rc == GM_OK && path[0]) fprintf(stderr, "gpumem: out-of-memory report written to %s\n", path);
    else if (rc != GM_OK)
        fprintf(stderr, "gpumem: out-of-memory report not written: %s (GPUMEM_OOM_REPORT=%s)\n",
                gm_last_error_detail(), dir);
}
