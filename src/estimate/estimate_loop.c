/* estimate_loop.c — the training loop as events (gm__est_build): the
 * parameters' setup, then per step and micro-batch the forward over the
 * blocks (checkpointed layers without saving), the backward in reverse
 * (recompute, loss, parameter gradients, freeing what each block saved),
 * the optimizer's state and step; or model.generate() instead. What each
 * block allocates is estimate_blocks.c. */
#include "estimate_emit.h"

/* ---- backward ------------------------------------------------------------ */

/* A parameter's gradient: allocated on the first micro-batch of a step
 * (zero_grad(set_to_none=True) freed the last one), accumulated in place
 * through a temporary afterwards. Under autocast a matmul weight's gradient
 * is computed in 16 bits and cast to the parameter's dtype. */
static void grad_touch(X *x, size_t i) {
    int64_t bytes = x->pl.p[i].elems * x->pb;
    uint32_t h = 0;
    if (x->ac && x->pl.p[i].cols) h = TMP(x, x->pl.p[i].elems * 2);
    if (gm__est_shard_grad(x, i)) {
        /* placed as the strategy places it */
    } else if (!x->gid[i]) {
        x->gid[i] = ALLOC(x, bytes, GM_EST_CAT_GRADS);
    } else {
        uint32_t t = TMP(x, bytes);
        FREE(x, t);
    }
    FREE(x, h);
}

static void free_saved(X *x, size_t mark) {
    while (x->nsv > mark) FREE(x, x->sv[--x->nsv]);
}

/* the loss's backward: nll_loss's gradient (the log-probabilities' dtype),
 * then log_softmax's (the dtype of its input) while its saved output still
 * lives, then the upcast's or the extra tensor's backward in the logits'
 * dtype. Returns the gradient handed to the head's matmul. */
static uint32_t loss_bwd(X *x) {
    int64_t nv = x->loss_rows * x->loss_classes;
    bool fp32_lsm = x->loss_upcast || x->ac;
    uint32_t g1 = TMP(x, nv * (fp32_lsm ? 4 : x->a));
    uint32_t g2;
    if (x->loss_upcast) {
        g2 = TMP(x, nv * 4);
        FREE(x, x->lsm);
        FREE(x, g1);
        if (x->a != 4) {
            uint32_t g3 = TMP(x, nv * x->a);
            FREE(x, g2);
            g2 = g3;
        }
    } else {
        FREE(x, x->lsm);
        g2 = TMP(x, nv * x->a);
        FREE(x, g1);
        if (x->loss_extra) {
            uint32_t g3 = TMP(x, nv * x->a);
            FREE(x, g2);
            FREE(x, x->loss_extra);
            g2 = g3;
        }
    }
    x->lsm = x->loss_extra = 0;
    return g2;
}

static void block_bwd(X *x, blk *b, size_t bi) {
    uint32_t lossg = 0;
    if (b->kind == K_LM_HEAD || b->kind == K_MLM_HEAD || b->kind == K_SEQCLS_HEAD ||
        b->kind == K_VIT_HEAD || b->kind == K_RN_HEAD)
        lossg = loss_bwd(x);
    if (!x->ws_bwd) x->ws_bwd = TMP(x, (int64_t)CUBLAS_WORKSPACE);
    uint32_t t = TMP(x, gm__est_block_bwd_tmp(x, b));
    for (size_t i = b->p0 + b->np; i-- > b->p0;) grad_touch(x, i);
    if (b->kind == K_LM_HEAD && x->m->tied) grad_touch(x, x->pl.wte); /* lm_head = wte */
    if (b->kind == K_MLM_HEAD && x->m->tied) grad_touch(x, x->pl.wte);
    int64_t db = gm__est_dx_bytes(x, b);
    uint32_t ndx = db ? TMP(x, db) : 0;
    free_saved(x, b->mark);
    FREE(x, lossg);
    FREE(x, t);
    FREE(x, x->dx);
    x->dx = ndx;
    (void)bi;
}

/* ---- optimizer ------------------------------------------------------------- */

typedef struct optstate {
    uint32_t *ids;
    int32_t *layer; /* the tag each was allocated under, to free it under */
    size_t n, cap;
    bool started;
} optstate;

static void state_add(X *x, optstate *os, int64_t bytes) {
    tpush(x, &os->ids, &os->layer, &os->n, &os->cap, ALLOC(x, bytes, GM_EST_CAT_OPTSTATE));
}

