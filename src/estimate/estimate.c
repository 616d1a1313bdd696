/* estimate.c — the estimator's entry points: the scan of an event program
 * for peaks by phase and category (exact for any depth: a deep model's
 * peaks extrapolate from two small programs), its replay on the simulated
 * device under an allocator configuration, and the search for the largest
 * batch or sequence that fits (gm__est_fit). The program is built by
 * estimate_loop.c, the run checked by estimate_check.c; estimate_emit.h
 * says how the units fit together. Calls go down only: this file to the
 * builder and the checks, never back. */
#include "estimate.h"

#include "internal.h"
#include "trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* torch's allocator rounds every request up to 512 bytes (kMinBlockSize). */
#define ROUND512(n) (((n) + 511) / 512 * 512)

/* ---- scan ------------------------------------------------------------------ */

/* The peaks of a stream of live-byte states: each event reports the bytes
 * (and bytes per category) live before and after it. */
static void track(gm_est_result *out, const gm_est_event *e, int64_t before, const int64_t *bcat_before,
                  int64_t after, const int64_t *bcat_after) {
    int lat = e->step > 1;
    if (before > out->phase_peak[lat][e->phase]) { /* what the phase starts with */
        out->phase_peak[lat][e->phase] = before;
        memcpy(out->phase_by_cat[lat][e->phase], bcat_before, sizeof out->phase_by_cat[lat][e->phase]);
    }
    if (e->free) return;
    if (after > out->phase_peak[lat][e->phase]) {
        out->phase_peak[lat][e->phase] = after;
        memcpy(out->phase_by_cat[lat][e->phase], bcat_after, sizeof out->phase_by_cat[lat][e->phase]);
    }
    if (after > out->peak) {
        out->peak = after;
        out->peak_step = e->step;
        out->peak_phase = e->phase;
        memcpy(out->peak_by_cat, bcat_after, sizeof out->peak_by_cat);
    }
}

/* Live bytes through a program: per event, the state before and after. */
typedef struct walker {
    const gm_est_program *p;
    uint64_t *sz;
    uint8_t *cat;
    size_t i;
    int64_t live, bycat[GM_EST_NCAT];
    int64_t live0, bycat0[GM_EST_NCAT]; /* before the current event */
} walker;

static int walker_init(walker *w, const gm_est_program *p) {
    memset(w, 0, sizeof *w);
    w->p = p;
    w->sz = calloc(p->ntensors + 1, sizeof *w->sz);
    w->cat = calloc(p->ntensors + 1, 1);
    if (w->sz && w->cat) return GM_OK;
    free(w->sz);
    free(w->cat);
    return gm__set_error(GM_ENOHOSTMEM, "out of host memory scanning the estimate");
}
static void walker_free(walker *w) {
    free(w->sz);
    free(w->cat);
}
/* Apply the next event; NULL at the end. */
static const gm_est_event *walk(walker *w) {
    if (w->i >= w->p->n) return NULL;
    const gm_est_event *e = &w->p->ev[w->i++];
    w->live0 = w->live;
    memcpy(w->bycat0, w->bycat, sizeof w->bycat);
    if (e->free) {
        w->live -= (int64_t)w->sz[e->id];
        w->bycat[w->cat[e->id]] -= (int64_t)w->sz[e->id];
        w->sz[e->id] = 0;
    } else {
        w->sz[e->id] = ROUND512(e->size);
        w->cat[e->id] = e->cat;
        w->live += (int64_t)w->sz[e->id];
        w->bycat[e->cat] += (int64_t)w->sz[e->id];
    }
    return e;
}

static int scan(const gm_est_program *p, gm_est_result *out) {
    walker w;
    int rc = walker_init(&w, p);
    if (rc) return rc;
    for (const gm_est_event *e; (e = walk(&w));) track(out, e, w.live0, w.bycat0, w.live, w.bycat);
    walker_free(&w);
    return GM_OK;
}

