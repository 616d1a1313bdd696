/* workload.c — seeded RNG, size mixtures, the live-allocation model and the
 * invariant checker shared by test_property, test_stress and test_faults.
 * See workload.h for what each check means and why. */
#include "workload.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- RNG ---------------------------------------------------------------- */

void wl_seed(wl_rng *r, uint64_t seed) { r->s = seed ^ 0x9e3779b97f4a7c15ull; }

uint64_t wl_next(wl_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t wl_below(wl_rng *r, uint64_t n) { return n ? wl_next(r) % n : 0; }

uint64_t wl_range(wl_rng *r, uint64_t lo, uint64_t hi) {
    if (hi <= lo) return lo;
    return lo + wl_below(r, hi - lo + 1);
}

double wl_unit(wl_rng *r) { return (double)(wl_next(r) >> 11) / 9007199254740992.0; }

bool wl_chance(wl_rng *r, double p) { return wl_unit(r) < p; }

uint64_t wl_env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return strtoull(v, NULL, 0);
}

/* ---- sizes -------------------------------------------------------------- */

/* Log-uniform in [lo, hi]: real tensors span many orders of magnitude. */
static uint64_t log_uniform(wl_rng *r, uint64_t lo, uint64_t hi) {
    double l = log((double)lo), h = log((double)hi);
    uint64_t v = (uint64_t)exp(l + (h - l) * wl_unit(r));
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    return v;
}

/* A fresh size of the mixture's shape; a quarter are multiples of 512 (most
 * real tensors are), the rest odd, to exercise rounding. */
static uint64_t fresh_size(wl_rng *r, const wl_mix *m) {
    double tot = m->small + m->medium + m->large, u = wl_unit(r) * tot;
    uint64_t v;
    if (u < m->small) v = log_uniform(r, 1, WL_MIB - 1);
    else if (u < m->small + m->medium) v = log_uniform(r, WL_MIB, 20 * WL_MIB);
    else v = log_uniform(r, 20 * WL_MIB, m->large_max > 20 * WL_MIB ? m->large_max : 20 * WL_MIB);
    if (wl_chance(r, 0.25) && v >= 512) v -= v % 512;
    return v;
}

void wl_mix_init(wl_mix *m, wl_rng *r, double small, double medium, double large,
                 uint64_t large_max) {
    memset(m, 0, sizeof *m);
    m->small = small;
    m->medium = medium;
    m->large = large;
    m->large_max = large_max;
    m->repeat = 0.5;
    m->npalette = 24;
    for (int i = 0; i < m->npalette; i++) m->palette[i] = fresh_size(r, m);
}

uint64_t wl_size(wl_rng *r, const wl_mix *m) {
    if (m->npalette > 0 && wl_chance(r, m->repeat))
        return m->palette[wl_below(r, (uint64_t)m->npalette)];
    return fresh_size(r, m);
}

/* ---- model -------------------------------------------------------------- */

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void wl_model_init(wl_model *m) { memset(m, 0, sizeof *m); }

void wl_model_free(wl_model *m) {
    free(m->live);
    memset(m, 0, sizeof *m);
}