/* A parameter as this rank holds it (its shard under FSDP). */
static ptensor held(const X *x, size_t i) {
    ptensor p = x->pl.p[i];
    int64_t n = gm__est_param_elems(x, i);
    if (n != p.elems) {
        p.elems = n;
        p.rows = p.cols ? (n + p.cols - 1) / p.cols : 0;
    }
    return p;
}

static void opt_step(X *x, optstate *os) {
    const gm_est_run *r = x->r;
    size_t np = x->pl.np;
    bool first = !os->started;
    int pb = x->pb;
    os->started = true;
    if (gm__est_shard_opt_step(x, first)) return;
    if (first) {
        for (size_t i = 0; i < np; i++) {
            const ptensor hp = held(x, i), *p = &hp;
            x->layer = p->layer;
            switch (r->optimizer) {
            case GM_EST_OPT_SGD: break;
            case GM_EST_OPT_SGD_MOMENTUM:
                state_add(x, os, p->elems * pb);
                break;
            case GM_EST_OPT_ADAM: case GM_EST_OPT_ADAMW:
                state_add(x, os, p->elems * pb);
                state_add(x, os, p->elems * pb);
                break;
            case GM_EST_OPT_ADAMW_8BIT: /* bitsandbytes: uint8 states + fp32 absmax per 256; small tensors 32-bit */
                if (p->elems >= 4096) {
                    for (int k = 0; k < 2; k++) {
                        state_add(x, os, p->elems);
                        state_add(x, os, (p->elems + 255) / 256 * 4);
                    }
                } else {
                    state_add(x, os, p->elems * 4);
                    state_add(x, os, p->elems * 4);
                }
                break;
            case GM_EST_OPT_ADAFACTOR: /* factored second moment: rows + cols of the last two dims */
                if (p->cols) {
                    state_add(x, os, p->elems / p->cols * pb);
                    state_add(x, os, p->elems / p->rows * pb);
                } else {
                    state_add(x, os, p->elems * pb);
                }
                break;
            default:
                break;
            }
        }
        x->layer = -1;
    }
    /* foreach temporaries: Adam's sqrt(exp_avg_sq) list, one per parameter */
    uint32_t *tmp = NULL;
    size_t nt = 0, ct = 0;
    if (r->optimizer == GM_EST_OPT_ADAM || r->optimizer == GM_EST_OPT_ADAMW) {
        for (size_t i = 0; i < np; i++) {
            x->layer = x->pl.p[i].layer;
            push(x, &tmp, &nt, &ct, TMP(x, held(x, i).elems * pb));
        }
    } else if (r->optimizer == GM_EST_OPT_ADAFACTOR) {
        /* per parameter (one at a time): the variance estimate and the update */
        int64_t mx = 0;
        for (size_t i = 0; i < np; i++)
            if (held(x, i).elems > mx) mx = held(x, i).elems;
        x->layer = -1;
        uint32_t a = TMP(x, mx * pb), b = TMP(x, mx * pb);
        FREE(x, a), FREE(x, b);
    }
    for (size_t i = 0; i < nt; i++) {
        x->layer = x->pl.p[i].layer; /* one per parameter, in order */
        FREE(x, tmp[i]);
    }
    free(tmp);
    /* zero_grad(set_to_none=True) */
    for (size_t i = 0; i < np; i++) {
        x->layer = x->pl.p[i].layer;
        FREE(x, x->gid[i]);
        x->gid[i] = 0;
    }
    gm__est_shard_zero_grad(x);
    x->layer = -1;
}

/* ---- the loop ------------------------------------------------------------- */

