/* estimate_models.c — the built-in models (one table), names of the
 * estimator's enums, and Hugging Face config.json reading (cJSON). */
#include "estimate.h"

#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GM_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

/* The built-ins: the configs of the Hugging Face hub's gpt2, gpt2-medium and
 * bert-base-uncased, and torchvision's resnet18/50 and vit_b_16. */
static const gm_est_model builtins[] = {
    {.name = "gpt2", .family = GM_EST_GPT2, .head = GM_EST_HEAD_CAUSAL_LM, .layers = 12, .hidden = 768,
     .heads = 12, .kv_heads = 12, .head_dim = 64, .intermediate = 3072, .vocab = 50257,
     .max_positions = 1024, .tied = true, .gelu_python = true, .dropout = true, .use_cache = true},
    {.name = "gpt2-medium", .family = GM_EST_GPT2, .head = GM_EST_HEAD_CAUSAL_LM, .layers = 24,
     .hidden = 1024, .heads = 16, .kv_heads = 16, .head_dim = 64, .intermediate = 4096, .vocab = 50257,
     .max_positions = 1024, .tied = true, .gelu_python = true, .dropout = true, .use_cache = true},
    {.name = "bert-base-uncased", .family = GM_EST_BERT, .head = GM_EST_HEAD_MASKED_LM, .layers = 12,
     .hidden = 768, .heads = 12, .kv_heads = 12, .head_dim = 64, .intermediate = 3072, .vocab = 30522,
     .max_positions = 512, .type_vocab = 2, .num_labels = 2, .tied = true, .dropout = true},
    {.name = "resnet18", .family = GM_EST_RESNET, .head = GM_EST_HEAD_IMAGE_CLS, .num_labels = 1000,
     .image = 224, .channels = 3, .blocks = {2, 2, 2, 2}, .bottleneck = false},
    {.name = "resnet50", .family = GM_EST_RESNET, .head = GM_EST_HEAD_IMAGE_CLS, .num_labels = 1000,
     .image = 224, .channels = 3, .blocks = {3, 4, 6, 3}, .bottleneck = true},
    {.name = "vit_b_16", .family = GM_EST_VIT_TV, .head = GM_EST_HEAD_IMAGE_CLS, .layers = 12,
     .hidden = 768, .heads = 12, .kv_heads = 12, .head_dim = 64, .intermediate = 3072,
     .num_labels = 1000, .image = 224, .patch = 16, .channels = 3},
};

size_t gm__est_builtin_count(void) { return sizeof builtins / sizeof builtins[0]; }
const gm_est_model *gm__est_builtin(size_t i) { return i < gm__est_builtin_count() ? &builtins[i] : NULL; }

int gm__est_builtin_find(const char *name, gm_est_model *out) {
    for (size_t i = 0; i < gm__est_builtin_count(); i++)
        if (!strcmp(builtins[i].name, name)) {
            *out = builtins[i];
            return GM_OK;
        }
    char list[256] = "";
    for (size_t i = 0; i < gm__est_builtin_count(); i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%.40s", i ? ", " : "", builtins[i].name);
    }
    return gm__set_error(GM_EINVAL, "unknown model '%.64s' (built-in models: %s; or --config config.json)",
                         name, list);
}

#define NAMEFN(fn, LIST)                                                       \
    const char *fn(int v) {                                                    \
        static const char *n[] = {LIST(GM__EST_S)};                            \
        return v >= 0 && v < (int)(sizeof n / sizeof n[0]) ? n[v] : "?";      \
    }
#define GM__EST_S(n, s) s,
NAMEFN(gm__est_precision_name, GM_EST_PRECISIONS)
NAMEFN(gm__est_optimizer_name, GM_EST_OPTIMIZERS)
NAMEFN(gm__est_phase_name, GM_EST_PHASES)
NAMEFN(gm__est_shard_name, GM_EST_SHARDS)
#undef GM__EST_S

