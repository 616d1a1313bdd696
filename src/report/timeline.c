/* timeline.c — the report's timeline: replays the device's allocs and frees
 * (paired by attrib.c exactly as gpumem replay pairs them) on a sim device
 * under the torch policy, reads allocated and reserved bytes after every
 * operation, and keeps per bucket of events the points of minimum and
 * maximum live bytes and of maximum reserved bytes, so the HTML stays small
 * and no peak is ever dropped. At the requested peak it records the segment
 * map with the live allocations, coloured by category, in each segment. */
#include "report.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OP_NONE UINT32_MAX
#define OP_FREE 0x80000000u

typedef struct segs_ctx {
    gm_seg_map *v;
    size_t n, cap;
    int rc;
} segs_ctx;

static int seg_cb(const gm_segment_info *s, void *arg) {
    segs_ctx *c = arg;
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 64;
        gm_seg_map *nv = realloc(c->v, nc * sizeof *nv);
        if (!nv) {
            c->rc = GM_ENOHOSTMEM;
            return 1;
        }
        c->v = nv;
        c->cap = nc;
    }
    c->v[c->n++] = (gm_seg_map){s->address, s->total_size, s->allocated_size, s->stream,
                                s->pool == GM_POOL_LARGE, s->expandable, NULL, 0};
    return 0;
}

static int cmp_seg(const void *x, const void *y) {
    const gm_seg_map *a = x, *b = y;
    return a->address < b->address ? -1 : a->address > b->address;
}

static int cmp_block(const void *x, const void *y) {
    const gm_seg_block *a = x, *b = y;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* The segments now, with the live allocations placed in them. */
static int capture_segments(gm_allocator *al, const gm_attribution *a, const gm_devptr *ptrs, size_t upto,
                            gm_timeline *tl) {
    segs_ctx c = {0};
    gm_walk_segments(al, 0, seg_cb, &c);
    if (c.rc) {
        free(c.v);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory for the segment map");
    }
    if (c.n > 1) qsort(c.v, c.n, sizeof *c.v, cmp_seg); /* c.v is NULL with no segment */
    size_t *count = calloc(c.n ? c.n : 1, sizeof *count);
    int rc = count ? GM_OK : GM_ENOHOSTMEM;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        for (size_t k = 0; k < a->nallocs; k++) {
            const gm_attr_alloc *x = &a->allocs[k];
            if (x->ev > upto) break;
            if (!ptrs[k] || (x->end != GM_ATTR_ALIVE && x->end <= upto)) continue;
            size_t lo = 0, hi = c.n; /* last segment with address <= ptr */
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (c.v[mid].address <= ptrs[k]) lo = mid + 1;
                else hi = mid;
            }
            if (!lo || ptrs[k] >= c.v[lo - 1].address + c.v[lo - 1].total_size) continue;
            gm_seg_map *s = &c.v[lo - 1];
            if (pass == 0) count[lo - 1]++;
            else s->blocks[s->nblocks++] = (gm_seg_block){ptrs[k] - s->address, x->size, x->cat};
        }
        for (size_t i = 0; pass == 0 && i < c.n && !rc; i++)
            if (count[i] && !(c.v[i].blocks = malloc(count[i] * sizeof *c.v[i].blocks))) rc = GM_ENOHOSTMEM;
    }
    for (size_t i = 0; i < c.n; i++)
        if (c.v[i].nblocks) qsort(c.v[i].blocks, c.v[i].nblocks, sizeof *c.v[i].blocks, cmp_block);
    free(count);
    tl->segs = c.v;
    tl->nsegs = c.n;
    return rc ? gm__set_error(rc, "out of host memory for the segment map") : GM_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t live_total(const gm_tl_point *p) {
    int64_t s = 0;
    for (int c = 0; c < GM_CAT_COUNT; c++) s += p->cat[c];
    return s;
}

/* Candidates of the current bucket: min and max live, max reserved. */
typedef struct bucket {
    gm_tl_point p[3];
    bool have;
} bucket;

static int cmp_pt(const void *x, const void *y) {
    const gm_tl_point *a = x, *b = y;
    return a->ev < b->ev ? -1 : a->ev > b->ev;
}

static void flush(gm_timeline *tl, bucket *b) {
    if (!b->have) return;
    qsort(b->p, 3, sizeof b->p[0], cmp_pt);
    for (int i = 0; i < 3; i++)
        if (!tl->npts || tl->pts[tl->npts - 1].ev != b->p[i].ev) tl->pts[tl->npts++] = b->p[i];
    b->have = false;
}

