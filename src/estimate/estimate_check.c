/* estimate_check.c — a run's defaults (gm__est_run_init) and its checks
 * against the model (gm__est_check): sizes in range, options that apply,
 * data-parallel settings, and a bound on every byte count the estimate will
 * form, so that nothing it adds up or multiplies can overflow: a run too
 * large to compute is refused, never answered with a wrong number. The
 * lowest unit of the estimator but the model table (estimate_models.c):
 * the builder (estimate_loop.c) and the entry points (estimate.c) call it. */
#include "estimate.h"

#include "internal.h"

#include <string.h>

void gm__est_run_init(gm_est_run *r) {
    memset(r, 0, sizeof *r);
    r->batch = 8;
    r->precision = GM_EST_BF16_AUTOCAST;
    r->optimizer = GM_EST_OPT_ADAMW;
    r->accum = 1;
    r->attention = GM_EST_ATTN_SDPA;
    r->steps = 3;
    r->shard = GM_EST_SHARD_NONE;
    r->world = 1;
    r->bucket_mb = GM_EST_DDP_BUCKET_MB;
    r->reshard_after_forward = true;
}

/* "a causal-lm model", "an image-classification model" */
static const char *article(const char *word) { return strchr("aeiou", word[0]) ? "an" : "a"; }

static long double maxl(long double a, long double b) { return a > b ? a : b; }

/* An upper bound on the bytes live at once, at 8 bytes an element: each
 * parameter in at most 12 copies (itself, 16-bit casts, gradients and
 * their temporaries, optimizer state, foreach temporaries, unsharded
 * copies, buckets), each repeated layer at most 64 activations no larger
 * than its widest, the rest of the model at most 64 no larger than its
 * widest. Loose, but it covers every product the emitters form
 * (estimate_blocks.c, estimate_loop.c, estimate_shard.c). */
static long double bytes_bound(const gm_est_model *m, const gm_est_run *r) {
    long double B = (long double)r->batch, d = (long double)m->hidden, f = (long double)m->intermediate;
    long double h = (long double)m->heads, hd = (long double)m->head_dim, V = (long double)m->vocab;
    long double T, N;
    if (gm__est_is_vision(m)) {
        T = (long double)r->image;
        long double g = m->patch ? T / (long double)m->patch : 0;
        N = m->family == GM_EST_RESNET ? B : B * (g * g + 1);
    } else {
        T = (long double)(r->seq + r->generate);
        N = B * T;
    }
    long double qkv = (h + 2 * (long double)m->kv_heads) * hd;
    long double layer = N * maxl(maxl(f, 4 * d), maxl(qkv, h * hd));
    layer = maxl(layer, maxl(d * f, 4 * d * d + qkv * d)); /* weights */
    if (r->attention == GM_EST_ATTN_EAGER) layer = maxl(layer, B * h * T * T); /* eager's T x T */
    long double rest = maxl(N * maxl(V, (long double)m->num_labels), V * d);
    rest = maxl(rest, (long double)m->max_positions * d + (long double)m->type_vocab * d);
    /* images, the stem and ResNet's widest stage (2048 channels) */
    if (gm__est_is_vision(m)) rest = maxl(rest, B * maxl((long double)m->channels, 2048) * T * T);
    long double blocks = (long double)m->blocks[0] + m->blocks[1] + m->blocks[2] + m->blocks[3];
    /* the parameters' own products (a patch embedding is d x channels x
     * patch^2), bounded before they are counted in integers */
    long double pl = maxl(4 * d * maxl(d, maxl(f, qkv)), V * d + (long double)m->max_positions * d);
    pl = maxl(pl, d * (long double)m->channels * (long double)m->patch * (long double)m->patch);
    if (pl * ((long double)m->layers + 2) * 16 > (long double)GM_EST_MAX_BYTES) return pl * ((long double)m->layers + 2) * 16;
    long double params = (long double)gm__est_param_count(m);
    return 8 * (12 * params + 64 * layer * ((long double)m->layers + 2) + 64 * rest * (blocks + 4)) + 4096;
}