/* First index whose ptr >= p. */
static size_t lower_bound(const wl_model *m, gm_devptr p) {
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->live[mid].ptr < p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

long wl_model_find(const wl_model *m, gm_devptr ptr) {
    size_t i = lower_bound(m, ptr);
    return (i < m->n && m->live[i].ptr == ptr) ? (long)i : -1;
}

/* A 0-byte block still occupies its address for the overlap test (1 byte):
 * two live pointers must never be equal. */
static uint64_t span(uint64_t size) { return size ? size : 1; }

int wl_model_add(wl_model *m, gm_devptr ptr, uint64_t size, gm_stream stream, char *err,
                 size_t errlen) {
    if (ptr == 0) return fail(err, errlen, "malloc(%" PRIu64 ") returned GM_OK with ptr 0", size);
    size_t i = lower_bound(m, ptr);
    if (i < m->n && m->live[i].ptr < ptr + span(size))
        return fail(err, errlen,
                    "overlap: new [0x%" PRIx64 ", +%" PRIu64 ") vs live [0x%" PRIx64 ", +%" PRIu64 ")",
                    ptr, size, m->live[i].ptr, m->live[i].size);
    if (i > 0 && m->live[i - 1].ptr + span(m->live[i - 1].size) > ptr)
        return fail(err, errlen,
                    "overlap: new [0x%" PRIx64 ", +%" PRIu64 ") vs live [0x%" PRIx64 ", +%" PRIu64 ")",
                    ptr, size, m->live[i - 1].ptr, m->live[i - 1].size);
    if (m->n == m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 256;
        wl_block *nl = realloc(m->live, nc * sizeof *nl);
        if (!nl) return fail(err, errlen, "test out of host memory");
        m->live = nl;
        m->cap = nc;
    }
    memmove(&m->live[i + 1], &m->live[i], (m->n - i) * sizeof *m->live);
    m->live[i] = (wl_block){ptr, size, stream, 0};
    m->n++;
    m->requested += size;
    return 0;
}

void wl_model_remove_at(wl_model *m, size_t i, wl_block *out) {
    if (out) *out = m->live[i];
    m->requested -= m->live[i].size;
    memmove(&m->live[i], &m->live[i + 1], (m->n - i - 1) * sizeof *m->live);
    m->n--;
}

int wl_free_all(gm_allocator *a, wl_model *m, char *err, size_t errlen) {
    while (m->n > 0) {
        wl_block b = m->live[m->n - 1];
        int rc = gm_free(a, b.ptr);
        if (rc != GM_OK)
            return fail(err, errlen, "gm_free(0x%" PRIx64 ") = %s", b.ptr, gm_status_name(rc));
        wl_model_remove_at(m, m->n - 1, NULL);
    }
    return 0;
}

/* ---- checks ------------------------------------------------------------- */

typedef struct seg_list {
    gm_segment_info *v;
    size_t n, cap;
    bool oom;
} seg_list;

static int collect_seg(const gm_segment_info *seg, void *arg) {
    seg_list *l = arg;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 64;
        gm_segment_info *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) {
            l->oom = true;
            return 1;
        }
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = *seg;
    return 0;
}

static int seg_cmp(const void *x, const void *y) {
    const gm_segment_info *a = x, *b = y;
    return a->address < b->address ? -1 : a->address > b->address;
}

/* Index of the segment containing p, or -1. Segments sorted, disjoint. */
static long seg_find(const seg_list *l, gm_devptr p) {
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->v[mid].address <= p) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return -1;
    const gm_segment_info *s = &l->v[lo - 1];
    return p < s->address + s->total_size ? (long)(lo - 1) : -1;
}

/* Segments: disjoint, no unmapped space reported (total == mapped), live
 * blocks inside one, per-pool recount of counts and bytes against the stats. */
static int check_segments(gm_allocator *a, const wl_model *m, const gm_stats *s, unsigned flags,
                          char *err, size_t errlen) {
    seg_list l = {0};
    int rc = gm_walk_segments(a, 0, collect_seg, &l);
    if (rc != GM_OK || l.oom) {
        free(l.v);
        return fail(err, errlen, "gm_walk_segments = %s", gm_status_name(rc));
    }
    if (l.n > 1) qsort(l.v, l.n, sizeof *l.v, seg_cmp);
    int64_t count[GM_POOL_COUNT] = {0}, req[GM_POOL_COUNT] = {0};
    int64_t alloc_b[GM_POOL_COUNT] = {0}, mapped[GM_POOL_COUNT] = {0};
    int out = 0;
    for (size_t i = 0; i < l.n && !out; i++) {
        const gm_segment_info *g = &l.v[i];
        if (g->pool != GM_POOL_SMALL && g->pool != GM_POOL_LARGE)
            out = fail(err, errlen, "segment 0x%" PRIx64 " has pool %d", g->address, g->pool);
        else if (g->mapped_size != g->total_size || g->allocated_size > g->mapped_size)
            out = fail(err, errlen, /* torch reports mapped memory only, expandable or not */
                       "segment 0x%" PRIx64 ": allocated %" PRIu64 " > mapped %" PRIu64
                       " or mapped != total %" PRIu64,
                       g->address, g->allocated_size, g->mapped_size, g->total_size);
        else if (i > 0 && l.v[i - 1].address + l.v[i - 1].total_size > g->address)
            out = fail(err, errlen, "segments overlap: 0x%" PRIx64 "+%" PRIu64 " and 0x%" PRIx64,
                       l.v[i - 1].address, l.v[i - 1].total_size, g->address);
        else {
            alloc_b[g->pool] += (int64_t)g->allocated_size;
            mapped[g->pool] += (int64_t)g->mapped_size;
        }
    }
    for (size_t i = 0; i < m->n && !out; i++) {
        const wl_block *b = &m->live[i];
        long k = seg_find(&l, b->ptr);
        if (k < 0) {
            out = fail(err, errlen, "live block 0x%" PRIx64 " (+%" PRIu64 ") in no segment", b->ptr,
                       b->size);
            break;
        }
        const gm_segment_info *g = &l.v[k];
        if (b->ptr + b->size > g->address + g->total_size)
            out = fail(err, errlen, "live block 0x%" PRIx64 " (+%" PRIu64 ") ends past its segment",
                       b->ptr, b->size);
        else if (m->torch_pools && g->pool != (b->size <= WL_MIB ? GM_POOL_SMALL : GM_POOL_LARGE))
            out = fail(err, errlen, "torch: block of %" PRIu64 " bytes in pool %d", b->size, g->pool);
        count[g->pool]++;
        req[g->pool] += (int64_t)b->size;
    }
    free(l.v);
    if (out) return out;
    for (int p = GM_POOL_SMALL; p <= GM_POOL_LARGE; p++) {
        if (s->allocation[p].current != count[p])
            return fail(err, errlen, "allocation[%d].current %" PRId64 " != recount %" PRId64, p,
                        s->allocation[p].current, count[p]);
        if (s->requested_bytes[p].current != req[p])
            return fail(err, errlen, "requested_bytes[%d].current %" PRId64 " != recount %" PRId64,
                        p, s->requested_bytes[p].current, req[p]);
        if (s->allocated_bytes[p].current != alloc_b[p])
            return fail(err, errlen,
                        "allocated_bytes[%d].current %" PRId64 " != sum of segments' allocated_size %" PRId64,
                        p, s->allocated_bytes[p].current, alloc_b[p]);
        bool loose = (flags & WL_CHECK_LOOSE) && s->reserved_bytes[p].current > mapped[p];
        if (s->reserved_bytes[p].current != mapped[p] && !loose)
            return fail(err, errlen,
                        "reserved_bytes[%d].current %" PRId64 " != sum of segments' mapped_size %" PRId64,
                        p, s->reserved_bytes[p].current, mapped[p]);
    }
    return 0;
}