const char *gm__est_family_name(int f) {
    static const char *n[] = {"gpt2", "llama", "bert", "vit", "torchvision-vit", "torchvision-resnet"};
    return f >= 0 && f < 6 ? n[f] : "?";
}
const char *gm__est_head_name(int h) {
    static const char *n[] = {"causal-lm", "masked-lm", "sequence-classification", "image-classification"};
    return h >= 0 && h < 4 ? n[h] : "?";
}

int gm__est_precision_parse(const char *s) {
    for (int i = 0; i < GM_EST_NPRECISION; i++)
        if (!strcmp(s, gm__est_precision_name(i))) return i;
    return -1;
}
int gm__est_optimizer_parse(const char *s) {
    for (int i = 0; i < GM_EST_NOPTIMIZER; i++)
        if (!strcmp(s, gm__est_optimizer_name(i))) return i;
    return -1;
}
int gm__est_shard_parse(const char *s) {
    for (int i = 0; i < GM_EST_NSHARD; i++)
        if (!strcmp(s, gm__est_shard_name(i))) return i;
    return -1;
}

bool gm__est_is_vision(const gm_est_model *m) {
    return m->family == GM_EST_VIT_HF || m->family == GM_EST_VIT_TV || m->family == GM_EST_RESNET;
}
bool gm__est_is_hf(const gm_est_model *m) { return m->family != GM_EST_VIT_TV && m->family != GM_EST_RESNET; }

/* ---- Hugging Face config.json ------------------------------------------ */

#ifdef GM_HAVE_CJSON
typedef struct cfgctx {
    const cJSON *root;
    const char *label;
    int rc;
} cfgctx;

/* A required positive integer key (first of up to two names). */
static int64_t req(cfgctx *c, const char *key, const char *alt) {
    if (c->rc) return 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!v && alt) v = cJSON_GetObjectItemCaseSensitive(c->root, alt);
    if (!v) {
        c->rc = gm__set_error(GM_EINVAL, "%s: missing key \"%s\" (needed for this model type)", c->label, key);
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e9 ||
        v->valuedouble != (double)(int64_t)v->valuedouble) {
        c->rc = gm__set_error(GM_EINVAL, "%s: \"%s\" must be a positive integer", c->label, key);
        return 0;
    }
    return (int64_t)v->valuedouble;
}

static int64_t opt_int(cfgctx *c, const char *key, int64_t dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->root, key);
    if (!v || cJSON_IsNull(v)) return dflt;
    return req(c, key, NULL);
}

