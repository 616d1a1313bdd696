/* estimate.c — emits a training loop's allocations as an event sequence.
 *
 * A model is a list of blocks (embeddings, each layer, the head with the
 * loss; for ResNet the stem, each residual block and the head). Each block
 * has its parameter tensors and a forward emitter that allocates what the
 * model's code allocates, in order: tensors that autograd saves for backward
 * go on a stack (SAVE), the rest are freed when the code drops them (TMP).
 * Backward walks the blocks in reverse: per block it allocates the incoming
 * gradients' working set, the parameter gradients (set_to_none: allocated on
 * the first micro-batch, accumulated through a temporary later), frees the
 * block's saved tensors and hands a gradient to the block below. With
 * checkpointing a layer's forward runs without saving (only its input is
 * kept) and runs again at the start of its backward.
 *
 * Sizes follow the code of transformers 5 / torchvision 0.26 / torch 2.11
 * under each precision: under autocast, matmul inputs and weights are cast
 * to 16 bits (the weight casts live until the layer's backward), LayerNorm
 * and softmax run in fp32, the residual stream stays fp32, the loss upcasts
 * the logits to fp32. Where a size is calibrated rather than derived, the
 * comment says so and bench/RESULTS.md has the measurement. */
#include "estimate.h"

#include "internal.h"
#include "trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* torch's allocator rounds every request up to 512 bytes (kMinBlockSize). */
#define ROUND512(n) (((n) + 511) / 512 * 512)
/* cuBLAS workspace per handle and stream on Hopper (torch's default
 * CUBLAS_WORKSPACE_CONFIG on sm90: 32 MiB), one for the forward thread and
 * one for the autograd thread; allocated through the caching allocator and
 * kept (seen in the GPT-2 and ResNet-50 snapshots in ../shared/traces). */
#define CUBLAS_WORKSPACE ((uint64_t)32 << 20)

void gm_est_run_init(gm_est_run *r) {
    memset(r, 0, sizeof *r);
    r->batch = 8;
    r->precision = GM_EST_BF16_AUTOCAST;
    r->optimizer = GM_EST_OPT_ADAMW;
    r->accum = 1;
    r->attention = GM_EST_ATTN_SDPA;
    r->steps = 3;
}

/* ---- blocks and parameters ---------------------------------------------- */

enum {
    K_GPT2_EMB, K_GPT2_LAYER, K_LLAMA_EMB, K_LLAMA_LAYER, K_BERT_EMB, K_BERT_LAYER, K_VITHF_EMB,
    K_VITHF_LAYER, K_VITTV_EMB, K_VITTV_LAYER, K_LM_HEAD, K_MLM_HEAD, K_SEQCLS_HEAD, K_VIT_HEAD,
    K_RN_STEM, K_RN_BLOCK, K_RN_HEAD,
};

typedef struct blk {
    int kind;
    bool layer;          /* checkpointable transformer layer */
    size_t p0, np;       /* its parameter tensors */
    size_t mark;         /* saved-stack position at its forward start */
    int64_t c_in, width, c_out, stride, h_in; /* resnet block geometry */
    bool downsample;
} blk;

typedef struct ptensor {
    int64_t elems, rows, cols; /* rows x cols = the last two dims (0 for 1-D) */
} ptensor;

typedef struct plan {
    blk *b;
    size_t nb, capb;
    ptensor *p;
    size_t np, capp;
    size_t wte; /* index of the token embedding (tied LM heads) */
    int err;
} plan;

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
    pl->p[pl->np++] = cols ? (ptensor){rows * cols, rows, cols} : (ptensor){rows, 0, 0};
}
static void addvec(plan *pl, int64_t n) { addp(pl, n, 0); }
static void addlin(plan *pl, int64_t out, int64_t in, bool bias) {
    addp(pl, out, in);
    if (bias) addvec(pl, out);
}
/* conv weight (out, in, k, k): Adafactor factors the last two dims */
static void addconv(plan *pl, int64_t out, int64_t in, int64_t k) { addp(pl, out * in * k, k); }

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
    b->p0 = pl->np;
    return b;
}
static void endb(plan *pl) {
    if (!pl->err) pl->b[pl->nb - 1].np = pl->np - pl->b[pl->nb - 1].p0;
}

