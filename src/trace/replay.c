/* replay.c — replays a trace's allocation stream through an allocator on
 * the sim backend, to predict what a policy and configuration would reserve.
 *
 * Compilation resolves every free to the alloc it frees once (trace
 * addresses -> slot numbers), so a run is a tight loop over a flat array
 * and `tune` can run many configurations over one compiled program. The
 * trace starts from an empty allocator, so alloc + free_completed in order
 * is exactly the input torch's allocator saw (free_requested only marks when
 * the tensor died; memory becomes reusable at free_completed). */
#include "trace.h"

#include "util/idmap.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OP_FREE 0x80000000u

typedef struct rop {
    uint64_t size;
    uint64_t stream;
    uint32_t slot;
    uint32_t ev; /* event index within the device; OP_FREE bit for frees */
} rop;

struct gm_replay_prog {
    rop *ops;
    size_t nops;
    uint32_t nslots;
    uint64_t events, unknown_frees, double_allocs, bad_events;
    char bad_first[160]; /* what the first bad event was */
    int64_t trace_peak_requested;
    /* segment_alloc (size, addr) in order: the sim places a new segment of
     * that size where the real one was, so best-fit ties between blocks of
     * equal size break by address as they did on the device */
    uint64_t *hint_size, *hint_addr;
    size_t nhints;
    /* private pools (CUDA graphs, MemPools): the distinct nonzero
     * segment_pool_ids of the device's final segments, and for each op
     * 1 + the pool its alloc goes to (0: the device's own); NULL when the
     * trace has no pool */
    uint64_t (*pools)[2];
    uint32_t npools;
    uint16_t *op_pool;
};

/* An event the replay cannot take as it is: counted, the first described,
 * and skipped (like unknown frees), so one bad event does not hide the rest
 * of the trace and a size that would wrap never reaches an allocator. */
static void bad_event(gm_replay_prog *p, size_t i, const char *what, uint64_t size, uint64_t addr) {
    if (!p->bad_events++)
        snprintf(p->bad_first, sizeof p->bad_first, "event %zu: %s (size %llu, address 0x%llx)", i,
                 what, (unsigned long long)size, (unsigned long long)addr);
}

#define SKIPPED_SLOT UINT64_MAX /* sizes[] of an alloc skipped as bad */

/* The device's pools, from its final segments: p->pools, p->op_pool. */
static int collect_pools(gm_replay_prog *p, const gm_trace *t, int device, size_t n) {
    for (size_t i = 0; i < t->nsegments; i++) {
        const gm_trace_segment *s = &t->segments[i];
        if (s->device != device || (!s->pool_id[0] && !s->pool_id[1])) continue;
        uint32_t k = 0;
        while (k < p->npools && (p->pools[k][0] != s->pool_id[0] || p->pools[k][1] != s->pool_id[1])) k++;
        if (k < p->npools) continue;
        if (p->npools == UINT16_MAX) return gm__set_error(GM_EINVAL, "trace has more private pools than gpumem keeps");
        uint64_t(*np)[2] = realloc(p->pools, (p->npools + 1) * sizeof *np);
        if (!np) return GM_ENOHOSTMEM;
        p->pools = np;
        p->pools[p->npools][0] = s->pool_id[0];
        p->pools[p->npools++][1] = s->pool_id[1];
    }
    if (p->npools && !(p->op_pool = calloc(n ? n : 1, sizeof *p->op_pool))) return GM_ENOHOSTMEM;
    return GM_OK;
}

/* 1 + the pool whose final segment holds addr on the device, or 0. */
static uint16_t pool_of(const gm_replay_prog *p, const gm_trace *t, int device, uint64_t addr) {
    for (size_t i = 0; i < t->nsegments; i++) {
        const gm_trace_segment *s = &t->segments[i];
        if (s->device != device || (!s->pool_id[0] && !s->pool_id[1])) continue;
        if (addr < s->address || addr - s->address >= s->total_size) continue;
        for (uint32_t k = 0; k < p->npools; k++)
            if (p->pools[k][0] == s->pool_id[0] && p->pools[k][1] == s->pool_id[1]) return (uint16_t)(k + 1);
    }
    return 0;
}

