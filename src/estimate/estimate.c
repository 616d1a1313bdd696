/* estimate.c — the estimator's entry points: a run's defaults and checks
 * (gm_est_run_init, gm_est_check), the scan of an event program for peaks by
 * phase and category, its replay on the simulated device under an
 * allocator configuration, and the search for the largest batch or sequence
 * that fits (gm_est_fit). The program itself is built by estimate_loop.c;
 * estimate_emit.h says how the units fit together. */
#include "estimate.h"

#include "internal.h"
#include "trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* torch's allocator rounds every request up to 512 bytes (kMinBlockSize). */
#define ROUND512(n) (((n) + 511) / 512 * 512)

void gm_est_run_init(gm_est_run *r) {
    memset(r, 0, sizeof *r);
    r->batch = 8;
    r->precision = GM_EST_BF16_AUTOCAST;
    r->optimizer = GM_EST_OPT_ADAMW;
    r->accum = 1;
    r->attention = GM_EST_ATTN_SDPA;
    r->steps = 3;
}

int gm_est_check(const gm_est_model *m, gm_est_run *r) {
    if (r->batch < 1 || r->batch > (1 << 20))
        return gm__set_error(GM_EINVAL, "batch must be between 1 and %d (got %lld)", 1 << 20, (long long)r->batch);
    if (r->accum < 1 || r->accum > 4096)
        return gm__set_error(GM_EINVAL, "accumulation must be between 1 and 4096 (got %lld)", (long long)r->accum);
    if (r->steps < 2 || r->steps > 16)
        return gm__set_error(GM_EINVAL, "steps must be between 2 and 16 (got %d)", r->steps);
    if ((unsigned)r->precision >= GM_EST_NPRECISION || (unsigned)r->optimizer >= GM_EST_NOPTIMIZER)
        return gm__set_error(GM_EINVAL, "bad precision or optimizer");
    if (gm_est_is_vision(m)) {
        if (r->seq) return gm__set_error(GM_EINVAL, "%s is a vision model: give --image, not --seq", m->name);
        if (!r->image) r->image = m->image;
        if (r->image < 32 || r->image > 8192)
            return gm__set_error(GM_EINVAL, "image size must be between 32 and 8192 pixels (got %lld)",
                                 (long long)r->image);
        if ((m->family == GM_EST_VIT_TV || m->family == GM_EST_VIT_HF) && r->image % m->patch)
            return gm__set_error(GM_EINVAL, "image size %lld is not a multiple of the patch size %lld",
                                 (long long)r->image, (long long)m->patch);
        if (m->family == GM_EST_VIT_TV && r->image != m->image)
            return gm__set_error(GM_EINVAL, "torchvision's %s takes %lld-pixel images only", m->name,
                                 (long long)m->image);
    } else {
        if (r->image) return gm__set_error(GM_EINVAL, "%s is a text model: give --seq, not --image", m->name);
        if (!r->seq) r->seq = m->max_positions < 1024 ? m->max_positions : 1024;
        if (r->seq < 1) return gm__set_error(GM_EINVAL, "sequence length must be positive");
        if ((m->family == GM_EST_GPT2 || m->family == GM_EST_BERT) && r->seq > m->max_positions)
            return gm__set_error(GM_EINVAL, "sequence length %lld exceeds %s's %lld positions",
                                 (long long)r->seq, m->name, (long long)m->max_positions);
        if (r->seq > (1 << 22)) return gm__set_error(GM_EINVAL, "sequence length %lld is too large", (long long)r->seq);
    }
    if (r->generate < 0 || r->generate > (1 << 20))
        return gm__set_error(GM_EINVAL, "new tokens must be between 1 and %d (got %lld)", 1 << 20,
                             (long long)r->generate);
    if (r->generate) {
        if (m->head != GM_EST_HEAD_CAUSAL_LM)
            return gm__set_error(GM_EINVAL, "--generate models a causal language model's generate(); %s is "
                                 "a %s model", m->name, gm_est_head_name(m->head));
        if (r->checkpointing || r->accum > 1)
            return gm__set_error(GM_EINVAL, "--generate is inference: --checkpointing and --accum do not apply");
        if (r->precision == GM_EST_FP16_AUTOCAST || r->precision == GM_EST_BF16_AUTOCAST)
            return gm__set_error(GM_EINVAL, "--generate models a model cast to 16 bits (--precision bf16, the "
                                 "same bytes as .half()) or fp32, not autocast");
        if ((m->family == GM_EST_GPT2) && r->seq + r->generate > m->max_positions)
            return gm__set_error(GM_EINVAL, "prompt %lld + %lld new tokens exceed %s's %lld positions",
                                 (long long)r->seq, (long long)r->generate, m->name, (long long)m->max_positions);
    }
    if (r->checkpointing && !gm_est_is_hf(m))
        return gm__set_error(GM_EINVAL, "--checkpointing models Hugging Face's gradient_checkpointing_enable(); "
                             "%s is a torchvision model", m->name);
    if (r->attention == GM_EST_ATTN_EAGER && m->family == GM_EST_RESNET)
        return gm__set_error(GM_EINVAL, "%s has no attention", m->name);
    if (r->attention == GM_EST_ATTN_EAGER && m->family == GM_EST_VIT_TV)
        return gm__set_error(GM_EINVAL, "torchvision's %s always uses scaled_dot_product_attention; "
                             "--attention eager is for Hugging Face models", m->name);
    return GM_OK;
}

