/* estimate.h — a model of the GPU memory of a PyTorch training loop.
 *
 * The loop modelled is the usual one:
 *   for step: for micro in accum:
 *       with torch.autocast(...):            # where the precision says so
 *           loss = model(**batch).loss / accum
 *       loss.backward()                      # scaler.scale(loss) for fp16
 *   optimizer.step(); optimizer.zero_grad(set_to_none=True)
 * on Hugging Face transformers models (GPT-2, Llama/Mistral, BERT, ViT) and
 * torchvision's resnet / vit_b_16, as they allocate under torch 2.11 /
 * transformers 5 (the tensors each op saves for backward follow the models'
 * code; bench/RESULTS.md "Training memory estimator" has the measurements).
 *
 * The model emits the loop as an allocation event sequence (alloc / free with
 * a size, a category and a phase), so peaks by phase and by category fall
 * out of one scan, and the same sequence is replayed on the simulated device
 * under the torch and gpumem allocator policies (src/trace/replay.c) to
 * predict peak reserved memory. Named gm_est_* (internal, like trace.h). */
#ifndef GPUMEM_ESTIMATE_ESTIMATE_H
#define GPUMEM_ESTIMATE_ESTIMATE_H

#include "gpumem/gpumem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Families of model code whose allocations are modelled. */
typedef enum gm_est_family {
    GM_EST_GPT2,      /* transformers GPT2 */
    GM_EST_LLAMA,     /* transformers Llama / Mistral (RMSNorm, RoPE, SwiGLU, GQA) */
    GM_EST_BERT,      /* transformers BERT */
    GM_EST_VIT_HF,    /* transformers ViT */
    GM_EST_VIT_TV,    /* torchvision vit_* */
    GM_EST_RESNET,    /* torchvision resnet* */
} gm_est_family;

typedef enum gm_est_head {
    GM_EST_HEAD_CAUSAL_LM,  /* *LMHeadModel / *ForCausalLM: loss over every token */
    GM_EST_HEAD_MASKED_LM,  /* *ForMaskedLM: loss over every token */
    GM_EST_HEAD_SEQ_CLS,    /* *ForSequenceClassification */
    GM_EST_HEAD_IMAGE_CLS,  /* *ForImageClassification, torchvision classifiers */
} gm_est_head;

typedef struct gm_est_model {
    char name[96];
    gm_est_family family;
    gm_est_head head;
    int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab;
    int64_t max_positions, type_vocab, num_labels;
    int64_t image, patch, channels; /* vision */
    int64_t blocks[4];              /* resnet: blocks per stage */
    bool bottleneck;                /* resnet: Bottleneck (50+) or BasicBlock (18/34) */
    bool tied;                      /* LM head weight is the input embedding */
    bool gelu_python;               /* GPT-2's gelu_new written as Python ops */
    bool dropout;                   /* the model has dropout > 0 in training */
    bool use_cache;                 /* transformers returns a KV cache in training */
} gm_est_model;

#define GM_EST_PRECISIONS(X)                                                   \
    X(FP32, "fp32") X(FP16_AUTOCAST, "fp16-autocast")                          \
    X(BF16_AUTOCAST, "bf16-autocast") X(BF16, "bf16")
typedef enum gm_est_precision {
#define GM__EST_E(n, s) GM_EST_##n,
    GM_EST_PRECISIONS(GM__EST_E)
#undef GM__EST_E
    GM_EST_NPRECISION
} gm_est_precision;

#define GM_EST_OPTIMIZERS(X)                                                   \
    X(SGD, "sgd") X(SGD_MOMENTUM, "sgd-momentum") X(ADAM, "adam")              \
    X(ADAMW, "adamw") X(ADAMW_8BIT, "adamw-8bit") X(ADAFACTOR, "adafactor")
typedef enum gm_est_optimizer {
#define GM__EST_E(n, s) GM_EST_OPT_##n,
    GM_EST_OPTIMIZERS(GM__EST_E)
#undef GM__EST_E
    GM_EST_NOPTIMIZER
} gm_est_optimizer;

