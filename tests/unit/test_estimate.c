/* test_estimate.c — the training-memory estimator (src/estimate/): parameter
 * counts against the real models', hand-checked byte counts on a tiny GPT-2
 * (parameters, optimizer state, one layer's saved activations), the event
 * sequence's bookkeeping for every model x precision x optimizer x option,
 * config.json reading and its errors, run validation, and --fit's answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "estimate/estimate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define R512(n) (((n) + 511) / 512 * 512)

static gm_est_model builtin(const char *name) {
    gm_est_model m;
    if (gm__est_builtin_find(name, &m) != GM_OK) fail_msg("no built-in %s", name);
    return m;
}

static gm_est_model from_json(const char *json) {
    gm_est_model m;
    if (gm__est_model_from_hf_config(json, "test", &m) != GM_OK) fail_msg("config: %s", gm_last_error_detail());
    return m;
}

/* torchvision / transformers parameter counts (sum(p.numel())), measured */
static void test_param_counts(void **state) {
    (void)state;
    gm_est_model m = builtin("gpt2");
    assert_int_equal(gm__est_param_count(&m), 124439808);
    m = builtin("bert-base-uncased");
    assert_int_equal(gm__est_param_count(&m), 109514298);
    m = builtin("resnet50");
    assert_int_equal(gm__est_param_count(&m), 25557032);
    m = builtin("resnet18");
    assert_int_equal(gm__est_param_count(&m), 11689512);
    m = builtin("vit_b_16");
    assert_int_equal(gm__est_param_count(&m), 86567656);
    m = from_json("{\"model_type\":\"bert\",\"architectures\":[\"BertForSequenceClassification\"],"
                  "\"hidden_size\":768,\"num_hidden_layers\":12,\"num_attention_heads\":12,"
                  "\"intermediate_size\":3072,\"vocab_size\":30522,\"max_position_embeddings\":512}");
    assert_int_equal(m.head, GM_EST_HEAD_SEQ_CLS);
    assert_int_equal(gm__est_param_count(&m), 109483778);
    /* Llama by hand: embed 32000x1024; per layer 2 norms (1024 each), q and o
     * 1024x1024, k and v 256x1024 (4 kv heads of 64), gate/up/down 3 x
     * 2816x1024; final norm; untied lm_head 32000x1024 */
    m = from_json("{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":1024,"
                  "\"intermediate_size\":2816,\"num_hidden_layers\":8,\"num_attention_heads\":16,"
                  "\"num_key_value_heads\":4,\"vocab_size\":32000}");
    uint64_t layer = 2 * 1024 + 2 * 1024 * 1024 + 2 * 256 * 1024 + 3 * 2816 * 1024;
    assert_int_equal(gm__est_param_count(&m), 2ull * 32000 * 1024 + 8 * layer + 1024);
}

/* tiny GPT-2: vocab 4096 (so the loss's N x V buffers set the peak at the
 * start of backward), 64 wide, 2 heads, 32 positions */
static const char *tiny_gpt2(int layers, char *buf, size_t len) {
    snprintf(buf, len,
             "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"n_layer\":%d,\"n_embd\":64,"
             "\"n_head\":2,\"vocab_size\":4096,\"n_positions\":32}",
             layers);
    return buf;
}

/* one GPT-2 block's parameter tensors, each rounded to 512 bytes (fp32) */
static int64_t tiny_layer_params(void) {
    return R512(64 * 4) * 4                    /* ln_1, ln_2 weight + bias */
           + R512(64 * 192 * 4) + R512(192 * 4) /* c_attn */
           + R512(64 * 64 * 4) + R512(64 * 4)   /* attn c_proj */
           + R512(64 * 256 * 4) + R512(256 * 4) /* c_fc */
           + R512(256 * 64 * 4) + R512(64 * 4); /* mlp c_proj */
}