static void plan_free(plan *pl) {
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

static int make_plan(const gm_est_model *m, plan *pl) {
    memset(pl, 0, sizeof *pl);
    int64_t d = m->hidden, f = m->intermediate, V = m->vocab, L = m->layers;
    switch (m->family) {
    case GM_EST_GPT2:
        addb(pl, K_GPT2_EMB);
        pl->wte = pl->np;
        addp(pl, V, d);
        addp(pl, m->max_positions, d);
        endb(pl);
        for (int64_t i = 0; i < L; i++) {
            blk *b = addb(pl, K_GPT2_LAYER);
            if (b) b->layer = true;
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
            blk *b = addb(pl, K_LLAMA_LAYER);
            if (b) b->layer = true;
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
            blk *b = addb(pl, K_BERT_LAYER);
            if (b) b->layer = true;
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
            blk *b = addb(pl, hf ? K_VITHF_LAYER : K_VITTV_LAYER);
            if (b) b->layer = hf;
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

uint64_t gm_est_param_count(const gm_est_model *m) {
    plan pl;
    uint64_t n = 0;
    if (make_plan(m, &pl) == GM_OK)
        for (size_t i = 0; i < pl.np; i++) n += (uint64_t)pl.p[i].elems;
    plan_free(&pl);
    return n;
}

/* ---- the emitter ----------------------------------------------------------- */

typedef struct X {
    gm_est_program *p;
    const gm_est_model *m;
    const gm_est_run *r;
    plan pl;
    int a;   /* bytes of an activation element */
    int rb;  /* bytes of the residual stream (fp32 under autocast) */
    int pb;  /* bytes of a parameter */
    bool ac; /* autocast */
    int64_t B, T, N; /* micro-batch, tokens per sample, tokens per micro-batch */
    uint8_t phase, step;
    /* saved for backward */
    uint32_t *sv;
    size_t nsv, capsv;
    /* no-grad forward (checkpointing): the last few tensors stay live */
    bool nograd;
    uint32_t ngw[2];
    int nngw;
    bool recompute;
    /* held by the model output (keep_output): freed when the next forward
     * returns and `out` is rebound */
    uint32_t *held, *held_prev;
    size_t nheld, nheld_prev, capheld, capheld_prev;
    uint32_t fwd_tmp[4]; /* per-forward temporaries (masks, inputs) */
    int nfwd_tmp;
    uint32_t input;     /* the micro-batch's input tensor */
    uint32_t cur_out;   /* output of the last block run */
    uint32_t dx;        /* gradient flowing into the block being differentiated */
    uint32_t *pid, *gid; /* parameter and gradient tensor ids per parameter */
    uint32_t ws_fwd, ws_bwd;
    uint32_t lsm, loss_extra; /* the loss's saved tensors */
    bool loss_upcast, loss_extra_ok;
    int64_t loss_rows, loss_classes;
    int err;
} X;

static uint32_t ev(X *x, uint64_t size, bool fr, uint32_t id, int cat) {
    if (x->err) return 0;
    gm_est_program *p = x->p;
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 4096;
        gm_est_event *n = realloc(p->ev, nc * sizeof *n);
        if (!n) {
            x->err = GM_ENOHOSTMEM;
            return 0;
        }
        p->ev = n;
        p->cap = nc;
    }
    if (!fr) id = ++p->ntensors;
    p->ev[p->n++] = (gm_est_event){fr ? 0 : size, id, fr, (uint8_t)cat, x->phase, x->step};
    return id;
}

static uint32_t ALLOC(X *x, int64_t bytes, int cat) {
    if (bytes <= 0) return 0;
    return ev(x, (uint64_t)bytes, false, 0, cat);
}
static void FREE(X *x, uint32_t id) {
    if (id) ev(x, 0, true, id, 0);
}
static uint32_t TMP(X *x, int64_t bytes) { return ALLOC(x, bytes, GM_EST_CAT_TEMPS); }

static void push(X *x, uint32_t **arr, size_t *n, size_t *cap, uint32_t id) {
    if (!id || x->err) return;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        uint32_t *na = realloc(*arr, nc * sizeof *na);
        if (!na) {
            x->err = GM_ENOHOSTMEM;
            return;
        }
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = id;
}

/* A tensor autograd saves. Without grad (checkpointed forward) nothing is
 * saved: it lives until two more such tensors exist. */
static uint32_t SAVE(X *x, int64_t bytes) {
    if (x->nograd) {
        uint32_t id = TMP(x, bytes);
        if (x->nngw == 2) {
            FREE(x, x->ngw[0]);
            x->ngw[0] = x->ngw[1];
            x->nngw = 1;
        }
        x->ngw[x->nngw++] = id;
        return id;
    }
    uint32_t id = ALLOC(x, bytes, GM_EST_CAT_ACTS);
    push(x, &x->sv, &x->nsv, &x->capsv, id);
    return id;
}
/* Saved in the plain forward; held by the output instead when it is kept. */
static uint32_t HOLD_OR_SAVE(X *x, int64_t bytes) {
    if (!x->r->keep_output || x->nograd || x->recompute) return SAVE(x, bytes);
    uint32_t id = ALLOC(x, bytes, GM_EST_CAT_ACTS);
    push(x, &x->held, &x->nheld, &x->capheld, id);
    return id;
}
/* Under autocast a matmul's weight (and bias) is cast to 16 bits and the
 * copy is saved for backward. */
static void WCOPY(X *x, int64_t elems) {
    if (x->ac) SAVE(x, elems * 2);
}
/* Under autocast a matmul's fp32 input is cast (and the copy saved);
 * otherwise the input itself is saved (by reference: the caller keeps it). */
static void CAST_IN(X *x, int64_t elems) {
    if (x->ac) SAVE(x, elems * 2);
}
static void first_matmul(X *x) {
    if (!x->ws_fwd) x->ws_fwd = TMP(x, (int64_t)CUBLAS_WORKSPACE);
}

/* The block input handed from the block below: saved by this block's
 * first op (or, with checkpointing, by the checkpoint). */
static void take_input(X *x, bool saved) {
    uint32_t in = x->cur_out;
    if (!in) return;
    if (x->recompute) return; /* already on the stack from the first forward */
    if (saved || x->nograd) /* saved by its first op, or kept by the checkpoint */
        push(x, &x->sv, &x->nsv, &x->capsv, in);
}
/* A block input not saved by anything is freed once used. */
static void input_done(X *x, uint32_t in, bool saved) {
    if (saved || x->nograd || x->recompute || !in) return;
    FREE(x, in);
}
static uint32_t OUT(X *x, int64_t bytes) { return ALLOC(x, bytes, GM_EST_CAT_ACTS); }

/* LayerNorm under the precision: saves mean and rstd; returns the output
 * (fp32 under autocast, not saved; otherwise saved as the next matmul's
 * input when save_out). */
static uint32_t layernorm(X *x, int64_t rows, int64_t d, bool out_saved_if_plain) {
    SAVE(x, rows * 4);
    SAVE(x, rows * 4);
    if (x->ac) return TMP(x, rows * d * 4);
    return out_saved_if_plain ? SAVE(x, rows * d * x->a) : TMP(x, rows * d * x->a);
}

/* Attention core: q, k, v already exist (saved). sdpa: flash (16-bit) or
 * memory-efficient (fp32) kernel saves output and logsumexp. eager:
 * matmul, scale, mask, softmax (fp32 under autocast), dropout, matmul. */
static void attention(X *x, int64_t heads, int64_t hd, bool causal, bool dropout) {
    int64_t B = x->B, T = x->T, N = x->N;
    if (x->r->attention == GM_EST_ATTN_SDPA) {
        int64_t tpad = x->a == 4 ? (T + 31) / 32 * 32 : T;
        SAVE(x, N * heads * hd * x->a);
        SAVE(x, B * heads * tpad * 4);
        if (dropout) SAVE(x, 8), SAVE(x, 8); /* philox seed and offset */
        return;
    }
    int64_t S = B * heads * T * T;
    uint32_t w = TMP(x, S * x->a);
    uint32_t w2 = TMP(x, S * x->a); /* / scale */
    FREE(x, w);
    if (causal || x->r->attention == GM_EST_ATTN_EAGER) {
        uint32_t w3 = TMP(x, S * x->a); /* + mask */
        FREE(x, w2);
        w2 = w3;
    }
    uint32_t sm;
    if (x->ac) {
        uint32_t f = TMP(x, S * 4); /* autocast: softmax input to fp32 */
        FREE(x, w2);
        sm = SAVE(x, S * 4);
        FREE(x, f);
        if (dropout) {
            uint32_t c = TMP(x, S * x->a); /* .type(value.dtype) */
            SAVE(x, S);                     /* mask */
            SAVE(x, S * x->a);              /* dropped, saved by matmul */
            FREE(x, c);
        } else {
            SAVE(x, S * x->a);
        }
    } else {
        sm = SAVE(x, S * x->a);
        FREE(x, w2);
        if (dropout) SAVE(x, S), SAVE(x, S * x->a);
    }
    (void)sm;
    uint32_t o = TMP(x, N * heads * hd * x->a); /* matmul out, (B, h, T, hd) */
    SAVE(x, N * heads * hd * x->a);             /* transpose + reshape copy */
    FREE(x, o);
}

/* Backward working set of a transformer layer, net of the saved tensors
 * its ops free as they go (allocated here before any is freed): the
 * attention kernel's dq, dk, dv and fp32 dq accumulator, or the MLP's
 * gradient through the activation (GPT-2's Python gelu_new makes a few
 * fp32 ones), whichever is larger; eager attention's two fp32 T x T
 * gradients. Calibrated on torchvision's vit_b_16 and BERT sequence
 * classification, whose peaks fall in the last layer's backward
 * (bench/RESULTS.md); the language models peak at the loss instead. */
static int64_t layer_bwd_tmp(X *x) {
    const gm_est_model *m = x->m;
    int64_t N = x->N, f = m->intermediate, d = m->hidden, e = x->ac ? 4 : x->a;
    int64_t mlp = N * f * x->a;
    if (m->family == GM_EST_GPT2 && m->gelu_python) mlp += 2 * N * f * e;
    int64_t att = N * d * (3 * x->a + 4);
    if (x->r->attention == GM_EST_ATTN_EAGER) att += x->B * m->heads * x->T * x->T * 4 * 2;
    return mlp > att ? mlp : att;
}

/* The tail of a transformer sublayer (attention or MLP): the output
 * projection (weight + bias `welems`, its 16-bit copy saved under
 * autocast), the residual dropout when `dropout` (its mask saved), and the
 * residual add in the stream's dtype -- saved as the next norm's input, or,
 * as the layer's last op (`layer_out`), handed to the block above. */
static void proj_residual(X *x, int64_t welems, bool dropout, bool layer_out) {
    int64_t N = x->N, d = x->m->hidden;
    WCOPY(x, welems);
    uint32_t o = TMP(x, N * d * x->a);
    if (dropout) {
        SAVE(x, N * d);
        uint32_t o2 = TMP(x, N * d * x->a);
        FREE(x, o);
        o = o2;
    }
    if (layer_out) x->cur_out = OUT(x, N * d * x->rb);
    else SAVE(x, N * d * x->rb);
    FREE(x, o);
}

/* ---- forward of each block kind -------------------------------------------- */

static void gpt2_emb(X *x) {
    int64_t N = x->N, d = x->m->hidden;
    int e = x->pb; /* embedding output: parameter dtype */
    uint32_t we = TMP(x, N * d * e), pe = TMP(x, x->T * d * e);
    uint32_t h = TMP(x, N * d * e);
    FREE(x, we), FREE(x, pe);
    if (x->r->attention == GM_EST_ATTN_EAGER && x->nfwd_tmp < 4) /* the 4-D causal mask */
        x->fwd_tmp[x->nfwd_tmp++] = TMP(x, x->B * x->T * x->T * x->pb);
    if (x->m->dropout) {
        SAVE(x, N * d);
        x->cur_out = OUT(x, N * d * e);
        FREE(x, h);
    } else {
        x->cur_out = h;
    }
}

static void gpt2_gelu_and_proj(X *x, int64_t N, int64_t f, uint32_t u) {
    if (!x->m->gelu_python) { /* one kernel: saves its input */
        uint32_t g = SAVE(x, N * f * x->a);
        (void)g;
        return; /* u saved by the caller, g saved by c_proj */
    }
    /* NewGELU: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) as Python ops */
    int64_t e = x->ac ? 4 : x->a; /* torch.pow runs in fp32 under autocast */
    if (x->ac) SAVE(x, N * f * 4);  /* the fp32 cast pow saves */
    uint32_t t1 = TMP(x, N * f * e), t2 = TMP(x, N * f * e);
    FREE(x, t1);
    uint32_t t3 = TMP(x, N * f * e);
    FREE(x, t2);
    uint32_t t4 = TMP(x, N * f * e);
    FREE(x, t3);
    SAVE(x, N * f * e); /* tanh */
    FREE(x, t4);
    SAVE(x, N * f * e);     /* 1 + tanh */
    SAVE(x, N * f * x->a);  /* 0.5 * x */
    if (x->ac) FREE(x, u);  /* c_fc's output: its fp32 copy is what is saved */
    if (x->ac) {
        uint32_t g = TMP(x, N * f * e);
        SAVE(x, N * f * 2); /* cast for c_proj */
        FREE(x, g);
    } else {
        SAVE(x, N * f * x->a); /* saved by c_proj */
    }
}

static void gpt2_layer(X *x) {
    const gm_est_model *m = x->m;
    int64_t N = x->N, d = m->hidden, f = m->intermediate;
    take_input(x, true);
    uint32_t y = layernorm(x, N, d, true);
    if (x->ac) {
        CAST_IN(x, N * d);
        FREE(x, y);
    }
    first_matmul(x);
    WCOPY(x, 3 * d * d + 3 * d);
    SAVE(x, N * 3 * d * x->a); /* qkv: q, k, v are views */
    bool cache = m->use_cache && !x->r->checkpointing;
    if (cache) { /* DynamicCache.update: torch.cat copies k and v; sdpa saves the copies */
        HOLD_OR_SAVE(x, N * d * x->a);
        HOLD_OR_SAVE(x, N * d * x->a);
    }
    attention(x, m->heads, m->head_dim, true, m->dropout);
    proj_residual(x, d * d + d, m->dropout, false); /* residual: saved by ln_2 */
    y = layernorm(x, N, d, true);
    if (x->ac) {
        CAST_IN(x, N * d);
        FREE(x, y);
    }
    WCOPY(x, d * f + f);
    uint32_t u = x->ac || !m->gelu_python ? (m->gelu_python ? TMP(x, N * f * x->a) : SAVE(x, N * f * x->a))
                                           : SAVE(x, N * f * x->a);
    gpt2_gelu_and_proj(x, N, f, u);
    proj_residual(x, f * d + d, m->dropout, true);
}

/* Llama RMSNorm: hidden.to(fp32); var = pow(2).mean; hidden * rsqrt(var+eps);
 * weight * hidden.to(dtype). Returns the output (to be cast or saved). */
static uint32_t rmsnorm(X *x, int64_t N, int64_t d) {
    if (x->a == 2 && !x->ac) SAVE(x, N * d * 4); /* bf16 model: the fp32 copy is saved */
    uint32_t p2 = TMP(x, N * d * 4);
    uint32_t mean = TMP(x, N * 4);
    FREE(x, p2);
    uint32_t me = TMP(x, N * 4);
    FREE(x, mean);
    SAVE(x, N * 4); /* rsqrt */
    FREE(x, me);
    SAVE(x, N * d * 4); /* hidden * rsqrt, saved by the weight mul */
    if (x->ac) return TMP(x, N * d * 4);
    if (x->a == 2) {
        uint32_t c = TMP(x, N * d * 2);
        uint32_t o = SAVE(x, N * d * 2);
        FREE(x, c);
        return o;
    }
    return SAVE(x, N * d * 4);
}

static void llama_emb(X *x) {
    int64_t N = x->N, d = x->m->hidden, hd = x->m->head_dim;
    x->cur_out = TMP(x, N * d * x->pb);
    /* rotary cos / sin, (B, T, head_dim) in the activation dtype, shared by every layer */
    SAVE(x, x->B * x->T * hd * x->a);
    SAVE(x, x->B * x->T * hd * x->a);
    if (x->r->attention == GM_EST_ATTN_EAGER && x->nfwd_tmp < 4)
        x->fwd_tmp[x->nfwd_tmp++] = TMP(x, x->B * x->T * x->T * x->pb);
}

static void llama_layer(X *x) {
    const gm_est_model *m = x->m;
    int64_t N = x->N, d = m->hidden, f = m->intermediate;
    int64_t qd = m->heads * m->head_dim, kvd = m->kv_heads * m->head_dim;
    take_input(x, true);
    uint32_t y = rmsnorm(x, N, d);
    if (x->ac) {
        CAST_IN(x, N * d), CAST_IN(x, N * d), CAST_IN(x, N * d); /* q, k, v each cast it */
        FREE(x, y);
    }
    first_matmul(x);
    WCOPY(x, qd * d), WCOPY(x, kvd * d), WCOPY(x, kvd * d);
    uint32_t q = TMP(x, N * qd * x->a), k = TMP(x, N * kvd * x->a), v = TMP(x, N * kvd * x->a);
    /* RoPE: q*cos + rotate_half(q)*sin, a new tensor per q and k */
    uint32_t ids[2] = {q, k};
    int64_t dims[2] = {qd, kvd};
    uint32_t emb[2];
    for (int i = 0; i < 2; i++) {
        uint32_t t1 = TMP(x, N * dims[i] * x->a), t2 = TMP(x, N * dims[i] * x->a);
        uint32_t t3 = TMP(x, N * dims[i] * x->a);
        FREE(x, t2);
        bool keep = i == 0 || !(m->use_cache && !x->r->checkpointing);
        emb[i] = keep ? SAVE(x, N * dims[i] * x->a) : TMP(x, N * dims[i] * x->a);
        FREE(x, t1), FREE(x, t3), FREE(x, ids[i]);
    }
    if (m->use_cache && !x->r->checkpointing) {
        HOLD_OR_SAVE(x, N * kvd * x->a);
        HOLD_OR_SAVE(x, N * kvd * x->a);
        FREE(x, emb[1]);
        FREE(x, v);
    } else {
        /* v is saved by attention; it stays (allocated as TMP above: re-own) */
        push(x, &x->sv, &x->nsv, &x->capsv, x->nograd ? 0 : v);
        if (x->nograd) FREE(x, v);
    }
    attention(x, m->heads, m->head_dim, true, m->dropout);
    proj_residual(x, d * qd, false, false); /* residual, saved by the next RMSNorm */
    y = rmsnorm(x, N, d);
    if (x->ac) {
        CAST_IN(x, N * d), CAST_IN(x, N * d);
        FREE(x, y);
    }
    WCOPY(x, f * d), WCOPY(x, f * d);
    SAVE(x, N * f * x->a); /* gate (silu saves its input) */
    SAVE(x, N * f * x->a); /* up */
    SAVE(x, N * f * x->a); /* silu(gate) */
    SAVE(x, N * f * x->a); /* silu(gate) * up, saved by down_proj */
    proj_residual(x, d * f, false, true);
}

static void bert_emb(X *x) {
    int64_t N = x->N, d = x->m->hidden;
    int e = x->pb;
    uint32_t we = TMP(x, N * d * e), te = TMP(x, N * d * e);
    uint32_t s1 = TMP(x, N * d * e);
    FREE(x, we), FREE(x, te);
    uint32_t pe = TMP(x, x->T * d * e);
    uint32_t s2 = SAVE(x, N * d * e); /* LayerNorm input */
    FREE(x, s1), FREE(x, pe);
    (void)s2;
    SAVE(x, N * 4), SAVE(x, N * 4);
    uint32_t ln = TMP(x, N * d * (x->ac ? 4 : x->a));
    if (x->m->dropout) {
        SAVE(x, N * d);
        x->cur_out = OUT(x, N * d * x->rb);
        FREE(x, ln);
    } else {
        x->cur_out = ln;
    }
}

static void bert_layer(X *x) {
    const gm_est_model *m = x->m;
    int64_t N = x->N, d = m->hidden, f = m->intermediate;
    uint32_t in = x->cur_out;
    bool in_saved = !x->ac; /* plain precisions: q/k/v save the input itself */
    take_input(x, in_saved);
    first_matmul(x);
    for (int i = 0; i < 3; i++) {
        CAST_IN(x, N * d);
        WCOPY(x, d * d + d);
        SAVE(x, N * d * x->a);
    }
    attention(x, m->heads, m->head_dim, false, m->dropout);
    proj_residual(x, d * d + d, m->dropout, false); /* o + input: LayerNorm input */
    input_done(x, in, in_saved);
    SAVE(x, N * 4), SAVE(x, N * 4);
    uint32_t att = x->ac ? TMP(x, N * d * 4) : SAVE(x, N * d * x->a); /* attention_output */
    CAST_IN(x, N * d);
    WCOPY(x, d * f + f);
    SAVE(x, N * f * x->a); /* gelu input */
    SAVE(x, N * f * x->a); /* gelu output, saved by the output dense */
    proj_residual(x, f * d + d, m->dropout, false); /* + attention_output: LayerNorm input */
    if (x->ac) FREE(x, att);
    SAVE(x, N * 4), SAVE(x, N * 4);
    x->cur_out = OUT(x, N * d * x->rb);
}

static void vit_emb(X *x, bool hf) {
    const gm_est_model *m = x->m;
    int64_t B = x->B, d = m->hidden, g = m->image / m->patch, np = g * g;
    int64_t img = B * m->channels * m->image * m->image;
    if (x->ac) SAVE(x, img * 2); /* conv input cast */
    first_matmul(x);
    WCOPY(x, d * m->channels * m->patch * m->patch + d);
    uint32_t c = TMP(x, B * d * np * x->a);
    if (!hf) { /* reshape + permute: a copy */
        uint32_t c2 = TMP(x, B * d * np * x->a);
        FREE(x, c);
        c = c2;
    }
    /* cat with the fp32 class token promotes to fp32; + position embedding */
    int e = x->ac ? 4 : x->a;
    uint32_t cat = TMP(x, x->N * d * e);
    FREE(x, c);
    x->cur_out = OUT(x, x->N * d * e);
    FREE(x, cat);
}

static void vit_layer(X *x, bool hf) {
    const gm_est_model *m = x->m;
    int64_t N = x->N, d = m->hidden, f = m->intermediate;
    take_input(x, true);
    uint32_t y = layernorm(x, N, d, true);
    first_matmul(x);
    if (hf) {
        for (int i = 0; i < 3; i++) {
            CAST_IN(x, N * d);
            WCOPY(x, d * d + d);
            SAVE(x, N * d * x->a);
        }
    } else {
        CAST_IN(x, N * d);
        WCOPY(x, 3 * d * d + 3 * d);
        uint32_t proj = TMP(x, N * 3 * d * x->a);
        SAVE(x, N * 3 * d * x->a); /* unflatten/transpose .contiguous() */
        FREE(x, proj);
    }
    if (x->ac) FREE(x, y);
    attention(x, m->heads, m->head_dim, false, false);
    /* permute(2,0,1,3).contiguous(): the flash kernel (16-bit) allocates its
     * output like q, (T, B, h, hd) here, so the permute is already
     * contiguous; the memory-efficient kernel (fp32) allocates (B, T, h, hd)
     * and the permute copies */
    if (!hf && x->a == 4) SAVE(x, N * d * x->a);
    proj_residual(x, d * d + d, false, false); /* + input: saved by the second LayerNorm */
    y = layernorm(x, N, d, true);
    CAST_IN(x, N * d);
    if (x->ac) FREE(x, y);
    WCOPY(x, d * f + f);
    SAVE(x, N * f * x->a);
    SAVE(x, N * f * x->a);
    proj_residual(x, f * d + d, false, true);
}

/* cross_entropy over rows x classes, saving log_softmax's output.
 * upcast: transformers' ForCausalLMLoss calls logits.float() first (a
 * transient fp32 copy; gradients in fp32 until the cast's backward).
 * Otherwise nn.CrossEntropyLoss on the logits: under autocast log_softmax
 * runs with dtype=float32 (fp32 output, gradient in the logits' dtype), and
 * one more logits-sized tensor in the logits' dtype is saved. That tensor is
 * calibrated, not derived: the BERT snapshot
 * (../shared/traces/bert_base_varseq_fp16.pickle.gz) has two N x V fp16 and
 * two N x V fp32 tensors live at the start of backward, and BERT MLM
 * measured 2.0 GB (fp32) and 1.0 GB (bf16 model) above the model without it
 * (bench/RESULTS.md), i.e. N x V x 4 and N x V x 2. */
static void xent(X *x, int64_t rows, int64_t classes, bool upcast) {
    int64_t nv = rows * classes;
    x->loss_upcast = upcast;
    x->loss_rows = rows;
    x->loss_classes = classes;
    uint32_t lf = 0;
    if (upcast && x->a != 4) lf = TMP(x, nv * 4);
    uint32_t lbl = upcast ? TMP(x, rows * 8) : 0; /* shifted / flattened labels */
    x->loss_extra = !upcast && x->loss_extra_ok ? ALLOC(x, nv * x->a, GM_EST_CAT_ACTS) : 0;
    x->lsm = ALLOC(x, nv * (upcast || x->ac ? 4 : x->a), GM_EST_CAT_ACTS);
    FREE(x, lf);
    uint32_t loss = TMP(x, 512);
    FREE(x, loss);
    FREE(x, lbl);
}

static void lm_head(X *x, bool mlm) {
    const gm_est_model *m = x->m;
    int64_t N = x->N, d = m->hidden, V = m->vocab;
    take_input(x, true);
    uint32_t y;
    if (mlm) { /* transform: dense, gelu, LayerNorm */
        uint32_t in = x->cur_out;
        CAST_IN(x, N * d);
        WCOPY(x, d * d + d);
        SAVE(x, N * d * x->a);                /* gelu input */
        uint32_t g = SAVE(x, N * d * x->a);   /* gelu out: LayerNorm input */
        (void)g;
        (void)in;
        y = layernorm(x, N, d, true);
    } else if (m->family == GM_EST_LLAMA) {
        y = rmsnorm(x, N, d);
    } else {
        y = layernorm(x, N, d, true);
    }
    if (x->ac) {
        CAST_IN(x, N * d);
        FREE(x, y);
    }
    WCOPY(x, V * d + (mlm ? V : 0));
    x->loss_extra_ok = mlm;
    uint32_t logits = x->r->keep_output ? 0 : TMP(x, N * V * x->a);
    if (x->r->keep_output) {
        logits = ALLOC(x, N * V * x->a, GM_EST_CAT_ACTS);
        push(x, &x->held, &x->nheld, &x->capheld, logits);
    }
    xent(x, N, V, !mlm);
    if (!x->r->keep_output) FREE(x, logits);
}

static void cls_head(X *x) {
    const gm_est_model *m = x->m;
    int64_t B = x->B, d = m->hidden, C = m->num_labels;
    take_input(x, true);
    if (m->family == GM_EST_BERT) {
        CAST_IN(x, B * d);
        WCOPY(x, d * d + d);
        SAVE(x, B * d * x->a); /* tanh output */
        if (m->dropout) SAVE(x, B * d);
    } else {
        uint32_t y = m->family == GM_EST_LLAMA ? rmsnorm(x, x->N, d) : layernorm(x, x->N, d, true);
        if (x->ac) {
            CAST_IN(x, x->N * d);
            FREE(x, y);
        }
    }
    WCOPY(x, C * d + C);
    int64_t rows = m->family == GM_EST_BERT ? B : x->N;
    uint32_t logits = TMP(x, rows * C * x->a);
    xent(x, B, C, true);
    FREE(x, logits);
}

static void vit_head(X *x) {
    const gm_est_model *m = x->m;
    int64_t B = x->B, d = m->hidden, C = m->num_labels;
    take_input(x, true);
    uint32_t y = layernorm(x, x->N, d, false);
    CAST_IN(x, B * d); /* the class token's row */
    if (!x->ac) SAVE(x, B * d * x->a);
    FREE(x, y);
    WCOPY(x, C * d + C);
    uint32_t logits = TMP(x, B * C * x->a);
    xent(x, B, C, false);
    FREE(x, logits);
}

/* ResNet: conv (input saved) -> BatchNorm (saves its input, the conv
 * output, and mean/invstd) -> ReLU in place (saves its output). */
static uint32_t conv_bn(X *x, int64_t cin, int64_t cout, int64_t k, int64_t hout, bool out_is_block_out) {
    int64_t B = x->B;
    WCOPY(x, cout * cin * k * k);
    SAVE(x, B * cout * hout * hout * x->a); /* conv output */
    SAVE(x, cout * 4), SAVE(x, cout * 4);
    if (out_is_block_out) return OUT(x, B * cout * hout * hout * x->a);
    return SAVE(x, B * cout * hout * hout * x->a); /* bn out = relu out */
}

static void rn_stem(X *x) {
    const gm_est_model *m = x->m;
    int64_t B = x->B, h1 = (x->T + 1) / 2, h2 = (h1 + 1) / 2;
    if (x->ac) SAVE(x, B * m->channels * x->T * x->T * 2);
    conv_bn(x, m->channels, 64, 7, h1, false);
    SAVE(x, B * 64 * h2 * h2 * 8); /* max_pool2d indices (int64) */
    x->cur_out = OUT(x, B * 64 * h2 * h2 * x->a);
}

static void rn_block(X *x, blk *b) {
    int64_t hin = b->h_in, hout = (hin + b->stride - 1) / b->stride;
    take_input(x, true);
    uint32_t ident = 0;
    if (x->m->bottleneck) {
        conv_bn(x, b->c_in, b->width, 1, hin, false);
        conv_bn(x, b->width, b->width, 3, hout, false);
        uint32_t o = conv_bn(x, b->width, b->c_out, 1, hout, true);
        if (b->downsample) {
            WCOPY(x, b->c_out * b->c_in);
            SAVE(x, x->B * b->c_out * hout * hout * x->a);
            SAVE(x, b->c_out * 4), SAVE(x, b->c_out * 4);
            ident = TMP(x, x->B * b->c_out * hout * hout * x->a);
        }
        FREE(x, ident);
        x->cur_out = o;
    } else {
        conv_bn(x, b->c_in, b->width, 3, hout, false);
        uint32_t o = conv_bn(x, b->width, b->width, 3, hout, true);
        if (b->downsample) {
            WCOPY(x, b->c_out * b->c_in);
            SAVE(x, x->B * b->c_out * hout * hout * x->a);
            SAVE(x, b->c_out * 4), SAVE(x, b->c_out * 4);
            ident = TMP(x, x->B * b->c_out * hout * hout * x->a);
        }
        FREE(x, ident);
        x->cur_out = o;
    }
}

static void rn_head(X *x, blk *b) {
    const gm_est_model *m = x->m;
    int64_t B = x->B, c = x->pl.p[b->p0].cols, C = m->num_labels;
    take_input(x, false);
    uint32_t in = x->cur_out;
    uint32_t pooled = SAVE(x, B * c * x->a); /* avgpool + flatten, saved by fc */
    FREE(x, in);                              /* adaptive_avg_pool2d keeps only the shape */
    (void)pooled;
    first_matmul(x);
    WCOPY(x, C * c + C);
    uint32_t logits = TMP(x, B * C * x->a);
    xent(x, B, C, false);
    FREE(x, logits);
}

static void block_fwd(X *x, blk *b) {
    switch (b->kind) {
    case K_GPT2_EMB: gpt2_emb(x); break;
    case K_GPT2_LAYER: gpt2_layer(x); break;
    case K_LLAMA_EMB: llama_emb(x); break;
    case K_LLAMA_LAYER: llama_layer(x); break;
    case K_BERT_EMB: bert_emb(x); break;
    case K_BERT_LAYER: bert_layer(x); break;
    case K_VITHF_EMB: vit_emb(x, true); break;
    case K_VITTV_EMB: vit_emb(x, false); break;
    case K_VITHF_LAYER: vit_layer(x, true); break;
    case K_VITTV_LAYER: vit_layer(x, false); break;
    case K_LM_HEAD: lm_head(x, false); break;
    case K_MLM_HEAD: lm_head(x, true); break;
    case K_SEQCLS_HEAD: cls_head(x); break;
    case K_VIT_HEAD: vit_head(x); break;
    case K_RN_STEM: rn_stem(x); break;
    case K_RN_BLOCK: rn_block(x, b); break;
    case K_RN_HEAD: rn_head(x, b); break;
    }
}

/* ---- backward ------------------------------------------------------------ */

/* A parameter's gradient: allocated on the first micro-batch of a step
 * (zero_grad(set_to_none=True) freed the last one), accumulated in place
 * through a temporary afterwards. Under autocast a matmul weight's gradient
 * is computed in 16 bits and cast to the parameter's dtype. */
static void grad_touch(X *x, size_t i) {
    int64_t bytes = x->pl.p[i].elems * x->pb;
    uint32_t h = 0;
    if (x->ac && x->pl.p[i].cols) h = TMP(x, x->pl.p[i].elems * 2);
    if (!x->gid[i]) {
        x->gid[i] = ALLOC(x, bytes, GM_EST_CAT_GRADS);
    } else {
        uint32_t t = TMP(x, bytes);
        FREE(x, t);
    }
    FREE(x, h);
}

/* Size of the gradient a block passes to the block below. */
static int64_t dx_bytes(X *x, blk *b) {
    const gm_est_model *m = x->m;
    switch (b->kind) {
    case K_RN_BLOCK:
        return x->B * b->c_in * b->h_in * b->h_in * x->a;
    case K_RN_HEAD: {
        int64_t c = x->pl.p[b->p0].cols, h = (x->T + 31) / 32;
        return x->B * c * h * h * x->a;
    }
    case K_RN_STEM: case K_GPT2_EMB: case K_LLAMA_EMB: case K_BERT_EMB:
    case K_VITHF_EMB: case K_VITTV_EMB:
        return 0;
    default:
        return x->N * m->hidden * x->rb;
    }
}

static int64_t block_bwd_tmp(X *x, blk *b) {
    switch (b->kind) {
    case K_RN_BLOCK: { /* two gradients of the block's largest tensor */
        int64_t ho = (b->h_in + b->stride - 1) / b->stride;
        int64_t big = b->c_out * ho * ho, mid = b->width * b->h_in * b->h_in;
        return 2 * x->B * (big > mid ? big : mid) * x->a;
    }
    case K_RN_STEM: return 2 * x->B * 64 * (x->T / 2) * (x->T / 2) * x->a;
    case K_GPT2_LAYER: case K_LLAMA_LAYER: case K_BERT_LAYER: case K_VITHF_LAYER:
    case K_VITTV_LAYER:
        return layer_bwd_tmp(x);
    default:
        return 0;
    }
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
    uint32_t t = TMP(x, block_bwd_tmp(x, b));
    for (size_t i = b->p0 + b->np; i-- > b->p0;) grad_touch(x, i);
    if (b->kind == K_LM_HEAD && x->m->tied) grad_touch(x, x->pl.wte); /* lm_head = wte */
    if (b->kind == K_MLM_HEAD && x->m->tied) grad_touch(x, x->pl.wte);
    int64_t db = dx_bytes(x, b);
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
    size_t n, cap;
} optstate;

static void opt_step(X *x, optstate *os) {
    const gm_est_run *r = x->r;
    size_t np = x->pl.np;
    bool first = os->n == 0;
    int pb = x->pb;
    if (first) {
        for (size_t i = 0; i < np; i++) {
            const ptensor *p = &x->pl.p[i];
            switch (r->optimizer) {
            case GM_EST_OPT_SGD: break;
            case GM_EST_OPT_SGD_MOMENTUM:
                push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems * pb, GM_EST_CAT_OPTSTATE));
                break;
            case GM_EST_OPT_ADAM: case GM_EST_OPT_ADAMW:
                push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems * pb, GM_EST_CAT_OPTSTATE));
                push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems * pb, GM_EST_CAT_OPTSTATE));
                break;
            case GM_EST_OPT_ADAMW_8BIT: /* bitsandbytes: uint8 states + fp32 absmax per 256; small tensors 32-bit */
                if (p->elems >= 4096) {
                    for (int k = 0; k < 2; k++) {
                        push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems, GM_EST_CAT_OPTSTATE));
                        push(x, &os->ids, &os->n, &os->cap,
                             ALLOC(x, (p->elems + 255) / 256 * 4, GM_EST_CAT_OPTSTATE));
                    }
                } else {
                    push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems * 4, GM_EST_CAT_OPTSTATE));
                    push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems * 4, GM_EST_CAT_OPTSTATE));
                }
                break;
            case GM_EST_OPT_ADAFACTOR: /* factored second moment: rows + cols of the last two dims */
                if (p->cols) {
                    push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems / p->cols * pb, GM_EST_CAT_OPTSTATE));
                    push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems / p->rows * pb, GM_EST_CAT_OPTSTATE));
                } else {
                    push(x, &os->ids, &os->n, &os->cap, ALLOC(x, p->elems * pb, GM_EST_CAT_OPTSTATE));
                }
                break;
            default:
                break;
            }
        }
    }
    /* foreach temporaries: Adam's sqrt(exp_avg_sq) list, one per parameter */
    uint32_t *tmp = NULL;
    size_t nt = 0, ct = 0;
    if (r->optimizer == GM_EST_OPT_ADAM || r->optimizer == GM_EST_OPT_ADAMW) {
        for (size_t i = 0; i < np; i++) push(x, &tmp, &nt, &ct, TMP(x, x->pl.p[i].elems * pb));
    } else if (r->optimizer == GM_EST_OPT_ADAFACTOR) {
        /* per parameter (one at a time): the variance estimate and the update */
        int64_t mx = 0;
        for (size_t i = 0; i < np; i++)
            if (x->pl.p[i].elems > mx) mx = x->pl.p[i].elems;
        uint32_t a = TMP(x, mx * pb), b = TMP(x, mx * pb);
        FREE(x, a), FREE(x, b);
    }
    for (size_t i = 0; i < nt; i++) FREE(x, tmp[i]);
    free(tmp);
    /* zero_grad(set_to_none=True) */
    for (size_t i = 0; i < np; i++) {
        FREE(x, x->gid[i]);
        x->gid[i] = 0;
    }
}