/* A model of L repeated layers, from the programs with K and K + 1: every
 * event of the K + 1 program but those of its layer FOLD_AT (interior)
 * corresponds, in order, to one of the K program (layers after FOLD_AT
 * shift down by one), and the bytes live at each such point are affine in
 * the layer count (each layer adds the same tensors), so
 * live(L) = live(K) + (L - K) * (live(K + 1) - live(K)) exactly. Points
 * inside the L - 4 interior layers are not visited: within them the bytes
 * are affine in the layer index too, so their extremes are at the ends,
 * the layers 1 and L - 2 that both programs hold. */
#define FOLD_K 4
#define FOLD_AT 2

static int64_t extrapolate(int64_t a, int64_t b, int64_t k) { return a + k * (b - a); }

static int scan_folded(const gm_est_model *m, const gm_est_run *r, int64_t L, gm_est_result *out) {
    gm_est_program pa, pb;
    int rc = gm__est_build_layers(m, r, FOLD_K, &pa);
    if (rc) return rc;
    if ((rc = gm__est_build_layers(m, r, FOLD_K + 1, &pb))) {
        gm__est_program_free(&pa);
        return rc;
    }
    walker wa, wb;
    if ((rc = walker_init(&wa, &pa)) == GM_OK && (rc = walker_init(&wb, &pb)) != GM_OK) walker_free(&wa);
    if (rc) {
        gm__est_program_free(&pa), gm__est_program_free(&pb);
        return rc;
    }
    int64_t k = L - FOLD_K;
    for (;;) {
        const gm_est_event *ea = walk(&wa), *eb;
        while ((eb = walk(&wb)) && eb->layer == FOLD_AT) {}
        if (!ea || !eb) {
            if (ea || eb) rc = gm__set_error(GM_ESTATE, "estimate: the %d- and %d-layer programs of %s differ",
                                             FOLD_K, FOLD_K + 1, m->name);
            break;
        }
        if (ea->free != eb->free || ea->phase != eb->phase || ea->step != eb->step || ea->cat != eb->cat) {
            rc = gm__set_error(GM_ESTATE, "estimate: the %d- and %d-layer programs of %s differ at event %zu",
                               FOLD_K, FOLD_K + 1, m->name, wa.i);
            break;
        }
        int64_t before = extrapolate(wa.live0, wb.live0, k), after = extrapolate(wa.live, wb.live, k);
        int64_t cb[GM_EST_NCAT], ca[GM_EST_NCAT];
        for (int c = 0; c < GM_EST_NCAT; c++) {
            cb[c] = extrapolate(wa.bycat0[c], wb.bycat0[c], k);
            ca[c] = extrapolate(wa.bycat[c], wb.bycat[c], k);
        }
        track(out, ea, before, cb, after, ca);
    }
    out->events = pa.n + pb.n;
    walker_free(&wa), walker_free(&wb);
    gm__est_program_free(&pa), gm__est_program_free(&pb);
    return rc;
}

/* Peaks of the model's run, scanned over its own layers or folded. */
static int scan_model(const gm_est_model *m, const gm_est_run *r, gm_est_result *out) {
    int64_t L = gm__est_repeated_layers(m);
    if (L > 2 * FOLD_K) return scan_folded(m, r, L, out);
    gm_est_program p;
    int rc = gm__est_build(m, r, &p);
    if (rc) return rc;
    rc = scan(&p, out);
    out->events = p.n;
    gm__est_program_free(&p);
    return rc;
}

/* ---- replay ---------------------------------------------------------------- */

static int to_prog(const gm_est_program *p, gm_replay_prog **out) {
    gm__trace_builder *b = gm__tb_new();
    if (!b) return gm__set_error(GM_ENOHOSTMEM, "out of host memory");
    int rc = GM_OK;
    for (size_t i = 0; i < p->n && !rc; i++) {
        const gm_est_event *e = &p->ev[i];
        gm_trace_event te = {.addr = (uint64_t)e->id << 12, .size = e->size,
                             .action = e->free ? GM_TA_FREE_COMPLETED : GM_TA_ALLOC,
                             .time_us = (int64_t)i};
        rc = gm__tb_event(b, &te);
    }
    gm_trace *t = NULL;
    if (rc) {
        gm__tb_discard(b);
        return rc;
    }
    if ((rc = gm__tb_finish(b, "gpumem-estimate", &t))) return rc;
    rc = gm__replay_compile(t, 0, out);
    gm__trace_free(t);
    return rc;
}