static void test_hand_checked_bytes(void **state) {
    (void)state;
    char js[512];
    gm_est_model m1 = from_json(tiny_gpt2(1, js, sizeof js));
    gm_est_model m2 = from_json(tiny_gpt2(2, js, sizeof js));
    /* elements: wte 4096x64, wpe 32x64, one block, ln_f */
    uint64_t block = 2 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 2 * 64 + 64 * 256 + 256 + 256 * 64 + 64;
    assert_int_equal(gm__est_param_count(&m1), 4096 * 64 + 32 * 64 + block + 2 * 64);
    int64_t params1 = R512(4096 * 64 * 4) + R512(32 * 64 * 4) + tiny_layer_params() + 2 * R512(64 * 4);

    gm_est_run r;
    gm__est_run_init(&r);
    r.batch = 2;
    r.seq = 32;
    gm_est_result res;
    static const struct { int opt; int64_t states; } opts[] = {
        {GM_EST_OPT_SGD, 0}, {GM_EST_OPT_SGD_MOMENTUM, 1}, {GM_EST_OPT_ADAMW, 2}, {GM_EST_OPT_ADAM, 2}};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        r.optimizer = opts[i].opt;
        assert_int_equal(gm__est_scan(&m1, &r, &res), GM_OK);
        assert_int_equal(res.peak_by_cat[GM_EST_CAT_PARAMS], params1);
        assert_int_equal(res.peak_by_cat[GM_EST_CAT_OPTSTATE], opts[i].states * params1);
        /* the first step has no optimizer state before its step */
        assert_int_equal(res.phase_by_cat[0][GM_EST_PH_BACKWARD][GM_EST_CAT_OPTSTATE], 0);
        /* gradients: all of them at the optimizer step */
        assert_int_equal(res.phase_by_cat[1][GM_EST_PH_OPTIMIZER][GM_EST_CAT_GRADS], params1);
    }
    /* the bf16 model halves parameters (every tensor here is >= 256 elements
     * or rounds to 512 either way) */
    r.optimizer = GM_EST_OPT_ADAMW;
    r.precision = GM_EST_BF16;
    assert_int_equal(gm__est_scan(&m1, &r, &res), GM_OK);
    int64_t half = R512(4096 * 64 * 2) + R512(32 * 64 * 2) + 4 * R512(64 * 2) + R512(64 * 192 * 2) +
                   R512(192 * 2) + R512(64 * 64 * 2) + R512(64 * 2) + R512(64 * 256 * 2) + R512(256 * 2) +
                   R512(256 * 64 * 2) + R512(64 * 2) + 2 * R512(64 * 2);
    assert_int_equal(res.peak_by_cat[GM_EST_CAT_PARAMS], half);

    /* One more layer adds, at the peak (the start of backward, all saved):
     * its parameters x 3 (AdamW) and what it saves under bf16 autocast,
     * N = 64 tokens, d = 64, f = 256, 2 heads of 32, dropout, KV cache: */
    r.precision = GM_EST_BF16_AUTOCAST;
    int64_t N = 64, d = 64, f = 256;
    int64_t saved = 2 * R512(N * 4)                 /* ln_1 mean, rstd */
                    + R512(N * d * 2)               /* ln_1 out cast to bf16 */
                    + R512((d * 3 * d + 3 * d) * 2) /* c_attn weight+bias cast */
                    + R512(N * 3 * d * 2)           /* qkv */
                    + 2 * R512(N * d * 2)           /* the cache's k, v copies */
                    + R512(N * d * 2)               /* sdpa out */
                    + R512(2 * 2 * 32 * 4)          /* logsumexp B x h x T fp32 */
                    + 2 * 512                       /* dropout seed, offset */
                    + R512((d * d + d) * 2)         /* c_proj cast */
                    + R512(N * d)                   /* dropout mask */
                    + R512(N * d * 4)               /* residual (fp32) */
                    + 2 * R512(N * 4)               /* ln_2 */
                    + R512(N * d * 2)               /* ln_2 out cast */
                    + R512((d * f + f) * 2)         /* c_fc cast */
                    + 3 * R512(N * f * 4)           /* gelu: fp32 x, tanh, 1+tanh */
                    + R512(N * f * 2)               /* 0.5*x (bf16) */
                    + R512(N * f * 2)               /* gelu out cast for c_proj */
                    + R512((f * d + d) * 2)         /* c_proj cast */
                    + R512(N * d)                   /* dropout mask */
                    + R512(N * d * 4);              /* block output (fp32) */
    gm_est_result a, b;
    assert_int_equal(gm__est_scan(&m1, &r, &a), GM_OK);
    assert_int_equal(gm__est_scan(&m2, &r, &b), GM_OK);
    assert_int_equal(a.peak_phase, GM_EST_PH_BACKWARD);
    assert_int_equal(b.peak_phase, GM_EST_PH_BACKWARD);
    assert_int_equal(b.peak - a.peak, saved + 3 * tiny_layer_params());
    assert_int_equal(b.peak_by_cat[GM_EST_CAT_ACTS] - a.peak_by_cat[GM_EST_CAT_ACTS], saved);
    /* the loss's buffers at that moment: log_softmax's output and two N x V
     * fp32 gradients */
    assert_true(a.peak_by_cat[GM_EST_CAT_TEMPS] >= 2 * R512(N * 4096 * 4));
}

/* Every alloc is freed exactly once and nothing is freed twice or unknown,
 * across models x precisions x optimizers x options. */
static void check_program(const gm_est_program *p, const char *what) {
    uint8_t *st = calloc(p->ntensors + 1, 1); /* 0 never, 1 live, 2 freed */
    assert_non_null(st);
    for (size_t i = 0; i < p->n; i++) {
        const gm_est_event *e = &p->ev[i];
        if (e->id == 0 || e->id > p->ntensors) fail_msg("%s: event %zu has id %u", what, i, e->id);
        if (e->free) {
            if (st[e->id] != 1) fail_msg("%s: event %zu frees tensor %u (state %d)", what, i, e->id, st[e->id]);
            st[e->id] = 2;
        } else {
            if (st[e->id] != 0) fail_msg("%s: tensor %u allocated twice", what, e->id);
            if (e->size == 0) fail_msg("%s: zero-byte alloc at %zu", what, i);
            st[e->id] = 1;
        }
    }
    for (uint32_t id = 1; id <= p->ntensors; id++)
        if (st[id] != 2) fail_msg("%s: tensor %u never freed", what, id);
    free(st);
}

