/* estimate_plan.c — a model as the estimator sees it: its blocks
 * (embeddings, layers, head; ResNet's stem, residual blocks, head) and each
 * block's parameter tensors in module order, with the geometry the block
 * emitters need (estimate_emit.h); and gm__est_param_count. */
#include "estimate_emit.h"

static void addp(plan *pl, int64_t rows, int64_t cols) {
    if (pl->err) return;
    if (pl->np == pl->capp) {
        size_t nc = pl->capp ? pl->capp * 2 : 64;
        ptensor *n = realloc(pl->p, nc * sizeof *n);
        if (!n) {
            pl->err = GM_ENOHOSTMEM;
            return;
        }
        pl->p = n;
        pl->capp = nc;
    }
    pl->p[pl->np++] = cols ? (ptensor){rows * cols, rows, cols, pl->cur_layer, rows}
                           : (ptensor){rows, 0, 0, pl->cur_layer, rows};
}
static void addvec(plan *pl, int64_t n) { addp(pl, n, 0); }
static void addlin(plan *pl, int64_t out, int64_t in, bool bias) {
    addp(pl, out, in);
    if (bias) addvec(pl, out);
}
/* conv weight (out, in, k, k): Adafactor factors the last two dims */
static void addconv(plan *pl, int64_t out, int64_t in, int64_t k) {
    addp(pl, out * in * k, k);
    if (!pl->err) pl->p[pl->np - 1].dim0 = out;
}

static blk *addb(plan *pl, int kind) {
    if (pl->err) return NULL;
    if (pl->nb == pl->capb) {
        size_t nc = pl->capb ? pl->capb * 2 : 32;
        blk *n = realloc(pl->b, nc * sizeof *n);
        if (!n) {
            pl->err = GM_ENOHOSTMEM;
            return NULL;
        }
        pl->b = n;
        pl->capb = nc;
    }
    blk *b = &pl->b[pl->nb++];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->li = -1;
    b->p0 = pl->np;
    pl->cur_layer = -1;
    return b;
}
static void endb(plan *pl) {
    if (!pl->err) pl->b[pl->nb - 1].np = pl->np - pl->b[pl->nb - 1].p0;
}

void gm__est_plan_free(plan *pl) {
    free(pl->b);
    free(pl->p);
}

static void resnet_plan(plan *pl, const gm_est_model *m) {
    addb(pl, K_RN_STEM);
    addconv(pl, 64, m->channels, 7);
    addvec(pl, 64), addvec(pl, 64);
    endb(pl);
    int64_t c = 64, h = (m->image + 1) / 2; /* conv1 stride 2, pad 3 */
    h = (h + 1) / 2;                          /* maxpool 3, stride 2, pad 1 */
    int exp = m->bottleneck ? 4 : 1;
    for (int s = 0; s < 4; s++) {
        int64_t w = 64 << s;
        for (int64_t i = 0; i < m->blocks[s]; i++) {
            blk *b = addb(pl, K_RN_BLOCK);
            if (!b) return;
            b->c_in = c;
            b->width = w;
            b->c_out = w * exp;
            b->stride = (s > 0 && i == 0) ? 2 : 1;
            b->h_in = h;
            b->downsample = i == 0 && (b->stride != 1 || c != w * exp);
            if (m->bottleneck) {
                addconv(pl, w, c, 1), addvec(pl, w), addvec(pl, w);
                addconv(pl, w, w, 3), addvec(pl, w), addvec(pl, w);
                addconv(pl, w * 4, w, 1), addvec(pl, w * 4), addvec(pl, w * 4);
            } else {
                addconv(pl, w, c, 3), addvec(pl, w), addvec(pl, w);
                addconv(pl, w, w, 3), addvec(pl, w), addvec(pl, w);
            }
            if (b->downsample) addconv(pl, w * exp, c, 1), addvec(pl, w * exp), addvec(pl, w * exp);
            endb(pl);
            h = (h + b->stride - 1) / b->stride;
            c = w * exp;
        }
    }
    addb(pl, K_RN_HEAD);
    addlin(pl, m->num_labels, c, true);
    endb(pl);
}

/* A repeated layer: its block and parameters carry its index. */
static blk *addlayer(plan *pl, int kind, int64_t i, bool checkpointable) {
    blk *b = addb(pl, kind);
    if (!b) return NULL;
    b->layer = checkpointable;
    b->li = (int32_t)i;
    pl->cur_layer = (int32_t)i;
    return b;
}

int64_t gm__est_repeated_layers(const gm_est_model *m) { return m->family == GM_EST_RESNET ? 0 : m->layers; }