typedef enum gm_est_attention { GM_EST_ATTN_SDPA, GM_EST_ATTN_EAGER } gm_est_attention;

/* Data-parallel training, per rank (estimate_shard.c says what each
 * allocates): torch DDP, FSDP2 fully_shard per layer and on the root, and
 * DeepSpeed's ZeRO stages 1-3. */
#define GM_EST_SHARDS(X)                                                       \
    X(NONE, "none") X(DDP, "ddp") X(FSDP, "fsdp") X(ZERO1, "zero1")            \
    X(ZERO2, "zero2") X(ZERO3, "zero3")
typedef enum gm_est_shard {
#define GM__EST_E(n, s) GM_EST_SHARD_##n,
    GM_EST_SHARDS(GM__EST_E)
#undef GM__EST_E
    GM_EST_NSHARD
} gm_est_shard;

/* torch DDP's bucket_cap_mb default (25) and its first bucket
 * (dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB). */
#define GM_EST_DDP_BUCKET_MB 25
#define GM_EST_DDP_FIRST_BUCKET ((int64_t)1 << 20)
/* The most ranks modelled. */
#define GM_EST_MAX_WORLD 65536

typedef struct gm_est_run {
    int64_t batch;       /* per micro-batch */
    int64_t seq;         /* text: tokens per sample (0 = model default) */
    int64_t image;       /* vision: image side in pixels (0 = model default) */
    gm_est_precision precision;
    gm_est_optimizer optimizer;
    int64_t accum;       /* micro-batches per optimizer step */
    bool checkpointing;  /* HF gradient_checkpointing_enable() */
    gm_est_attention attention;
    bool keep_output;    /* `out = model(...)` held across backward (workloads.py) */
    int steps;           /* optimizer steps modelled (>= 2; default 3) */
    int64_t generate;    /* > 0: model.generate(max_new_tokens=generate) instead of training */
    bool built_16bit;    /* precision bf16: from_pretrained(torch_dtype=bf16/fp16) builds it in 16 bits;
                            false: built in fp32 and cast (.half(), .to(torch.bfloat16)) */
    gm_est_shard shard;  /* data parallelism (NONE: one GPU) */
    int64_t world;       /* ranks (1 without sharding) */
    int64_t bucket_mb;   /* DDP bucket_cap_mb */
    bool reshard_after_forward; /* FSDP2 fully_shard(reshard_after_forward=) on the layers */
} gm_est_run;

void gm__est_run_init(gm_est_run *r);

/* Categories: the library's (gm_category, GM_CATEGORY_LIST in
 * gpumem/gpumem.h, as the report and the history tags use them); the
 * estimator uses the first five (nothing of a modelled loop is "other"). */
enum {
    GM_EST_CAT_PARAMS = GM_CAT_PARAMETERS,
    GM_EST_CAT_GRADS = GM_CAT_GRADIENTS,
    GM_EST_CAT_OPTSTATE = GM_CAT_OPTIMIZER,
    GM_EST_CAT_ACTS = GM_CAT_ACTIVATIONS,
    GM_EST_CAT_TEMPS = GM_CAT_TEMPORARIES,
    GM_EST_NCAT = GM_CAT_OTHER
};

#define GM_EST_PHASES(X) X(SETUP, "setup") X(FORWARD, "forward") X(BACKWARD, "backward") X(OPTIMIZER, "optimizer_step")
typedef enum gm_est_phase {
#define GM__EST_E(n, s) GM_EST_PH_##n,
    GM_EST_PHASES(GM__EST_E)
#undef GM__EST_E
    GM_EST_NPHASE
} gm_est_phase;

const char *gm__est_precision_name(int p);
const char *gm__est_optimizer_name(int o);
const char *gm__est_phase_name(int p);
const char *gm__est_family_name(int f);
const char *gm__est_head_name(int h);
/* name -> enum; -1 if unknown */
int gm__est_precision_parse(const char *s);
int gm__est_optimizer_parse(const char *s);
const char *gm__est_shard_name(int s);
int gm__est_shard_parse(const char *s);