static bool opt_bool(const cJSON *root, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static double opt_num(const cJSON *root, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* The four sizes every transformers config but GPT-2's names alike. */
static void hf_dims(cfgctx *c, gm_est_model *out) {
    out->layers = req(c, "num_hidden_layers", NULL);
    out->hidden = req(c, "hidden_size", NULL);
    out->heads = req(c, "num_attention_heads", NULL);
    out->intermediate = req(c, "intermediate_size", NULL);
}

static const char *opt_str(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int64_t num_labels(const cJSON *root) {
    const cJSON *id2 = cJSON_GetObjectItemCaseSensitive(root, "id2label");
    if (cJSON_IsObject(id2) && cJSON_GetArraySize(id2) > 0) return cJSON_GetArraySize(id2);
    double n = opt_num(root, "num_labels", 2);
    return n >= 1 && n <= 1e9 ? (int64_t)n : 2; /* in range before the cast (found by fuzz_estimate_config) */
}

/* architectures[0] -> head; its suffix decides. */
static int head_of(cfgctx *c, gm_est_family fam, gm_est_head *head) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(c->root, "architectures");
    const cJSON *first = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;
    const char *arch = cJSON_IsString(first) ? first->valuestring : NULL;
    if (!arch)
        return gm__set_error(GM_EINVAL, "%s: missing key \"architectures\" (it names the head: e.g. "
                             "[\"GPT2LMHeadModel\"])", c->label);
    static const struct { const char *suffix; gm_est_head head; } map[] = {
        {"LMHeadModel", GM_EST_HEAD_CAUSAL_LM}, {"ForCausalLM", GM_EST_HEAD_CAUSAL_LM},
        {"ForMaskedLM", GM_EST_HEAD_MASKED_LM}, {"ForSequenceClassification", GM_EST_HEAD_SEQ_CLS},
        {"ForImageClassification", GM_EST_HEAD_IMAGE_CLS},
    };
    size_t al = strlen(arch);
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        size_t sl = strlen(map[i].suffix);
        if (al >= sl && !strcmp(arch + al - sl, map[i].suffix)) {
            gm_est_head h = map[i].head;
            bool ok = (fam == GM_EST_VIT_HF) == (h == GM_EST_HEAD_IMAGE_CLS) &&
                      !(fam != GM_EST_BERT && h == GM_EST_HEAD_MASKED_LM) &&
                      !(fam == GM_EST_BERT && h == GM_EST_HEAD_CAUSAL_LM);
            if (!ok) break;
            *head = h;
            return GM_OK;
        }
    }
    return gm__set_error(GM_EINVAL, "%s: architecture \"%s\" is not modelled (this model type supports %s)",
                         c->label, arch,
                         fam == GM_EST_GPT2 || fam == GM_EST_LLAMA ? "*ForCausalLM / *LMHeadModel, *ForSequenceClassification"
                         : fam == GM_EST_BERT ? "*ForMaskedLM, *ForSequenceClassification"
                                              : "*ForImageClassification");
}
#endif

#ifdef GM_HAVE_CJSON
/* Where cJSON stopped (rest): the text was cut there, not wrong, when all
 * that is left is nothing, an unterminated string, or the start of a number
 * or of true/false/null. */
static bool json_cut_at(const char *rest) {
    rest += strspn(rest, " \t\r\n");
    if (!*rest) return true;
    if (*rest == '"') {
        for (const char *q = rest + 1; *q; q++) {
            if (*q == '\\' && q[1]) q++;
            else if (*q == '"') return false;
        }
        return true;
    }
    if (strspn(rest, "-+.0123456789eE") == strlen(rest)) return true;
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++)
        if (!strncmp(words[i], rest, strlen(rest))) return true;
    return false;
}
#endif