static int compile_events(gm_replay_prog *p, const gm_trace_event *ev, size_t n, int free_action) {
    gm__idmap m = {0}; /* address -> slot */
    int rc = gm__idmap_reserve(&m, 1024);
    uint64_t *sizes = NULL; /* requested bytes per slot, for the trace's own peak */
    size_t sizes_cap = 0;
    /* live requested bytes: each size is at most GM_LIMIT_ALLOC_BYTES (2^50)
     * and there are fewer than 2^32 slots, so this sum cannot overflow */
    uint64_t cur = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const gm_trace_event *e = &ev[i];
        if (e->action == GM_TA_ALLOC) {
            if ((rc = gm__idmap_reserve(&m, 1024))) break;
            if (p->nslots == UINT32_MAX - 1 || i >= OP_FREE) {
                rc = gm__set_error(GM_EINVAL, "trace too long to replay");
                break;
            }
            size_t j = gm__idmap_find(&m, e->addr);
            if (m.id[j] != GM__IDMAP_EMPTY) {
                p->double_allocs++; /* the old one is never freed */
                m.id[j] = p->nslots;
            } else {
                gm__idmap_set(&m, j, e->addr, p->nslots);
            }
            if (p->nslots >= sizes_cap) {
                sizes_cap = sizes_cap ? sizes_cap * 2 : 1024;
                uint64_t *ns = realloc(sizes, sizes_cap * sizeof *ns);
                if (!ns) {
                    rc = GM_ENOHOSTMEM;
                    break;
                }
                sizes = ns;
            }
            if (e->size > GM_LIMIT_ALLOC_BYTES) {
                bad_event(p, i, "alloc larger than GM_LIMIT_ALLOC_BYTES", e->size, e->addr);
                sizes[p->nslots++] = SKIPPED_SLOT; /* its free is skipped too */
                continue;
            }
            sizes[p->nslots] = e->size;
            cur += e->size;
            if (cur > (uint64_t)p->trace_peak_requested) p->trace_peak_requested = (int64_t)cur;
            p->ops[p->nops++] = (rop){e->size, e->stream, p->nslots++, (uint32_t)i};
        } else if (e->action == free_action) {
            size_t j = gm__idmap_find(&m, e->addr);
            if (m.id[j] == GM__IDMAP_EMPTY) {
                p->unknown_frees++;
                continue;
            }
            uint32_t slot = m.id[j];
            gm__idmap_del(&m, j);
            if (sizes[slot] == SKIPPED_SLOT) continue;
            cur -= sizes[slot];
            p->ops[p->nops++] = (rop){sizes[slot], e->stream, slot, (uint32_t)i | OP_FREE};
        }
    }
    free(sizes);
    gm__idmap_free(&m);
    return rc;
}

/* A segment the sim can place where the trace says it was: a non-zero
 * size under the limit at a non-zero 2 MiB-aligned address. */
static const char *bad_segment(const gm_trace_event *e) {
    if (e->size == 0) return "segment_alloc of 0 bytes";
    if (e->size > GM_LIMIT_ALLOC_BYTES) return "segment_alloc larger than GM_LIMIT_ALLOC_BYTES";
    if (e->addr == 0) return "segment_alloc at address 0";
    if (e->addr % (2 * GM__MIB)) return "segment_alloc at an address not 2 MiB-aligned";
    if (e->addr + e->size < e->addr) return "segment_alloc past the end of the address space";
    return NULL;
}

static int collect_hints(gm_replay_prog *p, const gm_trace_event *ev, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ev[i].action == GM_TA_SEGMENT_ALLOC;
    if (!k) return GM_OK;
    p->hint_size = malloc(k * sizeof *p->hint_size);
    p->hint_addr = malloc(k * sizeof *p->hint_addr);
    if (!p->hint_size || !p->hint_addr) return GM_ENOHOSTMEM;
    for (size_t i = 0; i < n; i++)
        if (ev[i].action == GM_TA_SEGMENT_ALLOC) {
            const char *why = bad_segment(&ev[i]);
            if (why) {
                bad_event(p, i, why, ev[i].size, ev[i].addr);
                continue;
            }
            p->hint_size[p->nhints] = ev[i].size;
            p->hint_addr[p->nhints++] = ev[i].addr;
        }
    return GM_OK;
}