/* Built-in models (one table, estimate_models.c). */
size_t gm__est_builtin_count(void);
const gm_est_model *gm__est_builtin(size_t i);
/* GM_EINVAL with a detail listing the names if unknown. */
int gm__est_builtin_find(const char *name, gm_est_model *out);
/* A Hugging Face config.json (text). GM_EFORMAT / GM_EINVAL with a detail
 * naming the missing key or unsupported model type. */
int gm__est_model_from_hf_config(const char *json, const char *label, gm_est_model *out);
int gm__est_model_from_hf_config_file(const char *path, gm_est_model *out);

uint64_t gm__est_param_count(const gm_est_model *m);
bool gm__est_is_vision(const gm_est_model *m);
bool gm__est_is_hf(const gm_est_model *m); /* has gradient_checkpointing_enable() */

/* ---- the event sequence ------------------------------------------------ */

typedef struct gm_est_event {
    uint64_t size;  /* bytes requested (0 for a free) */
    uint32_t id;    /* tensor id: an alloc and its free share it */
    int32_t layer;  /* the repeated layer it belongs to, -1 for none */
    uint8_t free;   /* 1 = free of id */
    uint8_t cat;    /* gm_est_category */
    uint8_t phase;  /* gm_est_phase */
    uint8_t step;   /* 0 = setup, 1.. optimizer step */
} gm_est_event;

typedef struct gm_est_program {
    gm_est_event *ev;
    size_t n, cap;
    uint32_t ntensors;
    int64_t layers;      /* repeated layers it has (the model's, or fewer: see gm__est_build) */
} gm_est_program;

/* Work and memory grow with the model's structure, never with its numbers:
 * the program holds at most this many micro-batches per step (the ones
 * after the second start from the same state, so the peaks repeat), ... */
#define GM_EST_EMIT_ACCUM 4
/* ... at most this many decode steps of generate() (the live bytes grow
 * with each, so the last ones hold the peak; earlier ones are skipped
 * over by resizing the cache), ... */
#define GM_EST_EMIT_DECODE 8
/* ... and the model's repeated layers up to this many for the replay (a
 * deeper model is replayed on this many and scaled to its exact peak,
 * marked as extrapolated). The peaks of any model of more than 8 layers
 * come from two small programs (4 and 5 layers): the bytes live at each
 * point are affine in the layer count, so they extrapolate exactly
 * (estimate.c, scan_folded). */
#define GM_EST_REPLAY_LAYERS 160

/* Validate run against model (sizes, options that apply); GM_EINVAL with a
 * detail on failure. Fills defaults (seq/image 0 -> model default).
 * GM_EINVAL too when the bytes the estimate would add up could exceed
 * GM_EST_MAX_BYTES: too large to compute, never a wrong number. */
int gm__est_check(const gm_est_model *m, gm_est_run *r);
#define GM_EST_MAX_BYTES ((int64_t)1 << 62)
/* The program replayed: the model's layers, or GM_EST_REPLAY_LAYERS of them
 * when it has more (p->layers says). */
int gm__est_build(const gm_est_model *m, const gm_est_run *r, gm_est_program *p);
/* The same with exactly `layers` repeated layers (0: the model's). */
int gm__est_build_layers(const gm_est_model *m, const gm_est_run *r, int64_t layers, gm_est_program *p);
/* Repeated layers of the model (transformer layers; 0 for ResNet). */
int64_t gm__est_repeated_layers(const gm_est_model *m);
void gm__est_program_free(gm_est_program *p);

/* ---- results ----------------------------------------------------------- */