/* ---- scan and replay ---------------------------------------------------------- */

static void scan(const gm_est_program *p, gm_est_result *out) {
    uint64_t *sz = calloc(p->ntensors + 1, sizeof *sz);
    uint8_t *cat = calloc(p->ntensors + 1, 1);
    int64_t live = 0, bycat[GM_EST_NCAT] = {0};
    if (!sz || !cat) {
        free(sz);
        free(cat);
        return;
    }
    for (size_t i = 0; i < p->n; i++) {
        const gm_est_event *e = &p->ev[i];
        int lat = e->step > 1;
        if (live > out->phase_peak[lat][e->phase]) { /* what the phase starts with */
            out->phase_peak[lat][e->phase] = live;
            memcpy(out->phase_by_cat[lat][e->phase], bycat, sizeof bycat);
        }
        if (e->free) {
            live -= (int64_t)sz[e->id];
            bycat[cat[e->id]] -= (int64_t)sz[e->id];
            sz[e->id] = 0;
            continue;
        }
        sz[e->id] = ROUND512(e->size);
        cat[e->id] = e->cat;
        live += (int64_t)sz[e->id];
        bycat[e->cat] += (int64_t)sz[e->id];
        int later = e->step > 1;
        if (live > out->phase_peak[later][e->phase]) {
            out->phase_peak[later][e->phase] = live;
            memcpy(out->phase_by_cat[later][e->phase], bycat, sizeof bycat);
        }
        if (live > out->peak) {
            out->peak = live;
            out->peak_step = e->step;
            out->peak_phase = e->phase;
            memcpy(out->peak_by_cat, bycat, sizeof bycat);
        }
    }
    free(sz);
    free(cat);
}

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
    rc = gm_replay_compile(t, 0, out);
    gm_trace_free(t);
    return rc;
}

/* Live bytes at the program's peak (each request rounded to 512). */
static int64_t program_peak(const gm_est_program *p) {
    gm_est_result r;
    memset(&r, 0, sizeof r);
    scan(p, &r);
    return r.peak;
}