int gm_replay_compile(const gm_trace *t, int device, gm_replay_prog **out) {
    *out = NULL;
    if (device < 0 || device >= t->ndevices)
        return gm__set_error(GM_EDEVICE, "the trace has no device %d (it has %d)", device,
                             t->ndevices);
    const gm_trace_event *ev = t->events ? t->events + t->dev_off[device] : NULL;
    size_t n = t->dev_off[device + 1] - t->dev_off[device];
    gm_replay_prog *p = calloc(1, sizeof *p);
    if (!p || !(p->ops = malloc((n ? n : 1) * sizeof *p->ops))) {
        free(p);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory compiling a replay");
    }
    p->events = n;
    /* old snapshots record no free_completed: then free_requested is the free */
    int free_action = GM_TA_FREE_COMPLETED;
    bool any_completed = false, any_requested = false;
    for (size_t i = 0; i < n; i++) {
        any_completed |= ev[i].action == GM_TA_FREE_COMPLETED;
        any_requested |= ev[i].action == GM_TA_FREE_REQUESTED;
    }
    if (!any_completed && any_requested) free_action = GM_TA_FREE_REQUESTED;
    int rc = collect_hints(p, ev, n);
    if (!rc) rc = collect_pools(p, t, device, n);
    if (!rc) rc = compile_events(p, ev, n, free_action);
    for (size_t i = 0; !rc && p->op_pool && i < p->nops; i++)
        if (!(p->ops[i].ev & OP_FREE)) p->op_pool[i] = pool_of(p, t, device, ev[p->ops[i].ev].addr);
    if (rc) {
        gm_replay_prog_free(p);
        return rc == GM_ENOHOSTMEM ? gm__set_error(rc, "out of host memory compiling a replay") : rc;
    }
    *out = p;
    return GM_OK;
}

void gm_replay_prog_free(gm_replay_prog *p) {
    if (!p) return;
    free(p->ops);
    free(p->hint_size);
    free(p->hint_addr);
    free(p->pools);
    free(p->op_pool);
    free(p);
}

