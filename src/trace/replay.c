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

/* The device's pools, from its final segments: p->pools (distinct ids, in
 * the order of their first segment) and seg_pool[i] (1 + the pool of
 * segment i, 0: not a pool segment of the device). Ids are found through a
 * keyed table, so the work is linear in the segments (a scan of the pools
 * per segment was quadratic). */
static int collect_pools(gm_replay_prog *p, const gm_trace *t, int device, uint32_t *seg_pool) {
    gm__idmap ids = {0}; /* hash of the pool id -> index into p->pools */
    uint32_t cap = 0;
    int rc = GM_OK;
    for (size_t i = 0; i < t->nsegments && !rc; i++) {
        const gm_trace_segment *s = &t->segments[i];
        seg_pool[i] = 0;
        if (s->device != device || (!s->pool_id[0] && !s->pool_id[1])) continue;
        if ((rc = gm__idmap_reserve(&ids, 64))) break;
        uint64_t h = gm__hash_bytes(s->pool_id, sizeof s->pool_id);
        size_t j = gm__idmap_home(&ids, h);
        for (; ids.id[j] != GM__IDMAP_EMPTY; j = gm__idmap_next(&ids, j)) {
            const uint64_t *q = p->pools[ids.id[j]];
            if (ids.key[j] == h && q[0] == s->pool_id[0] && q[1] == s->pool_id[1]) break;
        }
        if (ids.id[j] != GM__IDMAP_EMPTY) {
            seg_pool[i] = ids.id[j] + 1;
            continue;
        }
        if (p->npools == UINT16_MAX) {
            rc = gm__set_error(GM_EINVAL, "trace has more private pools than gpumem keeps");
            break;
        }
        if (p->npools == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t(*np)[2] = realloc(p->pools, cap * sizeof *np);
            if (!np) {
                rc = GM_ENOHOSTMEM;
                break;
            }
            p->pools = np;
        }
        p->pools[p->npools][0] = s->pool_id[0];
        p->pools[p->npools][1] = s->pool_id[1];
        gm__idmap_set(&ids, j, h, p->npools);
        seg_pool[i] = ++p->npools;
    }
    gm__idmap_free(&ids);
    return rc;
}

/* Which pool holds an address: the pool segments' ranges cut into disjoint
 * runs, each owned by the first segment (in the trace's order) that covers
 * it, as a scan of the segments in order would find; a lookup is a binary
 * search. */
typedef struct prange {
    uint64_t lo, hi; /* inclusive: a segment may end at the top of the address space */
    uint32_t seg;
} prange;

static int by_lo(const void *a, const void *b) {
    const prange *x = a, *y = b;
    gm__work_steps++;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->seg < y->seg ? -1 : x->seg > y->seg;
}

/* a min-heap of segment indexes (the covering segment that comes first) */
static void heap_push(prange *h, size_t *n, prange v) {
    size_t i = (*n)++;
    for (; i && h[(i - 1) / 2].seg > v.seg; i = (i - 1) / 2, gm__work_steps++) h[i] = h[(i - 1) / 2];
    h[i] = v;
}
static void heap_pop(prange *h, size_t *n) {
    prange v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].seg < h[c].seg) c++;
        if (h[c].seg >= v.seg) break;
        h[i] = h[c];
        i = c;
        gm__work_steps++;
    }
    if (*n) h[i] = v;
}

/* The runs of the n ranges r (sorted by lo): out (room for 2n), *nout. */
static void pool_runs(const prange *r, size_t n, prange *heap, prange *out, size_t *nout) {
    size_t hn = 0, next = 0, k = 0;
    uint64_t at = n ? r[0].lo : 0;
    for (;;) {
        while (next < n && r[next].lo <= at) heap_push(heap, &hn, r[next++]);
        while (hn && heap[0].hi < at) heap_pop(heap, &hn);
        if (!hn) {
            if (next == n) break;
            at = r[next].lo;
            continue;
        }
        /* heap[0] owns [at, end]: up to its end or the next start, whichever first */
        uint64_t end = heap[0].hi;
        if (next < n && r[next].lo - 1 < end) end = r[next].lo - 1;
        if (k && out[k - 1].seg == heap[0].seg && out[k - 1].hi + 1 == at) out[k - 1].hi = end;
        else out[k++] = (prange){at, end, heap[0].seg};
        if (end == UINT64_MAX) break;
        at = end + 1;
    }
    *nout = k;
}

/* p->op_pool for every alloc op (1 + its pool, 0: the device's own). */
static int assign_pools(gm_replay_prog *p, const gm_trace *t, const gm_trace_event *ev, const uint32_t *seg_pool) {
    size_t n = 0;
    for (size_t i = 0; i < t->nsegments; i++) n += seg_pool[i] && t->segments[i].total_size;
    prange *r = malloc((n ? n : 1) * 4 * sizeof *r);
    if (!r) return GM_ENOHOSTMEM;
    prange *heap = r + n, *runs = r + 2 * n;
    size_t k = 0, nruns = 0;
    for (size_t i = 0; i < t->nsegments; i++) {
        const gm_trace_segment *s = &t->segments[i];
        if (!seg_pool[i] || !s->total_size) continue;
        uint64_t hi = s->address + (s->total_size - 1);
        r[k++] = (prange){s->address, hi < s->address ? UINT64_MAX : hi, (uint32_t)i};
    }
    qsort(r, n, sizeof *r, by_lo);
    pool_runs(r, n, heap, runs, &nruns);
    for (size_t i = 0; i < p->nops; i++) {
        if (p->ops[i].ev & OP_FREE) continue;
        uint64_t addr = ev[p->ops[i].ev].addr;
        size_t lo = 0, hi = nruns; /* the last run that starts at or below addr */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            gm__work_steps++;
            if (runs[mid].lo <= addr) lo = mid + 1;
            else hi = mid;
        }
        p->op_pool[i] = lo && addr <= runs[lo - 1].hi ? (uint16_t)seg_pool[runs[lo - 1].seg] : 0;
    }
    free(r);
    return GM_OK;
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

