/* estimate_blocks.c — what each block kind allocates: the forward of
 * GPT-2, Llama, BERT and ViT (Hugging Face and torchvision) embeddings and
 * layers, the heads with their loss, ResNet's stem, blocks and head, and the
 * shared pieces (LayerNorm, RMSNorm, attention, a sublayer's projection and
 * residual, cross-entropy); per block kind, the backward working set and the
 * gradient handed below. The loop that calls them is estimate_loop.c. */
#include "estimate_emit.h"

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
 * (bench/RESULTS.md, "training memory estimator"); the language models peak at
 * the loss instead. */
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
    /* grouped-query heads, eager: repeat_kv copies k and v out to every query head,
     * and the two matmuls save the copies (sdpa takes enable_gqa instead) */
    if (x->r->attention == GM_EST_ATTN_EAGER && m->kv_heads < m->heads)
        SAVE(x, N * qd * x->a), SAVE(x, N * qd * x->a);
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
 * measured N x V x 4 bytes (fp32) and N x V x 2 (bf16 model) above the
 * model without it (bench/RESULTS.md, "training memory estimator"). */
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
        hold(x, logits);
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
    uint32_t o;
    if (x->m->bottleneck) {
        conv_bn(x, b->c_in, b->width, 1, hin, false);
        conv_bn(x, b->width, b->width, 3, hout, false);
        o = conv_bn(x, b->width, b->c_out, 1, hout, true);
    } else {
        conv_bn(x, b->c_in, b->width, 3, hout, false);
        o = conv_bn(x, b->width, b->width, 3, hout, true);
    }
    /* downsample: 1x1 conv + BatchNorm on the input, added to o */
    uint32_t ident = 0;
    if (b->downsample) {
        WCOPY(x, b->c_out * b->c_in);
        SAVE(x, x->B * b->c_out * hout * hout * x->a);
        SAVE(x, b->c_out * 4), SAVE(x, b->c_out * 4);
        ident = TMP(x, x->B * b->c_out * hout * hout * x->a);
    }
    FREE(x, ident);
    x->cur_out = o;
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

void gm__est_block_fwd(X *x, blk *b) {
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

/* Size of the gradient a block passes to the block below. */
int64_t gm__est_dx_bytes(X *x, blk *b) {
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

int64_t gm__est_block_bwd_tmp(X *x, blk *b) {
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
