/* collect.c — the collector shared by every view: one sample joins NVML's
 * devices and per-process used memory with the allocator numbers published
 * in shared memory, one row per (process, GPU). The sampler runs the
 * collector on its own thread and keeps the latest sample, so a slow view
 * (a terminal, an HTTP scrape) never delays sampling and vice versa. */
#define _GNU_SOURCE /* pthread_timedjoin_np */
#include "internal.h"
#include "monitor/monitor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct gm__collector {
    gm__nvml *nvml; /* NULL without NVML */
    gm__shm_cache *cache;
    bool all_users;
    char note[192];
};

void gm__collector_all_users(gm__collector *c, bool on) {
    c->all_users = on;
    gm__shm_cache_all_users(c->cache, on);
}

int gm__collector_create(gm__collector **out, const gm__nvml_fns *fns, bool try_nvml) {
    gm__collector *c = calloc(1, sizeof *c);
    if (!c || !(c->cache = gm__shm_cache_create())) {
        free(c);
        return GM_ENOHOSTMEM;
    }
    if (try_nvml) gm__nvml_open(&c->nvml, fns, c->note, sizeof c->note);
    else snprintf(c->note, sizeof c->note, "NVML not used: showing allocator data only");
    *out = c;
    return GM_OK;
}

void gm__collector_destroy(gm__collector *c) {
    if (!c) return;
    gm__nvml_close(c->nvml);
    gm__shm_cache_destroy(c->cache);
    free(c);
}

void gm__sample_free(gm__mon_sample *s) {
    free(s->devs);
    free(s->rows);
    memset(s, 0, sizeof *s);
}

int gm__sample_copy(gm__mon_sample *dst, const gm__mon_sample *src) {
    *dst = *src;
    dst->devs = malloc((size_t)(src->ndevices ? src->ndevices : 1) * sizeof *dst->devs);
    dst->rows = malloc((size_t)(src->nrows ? src->nrows : 1) * sizeof *dst->rows);
    if (!dst->devs || !dst->rows) {
        gm__sample_free(dst);
        return GM_ENOHOSTMEM;
    }
    if (src->ndevices) memcpy(dst->devs, src->devs, (size_t)src->ndevices * sizeof *dst->devs);
    if (src->nrows) memcpy(dst->rows, src->rows, (size_t)src->nrows * sizeof *dst->rows);
    return GM_OK;
}

/* CUDA device index of a producer -> NVML index, through the producer's
 * CUDA_VISIBLE_DEVICES (indices or UUIDs); identity when unset or unknown. */
static int map_device(const char *visible, int cuda_index, const gm__mon_sample *s) {
    if (!visible[0]) return cuda_index;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", visible);
    int i = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), i++) {
        if (i != cuda_index) continue;
        while (*tok == ' ') tok++;
        if (!strncmp(tok, "GPU-", 4) || !strncmp(tok, "MIG-", 4)) {
            for (int d = 0; d < s->ndevices; d++)
                if (s->devs[d].uuid[0] && !strncmp(s->devs[d].uuid, tok, strlen(tok))) return d;
            return cuda_index;
        }
        char *end;
        long v = strtol(tok, &end, 10);
        return end != tok && v >= 0 && v < GM_MAX_DEVICES ? (int)v : cuda_index;
    }
    return cuda_index;
}

static int add_row(gm__mon_sample *s, int *cap, gm__mon_row **out) {
    if (s->nrows == *cap) {
        int ncap = *cap ? *cap * 2 : 32;
        gm__mon_row *nr = realloc(s->rows, (size_t)ncap * sizeof *nr);
        if (!nr) return GM_ENOHOSTMEM;
        s->rows = nr;
        *cap = ncap;
    }
    *out = &s->rows[s->nrows++];
    memset(*out, 0, sizeof **out);
    return GM_OK;
}

static int collect_devices(gm__collector *c, gm__mon_sample *s) {
    int n = 0;
    if (c->nvml && gm__nvml_device_count(c->nvml, &n) != GM_OK) n = 0;
    s->devs = calloc((size_t)(n ? n : 1), sizeof *s->devs);
    if (!s->devs) return GM_ENOHOSTMEM;
    s->ndevices = n;
    for (int i = 0; i < n; i++) gm__nvml_device(c->nvml, i, &s->devs[i]);
    return GM_OK;
}

/* Devices known only from producers (no NVML): entries without NVML data. */
static int ensure_device(gm__mon_sample *s, int index) {
    if (index < s->ndevices) return GM_OK;
    gm__mon_dev *nd = realloc(s->devs, (size_t)(index + 1) * sizeof *nd);
    if (!nd) return GM_ENOHOSTMEM;
    for (int i = s->ndevices; i <= index; i++) {
        memset(&nd[i], 0, sizeof nd[i]);
        nd[i].index = i;
    }
    s->devs = nd;
    s->ndevices = index + 1;
    return GM_OK;
}