int gm_est_replay_conf(const gm_est_program *p, const char *conf, int64_t *peak_allocated,
                       int64_t *peak_reserved) {
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256];
    if (gm_config_parse(&cfg, conf, err, sizeof err) != GM_OK)
        return gm__set_error(GM_ECONFIG, "bad allocator setting '%s': %s", conf, err);
    gm_replay_prog *prog;
    int rc = to_prog(p, &prog);
    if (rc) return rc;
    /* A simulated device sized to the program (4x its peak + 2 GiB) replays
     * the same as a 141 GiB one unless the allocator would reserve that much,
     * and sets up much faster (gpumem's policy sizes its tables to the
     * device); if it runs out, replay again on the full-size device. */
    gm_sim_options so;
    gm_sim_options_init(&so);
    uint64_t small = (uint64_t)program_peak(p) * 4 + ((uint64_t)2 << 30);
    gm_replay_result rr;
    rc = gm_replay_run(prog, &cfg, small < so.capacity ? small : 0, &rr);
    if (!rc && rr.oom && small < so.capacity) rc = gm_replay_run(prog, &cfg, 0, &rr);
    gm_replay_prog_free(prog);
    if (rc) return rc;
    if (rr.error) return gm__set_error(rr.error, "%s", rr.error_detail);
    if (peak_allocated) *peak_allocated = rr.peak_allocated;
    if (peak_reserved) *peak_reserved = rr.peak_reserved;
    return GM_OK;
}

static int estimate(const gm_est_model *m, const gm_est_run *r, gm_est_result *out, int replay) {
    memset(out, 0, sizeof *out);
    gm_est_program p;
    int rc = gm_est_build(m, r, &p);
    if (rc) return rc;
    scan(&p, out);
    out->params = gm_est_param_count(m);
    gm_est_run rr = *r;
    gm_est_check(m, &rr);
    int64_t g = m->patch ? rr.image / m->patch : 0;
    out->tokens = gm_est_is_vision(m) ? (m->family == GM_EST_RESNET ? rr.batch : rr.batch * (g * g + 1))
                                      : rr.batch * rr.seq;
    out->cuda_context = GM_EST_CUDA_CONTEXT;
    out->events = p.n;
    out->steady_by_cat[GM_EST_CAT_PARAMS] = out->phase_by_cat[1][GM_EST_PH_FORWARD][GM_EST_CAT_PARAMS];
    out->steady_by_cat[GM_EST_CAT_OPTSTATE] = out->phase_by_cat[1][GM_EST_PH_FORWARD][GM_EST_CAT_OPTSTATE];
    if (replay) {
        rc = gm_est_replay_conf(&p, "", &out->peak_allocated, &out->peak_reserved_torch);
        if (!rc && replay > 1) rc = gm_est_replay_conf(&p, "policy:gpumem", NULL, &out->peak_reserved_gpumem);
        out->replayed = rc == GM_OK;
    }
    gm_est_program_free(&p);
    return rc;
}

int gm_est_scan(const gm_est_model *m, const gm_est_run *r, gm_est_result *out) {
    return estimate(m, r, out, 0);
}

int gm_est_estimate_torch(const gm_est_model *m, const gm_est_run *r, gm_est_result *out) {
    return estimate(m, r, out, 1);
}

int gm_est_estimate(const gm_est_model *m, const gm_est_run *r, gm_est_result *out) {
    return estimate(m, r, out, 2);
}

static int fits(const gm_est_model *m, const gm_est_run *r, uint64_t capacity, gm_est_result *res) {
    if (gm_est_estimate_torch(m, r, res)) return -1;
    double need = (double)res->peak_reserved_torch * (1.0 + GM_EST_FIT_MARGIN) + (double)res->cuda_context;
    return need <= (double)capacity;
}

int gm_est_fit(const gm_est_model *m, const gm_est_run *rin, int what, uint64_t capacity, int64_t *best,
               gm_est_result *at_best) {
    gm_est_run r = *rin;
    r.steps = 2; /* the peak is in step 1 or 2: later steps repeat step 2 */
    int rc = gm_est_check(m, &r);
    if (rc) return rc;
    if (what == 1 && gm_est_is_vision(m))
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