static void test_program_bookkeeping(void **state) {
    (void)state;
    const char *llama = "{\"model_type\":\"mistral\",\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":256,"
                        "\"intermediate_size\":512,\"num_hidden_layers\":2,\"num_attention_heads\":8,"
                        "\"num_key_value_heads\":2,\"vocab_size\":1000}";
    const char *vit = "{\"model_type\":\"vit\",\"architectures\":[\"ViTForImageClassification\"],\"hidden_size\":192,"
                      "\"num_hidden_layers\":2,\"num_attention_heads\":3,\"intermediate_size\":768,"
                      "\"image_size\":64,\"patch_size\":16}";
    const char *gpt2cls = "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2ForSequenceClassification\"],"
                          "\"n_layer\":2,\"n_embd\":64,\"n_head\":2,\"vocab_size\":500,\"n_positions\":64}";
    gm_est_model models[16];
    int nm = 0;
    for (size_t i = 0; i < gm__est_builtin_count(); i++) models[nm++] = *gm__est_builtin(i);
    models[nm++] = from_json(llama);
    models[nm++] = from_json(vit);
    models[nm++] = from_json(gpt2cls);
    for (int mi = 0; mi < nm; mi++) {
        const gm_est_model *m = &models[mi];
        for (int p = 0; p < GM_EST_NPRECISION; p++)
            for (int o = 0; o < GM_EST_NOPTIMIZER; o++)
                for (int opt = 0; opt < 8; opt++) {
                    gm_est_run r;
                    gm__est_run_init(&r);
                    r.batch = 2;
                    r.seq = gm__est_is_vision(m) ? 0 : 16;
                    r.image = gm__est_is_vision(m) && m->family == GM_EST_RESNET ? 64 : 0;
                    r.precision = p;
                    r.optimizer = o;
                    r.accum = opt & 1 ? 2 : 1;
                    r.checkpointing = (opt & 2) && gm__est_is_hf(m);
                    r.keep_output = opt & 4;
                    r.attention = (opt & 2) && gm__est_is_hf(m) ? GM_EST_ATTN_EAGER : GM_EST_ATTN_SDPA;
                    gm_est_program prog;
                    char what[160];
                    snprintf(what, sizeof what, "%.*s %s %s opt %d", (int)sizeof m->name, m->name,
                             gm__est_precision_name(p), gm__est_optimizer_name(o), opt);
                    if (gm__est_build(m, &r, &prog) != GM_OK) fail_msg("%s: %s", what, gm_last_error_detail());
                    check_program(&prog, what);
                    gm__est_program_free(&prog);
                }
        if (m->head != GM_EST_HEAD_CAUSAL_LM) continue;
        for (int p = GM_EST_FP32; p <= GM_EST_BF16; p += GM_EST_BF16 - GM_EST_FP32) { /* generation */
            gm_est_run r;
            gm__est_run_init(&r);
            r.batch = 3, r.seq = 8, r.generate = 5, r.precision = p;
            gm_est_program prog;
            if (gm__est_build(m, &r, &prog) != GM_OK) fail_msg("%s generate: %s", m->name, gm_last_error_detail());
            check_program(&prog, "generate");
            gm__est_program_free(&prog);
        }
    }
}

/* Physics that must hold whatever the constants: */
static void test_orderings(void **state) {
    (void)state;
    gm_est_model m = builtin("gpt2");
    gm_est_run r;
    gm__est_run_init(&r);
    r.seq = 1024;
    gm_est_result base, x;
    assert_int_equal(gm__est_estimate(&m, &r, &base), GM_OK);
    assert_true(base.replayed);
    /* allocated >= the sum of rounded live requests, reserved >= allocated */
    assert_true(base.peak_allocated >= base.peak);
    assert_true(base.peak_reserved_torch >= base.peak_allocated);
    assert_true(base.peak_reserved_gpumem >= base.peak_allocated);
    gm_est_run v = r;
    v.checkpointing = true;
    assert_int_equal(gm__est_scan(&m, &v, &x), GM_OK);
    assert_true(x.peak < base.peak);
    v = r;
    v.batch = 4, v.accum = 2;
    assert_int_equal(gm__est_scan(&m, &v, &x), GM_OK);
    assert_true(x.peak < base.peak);
    v = r;
    v.precision = GM_EST_FP32;
    assert_int_equal(gm__est_scan(&m, &v, &x), GM_OK);
    assert_true(x.peak > base.peak);
    v = r;
    v.attention = GM_EST_ATTN_EAGER;
    assert_int_equal(gm__est_scan(&m, &v, &x), GM_OK);
    assert_true(x.peak > base.peak);
    /* fp16 autocast + GradScaler = bf16 autocast to within the scaler's bytes */
    v = r;
    v.precision = GM_EST_FP16_AUTOCAST;
    assert_int_equal(gm__est_scan(&m, &v, &x), GM_OK);
    assert_true(x.peak - base.peak <= 512 && x.peak >= base.peak);
}