int gm__est_check(const gm_est_model *m, gm_est_run *r) {
    if (r->batch < 1 || r->batch > (1 << 20))
        return gm__set_error(GM_EINVAL, "batch must be between 1 and %d (got %lld)", 1 << 20, (long long)r->batch);
    if (r->accum < 1 || r->accum > (1 << 20))
        return gm__set_error(GM_EINVAL, "accumulation must be between 1 and %d (got %lld)", 1 << 20,
                             (long long)r->accum);
    if (r->steps < 2 || r->steps > 16)
        return gm__set_error(GM_EINVAL, "steps must be between 2 and 16 (got %d)", r->steps);
    if ((unsigned)r->precision >= GM_EST_NPRECISION || (unsigned)r->optimizer >= GM_EST_NOPTIMIZER)
        return gm__set_error(GM_EINVAL, "bad precision or optimizer");
    if (gm__est_is_vision(m)) {
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
        if (!r->seq) { /* a prompt that leaves generate() room in the positions */
            int64_t room = m->max_positions - (r->generate > 0 && r->generate < m->max_positions ? r->generate : 0);
            r->seq = room < 1024 ? room : 1024;
        }
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
        const char *h = gm__est_head_name(m->head);
        if (m->head != GM_EST_HEAD_CAUSAL_LM)
            return gm__set_error(GM_EINVAL, "--generate models a causal language model's generate(); %s is "
                                 "%s %s model", m->name, article(h), h);
        if (r->checkpointing || r->accum > 1)
            return gm__set_error(GM_EINVAL, "--generate is inference: --checkpointing and --accum do not apply");
        if (r->precision == GM_EST_FP16_AUTOCAST || r->precision == GM_EST_BF16_AUTOCAST)
            return gm__set_error(GM_EINVAL, "--generate models a 16-bit model (--precision bf16, the same "
                                 "bytes as fp16, the default) or fp32, not autocast");
        if (r->shard != GM_EST_SHARD_NONE)
            return gm__set_error(GM_EINVAL, "--generate is inference: --shard applies to training");
        if ((m->family == GM_EST_GPT2) && r->seq + r->generate > m->max_positions)
            return gm__set_error(GM_EINVAL, "prompt %lld + %lld new tokens exceed %s's %lld positions",
                                 (long long)r->seq, (long long)r->generate, m->name, (long long)m->max_positions);
    }
    if (r->built_16bit && r->precision != GM_EST_BF16)
        return gm__set_error(GM_EINVAL, "a model loaded in 16 bits (--torch-dtype bf16/fp16) runs in 16 bits: "
                             "--precision bf16, or --torch-dtype fp32 for %s", gm__est_precision_name(r->precision));
    if (r->checkpointing && !gm__est_is_hf(m))
        return gm__set_error(GM_EINVAL, "--checkpointing models Hugging Face's gradient_checkpointing_enable(); "
                             "%s is a torchvision model", m->name);
    if (r->attention == GM_EST_ATTN_EAGER && m->family == GM_EST_RESNET)
        return gm__set_error(GM_EINVAL, "%s has no attention", m->name);
    if (r->attention == GM_EST_ATTN_EAGER && m->family == GM_EST_VIT_TV)
        return gm__set_error(GM_EINVAL, "torchvision's %s always uses scaled_dot_product_attention; "
                             "--attention eager is for Hugging Face models", m->name);
    if ((unsigned)r->shard >= GM_EST_NSHARD) return gm__set_error(GM_EINVAL, "bad sharding strategy");
    if (r->world < 1 || r->world > GM_EST_MAX_WORLD)
        return gm__set_error(GM_EINVAL, "world size must be between 1 and %d (got %lld)", GM_EST_MAX_WORLD,
                             (long long)r->world);
    if (r->world > 1 && r->shard == GM_EST_SHARD_NONE)
        return gm__set_error(GM_EINVAL, "--world-size %lld needs --shard ddp|fsdp|zero1|zero2|zero3 (how the "
                             "ranks share the model)", (long long)r->world);
    if (r->bucket_mb < 1 || r->bucket_mb > (1 << 20))
        return gm__set_error(GM_EINVAL, "bucket_cap_mb must be between 1 and %d (got %lld)", 1 << 20,
                             (long long)r->bucket_mb);
    if (r->shard != GM_EST_SHARD_NONE && m->family == GM_EST_RESNET && r->shard != GM_EST_SHARD_DDP)
        return gm__set_error(GM_EINVAL, "--shard %s is modelled for transformer models (fully_shard per layer); "
                             "%s is a torchvision ResNet: use --shard ddp", gm__est_shard_name(r->shard), m->name);
    if (bytes_bound(m, r) > (long double)GM_EST_MAX_BYTES)
        return gm__set_error(GM_EINVAL, "%s at batch %lld is too large to estimate: its memory could exceed "
                             "4 EiB, beyond what the arithmetic holds (a smaller batch, sequence or model)",
                             m->name, (long long)r->batch);
    return GM_OK;
}