size_t gm_replay_prog_ops(const gm_replay_prog *p) { return p->nops; }
int64_t gm_replay_prog_peak_requested(const gm_replay_prog *p) { return p->trace_peak_requested; }
uint32_t gm_replay_prog_pools(const gm_replay_prog *p) { return p->npools; }
uint64_t gm_replay_prog_bad_events(const gm_replay_prog *p, const char **first) {
    if (first) *first = p->bad_first;
    return p->bad_events;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const int gm_replay_sized_kinds[GM_REPLAY_SIZED] = {GM_BCALL_MALLOC, GM_BCALL_FREE,
                                                     GM_BCALL_PHYS_CREATE, GM_BCALL_PHYS_RELEASE,
                                                     GM_BCALL_MAP, GM_BCALL_UNMAP};
const char *const gm_replay_sized_names[GM_REPLAY_SIZED] = {"device_alloc", "device_free", "phys_create",
                                                            "phys_release", "map", "unmap"};

const char *const gm_replay_call_names[GM_REPLAY_CALL_KINDS] = {
#define GM__REPLAY_CALL_NAME(name, field) #name,
    GM_REPLAY_CALLS(GM__REPLAY_CALL_NAME)
#undef GM__REPLAY_CALL_NAME
};

void gm_replay_calls(const gm_replay_result *r, int64_t out[GM_REPLAY_CALL_KINDS]) {
    int k = 0;
#define GM__REPLAY_CALL_GET(name, field) out[k++] = r->field;
    GM_REPLAY_CALLS(GM__REPLAY_CALL_GET)
#undef GM__REPLAY_CALL_GET
}

static void fill_stats(gm_replay_result *r, const gm_stats *s) {
    r->peak_requested = s->requested_bytes[GM_POOL_ALL].peak;
    r->peak_allocated = s->allocated_bytes[GM_POOL_ALL].peak;
    r->peak_reserved = s->reserved_bytes[GM_POOL_ALL].peak;
    r->segments = s->segment[GM_POOL_ALL].allocated;
    r->num_alloc_retries = s->num_alloc_retries;
    r->num_ooms = s->num_ooms;
#define GM__REPLAY_CALL_COPY(name, field) r->field = s->field;
    GM_REPLAY_CALLS(GM__REPLAY_CALL_COPY)
#undef GM__REPLAY_CALL_COPY
}

/* The device calls of a replay so far, by kind (the steady-state split). */
static void calls_of(const gm_stats *s, int64_t out[GM_REPLAY_CALL_KINDS]) {
    int k = 0;
#define GM__REPLAY_CALL_STAT(name, field) out[k++] = s->field;
    GM_REPLAY_CALLS(GM__REPLAY_CALL_STAT)
#undef GM__REPLAY_CALL_STAT
}

/* The device's live statistics (replay is single-threaded: read without
 * the lock). Peaks are not reset at the split, because the gpumem policy
 * reads the requested peak to place blocks: the steady peaks are tracked
 * here instead, two loads per op. */
static const gm_stats *live_stats(gm_allocator *a) {
    gm__device *d = __atomic_load_n(&a->devices[0], __ATOMIC_ACQUIRE);
    return d ? &d->stats : NULL;
}

/* The whole run's peaks at the split: a peak that rises past them was
 * reached in the steady state (a transient inside one op included). */
typedef struct steady_ctx {
    int64_t res_peak0, req_peak0;
} steady_ctx;

/* At the first op of the steady state: the calls so far. */
static void steady_split(gm_allocator *a, gm_replay_result *r, steady_ctx *c) {
    const gm_stats *s = live_stats(a);
    gm_stats zero;
    memset(&zero, 0, sizeof zero);
    if (!s) s = &zero;
    calls_of(s, r->steady_calls);
    r->steady_peak_reserved = s->reserved_bytes[GM_POOL_ALL].current;
    r->steady_peak_requested = s->requested_bytes[GM_POOL_ALL].current;
    c->res_peak0 = s->reserved_bytes[GM_POOL_ALL].peak;
    c->req_peak0 = s->requested_bytes[GM_POOL_ALL].peak;
    r->steady_started = true;
}

static void steady_track(gm_allocator *a, gm_replay_result *r, const steady_ctx *c) {
    const gm_stats *s = live_stats(a);
    if (!s) return;
    int64_t res = s->reserved_bytes[GM_POOL_ALL].current, req = s->requested_bytes[GM_POOL_ALL].current;
    if (s->reserved_bytes[GM_POOL_ALL].peak > c->res_peak0) res = s->reserved_bytes[GM_POOL_ALL].peak;
    if (s->requested_bytes[GM_POOL_ALL].peak > c->req_peak0) req = s->requested_bytes[GM_POOL_ALL].peak;
    if (res > r->steady_peak_reserved) r->steady_peak_reserved = res;
    if (req > r->steady_peak_requested) r->steady_peak_requested = req;
}

static void run_ops(const gm_replay_prog *p, gm_allocator *a, gm_devptr *ptrs, gm_replay_result *r,
                    uint64_t steady_ev, steady_ctx *sc) {
    for (size_t i = 0; i < p->nops; i++) {
        const rop *o = &p->ops[i];
        int rc;
        if (r->steady_started) steady_track(a, r, sc);
        else if ((o->ev & ~OP_FREE) >= steady_ev) steady_split(a, r, sc);
        if (o->ev & OP_FREE) {
            gm_devptr ptr = ptrs[o->slot];
            if (!ptr) continue; /* a 0-byte allocation */
            rc = gm_free(a, ptr);
            r->frees++;
        } else {
            uint16_t pool = p->op_pool ? p->op_pool[i] : 0;
            if (pool)
                rc = gm_malloc_pool(a, 0, o->size, o->stream, p->pools[pool - 1][0], p->pools[pool - 1][1],
                                    &ptrs[o->slot]);
            else rc = gm_malloc(a, 0, o->size, o->stream, &ptrs[o->slot]);
            r->allocs++;
            if (rc == GM_ENOMEM) {
                r->oom = true;
                r->oom_event = o->ev;
                r->oom_size = o->size;
                snprintf(r->oom_detail, sizeof r->oom_detail, "%s", gm_last_error_detail());
                return;
            }
        }
        if (rc) {
            r->error = rc;
            snprintf(r->error_detail, sizeof r->error_detail, "event %u: %s: %s",
                     o->ev & ~OP_FREE, gm_strerror(rc), gm_last_error_detail());
            return;
        }
    }
}

int gm_replay_run(const gm_replay_prog *p, const gm_config *cfg, uint64_t capacity,
                  gm_replay_result *r) {
    return gm_replay_run_steady(p, cfg, capacity, GM_REPLAY_STEADY_FROM, r);
}

int gm_replay_run_steady(const gm_replay_prog *p, const gm_config *cfg, uint64_t capacity, double steady_from,
                         gm_replay_result *r) {
    memset(r, 0, sizeof *r);
    if (!(steady_from >= 0.0 && steady_from < 1.0))
        return gm__set_error(GM_EINVAL, "steady_from %g: want a fraction of the trace in [0, 1)", steady_from);
    r->steady_from = steady_from;
    r->events = p->events;
    r->unknown_frees = p->unknown_frees;
    r->double_allocs = p->double_allocs;
    r->bad_events = p->bad_events;
    r->private_pools = p->npools;
    snprintf(r->bad_first, sizeof r->bad_first, "%s", p->bad_first);
    r->trace_peak_requested = p->trace_peak_requested;
    gm_sim_options so;
    gm_sim_options_init(&so);
    if (capacity) so.capacity = capacity;
    gm_backend *be = NULL;
    gm_allocator *a = NULL;
    int rc = gm_sim_create(&be, &so);
    for (size_t i = 0; !rc && i < p->nhints; i++)
        rc = gm_sim_add_address_hint(be, 0, p->hint_size[i], p->hint_addr[i]);
    if (!rc) rc = gm__allocator_create(&a, be, cfg, NULL); /* a simulation: publishes nothing */
    if (!rc && cfg && cfg->per_process_memory_fraction < 1.0)
        rc = gm_set_memory_fraction(a, 0, cfg->per_process_memory_fraction);
    for (uint32_t k = 0; !rc && k < p->npools; k++) /* each pool held for the whole run, as its graph held it */
        rc = gm_pool_retain(a, 0, p->pools[k][0], p->pools[k][1]);
    gm_devptr *ptrs = rc ? NULL : calloc(p->nslots ? p->nslots : 1, sizeof *ptrs);
    if (!rc && !ptrs) rc = gm__set_error(GM_ENOHOSTMEM, "out of host memory for a replay");
    if (rc) {
        int keep = rc;
        char msg[256];
        snprintf(msg, sizeof msg, "%s", gm_last_error_detail());
        if (a) gm_allocator_destroy(a);
        if (be) gm_backend_destroy(be);
        return gm__set_error(keep, "cannot set up the replay: %s%s%s", gm_strerror(keep),
                             *msg ? ": " : "", msg);
    }
    double t0 = now_s();
    uint64_t steady_ev = (uint64_t)((double)p->events * steady_from);
    steady_ctx sc = {0, 0};
    run_ops(p, a, ptrs, r, steady_ev, &sc);
    if (r->steady_started && !r->oom && !r->error) steady_track(a, r, &sc); /* after the last op */
    r->seconds = now_s() - t0;
    gm_stats st = {.size = sizeof st};
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    if (gm_get_stats(a, 0, &st) == GM_OK) {
        fill_stats(r, &st);
        /* the steady state: from the split to the end (never reached: none) */
        int64_t end[GM_REPLAY_CALL_KINDS];
        calls_of(&st, end);
        for (int k = 0; k < GM_REPLAY_CALL_KINDS; k++) {
            r->steady_calls[k] = r->steady_started ? end[k] - r->steady_calls[k] : 0;
            r->steady_device_calls += r->steady_calls[k];
        }
    }
    for (int k = 0; k < GM_REPLAY_SIZED; k++)
        gm_sim_call_sizes(be, 0, gm_replay_sized_kinds[k], r->sized_n[k], r->sized_bytes[k]);
    free(ptrs);
    gm_allocator_destroy(a);
    gm_backend_destroy(be);
    return GM_OK;
}