static int collect_producers(gm__collector *c, gm__mon_sample *s, int *cap) {
    gm__scan_result scan;
    int rc = gm__shm_scan_cached(c->cache, &scan, true);
    if (rc != GM_OK) return rc;
    s->nproducers = scan.nprocs;
    s->cleaned = scan.cleaned;
    memcpy(s->skipped_by, scan.skipped_by, sizeof s->skipped_by);
    for (int i = 0; i < scan.nprocs && rc == GM_OK; i++) {
        const gm__mon_proc *p = &scan.procs[i];
        for (uint32_t d = 0; d < p->ndevices && rc == GM_OK; d++) {
            if (!p->used[d]) continue;
            gm__mon_row *r;
            int dev = map_device(p->visible, (int)d, s);
            if ((rc = ensure_device(s, dev)) != GM_OK || (rc = add_row(s, cap, &r)) != GM_OK) break;
            r->pid = p->pid;
            r->ns_pid = p->ns_pid;
            /* the host pid until NVML's join says more: ours in the host
             * view, else what the publisher knew of itself */
            r->host_pid = s->host_view ? p->pid : p->host_pid;
            r->pid_map = r->host_pid > 0 ? GM_PIDMAP_EXACT : GM_PIDMAP_NONE;
            r->id = p->id;
            r->device = dev;
            r->source = p->source;
            memcpy(r->comm, p->comm, sizeof r->comm);
            memcpy(r->label, p->label, sizeof r->label);
            r->torn = p->torn[d];
            r->held = p->held[d];
            r->have_alloc = !p->torn[d];
            r->v = p->v[d];
            r->have_uid = true;
            r->uid = p->uid;
            r->have_step = p->have_step[d];
            r->step = p->step[d];
            /* no NVML for this device: its size as the allocator's backend
             * reports it (a simulated device, or NVML absent) */
            gm__mon_dev *dv = &s->devs[dev];
            if (!dv->have_mem && r->have_alloc && p->v[d].device_total > 0 &&
                (uint64_t)p->v[d].device_total > dv->total) {
                dv->total = (uint64_t)p->v[d].device_total;
                dv->have_alloc_total = true;
            }
        }
    }
    gm__scan_result_free(&scan);
    return rc;
}

/* A row for a process NVML sees and nobody publishes for: in the host view
 * its pid is ours and /proc names it; from inside a PID namespace the pid is
 * NVML's and /proc here may hold another process under that number, so it
 * is not looked up. */
static int nvml_only_row(gm__mon_sample *s, int *cap, int device, const gm__nvml_proc *p, int how,
                         gm__mon_row **out) {
    gm__mon_row *r;
    if (add_row(s, cap, &r) != GM_OK) return GM_ENOHOSTMEM;
    r->pid = p->pid;
    r->device = device;
    r->pid_map = how;
    r->host_pid = how == GM_PIDMAP_EXACT ? p->pid : 0;
    gm__ident_unknown(&r->id);
    if (how == GM_PIDMAP_EXACT) gm__proc_comm(r->pid, r->comm, sizeof r->comm);
    snprintf(r->label, sizeof r->label, "%s", how == GM_PIDMAP_EXACT ? r->comm : "?");
    *out = r;
    return GM_OK;
}

/* NVML's per-process used memory joins the producer rows (pidmap.c says
 * which is which, exactly or by inference); processes that do not publish
 * (plain PyTorch, anything else) get rows of their own. */
static int collect_nvml_procs(gm__collector *c, gm__mon_sample *s, int *cap, int nvml_devs) {
    int rc = GM_OK;
    for (int d = 0; d < nvml_devs && rc == GM_OK; d++) {
        gm__nvml_proc *np;
        int n;
        if (gm__nvml_processes(c->nvml, d, &np, &n) != GM_OK) continue;
        int *row_of = malloc((size_t)(n ? n : 1) * 2 * sizeof *row_of);
        if (!row_of) {
            free(np);
            return GM_ENOHOSTMEM;
        }
        int *how = row_of + n, nrows = s->nrows; /* only the published rows are candidates */
        gm__pidmap_match(s->rows, nrows, d, np, n, s->host_view, row_of, how);
        for (int i = 0; i < n && rc == GM_OK; i++) {
            gm__mon_row *r = row_of[i] >= 0 ? &s->rows[row_of[i]] : NULL;
            if (r) {
                r->host_pid = np[i].pid;
                r->pid_map = how[i];
            } else rc = nvml_only_row(s, cap, d, &np[i], how[i], &r);
            if (rc == GM_OK) {
                r->have_nvml_used = np[i].have_used;
                r->nvml_used = np[i].used;
            }
        }
        free(row_of);
        free(np);
    }
    return rc;
}

void gm__ident_unknown(gm__mon_ident *id) {
    memset(id, 0, sizeof *id);
#define GM__UNKNOWN_STR(n)
#define GM__UNKNOWN_INT(n) id->n = -1;
#define GM__UNKNOWN(name, kind, help) GM__UNKNOWN_##kind(name)
    GM_MON_IDENTITY(GM__UNKNOWN)
#undef GM__UNKNOWN
#undef GM__UNKNOWN_STR
#undef GM__UNKNOWN_INT
}