static void forward(X *x) {
    const gm_est_run *r = x->r;
    x->phase = GM_EST_PH_FORWARD;
    x->nfwd_tmp = 0;
    x->cur_out = 0;
    /* the batch: token ids (labels = the same tensor) or images + labels */
    if (gm__est_is_vision(x->m)) {
        x->input = ALLOC(x, x->B * x->m->channels * x->T * x->T * 4, GM_EST_CAT_ACTS);
        x->fwd_tmp[x->nfwd_tmp++] = ALLOC(x, x->B * 8, GM_EST_CAT_ACTS);
    } else {
        x->input = ALLOC(x, x->N * 8, GM_EST_CAT_ACTS);
    }
    for (size_t i = 0; i < x->pl.nb; i++) {
        blk *b = &x->pl.b[i];
        x->layer = b->li;
        gm__est_shard_pre_fwd(x, b);
        b->mark = x->nsv;
        bool ck = r->checkpointing && b->layer;
        x->nograd = ck;
        gm__est_block_fwd(x, b);
        if (ck) { /* what the no-grad forward left live dies with it */
            for (int k = 0; k < x->nngw; k++)
                if (x->ngw[k] != x->cur_out) FREE(x, x->ngw[k]);
            x->nngw = 0;
        }
        x->nograd = false;
        gm__est_shard_post_fwd(x, b);
    }
    x->layer = -1;
    gm__est_shard_fwd_end(x);
    /* the output is returned: `out = model(...)` rebinds, freeing the previous one */
    for (size_t i = 0; i < x->nheld_prev; i++) {
        x->layer = x->heldl_prev[i];
        FREE(x, x->held_prev[i]);
    }
    x->layer = -1;
    x->nheld_prev = 0;
    uint32_t *t = x->held_prev;
    int32_t *tl = x->heldl_prev;
    size_t tc = x->capheld_prev;
    x->held_prev = x->held;
    x->heldl_prev = x->heldl;
    x->nheld_prev = x->nheld;
    x->capheld_prev = x->capheld;
    x->held = t;
    x->heldl = tl;
    x->nheld = 0;
    x->capheld = tc;
}

static void backward(X *x) {
    x->phase = GM_EST_PH_BACKWARD;
    for (int k = 0; k < x->nfwd_tmp; k++) FREE(x, x->fwd_tmp[k]);
    x->nfwd_tmp = 0;
    x->dx = 0;
    for (size_t i = x->pl.nb; i-- > 0;) {
        blk *b = &x->pl.b[i];
        x->layer = b->li;
        gm__est_shard_pre_bwd(x, i);
        if (x->r->checkpointing && b->layer) {
            /* reentrant checkpoint: rerun the layer's forward with grad, from
             * its saved input (already at b->mark); its output is dropped */
            x->recompute = true;
            uint32_t keep = x->cur_out;
            x->cur_out = x->sv[b->mark];
            gm__est_block_fwd(x, b);
            FREE(x, x->cur_out);
            x->cur_out = keep;
            x->recompute = false;
        }
        block_bwd(x, b, i);
        gm__est_shard_post_bwd(x, b);
    }
    x->layer = -1;
    gm__est_shard_bwd_end(x);
    FREE(x, x->dx);
    x->dx = 0;
    FREE(x, x->input);
    x->input = 0;
}

/* ---- generation (inference) ------------------------------------------------ */

/* model.generate(ids, max_new_tokens=G) under no_grad, greedy, as
 * transformers 5 runs a decoder-only model: a prefill over the prompt, then
 * one token at a time; each layer's DynamicCache grows by torch.cat (the
 * longer copy is made before the shorter one is freed); the LM head runs on
 * the last position only (logits_to_keep=1) and its logits are copied to
 * fp32. Activations live one layer at a time (no graph). */
static void decoder_pass(X *x, int64_t B, int64_t q, int64_t kv_len, uint32_t (*cache)[2], bool first) {
    const gm_est_model *m = x->m;
    int64_t d = m->hidden, f = m->intermediate, a = x->a, N = B * q;
    int64_t kvd = m->kv_heads * m->head_dim, qd = m->heads * m->head_dim;
    uint32_t h = TMP(x, N * d * a); /* embeddings (+ positions) */
    for (int64_t l = 0; l < x->nlayers; l++) {
        x->layer = (int32_t)l;
        uint32_t y = TMP(x, N * d * a);                              /* norm */
        uint32_t qkv = TMP(x, N * (qd + 2 * kvd) * a);               /* projections */
        FREE(x, y);
        for (int k = 0; k < 2; k++) { /* cache.update: cat(old, new) */
            uint32_t c = ALLOC(x, B * kv_len * kvd * a, GM_EST_CAT_ACTS);
            if (!first) FREE(x, cache[l][k]);
            cache[l][k] = c;
        }
        uint32_t o = TMP(x, N * qd * a); /* attention */
        FREE(x, qkv);
        uint32_t p = TMP(x, N * d * a);
        FREE(x, o);
        uint32_t h2 = TMP(x, N * d * a); /* residual */
        FREE(x, p), FREE(x, h);
        uint32_t u = TMP(x, N * f * a), g = TMP(x, N * f * a); /* MLP */
        FREE(x, u);
        uint32_t dn = TMP(x, N * d * a);
        FREE(x, g);
        h = TMP(x, N * d * a);
        FREE(x, dn), FREE(x, h2);
    }
    x->layer = -1;
    uint32_t y = TMP(x, N * d * a);
    uint32_t logits = TMP(x, B * m->vocab * a); /* last position only */
    FREE(x, y), FREE(x, h);
    uint32_t lf = TMP(x, B * m->vocab * 4);     /* .to(torch.float32) */
    FREE(x, logits);
    uint32_t next = TMP(x, B * 8);
    FREE(x, lf), FREE(x, next);
}