static void test_config_errors(void **state) {
    (void)state;
    gm_est_model m;
    static const struct { const char *json, *needle; } bad[] = {
        {"{\"model_type\":\"t5\",\"architectures\":[\"T5Model\"]}", "t5"},
        {"{\"architectures\":[\"GPT2LMHeadModel\"]}", "model_type"},
        {"{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"n_layer\":2,\"n_embd\":64,"
         "\"n_head\":2,\"n_positions\":64}", "vocab_size"},
        {"{\"model_type\":\"gpt2\",\"n_layer\":2,\"n_embd\":64,\"n_head\":2,\"vocab_size\":5,\"n_positions\":64}",
         "architectures"},
        {"{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"n_layer\":-2,\"n_embd\":64,"
         "\"n_head\":2,\"vocab_size\":5,\"n_positions\":64}", "n_layer"},
        {"{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"n_layer\":2,\"n_embd\":65,"
         "\"n_head\":2,\"vocab_size\":5,\"n_positions\":64}", "multiple"},
        {"{\"model_type\":\"bert\",\"architectures\":[\"BertForTokenClassification\"],\"hidden_size\":64,"
         "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":64,\"vocab_size\":9,"
         "\"max_position_embeddings\":64}", "BertForTokenClassification"},
        {"[1,2]", "JSON object"},
        {"{not json", "invalid JSON at byte 2"}, /* where cJSON stopped */
        {"{\"model_type\": \"gp", "truncated JSON at byte 18"},
        {"{\"n_layer\": 2", "truncated JSON at byte 13"},
        {"{\"n_layer\": tr", "truncated JSON at byte 14"},
        {"", "truncated JSON at byte 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = gm__est_model_from_hf_config(bad[i].json, "cfg.json", &m);
        if (rc == GM_OK) fail_msg("accepted %s", bad[i].json);
        if (!strstr(gm_last_error_detail(), bad[i].needle))
            fail_msg("error '%s' does not name '%s'", gm_last_error_detail(), bad[i].needle);
    }
    assert_int_not_equal(gm__est_builtin_find("gpt5", &m), GM_OK);
    assert_non_null(strstr(gm_last_error_detail(), "gpt2"));
}

static void test_run_errors(void **state) {
    (void)state;
    gm_est_model g = builtin("gpt2"), rn = builtin("resnet50");
    gm_est_run r;
    gm__est_run_init(&r);
    r.batch = -1;
    assert_int_equal(gm__est_check(&g, &r), GM_EINVAL);
    gm__est_run_init(&r);
    r.seq = 2048; /* GPT-2 has 1024 positions */
    assert_int_equal(gm__est_check(&g, &r), GM_EINVAL);
    assert_non_null(strstr(gm_last_error_detail(), "1024"));
    gm__est_run_init(&r);
    r.checkpointing = true;
    assert_int_equal(gm__est_check(&rn, &r), GM_EINVAL);
    gm__est_run_init(&r);
    r.seq = 128;
    assert_int_equal(gm__est_check(&rn, &r), GM_EINVAL);
    gm__est_run_init(&r);
    r.accum = 0;
    assert_int_equal(gm__est_check(&g, &r), GM_EINVAL);
    gm__est_run_init(&r);
    assert_int_equal(gm__est_check(&g, &r), GM_OK);
    assert_int_equal(r.seq, 1024); /* default filled */
}

/* --fit: the answer fits, one more does not */
static void test_fit(void **state) {
    (void)state;
    gm_est_model m = builtin("gpt2");
    gm_est_run r;
    gm__est_run_init(&r);
    r.seq = 512;
    uint64_t cap = (uint64_t)20 << 30;
    int64_t best = 0;
    gm_est_result at;
    assert_int_equal(gm__est_fit(&m, &r, 0, cap, &best, &at), GM_OK);
    assert_true(best > 1);
    double margin = 1.0 + GM_EST_FIT_MARGIN;
    gm_est_result x;
    r.batch = best;
    assert_int_equal(gm__est_estimate_torch(&m, &r, &x), GM_OK);
    assert_true((double)x.peak_reserved_torch * margin + (double)x.cuda_context <= (double)cap);
    r.batch = best + 1;
    assert_int_equal(gm__est_estimate_torch(&m, &r, &x), GM_OK);
    assert_true((double)x.peak_reserved_torch * margin + (double)x.cuda_context > (double)cap);
    /* nothing fits in 1 GiB with AdamW on GPT-2 (1.5 GB of state alone) */
    assert_int_equal(gm__est_fit(&m, &r, 0, (uint64_t)1 << 30, &best, NULL), GM_OK);
    assert_int_equal(best, 0);
}


/* ---- any size: exact, bounded, monotone (issues #25, #26-2) ------------- */

/* live bytes of a program, as torch rounds them: peak and phase peaks */
static void full_scan(const gm_est_program *p, int64_t *peak, int64_t phase[2][GM_EST_NPHASE]) {
    uint64_t *sz = calloc(p->ntensors + 1, sizeof *sz);
    assert_non_null(sz);
    int64_t live = 0;
    *peak = 0;
    memset(phase, 0, sizeof(int64_t) * 2 * GM_EST_NPHASE);
    for (size_t i = 0; i < p->n; i++) {
        const gm_est_event *e = &p->ev[i];
        int lat = e->step > 1;
        if (live > phase[lat][e->phase]) phase[lat][e->phase] = live;
        if (e->free) {
            live -= (int64_t)sz[e->id];
            continue;
        }
        sz[e->id] = R512(e->size);
        live += (int64_t)sz[e->id];
        if (live > phase[lat][e->phase]) phase[lat][e->phase] = live;
        if (live > *peak) *peak = live;
    }
    free(sz);
}

/* A deep model's peaks come from its 4- and 5-layer programs; they must
 * equal the full program's, to the byte, for every family, precision,
 * option and sharding strategy. */
static void test_folded_scan_is_exact(void **state) {
    (void)state;
    char js[512];
    const char *fmt[] = {
        "{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"n_layer\":%d,\"n_embd\":64,"
        "\"n_head\":2,\"vocab_size\":4096,\"n_positions\":64}",
        "{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":128,"
        "\"intermediate_size\":352,\"num_hidden_layers\":%d,\"num_attention_heads\":4,"
        "\"num_key_value_heads\":2,\"vocab_size\":1000}",
        "{\"model_type\":\"bert\",\"architectures\":[\"BertForMaskedLM\"],\"hidden_size\":64,"
        "\"num_hidden_layers\":%d,\"num_attention_heads\":2,\"intermediate_size\":256,\"vocab_size\":900,"
        "\"max_position_embeddings\":64}",
        "{\"model_type\":\"vit\",\"architectures\":[\"ViTForImageClassification\"],\"hidden_size\":64,"
        "\"num_hidden_layers\":%d,\"num_attention_heads\":2,\"intermediate_size\":256,"
        "\"image_size\":64,\"patch_size\":16}",
    };
    static const struct { int shard; int world; } sh[] = {
        {GM_EST_SHARD_NONE, 1}, {GM_EST_SHARD_DDP, 4}, {GM_EST_SHARD_FSDP, 4}, {GM_EST_SHARD_FSDP, 3},
        {GM_EST_SHARD_ZERO1, 1}, {GM_EST_SHARD_ZERO2, 1}, {GM_EST_SHARD_ZERO3, 1},
    };
    for (size_t f = 0; f < sizeof fmt / sizeof fmt[0]; f++)
        for (int L = 9; L <= 14; L += 5)
            for (int v = 0; v < 16; v++) {
                snprintf(js, sizeof js, fmt[f], L);
                gm_est_model m = from_json(js);
                gm_est_run r;
                gm__est_run_init(&r);
                r.batch = 2;
                r.seq = gm__est_is_vision(&m) ? 0 : 16;
                r.precision = v % GM_EST_NPRECISION;
                r.accum = v & 4 ? 3 : 1;
                r.checkpointing = v & 8;
                r.keep_output = v & 2;
                r.shard = sh[v % 7].shard;
                r.world = sh[v % 7].world;
                r.reshard_after_forward = !(v & 1);
                if (r.shard >= GM_EST_SHARD_ZERO1 && (r.precision == GM_EST_FP16_AUTOCAST ||
                                                      r.precision == GM_EST_BF16_AUTOCAST))
                    r.precision = GM_EST_BF16;
                gm_est_result res;
                gm_est_program p;
                if (gm__est_scan(&m, &r, &res) != GM_OK) fail_msg("%s variant %d: %s", js, v, gm_last_error_detail());
                assert_int_equal(gm__est_build(&m, &r, &p), GM_OK);
                assert_int_equal(p.layers, L);
                check_program(&p, js);
                int64_t peak, phase[2][GM_EST_NPHASE];
                full_scan(&p, &peak, phase);
                gm__est_program_free(&p);
                /* ZeRO's flat buffers hold every layer at once: 512-byte rounding of a
                 * size that grows with the depth is affine only to within 512 bytes
                 * a layer for each of its (at most 8) buffers */
                int64_t tol = r.shard >= GM_EST_SHARD_ZERO1 ? 8 * 512 * L : 0;
                if (llabs(res.peak - peak) > tol)
                    fail_msg("%s variant %d: folded %lld, full %lld", js, v, (long long)res.peak, (long long)peak);
                for (int l = 0; l < 2; l++)
                    for (int ph = 0; ph < GM_EST_NPHASE; ph++)
                        if (llabs(res.phase_peak[l][ph] - phase[l][ph]) > tol)
                            fail_msg("%s variant %d: phase %d/%d folded %lld, full %lld", js, v, l, ph,
                                     (long long)res.phase_peak[l][ph], (long long)phase[l][ph]);
                int64_t sum = 0;
                for (int c = 0; c < GM_EST_NCAT; c++) sum += res.peak_by_cat[c];
                assert_int_equal(sum, res.peak);
            }
}

/* The property of issue #25: the peak grows with batch and with sequence
 * length at every size, linearly once model states are covered, and fits
 * is never true above the capacity (no device's size caps it). */
static void test_monotone_any_size(void **state) {
    (void)state;
    gm_est_model m = builtin("gpt2");
    gm_est_run r;
    gm__est_run_init(&r);
    r.seq = 1024;
    int64_t prev = 0, d1 = 0;
    for (int64_t b = 1; b <= 65536; b *= 2) {
        r.batch = b;
        gm_est_result x;
        assert_int_equal(gm__est_scan(&m, &r, &x), GM_OK);
        if (x.peak <= prev) fail_msg("batch %lld: peak %lld after %lld", (long long)b, (long long)x.peak, (long long)prev);
        if (b >= 128) { /* activations dominate: doubling the batch doubles the growth */
            int64_t d = x.peak - prev;
            if (d1) assert_true(llabs(d - 2 * d1) <= d1 / 50);
            d1 = d;
        }
        prev = x.peak;
    }
    gm_est_model l = from_json("{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],"
                               "\"hidden_size\":512,\"intermediate_size\":1408,\"num_hidden_layers\":24,"
                               "\"num_attention_heads\":8,\"vocab_size\":32000}");
    gm__est_run_init(&r);
    prev = 0;
    for (int64_t s = 64; s <= (1 << 22); s *= 4) {
        r.seq = s;
        gm_est_result x;
        assert_int_equal(gm__est_scan(&l, &r, &x), GM_OK);
        assert_true(x.peak > prev);
        prev = x.peak;
    }
    /* past 141 GiB, the replay follows the scan: batch 160 is 221 GiB, not 129 */
    gm__est_run_init(&r);
    r.seq = 1024;
    for (int64_t b = 64; b <= 4096; b *= 4) {
        r.batch = b;
        gm_est_result x;
        assert_int_equal(gm__est_estimate_torch(&m, &r, &x), GM_OK);
        assert_true(x.peak_allocated >= x.peak);
        assert_true(x.peak_reserved_torch >= x.peak_allocated);
        uint64_t cap = (uint64_t)x.peak; /* any capacity below the peak does not fit */
        double need = (double)x.peak_reserved_torch * (1.0 + GM_EST_FIT_MARGIN) + (double)x.cuda_context;
        assert_true(need > (double)cap);
    }
}

/* #26-2's probes: work and memory follow the model's structure, never its
 * numbers; what cannot be computed is an error. */
static void test_numbers_do_not_cost(void **state) {
    (void)state;
    /* n_layer 1e9: 24 GB and killed before; now arithmetic over the layers */
    gm_est_model m = from_json("{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],"
                               "\"n_layer\":1000000000,\"n_embd\":768,\"n_head\":12,\"vocab_size\":50257,"
                               "\"n_positions\":1024}");
    gm_est_run r;
    gm__est_run_init(&r);
    r.batch = 1, r.seq = 128;
    gm_est_result x;
    assert_int_equal(gm__est_estimate(&m, &r, &x), GM_OK);
    assert_int_equal(x.params, 1000000000ull * 7087872 + 50257ull * 768 + 1024 * 768 + 2 * 768);
    assert_true(x.events < 100000);
    assert_true(x.reserved_extrapolated);
    /* params (fp32) + gradients + AdamW's two states at the optimizer step */
    assert_true(x.peak >= (int64_t)x.params * 16);
    assert_true(x.peak_reserved_torch >= x.peak_allocated && x.peak_allocated >= x.peak);
    r.batch = 8, r.seq = 1024; /* past 4 EiB: refused, not wrapped */
    assert_int_equal(gm__est_scan(&m, &r, &x), GM_EINVAL);
    assert_non_null(strstr(gm_last_error_detail(), "too large"));
    /* vocab 1e9: "0 B fits" before; the logits alone are N x V x 4 */
    m = from_json("{\"model_type\":\"gpt2\",\"architectures\":[\"GPT2LMHeadModel\"],\"n_layer\":12,"
                  "\"n_embd\":768,\"n_head\":12,\"vocab_size\":1000000000,\"n_positions\":1024}");
    gm__est_run_init(&r);
    assert_int_equal(gm__est_estimate_torch(&m, &r, &x), GM_OK);
    assert_true(x.peak > (int64_t)8192 * 1000000000 * 4);
    assert_true(x.peak_allocated >= x.peak);
    /* every size 1e9: refused (UBSan saw signed overflow here before) */
    gm_est_model big = from_json("{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],"
                                 "\"hidden_size\":1000000000,\"intermediate_size\":1000000000,"
                                 "\"num_hidden_layers\":1000000000,\"num_attention_heads\":1000000000,"
                                 "\"vocab_size\":1000000000}");
    gm__est_run_init(&r);
    r.batch = 1 << 20, r.seq = 1 << 22;
    assert_int_equal(gm__est_scan(&big, &r, &x), GM_EINVAL);
    /* a patch embedding of 1e9 x 1e9 x 8192^2 is refused before it is counted */
    gm_est_model vit = from_json("{\"model_type\":\"vit\",\"architectures\":[\"ViTForImageClassification\"],"
                                 "\"hidden_size\":1000000000,\"num_hidden_layers\":1,\"num_attention_heads\":1,"
                                 "\"intermediate_size\":1,\"image_size\":8192,\"patch_size\":8192,"
                                 "\"num_channels\":1000000000}");
    gm__est_run_init(&r);
    assert_int_equal(gm__est_scan(&vit, &r, &x), GM_EINVAL);
    /* accum 4096: 45 s and 2.3 GB before; the same events and peaks as accum 4 */
    m = builtin("gpt2");
    gm__est_run_init(&r);
    r.accum = 4;
    gm_est_result a4, a4096;
    assert_int_equal(gm__est_scan(&m, &r, &a4), GM_OK);
    r.accum = 4096;
    assert_int_equal(gm__est_scan(&m, &r, &a4096), GM_OK);
    assert_int_equal(a4096.peak, a4.peak);
    assert_int_equal(a4096.events, a4.events);
    /* generate: the decode steps beyond the last few are skipped over, and
     * the peak (the last step's) is the same as emitting every one */
    gm__est_run_init(&r);
    r.precision = GM_EST_BF16, r.seq = 16, r.generate = 1000;
    gm_est_program p;
    assert_int_equal(gm__est_build(&m, &r, &p), GM_OK);
    assert_true(p.n < 50000);
    gm__est_program_free(&p);
    /* with the cache holding the peak (batch 2048), each new token adds its
     * k and v in every layer and a column of ids (and grows the copy cat
     * makes): steps 9 -> 10 (every decode step emitted, then the first
     * skipped) add what 10 -> 11 adds, and 999 -> 1000 what 1000 -> 1001 */
    r.batch = 2048;
    int64_t step = (int64_t)12 * 2 * 2048 * 768 * 2 + 2048 * 8, pk[6];
    static const int64_t gens[] = {9, 10, 11, 999, 1000, 1001};
    for (size_t i = 0; i < 6; i++) {
        r.generate = gens[i];
        assert_int_equal(gm__est_scan(&m, &r, &x), GM_OK);
        pk[i] = x.peak;
    }
    assert_int_equal(pk[1] - pk[0], pk[2] - pk[1]);
    assert_int_equal(pk[4] - pk[3], pk[5] - pk[4]);
    assert_true(pk[1] - pk[0] >= step && pk[4] - pk[3] >= step);
}

/* Per rank: each strategy holds less than the one before it where it
 * shards more, and sharding divides model states by the world size. */
static void test_sharding(void **state) {
    (void)state;
    gm_est_model m = builtin("gpt2-medium");
    gm_est_run r;
    gm__est_run_init(&r);
    r.batch = 2, r.seq = 512, r.precision = GM_EST_BF16;
    gm_est_result one, ddp, z1, z2, z3, fsdp, fsdp8;
    assert_int_equal(gm__est_scan(&m, &r, &one), GM_OK);
    r.world = 8;
    r.shard = GM_EST_SHARD_DDP;
    assert_int_equal(gm__est_scan(&m, &r, &ddp), GM_OK);
    /* DDP = one GPU + its buckets (the gradients' bytes again) */
    int64_t grads = one.phase_by_cat[1][GM_EST_PH_OPTIMIZER][GM_EST_CAT_GRADS];
    assert_true(ddp.peak > one.peak && ddp.peak - one.peak <= grads + grads / 50);
    r.shard = GM_EST_SHARD_ZERO1;
    assert_int_equal(gm__est_scan(&m, &r, &z1), GM_OK);
    r.shard = GM_EST_SHARD_ZERO2;
    assert_int_equal(gm__est_scan(&m, &r, &z2), GM_OK);
    r.shard = GM_EST_SHARD_ZERO3;
    assert_int_equal(gm__est_scan(&m, &r, &z3), GM_OK);
    assert_true(z3.steady_by_cat[GM_EST_CAT_PARAMS] < z1.steady_by_cat[GM_EST_CAT_PARAMS]);
    /* ZeRO-2 trades the full gradients for the reduce bucket (5e8 elements:
     * all of a model this size) plus the partition */
    assert_true(z2.peak <= z1.peak + grads + grads / 8 + (1 << 20));
    assert_true(z1.peak < ddp.peak);
    r.shard = GM_EST_SHARD_FSDP;
    r.precision = GM_EST_BF16_AUTOCAST;
    assert_int_equal(gm__est_scan(&m, &r, &fsdp), GM_OK);
    r.shard = GM_EST_SHARD_NONE, r.world = 1;
    assert_int_equal(gm__est_scan(&m, &r, &one), GM_OK);
    /* sharded parameters and optimizer state: an eighth (padded) of one GPU's */
    int64_t os1 = one.steady_by_cat[GM_EST_CAT_OPTSTATE], os8 = fsdp.steady_by_cat[GM_EST_CAT_OPTSTATE];
    assert_true(os8 * 8 >= os1 && os8 * 8 <= os1 + os1 / 20);
    r.shard = GM_EST_SHARD_FSDP, r.world = 64;
    assert_int_equal(gm__est_scan(&m, &r, &fsdp8), GM_OK);
    assert_true(fsdp8.peak < fsdp.peak && fsdp.peak < one.peak);
    /* bad settings name what is wrong */
    r.world = 8, r.shard = GM_EST_SHARD_NONE;
    assert_int_equal(gm__est_check(&m, &r), GM_EINVAL);
    assert_non_null(strstr(gm_last_error_detail(), "--shard"));
}

/* the explained OOM: every fact present, changes ranked by saving, safe truncation */
static void test_oom_explain(void **state) {
    (void)state;
    const uint64_t G = 1ull << 30;
    const char *scopes[] = {"model.transformer.h.11", "optimizer"};
    const uint64_t sb[] = {3 * G, 2 * G};
    gm_est_oom_info in = {.device = 0, .requested = 2 * G, .device_total = 80 * G, .device_free = G / 2,
                          .allocated = 70 * G, .reserved = 78 * G, .largest_free_block = G,
                          .have_categories = true, .scopes = scopes, .scope_bytes = sb, .nscopes = 2};
    in.by_category[GM_EST_CAT_PARAMS] = 4 * G;
    in.by_category[GM_EST_CAT_OPTSTATE] = 8 * G;
    in.by_category[GM_EST_CAT_ACTS] = 40 * G;
    char buf[2048];
    size_t need = gm__est_oom_explain(&in, buf, sizeof buf);
    assert_int_equal(need, strlen(buf));
    static const char *facts[] = {"tried to allocate 2.00 GiB", "80.00 GiB", "512.00 MiB is free",
                                  "70.00 GiB allocated", "8.00 GiB reserved but unallocated",
                                  "largest free block is 1.00 GiB", "activations 40.00 GiB",
                                  "model.transformer.h.11 3.00 GiB", "expandable_segments:True"};
    for (size_t i = 0; i < sizeof facts / sizeof facts[0]; i++)
        if (!strstr(buf, facts[i])) fail_msg("'%s' missing from:\n%s", facts[i], buf);
    /* ranked: checkpointing (30 GiB) before accumulation (20) before fragmentation (8); three shown */
    const char *ck = strstr(buf, "checkpointing"), *acc = strstr(buf, "accumulation"), *fr = strstr(buf, "expandable");
    assert_non_null(ck), assert_non_null(acc), assert_non_null(fr);
    assert_true(ck < acc && acc < fr);
    assert_null(strstr(buf, "8-bit")); /* the fourth (6 GiB) is left out */
    /* truncation: the same length needed, the buffer terminated */
    char small[40];
    assert_int_equal(gm__est_oom_explain(&in, small, sizeof small), need);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_int_equal(gm__est_oom_explain(&in, NULL, 0), need);
    /* nothing known, nothing reclaimable: says what else to do */
    gm_est_oom_info bare = {.requested = G, .device_total = 16 * G, .device_free = 0, .allocated = 15 * G,
                            .reserved = 15 * G};
    gm__est_oom_explain(&bare, buf, sizeof buf);
    assert_non_null(strstr(buf, "--fit batch"));
    /* already on expandable segments: suggest gpumem's policy instead */
    in.expandable_segments = true;
    gm__est_oom_explain(&in, buf, sizeof buf);
    assert_null(strstr(buf, "expandable_segments:True"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_counts),    cmocka_unit_test(test_hand_checked_bytes),
        cmocka_unit_test(test_program_bookkeeping), cmocka_unit_test(test_orderings),
        cmocka_unit_test(test_config_errors),   cmocka_unit_test(test_run_errors),
        cmocka_unit_test(test_fit),             cmocka_unit_test(test_oom_explain),
        cmocka_unit_test(test_folded_scan_is_exact), cmocka_unit_test(test_monotone_any_size),
        cmocka_unit_test(test_numbers_do_not_cost), cmocka_unit_test(test_sharding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