/* Grouped by job (rows without a run id last), then rank, device, pid. */
static int row_cmp(const void *a, const void *b) {
    const gm__mon_row *x = a, *y = b;
    bool xj = x->id.run_id[0] != '\0', yj = y->id.run_id[0] != '\0';
    if (xj != yj) return xj ? -1 : 1;
    int c = strcmp(x->id.run_id, y->id.run_id);
    if (c) return c;
    if (x->id.rank != y->id.rank) return x->id.rank < y->id.rank ? -1 : 1;
    if (x->device != y->device) return x->device < y->device ? -1 : 1;
    return x->pid < y->pid ? -1 : x->pid > y->pid;
}

int gm__collector_sample(gm__collector *c, gm__mon_sample *s) {
    memset(s, 0, sizeof *s);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s->time_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    s->nvml = c->nvml != NULL;
    s->all_users = c->all_users;
    const char *node = getenv("NODE_NAME");
    if (node && *node) snprintf(s->hostname, sizeof s->hostname, "%s", node);
    else if (gethostname(s->hostname, sizeof s->hostname) != 0) s->hostname[0] = '\0';
    s->hostname[sizeof s->hostname - 1] = '\0';
    s->host_view = gm__procfs_is_init();
    int cap = 0, rc = collect_devices(c, s);
    int nvml_devs = s->ndevices;
    if (rc == GM_OK) rc = collect_producers(c, s, &cap);
    if (rc == GM_OK && c->nvml) rc = collect_nvml_procs(c, s, &cap, nvml_devs);
    if (rc != GM_OK) {
        gm__sample_free(s);
        return rc;
    }
    if (c->nvml && gm__nvml_mem_v1_fallback(c->nvml)) {
        s->nvml_mem_v1 = true;
        snprintf(s->nvml_note, sizeof s->nvml_note,
                 "nvmlDeviceGetMemoryInfo_v2 unavailable: using v1, reserved memory is counted in used");
    } else if (!c->nvml) snprintf(s->nvml_note, sizeof s->nvml_note, "%s", c->note);
    if (s->nrows > 1) qsort(s->rows, (size_t)s->nrows, sizeof *s->rows, row_cmp);
    return GM_OK;
}

/* ---- sampler thread ------------------------------------------------------ */

struct gm__sampler {
    gm__collector *c;
    double interval;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled on a new sample and on stop */
    bool stop;
    uint64_t seq;
    gm__mon_sample latest;
};

static struct timespec deadline_after(double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_nsec + seconds * 1e9;
    ts.tv_sec += (time_t)(t / 1e9);
    ts.tv_nsec = (long)(t - (double)(time_t)(t / 1e9) * 1e9);
    return ts;
}

static void *sampler_main(void *arg) {
    gm__sampler *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        pthread_mutex_unlock(&s->mu);
        gm__mon_sample fresh;
        int rc = gm__collector_sample(s->c, &fresh);
        pthread_mutex_lock(&s->mu);
        if (rc == GM_OK) {
            gm__sample_free(&s->latest);
            s->latest = fresh;
            s->seq++;
            pthread_cond_broadcast(&s->cv);
        }
        struct timespec dl = deadline_after(s->interval);
        while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &dl) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int gm__sampler_start(gm__sampler **out, gm__collector *c, double interval_s) {
    gm__sampler *s = calloc(1, sizeof *s);
    if (!s) return GM_ENOHOSTMEM;
    s->c = c;
    s->interval = interval_s > 0.001 ? interval_s : 0.001;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->thread, NULL, sampler_main, s) != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return GM_ENOHOSTMEM;
    }
    *out = s;
    return GM_OK;
}

int gm__sampler_latest(gm__sampler *s, gm__mon_sample *out, uint64_t *seqno, uint64_t after, double timeout_s) {
    pthread_mutex_lock(&s->mu);
    if (timeout_s > 0) {
        struct timespec dl = deadline_after(timeout_s);
        while (s->seq <= after && !s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &dl) != ETIMEDOUT) {
        }
    }
    int rc = GM_ESTATE;
    if (s->seq > 0) rc = gm__sample_copy(out, &s->latest);
    if (seqno) *seqno = s->seq;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

bool gm__sampler_stop_within(gm__sampler *s, double seconds) {
    if (!s) return true;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl); /* pthread_timedjoin_np's clock */
    double t = (double)dl.tv_nsec + seconds * 1e9;
    dl.tv_sec += (time_t)(t / 1e9);
    dl.tv_nsec = (long)(t - (double)(time_t)(t / 1e9) * 1e9);
    if (pthread_timedjoin_np(s->thread, NULL, &dl) != 0) {
        pthread_detach(s->thread);
        return false;
    }
    gm__sample_free(&s->latest);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return true;
}

void gm__sampler_stop(gm__sampler *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    gm__sample_free(&s->latest);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