/* Live bytes at the program's peak (each request rounded to 512). */
static int64_t program_peak(const gm_est_program *p) {
    gm_est_result r;
    memset(&r, 0, sizeof r);
    return scan(p, &r) == GM_OK ? r.peak : 0;
}

int gm__est_replay_conf(const gm_est_program *p, const char *conf, int64_t *peak_allocated,
                       int64_t *peak_reserved) {
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256];
    if (gm_config_parse(&cfg, conf, err, sizeof err) != GM_OK)
        return gm__set_error(GM_ECONFIG, "bad allocator setting '%s': %s", conf, err);
    /* A simulated device sized to the program: twice its peak + 2 GiB holds
     * whatever an allocator reserves for it (reserved stays under twice the
     * allocated peak in every job measured: bench/RESULTS.md, "training
     * memory estimator"), at any size -- no device's capacity caps it -- and
     * sets up fast (gpumem's policy sizes its tables to the device). */
    int64_t peak = program_peak(p);
    if (peak <= 0) return gm__set_error(GM_ESTATE, "estimate: an empty program");
    uint64_t cap = (uint64_t)peak * 2 + ((uint64_t)2 << 30); /* peak < 2^62 (gm__est_check) */
    gm_replay_prog *prog;
    int rc = to_prog(p, &prog);
    if (rc) return rc;
    gm_replay_result rr;
    rc = gm__replay_run(prog, &cfg, cap, &rr);
    gm__replay_prog_free(prog);
    if (rc) return rc;
    if (rr.error) return gm__set_error(rr.error, "%s", rr.error_detail);
    if (rr.oom || rr.peak_allocated < peak)
        return gm__set_error(GM_ESTATE, "estimate: the replay under '%s' could not place the run's %lld bytes "
                             "on a %llu-byte simulated device; no peak reserved to report", conf[0] ? conf : "torch "
                             "defaults", (long long)peak, (unsigned long long)cap);
    if (peak_allocated) *peak_allocated = rr.peak_allocated;
    if (peak_reserved) *peak_reserved = rr.peak_reserved;
    return GM_OK;
}

/* A replay of fewer layers than the model's: scaled by the exact peak. */
static int64_t scale(int64_t v, int64_t from, int64_t to) {
    long double x = (long double)v * (long double)to / (long double)from;
    return x >= (long double)GM_EST_MAX_BYTES * 2 ? INT64_MAX : (int64_t)x;
}

/* The simulated device gives each process 1 TiB of addresses
 * (src/backend/sim.c): a larger run is replayed with every size divided by
 * a power of two. Such runs are made of tensors far above the allocator's
 * size classes (1 MiB, 10 MiB, 2 MiB granules), whose rounding the
 * reduced replay keeps in proportion. */
#define REPLAY_MAX_BYTES ((int64_t)256 << 30)

static int replay(const gm_est_model *m, const gm_est_run *r, gm_est_result *out, bool gpumem) {
    gm_est_program p;
    int rc = gm__est_build(m, r, &p);
    if (rc) return rc;
    int64_t pk = program_peak(&p);
    bool shrunk = pk > REPLAY_MAX_BYTES;
    if (shrunk) {
        uint64_t f = 1;
        while ((int64_t)((uint64_t)pk / f) > REPLAY_MAX_BYTES) f *= 2;
        for (size_t i = 0; i < p.n; i++)
            if (!p.ev[i].free) p.ev[i].size = p.ev[i].size / f ? p.ev[i].size / f : 1;
        pk = program_peak(&p);
    }
    rc = gm__est_replay_conf(&p, "", &out->peak_allocated, &out->peak_reserved_torch);
    if (!rc && gpumem) rc = gm__est_replay_conf(&p, "policy:gpumem", NULL, &out->peak_reserved_gpumem);
    if (!rc && (shrunk || p.layers < gm__est_repeated_layers(m))) {
        out->peak_allocated = scale(out->peak_allocated, pk, out->peak);
        out->peak_reserved_torch = scale(out->peak_reserved_torch, pk, out->peak);
        out->peak_reserved_gpumem = scale(out->peak_reserved_gpumem, pk, out->peak);
        out->reserved_extrapolated = true;
    }
    out->replayed = rc == GM_OK;
    gm__est_program_free(&p);
    return rc;
}