/* ---- the loop ------------------------------------------------------------- */

static void forward(X *x) {
    const gm_est_run *r = x->r;
    x->phase = GM_EST_PH_FORWARD;
    x->nfwd_tmp = 0;
    x->cur_out = 0;
    /* the batch: token ids (labels = the same tensor) or images + labels */
    if (gm_est_is_vision(x->m)) {
        x->input = ALLOC(x, x->B * x->m->channels * x->T * x->T * 4, GM_EST_CAT_ACTS);
        x->fwd_tmp[x->nfwd_tmp++] = ALLOC(x, x->B * 8, GM_EST_CAT_ACTS);
    } else {
        x->input = ALLOC(x, x->N * 8, GM_EST_CAT_ACTS);
    }
    for (size_t i = 0; i < x->pl.nb; i++) {
        blk *b = &x->pl.b[i];
        b->mark = x->nsv;
        bool ck = r->checkpointing && b->layer;
        x->nograd = ck;
        block_fwd(x, b);
        if (ck) { /* what the no-grad forward left live dies with it */
            for (int k = 0; k < x->nngw; k++)
                if (x->ngw[k] != x->cur_out) FREE(x, x->ngw[k]);
            x->nngw = 0;
        }
        x->nograd = false;
    }
    /* the output is returned: `out = model(...)` rebinds, freeing the previous one */
    for (size_t i = 0; i < x->nheld_prev; i++) FREE(x, x->held_prev[i]);
    x->nheld_prev = 0;
    uint32_t *t = x->held_prev;
    size_t tc = x->capheld_prev;
    x->held_prev = x->held;
    x->nheld_prev = x->nheld;
    x->capheld_prev = x->capheld;
    x->held = t;
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
        if (x->r->checkpointing && b->layer) {
            /* reentrant checkpoint: rerun the layer's forward with grad, from
             * its saved input (already at b->mark); its output is dropped */
            x->recompute = true;
            uint32_t keep = x->cur_out;
            x->cur_out = x->sv[b->mark];
            block_fwd(x, b);
            FREE(x, x->cur_out);
            x->cur_out = keep;
            x->recompute = false;
        }
        block_bwd(x, b, i);
    }
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
    for (int64_t l = 0; l < m->layers; l++) {
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
    int64_t B = x->B, T = x->T, L = x->m->layers;
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
    for (int64_t t = 1; t < r->generate && !x->err; t++) {
        x->step = 2;
        decoder_pass(x, B, 1, T + t, cache, false);
        uint32_t o2 = ALLOC(x, B * (T + t + 1) * 8, GM_EST_CAT_ACTS);
        FREE(x, out);
        out = o2;
    }
    for (int64_t l = 0; l < L; l++) FREE(x, cache[l][0]), FREE(x, cache[l][1]);
    FREE(x, out), FREE(x, ids);
    free(cache);
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

int gm_est_build(const gm_est_model *m, const gm_est_run *rin, gm_est_program *p) {
    memset(p, 0, sizeof *p);
    gm_est_run r = *rin;
    int rc = gm_est_check(m, &r);
    if (rc) return rc;
    gm_est_model mm = *m; /* the resnet plan's geometry follows the run's image size */
    if (gm_est_is_vision(m)) mm.image = r.image;
    m = &mm;
    X x;
    memset(&x, 0, sizeof x);
    x.p = p;
    x.m = m;
    x.r = &r;
    if ((rc = make_plan(m, &x.pl))) {
        plan_free(&x.pl);
        return gm__set_error(rc, "out of host memory");
    }
    x.ac = r.precision == GM_EST_FP16_AUTOCAST || r.precision == GM_EST_BF16_AUTOCAST;
    x.a = r.precision == GM_EST_FP32 ? 4 : 2;
    x.pb = r.precision == GM_EST_BF16 ? 2 : 4;
    x.rb = x.ac ? 4 : x.a;
    x.B = r.batch;
    if (gm_est_is_vision(m)) {
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
    if (!x.pid || !x.gid) x.err = GM_ENOHOSTMEM;
    /* model.cuda(): the parameters, in module order; a 16-bit model is
     * built in fp32 and cast (model.to(torch.bfloat16) / .half()): Module._apply
     * converts one tensor at a time, so the fp32 model and the first 16-bit
     * copy (the embedding) coexist -- the whole peak of the generation
     * workload (../shared/traces/gpt2_generate_kvcache.pickle.gz) */
    x.phase = GM_EST_PH_SETUP;
    for (size_t i = 0; i < x.pl.np; i++)
        x.pid[i] = ALLOC(&x, x.pl.p[i].elems * (x.pb == 2 ? 4 : x.pb), GM_EST_CAT_PARAMS);
    if (x.pb == 2)
        for (size_t i = 0; i < x.pl.np; i++) {
            uint32_t h = ALLOC(&x, x.pl.p[i].elems * 2, GM_EST_CAT_PARAMS);
            FREE(&x, x.pid[i]);
            x.pid[i] = h;
        }
    optstate os = {0};
    if (r.generate) {
        generate(&x);
        r.steps = 0;
    }
    uint32_t scaler = 0;
    for (int s = 1; s <= r.steps && !x.err; s++) {
        x.step = (uint8_t)s;
        for (int64_t k = 0; k < r.accum && !x.err; k++) {
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
    for (size_t i = 0; i < x.nheld_prev; i++) FREE(&x, x.held_prev[i]);
    for (size_t i = 0; i < os.n; i++) FREE(&x, os.ids[i]);
    FREE(&x, scaler);
    FREE(&x, x.ws_fwd), FREE(&x, x.ws_bwd);
    for (size_t i = 0; i < x.pl.np; i++) FREE(&x, x.pid[i]);
    free(os.ids);
    free(x.sv);
    free(x.held);
    free(x.held_prev);
    free(x.pid);
    free(x.gid);
    plan_free(&x.pl);
    if (x.err) {
        gm_est_program_free(p);
        return gm__set_error(x.err, "out of host memory building the estimate");
    }
    return GM_OK;
}

void gm_est_program_free(gm_est_program *p) {
    free(p->ev);
    memset(p, 0, sizeof *p);
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