int gm__est_model_from_hf_config(const char *json, const char *label, gm_est_model *out) {
#ifndef GM_HAVE_CJSON
    (void)json;
    (void)out;
    return gm__set_error(GM_ENOTSUP, "%s: this gpumem was built without cJSON; use --model", label);
#else
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, false);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        if (json_cut_at(json + at) || (at && json_cut_at(json + at - 1))) /* cJSON may stop one past */
            return gm__set_error(GM_EFORMAT, "%s: truncated JSON at byte %zu (the text ends inside a value; expected "
                                 "a whole Hugging Face config.json)", label, strlen(json));
        return gm__set_error(GM_EFORMAT, "%s: invalid JSON at byte %zu (from 0; expected a Hugging Face config.json)",
                             label, at);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return gm__set_error(GM_EFORMAT, "%s: not a JSON object (expected a Hugging Face config.json)", label);
    }
    cfgctx c = {root, label, 0};
    const char *mt = opt_str(root, "model_type");
    int rc = GM_OK;
    if (!mt) {
        rc = gm__set_error(GM_EINVAL, "%s: missing key \"model_type\" (gpt2, llama, mistral, bert or vit)", label);
        goto done;
    }
    snprintf(out->name, sizeof out->name, "%s", label);
    if (!strcmp(mt, "gpt2")) {
        out->family = GM_EST_GPT2;
        out->layers = req(&c, "n_layer", NULL);
        out->hidden = req(&c, "n_embd", NULL);
        out->heads = req(&c, "n_head", NULL);
        out->vocab = req(&c, "vocab_size", NULL);
        out->max_positions = req(&c, "n_positions", NULL);
        out->intermediate = opt_int(&c, "n_inner", 4 * out->hidden);
        const char *act = opt_str(root, "activation_function");
        out->gelu_python = !act || !strcmp(act, "gelu_new");
        out->dropout = opt_num(root, "resid_pdrop", 0.1) > 0 || opt_num(root, "attn_pdrop", 0.1) > 0;
        out->tied = opt_bool(root, "tie_word_embeddings", true);
        out->use_cache = opt_bool(root, "use_cache", true);
    } else if (!strcmp(mt, "llama") || !strcmp(mt, "mistral")) {
        out->family = GM_EST_LLAMA;
        hf_dims(&c, out);
        out->vocab = req(&c, "vocab_size", NULL);
        out->kv_heads = opt_int(&c, "num_key_value_heads", out->heads);
        out->max_positions = opt_int(&c, "max_position_embeddings", 2048);
        out->tied = opt_bool(root, "tie_word_embeddings", false);
        out->dropout = opt_num(root, "attention_dropout", 0.0) > 0;
        out->use_cache = opt_bool(root, "use_cache", true);
        if (!c.rc && out->heads) out->head_dim = opt_int(&c, "head_dim", out->hidden / out->heads);
    } else if (!strcmp(mt, "bert")) {
        out->family = GM_EST_BERT;
        hf_dims(&c, out);
        out->vocab = req(&c, "vocab_size", NULL);
        out->max_positions = req(&c, "max_position_embeddings", NULL);
        out->type_vocab = opt_int(&c, "type_vocab_size", 2);
        out->dropout = opt_num(root, "hidden_dropout_prob", 0.1) > 0;
        out->tied = opt_bool(root, "tie_word_embeddings", true);
    } else if (!strcmp(mt, "vit")) {
        out->family = GM_EST_VIT_HF;
        hf_dims(&c, out);
        out->image = req(&c, "image_size", NULL);
        out->patch = req(&c, "patch_size", NULL);
        out->channels = opt_int(&c, "num_channels", 3);
        out->dropout = opt_num(root, "hidden_dropout_prob", 0.0) > 0;
    } else {
        rc = gm__set_error(GM_EINVAL, "%s: model_type \"%s\" is not modelled (supported: gpt2, llama, "
                           "mistral, bert, vit)", label, mt);
        goto done;
    }
    if (c.rc) {
        rc = c.rc;
        goto done;
    }
    if (!out->kv_heads) out->kv_heads = out->heads;
    if (!out->head_dim) out->head_dim = out->hidden / out->heads;
    if (out->family != GM_EST_LLAMA && out->hidden % out->heads) {
        rc = gm__set_error(GM_EINVAL, "%s: hidden size %lld is not a multiple of the %lld heads", label,
                           (long long)out->hidden, (long long)out->heads);
        goto done;
    }
    if (out->heads % out->kv_heads) {
        rc = gm__set_error(GM_EINVAL, "%s: %lld attention heads are not a multiple of %lld key/value heads",
                           label, (long long)out->heads, (long long)out->kv_heads);
        goto done;
    }
    if (out->family == GM_EST_VIT_HF && out->image % out->patch) {
        rc = gm__set_error(GM_EINVAL, "%s: image_size %lld is not a multiple of patch_size %lld", label,
                           (long long)out->image, (long long)out->patch);
        goto done;
    }
    out->num_labels = num_labels(root);
    rc = head_of(&c, out->family, &out->head);
done:
    cJSON_Delete(root);
    return rc;
#endif
}

int gm__est_model_from_hf_config_file(const char *path, gm_est_model *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return gm__set_error(GM_EIO, "cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > ((size_t)16 << 20)) {
                free(buf);
                fclose(f);
                return gm__set_error(GM_EFORMAT, "%s: larger than 16 MiB; not a config.json", path);
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return gm__set_error(GM_ENOHOSTMEM, "out of host memory reading %s", path);
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) break;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return gm__set_error(GM_EIO, "cannot read %s", path);
    }
    buf[len] = 0;
    const char *base = strrchr(path, '/');
    int rc = gm__est_model_from_hf_config(buf, path, out);
    (void)base;
    free(buf);
    return rc;
}