static int estimate(const gm_est_model *m, const gm_est_run *r, gm_est_result *out, int replay_level) {
    memset(out, 0, sizeof *out);
    gm_est_run rr = *r;
    int rc = gm__est_check(m, &rr);
    if (rc) return rc;
    if ((rc = scan_model(m, &rr, out))) return rc;
    out->params = gm__est_param_count(m);
    int64_t g = m->patch ? rr.image / m->patch : 0;
    out->tokens = gm__est_is_vision(m) ? (m->family == GM_EST_RESNET ? rr.batch : rr.batch * (g * g + 1))
                                      : rr.batch * rr.seq;
    out->cuda_context = GM_EST_CUDA_CONTEXT;
    out->steady_by_cat[GM_EST_CAT_PARAMS] = out->phase_by_cat[1][GM_EST_PH_FORWARD][GM_EST_CAT_PARAMS];
    out->steady_by_cat[GM_EST_CAT_OPTSTATE] = out->phase_by_cat[1][GM_EST_PH_FORWARD][GM_EST_CAT_OPTSTATE];
    if (replay_level) rc = replay(m, &rr, out, replay_level > 1);
    return rc;
}

int gm__est_scan(const gm_est_model *m, const gm_est_run *r, gm_est_result *out) {
    return estimate(m, r, out, 0);
}

int gm__est_estimate_torch(const gm_est_model *m, const gm_est_run *r, gm_est_result *out) {
    return estimate(m, r, out, 1);
}

int gm__est_estimate(const gm_est_model *m, const gm_est_run *r, gm_est_result *out) {
    return estimate(m, r, out, 2);
}

static int fits(const gm_est_model *m, const gm_est_run *r, uint64_t capacity, gm_est_result *res) {
    if (gm__est_estimate_torch(m, r, res)) return -1;
    double need = (double)res->peak_reserved_torch * (1.0 + GM_EST_FIT_MARGIN) + (double)res->cuda_context;
    return need <= (double)capacity;
}

int gm__est_fit(const gm_est_model *m, const gm_est_run *rin, int what, uint64_t capacity, int64_t *best,
               gm_est_result *at_best) {
    gm_est_run r = *rin;
    r.steps = 2; /* the peak is in step 1 or 2: later steps repeat step 2 */
    int rc = gm__est_check(m, &r);
    if (rc) return rc;
    if (what == 1 && gm__est_is_vision(m))
        return gm__set_error(GM_EINVAL, "--fit seq is for text models; %s is a vision model", m->name);
    int64_t hi_limit = what == 0 ? (1 << 20) : (m->family == GM_EST_GPT2 || m->family == GM_EST_BERT)
                                                  ? m->max_positions : (1 << 20);
    int64_t *knob = what == 0 ? &r.batch : &r.seq;
    gm_est_result res;
    *best = 0;
    *knob = 1;
    int f = fits(m, &r, capacity, &res);
    if (f < 0) return gm__set_error(GM_EINVAL, "%s", gm_last_error_detail());
    if (!f) return GM_OK;
    if (at_best) *at_best = res;
    int64_t lo = 1, hi = 2;
    /* grow: find a size that does not fit */
    while (hi <= hi_limit) {
        *knob = hi;
        f = fits(m, &r, capacity, &res);
        if (f != 1) break;
        lo = hi;
        if (at_best) *at_best = res;
        hi *= 2;
    }
    if (hi > hi_limit) {
        *knob = hi_limit;
        if (fits(m, &r, capacity, &res) == 1) {
            *best = hi_limit;
            if (at_best) *at_best = res;
            return GM_OK;
        }
        hi = hi_limit;
    }
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        *knob = mid;
        f = fits(m, &r, capacity, &res);
        if (f == 1) {
            lo = mid;
            if (at_best) *at_best = res;
        } else {
            hi = mid;
        }
    }
    *best = lo;
    return GM_OK;
}