static void generate(X *x) {
    const gm_est_run *r = x->r;
    int64_t B = x->B, T = x->T, L = x->nlayers, G = r->generate;
    uint32_t(*cache)[2] = calloc((size_t)L, sizeof *cache);
    if (!cache) {
        x->err = GM_ENOHOSTMEM;
        return;
    }
    x->phase = GM_EST_PH_FORWARD;
    x->step = 1;
    uint32_t ids = ALLOC(x, B * T * 8, GM_EST_CAT_ACTS);
    decoder_pass(x, B, T, T, cache, true);
    uint32_t out = ALLOC(x, B * (T + 1) * 8, GM_EST_CAT_ACTS); /* the growing output ids */
    /* decode steps 1..t0 only grow what the last ones hold: skip to t0 by
     * resizing the cache and the ids (freed before allocated: no peak the
     * real run does not reach later) */
    int64_t t0 = G - 1 > GM_EST_EMIT_DECODE ? G - 1 - GM_EST_EMIT_DECODE : 0;
    if (t0) {
        x->step = 2;
        int64_t kvd = x->m->kv_heads * x->m->head_dim;
        for (int64_t l = 0; l < L; l++)
            for (int k = 0; k < 2; k++) {
                x->layer = (int32_t)l;
                FREE(x, cache[l][k]);
                cache[l][k] = ALLOC(x, B * (T + t0) * kvd * x->a, GM_EST_CAT_ACTS);
            }
        x->layer = -1;
        FREE(x, out);
        out = ALLOC(x, B * (T + t0 + 1) * 8, GM_EST_CAT_ACTS);
    }
    for (int64_t t = t0 + 1; t < G && !x->err; t++) {
        x->step = 2;
        decoder_pass(x, B, 1, T + t, cache, false);
        uint32_t o2 = ALLOC(x, B * (T + t + 1) * 8, GM_EST_CAT_ACTS);
        FREE(x, out);
        out = o2;
    }
    for (int64_t l = 0; l < L; l++) {
        x->layer = (int32_t)l;
        FREE(x, cache[l][0]), FREE(x, cache[l][1]);
    }
    x->layer = -1;
    FREE(x, out), FREE(x, ids);
    free(cache);
}

int gm__est_build(const gm_est_model *m, const gm_est_run *r, gm_est_program *p) {
    int64_t L = gm__est_repeated_layers(m);
    return gm__est_build_layers(m, r, L > GM_EST_REPLAY_LAYERS ? GM_EST_REPLAY_LAYERS : 0, p);
}