int gm__est_make_plan(const gm_est_model *m, int64_t layers, plan *pl) {
    memset(pl, 0, sizeof *pl);
    int64_t d = m->hidden, f = m->intermediate, V = m->vocab, L = layers;
    switch (m->family) {
    case GM_EST_GPT2:
        addb(pl, K_GPT2_EMB);
        pl->wte = pl->np;
        addp(pl, V, d);
        addp(pl, m->max_positions, d);
        endb(pl);
        for (int64_t i = 0; i < L; i++) {
            addlayer(pl, K_GPT2_LAYER, i, true);
            addvec(pl, d), addvec(pl, d);
            addlin(pl, 3 * d, d, true); /* Conv1D c_attn */
            addlin(pl, d, d, true);
            addvec(pl, d), addvec(pl, d);
            addlin(pl, f, d, true);
            addlin(pl, d, f, true);
            endb(pl);
        }
        break;
    case GM_EST_LLAMA: {
        int64_t qd = m->heads * m->head_dim, kvd = m->kv_heads * m->head_dim;
        addb(pl, K_LLAMA_EMB);
        pl->wte = pl->np;
        addp(pl, V, d);
        endb(pl);
        for (int64_t i = 0; i < L; i++) {
            addlayer(pl, K_LLAMA_LAYER, i, true);
            addvec(pl, d);
            addlin(pl, qd, d, false), addlin(pl, kvd, d, false), addlin(pl, kvd, d, false);
            addlin(pl, d, qd, false);
            addvec(pl, d);
            addlin(pl, f, d, false), addlin(pl, f, d, false), addlin(pl, d, f, false);
            endb(pl);
        }
        break;
    }
    case GM_EST_BERT:
        addb(pl, K_BERT_EMB);
        pl->wte = pl->np;
        addp(pl, V, d);
        addp(pl, m->max_positions, d);
        addp(pl, m->type_vocab, d);
        addvec(pl, d), addvec(pl, d);
        endb(pl);
        for (int64_t i = 0; i < L; i++) {
            addlayer(pl, K_BERT_LAYER, i, true);
            for (int k = 0; k < 4; k++) addlin(pl, d, d, true);
            addvec(pl, d), addvec(pl, d);
            addlin(pl, f, d, true);
            addlin(pl, d, f, true);
            addvec(pl, d), addvec(pl, d);
            endb(pl);
        }
        break;
    case GM_EST_VIT_HF:
    case GM_EST_VIT_TV: {
        int64_t np = (m->image / m->patch) * (m->image / m->patch);
        bool hf = m->family == GM_EST_VIT_HF;
        addb(pl, hf ? K_VITHF_EMB : K_VITTV_EMB);
        if (hf) {
            addvec(pl, d);                 /* cls_token */
            addp(pl, np + 1, d);           /* position_embeddings */
            addconv(pl, d, m->channels, m->patch), addvec(pl, d);
        } else {
            addvec(pl, d);                 /* class_token */
            addconv(pl, d, m->channels, m->patch), addvec(pl, d);
            addp(pl, np + 1, d);           /* encoder.pos_embedding */
        }
        endb(pl);
        for (int64_t i = 0; i < L; i++) {
            addlayer(pl, hf ? K_VITHF_LAYER : K_VITTV_LAYER, i, hf);
            addvec(pl, d), addvec(pl, d);
            if (hf) {
                for (int k = 0; k < 4; k++) addlin(pl, d, d, true);
            } else {
                addlin(pl, 3 * d, d, true), addlin(pl, d, d, true);
            }
            addvec(pl, d), addvec(pl, d);
            addlin(pl, f, d, true);
            addlin(pl, d, f, true);
            endb(pl);
        }
        break;
    }
    case GM_EST_RESNET:
        resnet_plan(pl, m);
        return pl->err;
    }
    /* heads */
    switch (m->head) {
    case GM_EST_HEAD_CAUSAL_LM:
        addb(pl, K_LM_HEAD);
        if (m->family == GM_EST_GPT2) addvec(pl, d), addvec(pl, d);
        else addvec(pl, d);
        if (!m->tied) addp(pl, V, d);
        endb(pl);
        break;
    case GM_EST_HEAD_MASKED_LM:
        addb(pl, K_MLM_HEAD);
        addlin(pl, d, d, true);
        addvec(pl, d), addvec(pl, d);
        if (!m->tied) addp(pl, V, d);
        addvec(pl, V); /* decoder bias */
        endb(pl);
        break;
    case GM_EST_HEAD_SEQ_CLS:
        addb(pl, K_SEQCLS_HEAD);
        if (m->family == GM_EST_BERT) {
            addlin(pl, d, d, true);                 /* pooler */
            addlin(pl, m->num_labels, d, true);     /* classifier */
        } else {
            if (m->family == GM_EST_GPT2) addvec(pl, d), addvec(pl, d); /* ln_f */
            else addvec(pl, d);                                           /* norm */
            addlin(pl, m->num_labels, d, false);                          /* score */
        }
        endb(pl);
        break;
    case GM_EST_HEAD_IMAGE_CLS:
        addb(pl, K_VIT_HEAD);
        addvec(pl, d), addvec(pl, d);
        addlin(pl, m->num_labels, d, true);
        endb(pl);
        break;
    }
    return pl->err;
}

static uint64_t count_params(const gm_est_model *m, int64_t layers) {
    plan pl;
    uint64_t n = 0;
    if (gm__est_make_plan(m, layers, &pl) == GM_OK)
        for (size_t i = 0; i < pl.np; i++) n += (uint64_t)pl.p[i].elems;
    gm__est_plan_free(&pl);
    return n;
}

/* Arithmetic over the layers: one layer's parameters times their count
 * (gm__est_check has bounded the product). */
uint64_t gm__est_param_count(const gm_est_model *m) {
    int64_t L = gm__est_repeated_layers(m);
    if (L <= 2) return count_params(m, m->layers);
    uint64_t one = count_params(m, 1), two = count_params(m, 2);
    return one + (two - one) * (uint64_t)(L - 1);
}