/* Apply f to every gm_stat of the struct, with a printable name. */
typedef int (*stat_fn)(const char *name, int pool, const gm_stat *cur, const gm_stat *prev,
                       char *err, size_t errlen);

static int each_stat(const gm_stats *s, const gm_stats *prev, stat_fn f, char *err, size_t errlen) {
    int rc;
#define WL__ARR(n)                                                                 \
    for (int p = 0; p < GM_POOL_COUNT; p++)                                        \
        if ((rc = f(#n, p, &s->n[p], prev ? &prev->n[p] : NULL, err, errlen))) return rc;
#define WL__ONE(n) \
    if ((rc = f(#n, -1, &s->n, prev ? &prev->n : NULL, err, errlen))) return rc;
    GM_STAT_ARRAYS(WL__ARR)
    GM_STAT_SINGLES(WL__ONE)
#undef WL__ARR
#undef WL__ONE
    return 0;
}

static int stat_basic(const char *name, int pool, const gm_stat *c, const gm_stat *prev, char *err,
                      size_t errlen) {
    if (c->current < 0 || c->current > c->peak)
        return fail(err, errlen, "%s[%d]: current %" PRId64 " peak %" PRId64, name, pool,
                    c->current, c->peak);
    if (c->allocated - c->freed != c->current)
        return fail(err, errlen,
                    "%s[%d]: allocated %" PRId64 " - freed %" PRId64 " != current %" PRId64, name,
                    pool, c->allocated, c->freed, c->current);
    if (prev && c->peak < prev->peak)
        return fail(err, errlen, "%s[%d]: peak fell from %" PRId64 " to %" PRId64, name, pool,
                    prev->peak, c->peak);
    return 0;
}

static int stat_peak_eq_current(const char *name, int pool, const gm_stat *c, const gm_stat *prev,
                                char *err, size_t errlen) {
    if (c->peak != c->current)
        return fail(err, errlen, "after reset_peak_stats %s[%d]: peak %" PRId64 " != current %" PRId64,
                    name, pool, c->peak, c->current);
    return 0;
}

/* all == small + large for the current value of every per-pool stat. */
static int check_pool_sums(const gm_stats *s, char *err, size_t errlen) {
#define WL__SUM(n)                                                                       \
    if (s->n[GM_POOL_ALL].current != s->n[GM_POOL_SMALL].current + s->n[GM_POOL_LARGE].current) \
        return fail(err, errlen, #n ": all %" PRId64 " != small %" PRId64 " + large %" PRId64,      \
                    s->n[GM_POOL_ALL].current, s->n[GM_POOL_SMALL].current,                  \
                    s->n[GM_POOL_LARGE].current);
    GM_STAT_ARRAYS(WL__SUM)
#undef WL__SUM
    return 0;
}

static int get_stats(gm_allocator *a, gm_stats *s, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    int rc = gm_get_stats(a, 0, s);
    if (rc != GM_OK) return fail(err, errlen, "gm_get_stats = %s", gm_status_name(rc));
    return 0;
}

static int check_totals(const wl_model *m, const gm_stats *s, char *err, size_t errlen) {
    for (int p = 0; p < GM_POOL_COUNT; p++) {
        if (s->reserved_bytes[p].current < s->allocated_bytes[p].current)
            return fail(err, errlen, "pool %d: reserved %" PRId64 " < allocated %" PRId64, p,
                        s->reserved_bytes[p].current, s->allocated_bytes[p].current);
        if (s->allocated_bytes[p].current < s->requested_bytes[p].current)
            return fail(err, errlen, "pool %d: allocated %" PRId64 " < requested %" PRId64, p,
                        s->allocated_bytes[p].current, s->requested_bytes[p].current);
        if (s->active_bytes[p].current < s->allocated_bytes[p].current)
            return fail(err, errlen, "pool %d: active_bytes %" PRId64 " < allocated %" PRId64, p,
                        s->active_bytes[p].current, s->allocated_bytes[p].current);
    }
    int64_t nlive = 0;
    for (size_t i = 0; i < m->n; i++) nlive += m->live[i].size > 0;
    if (s->allocation[GM_POOL_ALL].current != nlive)
        return fail(err, errlen, "allocation.all.current %" PRId64 " != live blocks %" PRId64,
                    s->allocation[GM_POOL_ALL].current, nlive);
    if (s->requested_bytes[GM_POOL_ALL].current != (int64_t)m->requested)
        return fail(err, errlen, "requested_bytes.all.current %" PRId64 " != live bytes %" PRIu64,
                    s->requested_bytes[GM_POOL_ALL].current, m->requested);
    if (s->num_ooms != m->ooms)
        return fail(err, errlen, "num_ooms %" PRId64 " != OOMs returned %" PRId64, s->num_ooms,
                    m->ooms);
    return 0;
}

static int check_sim_used(gm_allocator *a, const gm_stats *s, char *err, size_t errlen) {
    uint64_t freeb = 0, total = 0;
    int rc = gm_mem_get_info(a, 0, &freeb, &total);
    if (rc != GM_OK) return fail(err, errlen, "gm_mem_get_info = %s", gm_status_name(rc));
    if (freeb > total || (int64_t)(total - freeb) != s->reserved_bytes[GM_POOL_ALL].current)
        return fail(err, errlen,
                    "bytes unaccounted for: device used %" PRIu64 " (total %" PRIu64 " - free %" PRIu64
                    ") != reserved_bytes %" PRId64,
                    total - freeb, total, freeb, s->reserved_bytes[GM_POOL_ALL].current);
    return 0;
}

int wl_check(gm_allocator *a, wl_model *m, unsigned flags, char *err, size_t errlen) {
    char cerr[512] = "";
    int rc = gm_check(a, 0, cerr, sizeof cerr);
    if (rc != GM_OK) return fail(err, errlen, "gm_check = %s: %s", gm_status_name(rc), cerr);
    gm_stats s;
    if (get_stats(a, &s, err, errlen)) return -1;
    bool peaks = (flags & WL_CHECK_PEAKS) && m->have_prev;
    if (each_stat(&s, peaks ? &m->prev : NULL, stat_basic, err, errlen)) return -1;
    if (check_pool_sums(&s, err, errlen) || check_totals(m, &s, err, errlen)) return -1;
    if ((flags & WL_CHECK_SEGMENTS) && check_segments(a, m, &s, flags, err, errlen)) return -1;
    if ((flags & WL_CHECK_SIM_USED) && check_sim_used(a, &s, err, errlen)) return -1;
    m->prev = s;
    m->have_prev = true;
    return 0;
}

int wl_check_peaks_reset(gm_allocator *a, wl_model *m, char *err, size_t errlen) {
    gm_stats s;
    if (get_stats(a, &s, err, errlen)) return -1;
    if (each_stat(&s, NULL, stat_peak_eq_current, err, errlen)) return -1;
    m->prev = s;
    m->have_prev = true;
    return 0;
}