int gm__est_build_layers(const gm_est_model *m, const gm_est_run *rin, int64_t layers, gm_est_program *p) {
    memset(p, 0, sizeof *p);
    gm_est_run r = *rin;
    int rc = gm__est_check(m, &r);
    if (rc) return rc;
    if (layers < 0 || layers > m->layers || (layers && !gm__est_repeated_layers(m)))
        return gm__set_error(GM_EINVAL, "cannot build %s with %lld layers", m->name, (long long)layers);
    if (!layers) layers = m->layers;
    gm_est_model mm = *m; /* the resnet plan's geometry follows the run's image size */
    if (gm__est_is_vision(m)) mm.image = r.image;
    m = &mm;
    X x;
    memset(&x, 0, sizeof x);
    x.p = p;
    x.m = m;
    x.r = &r;
    x.layer = -1;
    x.nlayers = layers;
    p->layers = layers;
    if ((rc = gm__est_make_plan(m, layers, &x.pl))) {
        gm__est_plan_free(&x.pl);
        return gm__set_error(rc, "out of host memory");
    }
    x.ac = r.precision == GM_EST_FP16_AUTOCAST || r.precision == GM_EST_BF16_AUTOCAST;
    x.a = r.precision == GM_EST_FP32 ? 4 : 2;
    x.pb = r.precision == GM_EST_BF16 ? 2 : 4;
    x.rb = x.ac ? 4 : x.a;
    x.B = r.batch;
    if (gm__est_is_vision(m)) {
        x.T = r.image;
        int64_t g = m->patch ? r.image / m->patch : 0;
        x.N = m->family == GM_EST_RESNET ? x.B : x.B * (g * g + 1);
    } else {
        x.T = r.seq;
        x.N = x.B * x.T;
    }
    if (m->family == GM_EST_RESNET) x.T = r.image;
    x.pid = calloc(x.pl.np, sizeof *x.pid);
    x.gid = calloc(x.pl.np, sizeof *x.gid);
    if (!x.pid || !x.gid || gm__est_shard_init(&x)) x.err = GM_ENOHOSTMEM;
    /* model.cuda(): the parameters, in module order; a 16-bit model is
     * built in fp32 and cast (model.to(torch.bfloat16) / .half()): Module._apply
     * converts one tensor at a time, so the fp32 model and the first 16-bit
     * copy (the embedding) coexist -- the whole peak of the generation
     * workload (../shared/traces/gpt2_generate_kvcache.pickle.gz) -- unless
     * from_pretrained(torch_dtype=) builds it in 16 bits (built_16bit) */
    x.phase = GM_EST_PH_SETUP;
    /* sharded (FSDP, ZeRO-3): materialised as shards, in their dtype */
    bool cast = x.pb == 2 && !r.built_16bit && (r.shard == GM_EST_SHARD_NONE || r.shard == GM_EST_SHARD_DDP);
    for (size_t i = 0; i < x.pl.np && !x.err; i++) {
        x.layer = x.pl.p[i].layer;
        x.pid[i] = ALLOC(&x, gm__est_param_elems(&x, i) * (cast ? 4 : x.pb), GM_EST_CAT_PARAMS);
    }
    if (cast)
        for (size_t i = 0; i < x.pl.np; i++) {
            x.layer = x.pl.p[i].layer;
            uint32_t h = ALLOC(&x, x.pl.p[i].elems * 2, GM_EST_CAT_PARAMS);
            FREE(&x, x.pid[i]);
            x.pid[i] = h;
        }
    x.layer = -1;
    gm__est_shard_setup(&x);
    optstate os = {0};
    if (r.generate) {
        generate(&x);
        r.steps = 0;
    }
    uint32_t scaler = 0;
    for (int s = 1; s <= r.steps && !x.err; s++) {
        x.step = (uint8_t)s;
        /* micro-batches after the second start from its state: the peaks repeat */
        int64_t accum = r.accum < GM_EST_EMIT_ACCUM ? r.accum : GM_EST_EMIT_ACCUM;
        for (int64_t k = 0; k < accum && !x.err; k++) {
            forward(&x);
            if (r.precision == GM_EST_FP16_AUTOCAST && !scaler) /* GradScaler: scale + growth tracker */
                scaler = ALLOC(&x, 8, GM_EST_CAT_OPTSTATE);
            backward(&x);
        }
        x.phase = GM_EST_PH_OPTIMIZER;
        opt_step(&x, &os);
    }
    /* the end: everything is released */
    x.phase = GM_EST_PH_SETUP;
    for (size_t i = 0; i < x.nheld_prev; i++) {
        x.layer = x.heldl_prev[i];
        FREE(&x, x.held_prev[i]);
    }
    x.layer = -1;
    for (size_t i = 0; i < os.n; i++) {
        x.layer = os.layer[i];
        FREE(&x, os.ids[i]);
    }
    x.layer = -1;
    FREE(&x, scaler);
    FREE(&x, x.ws_fwd), FREE(&x, x.ws_bwd);
    gm__est_shard_free(&x);
    for (size_t i = 0; i < x.pl.np; i++) {
        x.layer = x.pl.p[i].layer;
        FREE(&x, x.pid[i]);
    }
    x.layer = -1;
    free(os.ids);
    free(os.layer);
    free(x.sv);
    free(x.held), free(x.heldl);
    free(x.held_prev), free(x.heldl_prev);
    free(x.pid);
    free(x.gid);
    gm__est_plan_free(&x.pl);
    if (x.err) {
        gm__est_program_free(p);
        return gm__set_error(x.err, "out of host memory building the estimate");
    }
    return GM_OK;
}

void gm__est_program_free(gm_est_program *p) {
    free(p->ev);
    memset(p, 0, sizeof *p);
}