int gm__timeline_build(const gm_attribution *a, const gm_config *cfg, size_t max_points, gm_timeline **out) {
    *out = NULL;
    if (max_points < 6) max_points = 6;
    gm_timeline *tl = calloc(1, sizeof *tl);
    uint32_t *op = malloc((a->nevents ? a->nevents : 1) * sizeof *op);
    gm_devptr *ptrs = calloc(a->nallocs ? a->nallocs : 1, sizeof *ptrs);
    size_t nb = max_points / 3;
    if (tl) tl->pts = malloc((nb + 2) * 3 * sizeof *tl->pts);
    gm_backend *be = NULL;
    gm_allocator *al = NULL;
    int rc = GM_OK;
    if (!tl || !op || !ptrs || !tl->pts) {
        rc = gm__set_error(GM_ENOHOSTMEM, "out of host memory for the timeline");
        goto out;
    }
    gm_config defaults;
    if (!cfg) {
        gm_config_init(&defaults);
        cfg = &defaults;
    }
    if (gm_config_format(cfg, tl->conf, sizeof tl->conf) != GM_OK) tl->conf[0] = '\0';
    for (size_t i = 0; i < a->nevents; i++) op[i] = OP_NONE;
    for (size_t k = 0; k < a->nallocs; k++) {
        op[a->allocs[k].ev] = (uint32_t)k;
        if (a->allocs[k].end != GM_ATTR_ALIVE) op[a->allocs[k].end] = (uint32_t)k | OP_FREE;
    }
    if (a->nallocs >= OP_FREE) {
        rc = gm__set_error(GM_EINVAL, "trace too long for a timeline");
        goto out;
    }
    /* the same sim device gpumem replay sets up (src/trace/replay.c) */
    gm_sim_options so;
    gm_sim_options_init(&so);
    rc = gm_sim_create(&be, &so);
    for (size_t i = 0; !rc && i < a->nevents; i++)
        if (a->ev[i].action == GM_TA_SEGMENT_ALLOC) {
            /* a hint only: one the sim refuses (address 0 or not aligned,
             * which replay skips as a bad event too) is left out */
            rc = gm_sim_add_address_hint(be, 0, a->ev[i].size, a->ev[i].addr);
            if (rc == GM_EINVAL) rc = GM_OK;
        }
    if (!rc) rc = gm__allocator_create(&al, be, cfg, NULL); /* a simulation: publishes nothing */
    if (!rc && cfg->per_process_memory_fraction < 1.0)
        rc = gm_set_memory_fraction(al, 0, cfg->per_process_memory_fraction);
    if (rc) {
        rc = gm__set_error(rc, "cannot set up the replay for the timeline: %s", gm_last_error_detail());
        goto out;
    }
    int64_t t0 = a->nevents ? a->ev[0].time_us : 0;
    bool use_time = a->nevents && a->ev[a->nevents - 1].time_us > t0;
    size_t per = (a->nevents + nb - 1) / (nb ? nb : 1);
    if (!per) per = 1;
    gm_tl_point cur = {0};
    bucket b = {0};
    gm_stats st;
    double start = now_s();
    for (size_t i = 0; i < a->nevents; i++) {
        uint32_t o = op[i];
        if (o != OP_NONE) {
            uint32_t k = o & ~OP_FREE;
            const gm_attr_alloc *x = &a->allocs[k];
            if (o & OP_FREE) {
                if (ptrs[k]) gm_free(al, ptrs[k]);
                cur.cat[x->cat] -= (int64_t)x->size;
            } else {
                int r = gm_malloc(al, 0, x->size, x->stream, &ptrs[k]);
                if (r == GM_ENOMEM) tl->oom = true;
                else if (r == GM_EINVAL) ptrs[k] = 0; /* no device could (replay skips it too) */
                else if (r) {
                    rc = gm__set_error(r, "replay for the timeline failed at event %zu: %s", i,
                                       gm_last_error_detail()); /* gm__set_error may quote its own detail */
                    goto out;
                }
                cur.cat[x->cat] += (int64_t)x->size;
            }
            /* after every op: no copy of gm_stats (a tenth of a report of 10 M events) */
            const gm_stats *ls = gm__replay_live_stats(al);
            cur.allocated = ls ? ls->allocated_bytes[GM_POOL_ALL].current : 0;
            cur.reserved = ls ? ls->reserved_bytes[GM_POOL_ALL].current : 0;
        }
        cur.ev = (uint32_t)i;
        cur.t = use_time ? (double)(a->ev[i].time_us - t0) * 1e-6 : (double)i;
        if (i == a->peak_ev && a->peak_bytes && (rc = capture_segments(al, a, ptrs, i, tl))) goto out;
        if (!b.have) {
            b.p[0] = b.p[1] = b.p[2] = cur;
            b.have = true;
        } else {
            int64_t v = live_total(&cur);
            if (v < live_total(&b.p[0])) b.p[0] = cur;
            if (v > live_total(&b.p[1])) b.p[1] = cur;
            if (cur.reserved > b.p[2].reserved) b.p[2] = cur;
        }
        if ((i + 1) % per == 0 || i + 1 == a->nevents) flush(tl, &b);
    }
    tl->seconds = now_s() - start;
    st.size = sizeof st;
    gm_get_stats(al, 0, &st);
    tl->peak_requested = st.requested_bytes[GM_POOL_ALL].peak;
    tl->peak_allocated = st.allocated_bytes[GM_POOL_ALL].peak;
    tl->peak_reserved = st.reserved_bytes[GM_POOL_ALL].peak;
    for (size_t i = 0; i < tl->npts; i++)
        if (tl->pts[i].ev == a->peak_ev) tl->peak_pt = i;
out:
    free(op);
    if (ptrs && al)
        for (size_t k = 0; k < a->nallocs; k++)
            if (ptrs[k] && a->allocs[k].end == GM_ATTR_ALIVE) gm_free(al, ptrs[k]);
    free(ptrs);
    if (al) gm_allocator_destroy(al);
    if (be) gm_backend_destroy(be);
    if (rc) {
        gm__timeline_free(tl);
        return rc;
    }
    *out = tl;
    return GM_OK;
}

void gm__timeline_free(gm_timeline *tl) {
    if (!tl) return;
    for (size_t i = 0; i < tl->nsegs; i++) free(tl->segs[i].blocks);
    free(tl->segs);
    free(tl->pts);
    free(tl);
}