/* k: the segment_allocs among the n events (counted by the caller's pass) */
static int collect_hints(gm_replay_prog *p, const gm_trace_event *ev, size_t n, size_t k) {
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

int gm__replay_compile(const gm_trace *t, int device, gm_replay_prog **out) {
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
    size_t segs = 0;
    for (size_t i = 0; i < n; i++) {
        any_completed |= ev[i].action == GM_TA_FREE_COMPLETED;
        any_requested |= ev[i].action == GM_TA_FREE_REQUESTED;
        segs += ev[i].action == GM_TA_SEGMENT_ALLOC;
    }
    if (!any_completed && any_requested) free_action = GM_TA_FREE_REQUESTED;
    uint32_t *seg_pool = malloc((t->nsegments ? t->nsegments : 1) * sizeof *seg_pool);
    int rc = seg_pool ? collect_hints(p, ev, n, segs) : GM_ENOHOSTMEM;
    if (!rc) rc = collect_pools(p, t, device, seg_pool);
    if (!rc && p->npools && !(p->op_pool = calloc(n ? n : 1, sizeof *p->op_pool))) rc = GM_ENOHOSTMEM;
    if (!rc) rc = compile_events(p, ev, n, free_action);
    if (!rc && p->op_pool) rc = assign_pools(p, t, ev, seg_pool);
    free(seg_pool);
    if (rc) {
        gm__replay_prog_free(p);
        return rc == GM_ENOHOSTMEM ? gm__set_error(rc, "out of host memory compiling a replay") : rc;
    }
    *out = p;
    return GM_OK;
}

void gm__replay_prog_free(gm_replay_prog *p) {
    if (!p) return;
    free(p->ops);
    free(p->hint_size);
    free(p->hint_addr);
    free(p->pools);
    free(p->op_pool);
    free(p);
}

size_t gm__replay_prog_ops(const gm_replay_prog *p) { return p->nops; }
int64_t gm__replay_prog_peak_requested(const gm_replay_prog *p) { return p->trace_peak_requested; }
uint32_t gm__replay_prog_pools(const gm_replay_prog *p) { return p->npools; }
uint32_t gm__replay_op_pool(const gm_replay_prog *p, size_t i) {
    return p->op_pool && i < p->nops ? p->op_pool[i] : 0;
}
uint64_t gm__replay_prog_bad_events(const gm_replay_prog *p, const char **first) {
    if (first) *first = p->bad_first;
    return p->bad_events;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const int gm__replay_sized_kinds[GM_REPLAY_SIZED] = {GM_BCALL_MALLOC, GM_BCALL_FREE,
                                                     GM_BCALL_PHYS_CREATE, GM_BCALL_PHYS_RELEASE,
                                                     GM_BCALL_MAP, GM_BCALL_UNMAP};
const char *const gm__replay_sized_names[GM_REPLAY_SIZED] = {"device_alloc", "device_free", "phys_create",
                                                            "phys_release", "map", "unmap"};

const char *const gm__replay_call_names[GM_REPLAY_CALL_KINDS] = {
#define GM__REPLAY_CALL_NAME(name, field) #name,
    GM_REPLAY_CALLS(GM__REPLAY_CALL_NAME)
#undef GM__REPLAY_CALL_NAME
};

void gm__replay_calls(const gm_replay_result *r, int64_t out[GM_REPLAY_CALL_KINDS]) {
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
    r->stream_waits = s->num_stream_waits;
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

/* Peaks are not reset at the split, because the gpumem policy reads the
 * requested peak to place blocks: the steady peaks are tracked here
 * instead, two loads per op (gm__replay_live_stats). */
const gm_stats *gm__replay_live_stats(gm_allocator *a) {
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
    const gm_stats *s = gm__replay_live_stats(a);
    gm_stats zero;
    memset(&zero, 0, sizeof zero);
    if (!s) s = &zero;
    calls_of(s, r->steady_calls);
    r->steady_stream_waits = s->num_stream_waits; /* until the end: the count there less this */
    r->steady_peak_reserved = s->reserved_bytes[GM_POOL_ALL].current;
    r->steady_peak_requested = s->requested_bytes[GM_POOL_ALL].current;
    c->res_peak0 = s->reserved_bytes[GM_POOL_ALL].peak;
    c->req_peak0 = s->requested_bytes[GM_POOL_ALL].peak;
    r->steady_started = true;
}

static void steady_track(gm_allocator *a, gm_replay_result *r, const steady_ctx *c) {
    const gm_stats *s = gm__replay_live_stats(a);
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

int gm__replay_run(const gm_replay_prog *p, const gm_config *cfg, uint64_t capacity,
                  gm_replay_result *r) {
    return gm__replay_run_steady(p, cfg, capacity, GM_REPLAY_STEADY_FROM, r);
}

int gm__replay_run_steady(const gm_replay_prog *p, const gm_config *cfg, uint64_t capacity, double steady_from,
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
        r->steady_stream_waits = r->steady_started ? st.num_stream_waits - r->steady_stream_waits : 0;
    }
    for (int k = 0; k < GM_REPLAY_SIZED; k++)
        gm_sim_call_sizes(be, 0, gm__replay_sized_kinds[k], r->sized_n[k], r->sized_bytes[k]);
    free(ptrs);
    gm_allocator_destroy(a);
    gm_backend_destroy(be);
    return GM_OK;
}