typedef struct gm_est_result {
    uint64_t params;                   /* parameter count */
    int64_t tokens;                    /* tokens (or images) per micro-batch */
    /* live bytes, each request rounded up to 512 as torch's allocator does */
    int64_t peak;                      /* overall (= the sum torch reports as peak requested-ish) */
    int peak_step, peak_phase;         /* where the overall peak happens */
    int64_t peak_by_cat[GM_EST_NCAT];  /* categories at the overall peak */
    /* [0] = first step, [1] = later steps; by phase */
    int64_t phase_peak[2][GM_EST_NPHASE];
    int64_t phase_by_cat[2][GM_EST_NPHASE][GM_EST_NCAT];
    int64_t steady_by_cat[GM_EST_NCAT]; /* persistent (params, optimizer state) */
    /* replay on the simulated device */
    bool replayed;
    int64_t peak_allocated;            /* torch policy: torch.cuda.max_memory_allocated() */
    int64_t peak_reserved_torch;       /* torch.cuda.max_memory_reserved() */
    int64_t peak_reserved_gpumem;      /* under policy:gpumem */
    int64_t cuda_context;              /* bytes outside the allocator */
    size_t events;
    bool reserved_extrapolated;        /* replayed on fewer layers (GM_EST_REPLAY_LAYERS) or at a
                                          reduced scale (above 256 GiB), then scaled to the peak */
} gm_est_result;

/* Device memory outside the caching allocator: the CUDA context, loaded
 * kernels, cuBLAS/cuDNN handles. A round figure: above what the H200
 * measured in a process training one model, below it once more kernels were
 * loaded (bench/estimate_measured.json, device_used_outside_allocator;
 * bench/RESULTS.md, "training memory estimator", has the range). */
#define GM_EST_CUDA_CONTEXT ((int64_t)800 << 20)

/* Scan only (fast): fills everything but the replay fields. */
int gm__est_scan(const gm_est_model *m, const gm_est_run *r, gm_est_result *out);
/* Scan + replay under torch defaults and policy:gpumem. */
int gm__est_estimate(const gm_est_model *m, const gm_est_run *r, gm_est_result *out);
/* Scan + replay under torch defaults only (peak_reserved_gpumem stays 0). */
int gm__est_estimate_torch(const gm_est_model *m, const gm_est_run *r, gm_est_result *out);
/* Replay the program under one allocator configuration string
 * (PYTORCH_CUDA_ALLOC_CONF syntax, "" = torch defaults). */
int gm__est_replay_conf(const gm_est_program *p, const char *conf, int64_t *peak_allocated,
                       int64_t *peak_reserved);

/* Largest batch (what=0) or sequence length (what=1) whose predicted device
 * total (peak reserved under torch + context, with GM_EST_FIT_MARGIN) fits
 * capacity; 0 if even 1 does not fit. */
/* 10%: the accuracy target of the predictions (bench/RESULTS.md, "training
 * memory estimator") */
#define GM_EST_FIT_MARGIN 0.10
int gm__est_fit(const gm_est_model *m, const gm_est_run *r, int what, uint64_t capacity, int64_t *best,
               gm_est_result *at_best);

/* ---- explained OOM (oom_explain.c) ------------------------------------------
 * The text of an out-of-memory error: what was asked, device total and free,
 * allocated, reserved but unallocated, the largest free block, the
 * categories and top scopes holding memory when known, and the two or three
 * changes that would have made it fit, each with its predicted saving
 * (fragmentation settings from reserved-but-unallocated; optimizer,
 * checkpointing, accumulation, precision from the categories). For the
 * library's OOM message (stderr, Python's exception, the OOM dump): the
 * caller fills what it knows; zero / NULL fields are left out. */
typedef struct gm_est_oom_info {
    int device;
    uint64_t requested;          /* bytes the failing allocation asked for */
    uint64_t device_total, device_free;
    uint64_t allocated, reserved; /* this process's allocator */
    uint64_t largest_free_block; /* largest free block inside reserved segments */
    uint64_t limit;              /* per-process limit (memory fraction), 0 = none */
    bool have_categories;
    int64_t by_category[GM_EST_NCAT];
    const char *const *scopes;   /* top scopes holding memory, largest first */
    const uint64_t *scope_bytes;
    int nscopes;
    bool expandable_segments;    /* already set: not suggested again */
    bool gpumem_policy;          /* already gpumem's policy */
    bool tail_only;              /* only what holds the memory and the changes (the library's
                                    OOM text has already said what was asked and what is held) */
} gm_est_oom_info;

/* Writes the text (always NUL-terminated); returns the length it needed. */
size_t gm__est_oom_explain(const gm_est_oom_info *in, char *buf, size_t len);

#endif
