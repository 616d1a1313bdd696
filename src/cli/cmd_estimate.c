/* cmd_estimate.c — 'gpumem estimate': predicted training memory for a model
 * and run configuration (src/estimate/), by phase and category, peak
 * reserved under the torch and gpumem policies, each memory-saving strategy's
 * predicted saving, the best combination that fits a capacity, and the
 * largest batch / sequence that fits (--fit). */
#include "cli.h"

#include "estimate/estimate.h"
#include "gpumem/gpumem.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

/* ---- strategies -------------------------------------------------------------- */

typedef struct strat {
    char name[96];
    char change[160]; /* what to do, in the user's terms */
    gm_est_run run;
    const char *conf; /* allocator setting (NULL: a run change) */
    gm_est_result res;
    int64_t peak, base;  /* the metric compared */
    bool reserved_metric;
    bool ok;
} strat;

static const char *const alloc_settings[] = {
    "expandable_segments:True",
    "policy:gpumem",
    "garbage_collection_threshold:0.6,max_split_size_mb:128",
};
#define NALLOC (sizeof alloc_settings / sizeof alloc_settings[0])

/* --torch-dtype's 16-bit name (bf16 or fp16: the same bytes) for the output */
static const char *dtype16 = "bf16";
static const char *torch_dtype_name(const gm_est_run *r) {
    return r->built_16bit ? dtype16 : "fp32";
}

static int64_t device_total(const gm_est_result *r) { return r->peak_reserved_torch + r->cuda_context; }
/* The one fit rule (docs/estimate.md): the whole device plus a margin of
 * GM_EST_FIT_MARGIN of peak reserved (the predictions' accuracy target)
 * must not exceed the capacity. */
static int64_t fit_margin(int64_t peak_reserved) { return (int64_t)((double)peak_reserved * GM_EST_FIT_MARGIN); }
static int64_t fit_needed(int64_t peak_reserved, int64_t context) {
    return peak_reserved + fit_margin(peak_reserved) + context;
}
static bool fits(const gm_est_result *r, uint64_t capacity) {
    return fit_needed(r->peak_reserved_torch, r->cuda_context) <= (int64_t)capacity;
}

typedef struct ctx {
    const char *cmd;
    gm_est_model m;
    gm_est_run run;
    gm_est_result base;
    uint64_t capacity;
    strat s[32];
    int ns;
    strat best;
    bool have_best, best_tried;
    int64_t fit_value;
    int fit_what; /* -1 none */
    gm_est_result fit_res;
} ctx;

static void add_run_strategy(ctx *c, const char *name, const char *change, const gm_est_run *r) {
    if (c->ns >= 32) return;
    strat *s = &c->s[c->ns];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->change, sizeof s->change, "%s", change);
    s->run = *r;
    s->run.steps = 2; /* the peak is in step 1 or 2: later steps repeat step 2 */
    if (gm__est_estimate_torch(&c->m, r, &s->res) != GM_OK) return;
    s->peak = s->res.peak_allocated;
    s->base = c->base.peak_allocated;
    s->ok = true;
    c->ns++;
}

static void strategies(ctx *c) {
    gm_est_run r;
    char name[96], change[160];
    bool gen = c->run.generate > 0;
    for (int p = 0; p < GM_EST_NPRECISION; p++) {
        if (p == (int)c->run.precision) continue;
        if (gen && p != GM_EST_FP32 && p != GM_EST_BF16) continue; /* inference: a 16-bit or fp32 model */
        r = c->run;
        r.precision = p;
        r.built_16bit = c->run.built_16bit && p == GM_EST_BF16;
        snprintf(name, sizeof name, "precision %s", gm__est_precision_name(p));
        if (c->run.built_16bit && p == GM_EST_FP32) snprintf(change, sizeof change, "--torch-dtype fp32");
        else snprintf(change, sizeof change, "--precision %s", gm__est_precision_name(p));
        add_run_strategy(c, name, change, &r);
    }
    if (c->run.precision == GM_EST_BF16 && !c->run.built_16bit && !c->run.shard) {
        r = c->run;
        r.built_16bit = true; /* no fp32 copy while casting */
        add_run_strategy(c, "load in 16 bits", "--torch-dtype bf16: from_pretrained(torch_dtype=torch.bfloat16)", &r);
    }
    for (int k = 2; k <= 8 && !gen; k *= 2) {
        if (c->run.batch % k) continue;
        r = c->run;
        r.batch /= k;
        r.accum *= k;
        snprintf(name, sizeof name, "accumulation: batch %lld x %lld", (long long)r.batch, (long long)r.accum);
        snprintf(change, sizeof change, "--batch %lld --accum %lld (same effective batch)", (long long)r.batch,
                 (long long)r.accum);
        add_run_strategy(c, name, change, &r);
    }
    if (!gen && !c->run.checkpointing && gm__est_is_hf(&c->m)) {
        r = c->run;
        r.checkpointing = true;
        add_run_strategy(c, "activation checkpointing", "model.gradient_checkpointing_enable()", &r);
    }
    if (c->run.attention == GM_EST_ATTN_EAGER) {
        r = c->run;
        r.attention = GM_EST_ATTN_SDPA;
        add_run_strategy(c, "sdpa attention", "attn_implementation=\"sdpa\"", &r);
    }
    /* data parallelism over the same ranks: what each strategy holds per rank */
    for (int sh = GM_EST_SHARD_DDP; sh < GM_EST_NSHARD && c->run.world > 1; sh++) {
        if (sh == (int)c->run.shard) continue;
        r = c->run;
        r.shard = sh;
        bool zero = sh >= GM_EST_SHARD_ZERO1;
        if (zero && (r.precision == GM_EST_BF16_AUTOCAST || r.precision == GM_EST_FP16_AUTOCAST))
            r.precision = GM_EST_BF16; /* DeepSpeed casts the model */
        snprintf(name, sizeof name, "shard %s (per rank)", gm__est_shard_name(sh));
        snprintf(change, sizeof change, "--shard %s%s", gm__est_shard_name(sh),
                 r.precision != c->run.precision ? " --precision bf16" : "");
        add_run_strategy(c, name, change, &r);
    }
    for (int o = 0; o < GM_EST_NOPTIMIZER && !gen; o++) {
        if (o == (int)c->run.optimizer) continue;
        r = c->run;
        r.optimizer = o;
        snprintf(name, sizeof name, "optimizer %s%s", gm__est_optimizer_name(o),
                 o == GM_EST_OPT_ADAMW_8BIT ? " (unmeasured)" : "");
        snprintf(change, sizeof change, "--optimizer %s", gm__est_optimizer_name(o));
        add_run_strategy(c, name, change, &r);
    }
    /* allocator settings: the same allocation sequence replayed */
    gm_est_program p;
    if (gm__est_build(&c->m, &c->run, &p) != GM_OK) return;
    for (size_t i = 0; i < NALLOC && c->ns < 32; i++) {
        strat *s = &c->s[c->ns];
        memset(s, 0, sizeof *s);
        s->conf = alloc_settings[i];
        bool gp = !strncmp(s->conf, "policy:gpumem", 13);
        snprintf(s->name, sizeof s->name, "allocator %s", s->conf);
        if (strlen(s->name) > 44) snprintf(s->name + 40, 5, "...");
        snprintf(s->change, sizeof s->change, "%s=%s", gp ? "GPUMEM_CONF" : "PYTORCH_CUDA_ALLOC_CONF", s->conf);
        s->run = c->run;
        s->res = c->base;
        if (gm__est_replay_conf(&p, s->conf, &s->res.peak_allocated, &s->res.peak_reserved_torch) != GM_OK)
            continue;
        s->reserved_metric = true;
        s->peak = s->res.peak_reserved_torch;
        s->base = c->base.peak_reserved_torch;
        s->ok = true;
        c->ns++;
    }
    gm__est_program_free(&p);
}

/* The best combination that fits: the fewest changes, then the least
 * drastic (the highest peak that still fits). Candidates are ranked by a scan (no replay); the first few are
 * replayed to confirm. */
typedef struct cand {
    gm_est_run run;
    int changes;
    int64_t peak;
} cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->changes != y->changes) return x->changes - y->changes;
    return x->peak > y->peak ? -1 : x->peak < y->peak; /* the least drastic that fits */
}

static void best_combination(ctx *c) {
    if (!c->capacity || c->run.generate) return;
    c->best_tried = true;
    cand *cs = calloc(512, sizeof *cs);
    if (!cs) return;
    int n = 0;
    bool hf = gm__est_is_hf(&c->m);
    for (int p = 0; p < GM_EST_NPRECISION; p++)
        for (int k = 1; k <= 8; k *= 2) {
            if (c->run.batch % k) continue;
            for (int ck = 0; ck < (hf ? 2 : 1); ck++)
                for (int o = 0; o < GM_EST_NOPTIMIZER; o++) {
                    if (n >= 512) break;
                    gm_est_run r = c->run;
                    r.precision = p;
                    r.built_16bit = c->run.built_16bit && p == GM_EST_BF16;
                    r.batch /= k;
                    r.accum *= k;
                    r.checkpointing = c->run.checkpointing || ck;
                    r.optimizer = o;
                    r.steps = 2;
                    int ch = (p != (int)c->run.precision) + (k > 1) + (ck && !c->run.checkpointing) +
                             (o != (int)c->run.optimizer);
                    gm_est_result res;
                    if (gm__est_scan(&c->m, &r, &res) != GM_OK) continue;
                    if (fit_needed(res.peak, res.cuda_context) > (int64_t)c->capacity) continue;
                    r.steps = c->run.steps;
                    cs[n++] = (cand){r, ch, res.peak};
                }
        }
    qsort(cs, (size_t)n, sizeof *cs, cmp_cand);
    for (int i = 0; i < n && i < 8; i++) {
        strat *s = &c->best;
        memset(s, 0, sizeof *s);
        s->run = cs[i].run;
        if (gm__est_estimate_torch(&c->m, &s->run, &s->res) != GM_OK) continue;
        if (!fits(&s->res, c->capacity)) continue;
        s->peak = s->res.peak_allocated;
        s->base = c->base.peak_allocated;
        s->ok = true;
        char *w = s->change;
        size_t left = sizeof s->change;
        int k;
#define APPEND(...)                                                            \
    do {                                                                       \
        k = snprintf(w, left, __VA_ARGS__);                                    \
        if (k > 0 && (size_t)k < left) w += k, left -= (size_t)k;             \
    } while (0)
        if (s->run.precision != c->run.precision) APPEND("--precision %s ", gm__est_precision_name(s->run.precision));
        if (s->run.accum != c->run.accum)
            APPEND("--batch %lld --accum %lld ", (long long)s->run.batch, (long long)s->run.accum);
        if (s->run.checkpointing != c->run.checkpointing) APPEND("--checkpointing ");
        if (s->run.optimizer != c->run.optimizer) APPEND("--optimizer %s ", gm__est_optimizer_name(s->run.optimizer));
#undef APPEND
        if (w > s->change) w[-1] = 0;
        else snprintf(s->change, sizeof s->change, "(no change needed)");
        c->have_best = true;
        break;
    }
    free(cs);
}

static const char *const fit_names[] = {"batch", "seq", "world"};

/* ---- output ---------------------------------------------------------------- */

static void json_cats(const int64_t *v) {
    printf("{");
    for (int k = 0; k < GM_EST_NCAT; k++) printf("%s\"%s\":%lld", k ? "," : "", gm_category_name(k), (long long)v[k]);
    printf("}");
}

static void json_run(const gm_est_model *m, const gm_est_run *r) {
    printf("{\"batch\":%lld,\"shard\":\"%s\",\"world_size\":%lld,", (long long)r->batch,
           gm__est_shard_name(r->shard), (long long)r->world);
    if (r->shard == GM_EST_SHARD_DDP) printf("\"bucket_cap_mb\":%lld,", (long long)r->bucket_mb);
    if (r->shard == GM_EST_SHARD_FSDP)
        printf("\"reshard_after_forward\":%s,", r->reshard_after_forward ? "true" : "false");
    if (gm__est_is_vision(m)) printf("\"image\":%lld,", (long long)r->image);
    else printf("\"seq\":%lld,", (long long)r->seq);
    printf("\"precision\":\"%s\",\"optimizer\":\"%s\",\"accum\":%lld,\"checkpointing\":%s,"
           "\"attention\":\"%s\",\"keep_output\":%s,\"steps\":%d,\"generate\":%lld,\"torch_dtype\":\"%s\"}",
           gm__est_precision_name(r->precision), gm__est_optimizer_name(r->optimizer), (long long)r->accum,
           r->checkpointing ? "true" : "false", r->attention == GM_EST_ATTN_EAGER ? "eager" : "sdpa",
           r->keep_output ? "true" : "false", r->steps, (long long)r->generate, torch_dtype_name(r));
}

static void json_strat(const gm_est_model *m, const strat *s) {
    printf("{\"name\":");
    cli_json_string(stdout, s->name);
    printf(",\"change\":");
    cli_json_string(stdout, s->change);
    printf(",\"metric\":\"%s\",\"peak_allocated\":%lld,\"peak_reserved\":%lld,\"device_total\":%lld,"
           "\"saving_bytes\":%lld,\"saving_pct\":%.2f",
           s->reserved_metric ? "peak_reserved" : "peak_allocated", (long long)s->res.peak_allocated,
           (long long)s->res.peak_reserved_torch, (long long)device_total(&s->res), (long long)(s->base - s->peak),
           s->base ? 100.0 * (double)(s->base - s->peak) / (double)s->base : 0.0);
    if (!s->reserved_metric) {
        printf(",\"run\":");
        json_run(m, &s->run);
    }
    printf("}");
}

static void print_json(ctx *c) {
    const gm_est_result *b = &c->base;
    printf("{\"model\":{\"name\":");
    cli_json_string(stdout, c->m.name);
    printf(",\"family\":\"%s\",\"head\":\"%s\",\"parameters\":%llu},\"run\":", gm__est_family_name(c->m.family),
           gm__est_head_name(c->m.head), (unsigned long long)b->params);
    json_run(&c->m, &c->run);
    printf(",\"peak_allocated\":%lld,\"peak_requested\":%lld,\"peak_reserved\":{\"torch\":%lld,\"gpumem\":%lld},"
           "\"cuda_context\":%lld,\"device_total\":{\"torch\":%lld,\"gpumem\":%lld},",
           (long long)b->peak_allocated, (long long)b->peak, (long long)b->peak_reserved_torch,
           (long long)b->peak_reserved_gpumem, (long long)b->cuda_context, (long long)device_total(b),
           (long long)(b->peak_reserved_gpumem + b->cuda_context));
    printf("\"per_rank\":%s,\"reserved_extrapolated\":%s,", c->run.shard ? "true" : "false",
           b->reserved_extrapolated ? "true" : "false");
    printf("\"peak_at\":{\"step\":\"%s\",\"phase\":\"%s\"},\"by_category\":", b->peak_step > 1 ? "later" : "first",
           gm__est_phase_name(b->peak_phase));
    json_cats(b->peak_by_cat);
    printf(",\"phases\":{");
    for (int l = 0; l < 2; l++) {
        printf("%s\"%s\":{", l ? "," : "", l ? "later_steps" : "first_step");
        bool first = true;
        for (int ph = GM_EST_PH_FORWARD; ph < GM_EST_NPHASE; ph++) {
            printf("%s\"%s\":{\"peak\":%lld,\"by_category\":", first ? "" : ",", gm__est_phase_name(ph),
                   (long long)b->phase_peak[l][ph]);
            json_cats(b->phase_by_cat[l][ph]);
            printf("}");
            first = false;
        }
        printf("}");
    }
    printf("},\"capacity\":%llu,\"fits\":%s,\"fit_margin\":%.2f,\"fit_needed\":%lld,\"strategies\":[",
           (unsigned long long)c->capacity, !c->capacity ? "null" : fits(b, c->capacity) ? "true" : "false",
           GM_EST_FIT_MARGIN, (long long)fit_needed(b->peak_reserved_torch, b->cuda_context));
    for (int i = 0; i < c->ns; i++) {
        if (i) putchar(',');
        json_strat(&c->m, &c->s[i]);
    }
    printf("],\"best_combination\":");
    if (c->have_best) json_strat(&c->m, &c->best);
    else printf("null");
    if (c->fit_what >= 0) {
        printf(",\"fit\":{\"what\":\"%s\",\"value\":%lld,\"device_total\":%lld,\"peak_allocated\":%lld}",
               fit_names[c->fit_what], (long long)c->fit_value,
               c->fit_value ? (long long)device_total(&c->fit_res) : 0LL,
               c->fit_value ? (long long)c->fit_res.peak_allocated : 0LL);
    }
    printf(",\"events\":%zu}\n", b->events);
}

static void print_text(ctx *c) {
    const gm_est_result *b = &c->base;
    char x1[32], x2[32], x3[32];
    printf("model      %s (%s, %s), %.1f M parameters\n", c->m.name, gm__est_family_name(c->m.family),
           gm__est_head_name(c->m.head), (double)b->params / 1e6);
    if (c->run.shard)
        printf("ranks      %lld, %s%s; every figure below is per rank (rank 0)\n", (long long)c->run.world,
               gm__est_shard_name(c->run.shard),
               c->run.shard == GM_EST_SHARD_FSDP && !c->run.reshard_after_forward ? " (reshard_after_forward=False)" : "");
    printf("run        batch %lld", (long long)c->run.batch);
    if (gm__est_is_vision(&c->m)) printf(", image %lld", (long long)c->run.image);
    else printf(", seq %lld", (long long)c->run.seq);
    if (c->run.generate)
        printf(", %s, generate(max_new_tokens=%lld) under no_grad\n", gm__est_precision_name(c->run.precision),
               (long long)c->run.generate);
    else
    printf(", %s, %s, accum %lld%s%s%s\n", gm__est_precision_name(c->run.precision),
           gm__est_optimizer_name(c->run.optimizer), (long long)c->run.accum,
           c->run.checkpointing ? ", checkpointing" : "", c->run.attention == GM_EST_ATTN_EAGER ? ", eager attention" : "",
           c->run.keep_output ? ", output kept" : "");
    if (c->run.precision == GM_EST_BF16 && !c->run.shard)
        printf("loading    %s\n", c->run.built_16bit
                   ? (strcmp(dtype16, "fp16") ? "from_pretrained(torch_dtype=torch.bfloat16): built in 16 bits "
                                                "(--torch-dtype fp32: built in fp32, then cast)"
                                              : "from_pretrained(torch_dtype=torch.float16): built in 16 bits "
                                                "(--torch-dtype fp32: built in fp32, then cast)")
                   : "built in fp32, then cast (.to(torch.bfloat16) / .half()): the fp32 model and the first "
                     "16-bit copy coexist (--torch-dtype bf16: from_pretrained(torch_dtype=torch.bfloat16))");
    else if (c->run.precision == GM_EST_FP32 && c->run.generate)
        printf("loading    from_pretrained(torch_dtype=torch.float32) (--torch-dtype bf16: built in 16 bits)\n");
    printf("\n");
    printf("peak allocated   %-11s (torch.cuda.max_memory_allocated(); %s step, %s)\n",
           cli_format_bytes((uint64_t)b->peak_allocated, x1, sizeof x1), b->peak_step > 1 ? "a later" : "the first",
           gm__est_phase_name(b->peak_phase));
    printf("peak reserved    %-11s under PyTorch's allocator, %s under gpumem's%s\n",
           cli_format_bytes((uint64_t)b->peak_reserved_torch, x1, sizeof x1),
           cli_format_bytes((uint64_t)b->peak_reserved_gpumem, x2, sizeof x2),
           b->reserved_extrapolated ? "\n                 (replayed on a reduced program and scaled to the exact peak)" : "");
    printf("whole device     %-11s (reserved + %s CUDA context)\n",
           cli_format_bytes((uint64_t)device_total(b), x1, sizeof x1),
           cli_format_bytes((uint64_t)b->cuda_context, x3, sizeof x3));
    printf("\nat the peak      ");
    for (int k = 0; k < GM_EST_NCAT; k++)
        printf("%s%s %s", k ? ", " : "", gm_category_name(k),
               cli_format_bytes((uint64_t)b->peak_by_cat[k], x1, sizeof x1));
    printf("\n\n%-16s %12s %12s %16s\n", "peak by phase", "forward", "backward", "optimizer step");
    for (int l = 0; l < 2; l++) {
        printf("%-16s", l ? "later steps" : "first step");
        for (int ph = GM_EST_PH_FORWARD; ph < GM_EST_NPHASE; ph++)
            printf(" %*s", ph == GM_EST_PH_OPTIMIZER ? 16 : 12,
                   cli_format_bytes((uint64_t)b->phase_peak[l][ph], x1, sizeof x1));
        printf("\n");
    }
    if (c->capacity) {
        char x4[32];
        bool fit = fits(b, c->capacity);
        printf("\ncapacity %s: %s: whole device %s + %.0f%% margin %s = %s %s %s\n",
               cli_format_bytes(c->capacity, x1, sizeof x1), fit ? "fits" : "does NOT fit",
               cli_format_bytes((uint64_t)device_total(b), x2, sizeof x2), 100.0 * GM_EST_FIT_MARGIN,
               cli_format_bytes((uint64_t)fit_margin(b->peak_reserved_torch), x3, sizeof x3),
               cli_format_bytes((uint64_t)fit_needed(b->peak_reserved_torch, b->cuda_context), x4, sizeof x4),
               fit ? "<=" : ">", x1);
        printf("  (the margin: %.0f%% of peak reserved, the estimate's accuracy target; --fit and the best\n"
               "   combination use the same rule)\n", 100.0 * GM_EST_FIT_MARGIN);
    }
    printf("\n%-44s %11s %20s   %s\n", "strategy (alone)", "peak", "saving", "change");
    char same[512] = "";
    size_t nsame = 0;
    for (int i = 0; i < c->ns; i++) {
        const strat *s = &c->s[i];
        char sv[48];
        int64_t d = s->base - s->peak;
        /* a change that moves the peak by less than 0.05% (prints as 0.0%) is not a strategy: listed below */
        if (s->base && llabs(d) * 2000 < s->base) {
            nsame += (size_t)snprintf(same + nsame, nsame < sizeof same ? sizeof same - nsame : 0, "%s%s",
                                      nsame ? ", " : "", s->name);
            if (nsame >= sizeof same) nsame = sizeof same;
            continue;
        }
        snprintf(sv, sizeof sv, "%s%s (%.1f%%)", d < 0 ? "-" : "", cli_format_bytes((uint64_t)(d < 0 ? -d : d), x2, sizeof x2),
                 s->base ? 100.0 * (double)d / (double)s->base : 0.0);
        printf("%-44s %11s %20s   %s%s\n", s->name, cli_format_bytes((uint64_t)s->peak, x1, sizeof x1), sv, s->change,
               s->reserved_metric ? "  [peak reserved]" : "");
    }
    if (*same) printf("(the same peak within 0.05%%, not listed: %s)\n", same);
    if (c->have_best) {
        printf("\nbest combination that fits %s: %s\n  peak allocated %s, whole device %s\n",
               cli_format_bytes(c->capacity, x1, sizeof x1), c->best.change,
               cli_format_bytes((uint64_t)c->best.res.peak_allocated, x2, sizeof x2),
               cli_format_bytes((uint64_t)device_total(&c->best.res), x3, sizeof x3));
    } else if (c->best_tried) {
        printf("\nno combination of these strategies fits %s\n", cli_format_bytes(c->capacity, x1, sizeof x1));
    }
    if (c->fit_what >= 0) {
        static const char *const what[] = {"largest batch", "largest sequence length", "fewest ranks"};
        if (c->fit_value)
            printf("\n%s that fits %s: %lld (whole device %s)\n", what[c->fit_what],
                   cli_format_bytes(c->capacity, x1, sizeof x1), (long long)c->fit_value,
                   cli_format_bytes((uint64_t)device_total(&c->fit_res), x2, sizeof x2));
        else if (c->fit_what == 2)
            printf("\nno world size up to %d fits %s with --shard %s\n", GM_EST_MAX_WORLD,
                   cli_format_bytes(c->capacity, x1, sizeof x1), gm__est_shard_name(c->run.shard));
        else
            printf("\neven %s 1 does not fit %s\n", c->fit_what ? "sequence length" : "batch",
                   cli_format_bytes(c->capacity, x1, sizeof x1));
    }
    printf("\n(peaks: allocated = live tensors rounded as torch rounds them; reserved = the allocation\n"
           " sequence replayed on a simulated device; saving relative to peak allocated, or to peak\n"
           " reserved for allocator settings. Accuracy: bench/RESULTS.md, docs/estimate.md)\n");
}

/* --fit world: the fewest ranks (powers of two) whose per-rank peak fits */
static int fit_world(ctx *c) {
    gm_est_run r = c->run;
    r.steps = 2;
    c->fit_value = 0;
    for (int64_t w = 1; w <= GM_EST_MAX_WORLD; w *= 2) {
        r.world = w;
        gm_est_result res;
        int st = gm__est_estimate_torch(&c->m, &r, &res);
        if (st == GM_EINVAL) return st;
        if (st) continue;
        if (fits(&res, c->capacity)) {
            c->fit_value = w;
            c->fit_res = res;
            return GM_OK;
        }
    }
    return GM_OK;
}

static const char ABOUT[] =
    "Predicts the GPU memory of a training loop (forward under autocast where named, loss,\n"
    "backward with GradScaler for fp16, optimizer.step(), zero_grad(set_to_none=True)):\n"
    "peak allocated (torch.cuda.max_memory_allocated()) by phase and category, peak reserved\n"
    "under PyTorch's allocator and gpumem's, the whole device with the CUDA context, what each\n"
    "memory-saving strategy would save, and with --capacity the best combination that fits.\n"
    "With --world-size N --shard ddp|fsdp|zero1|zero2|zero3, everything is per rank.\n"
    "Give exactly one of --model, --config or --trace (a step of your own code traced on meta or\n"
    "fake tensors by gpumem.estimate.trace_step). Model and accuracy: docs/estimate.md.";

int cmd_estimate(int argc, char **argv) {
    const char *cmd = argv[0], *model = NULL, *config = NULL, *fit = NULL, *trace = NULL;
    const char *precision = NULL, *optimizer = "adamw", *attention = "sdpa", *shard = "none", *torch_dtype = NULL;
    long long batch = 8, seq = 0, image = 0, accum = 1, steps = 3, generate = 0, world = 1,
              bucket = GM_EST_DDP_BUCKET_MB;
    bool json = false, ckpt = false, keep = false, no_reshard = false;
    uint64_t capacity = 0;
    const struct cli_opt opts[] = {
        {"model", 0, CLI_STR, &model, "NAME",
         "built-in: gpt2, gpt2-medium, bert-base-uncased, resnet18, resnet50, vit_b_16", NULL, 0, 0},
        {"config", 0, CLI_STR, &config, "FILE",
         "a Hugging Face config.json (gpt2, llama, mistral, bert, vit; head from \"architectures\")", NULL, 0, 0},
        {"trace", 0, CLI_STR, &trace, "FILE",
         "a step of your own code traced by gpumem.estimate.trace_step (or any recorded trace): replayed "
         "under each allocator model; only --capacity and --json apply", NULL, 0, 0},
        {"batch", 0, CLI_INT, &batch, "N", "samples per micro-batch", "8", 1, 1 << 20},
        {"seq", 0, CLI_INT, &seq, "N", "tokens per sample (text models)", "min(1024, max positions)", 1, 1 << 22},
        {"image", 0, CLI_INT, &image, "N", "image side in pixels (vision models)", "the model's", 1, 8192},
        {"precision", 0, CLI_STR, &precision, "P",
         "fp32, fp16-autocast, bf16-autocast, or bf16 (the model cast, no autocast)",
         "bf16-autocast; bf16 with --generate or --shard zero*", 0, 0},
        {"optimizer", 0, CLI_STR, &optimizer, "O",
         "sgd, sgd-momentum, adam, adamw, adamw-8bit (bitsandbytes; unmeasured), adafactor", "adamw", 0, 0},
        {"torch-dtype", 0, CLI_CHOICE, &torch_dtype, "bf16|fp16|fp32",
         "the dtype the model is loaded in, as from_pretrained(torch_dtype=...): bf16/fp16 build it in 16 bits "
         "(--precision bf16); fp32 with --precision bf16 builds it in fp32 and casts it (.half(): the fp32 model "
         "and the first 16-bit copy coexist)", "bf16 with --generate, else fp32", 0, 0},
        {"accum", 0, CLI_INT, &accum, "N", "micro-batches per optimizer step", "1", 1, 1 << 20},
        {"checkpointing", 0, CLI_FLAG, &ckpt, NULL, "Hugging Face gradient_checkpointing_enable()", NULL, 0, 0},
        {"attention", 0, CLI_CHOICE, &attention, "sdpa|eager", "attention implementation, as transformers'",
         "sdpa", 0, 0},
        {"keep-output", 0, CLI_FLAG, &keep, NULL,
         "the model output is held through backward (out = model(...); out.loss.backward())", NULL, 0, 0},
        {"steps", 0, CLI_INT, &steps, "N", "optimizer steps modelled", "3", 2, 16},
        {"generate", 0, CLI_INT, &generate, "N",
         "inference instead: model.generate(max_new_tokens=N) after a --seq prompt (causal LMs)", NULL, 1, 1 << 20},
        {"capacity", 0, CLI_SIZE, &capacity, "SIZE",
         "device memory (80GiB): says whether it fits, picks the best combination that fits", NULL,
         CLI_CAPACITY_MIN, CLI_CAPACITY_MAX},
        {"fit", 0, CLI_CHOICE, &fit, "batch|seq|world",
         "the largest batch (or sequence length), or the fewest ranks, that fits --capacity", NULL, 0, 0},
        {"world-size", 0, CLI_INT, &world, "N", "data-parallel ranks (with --shard)", "1", 1, GM_EST_MAX_WORLD},
        {"shard", 0, CLI_CHOICE, &shard, "none|ddp|fsdp|zero1|zero2|zero3",
         "torch DDP, FSDP2 fully_shard per layer, DeepSpeed ZeRO stage 1-3; figures per rank", "none", 0, 0},
        {"bucket-cap-mb", 0, CLI_INT, &bucket, "N", "DDP's bucket_cap_mb", "25", 1, 1 << 20},
        {"no-reshard-after-forward", 0, CLI_FLAG, &no_reshard, NULL,
         "FSDP: fully_shard(reshard_after_forward=False) on the layers", NULL, 0, 0},
        CLI_OPT_JSON(&json),
    };
    const struct cli_spec spec = {cmd, "", ABOUT, opts, CLI_NOPTS(opts), 0, 0,
                                  "JSON: integer bytes; top-level peak_allocated is the predicted\n"
                                  "torch.cuda.max_memory_allocated().\n"
                                  "Exit status: 0 estimated, 1 internal failure, 2 bad usage or input.",
                                  false};
    int rc = cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return cli_parse_exit(rc);
    /* dozens of estimates each build and free arrays of a few MiB: keep the
     * freed memory in the heap instead of mapping it anew each time */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    if (trace) {
        if (model || config)
            return cli_usage_error(cmd, "--trace estimates a traced step by itself: give it without --model or "
                                   "--config");
        return cli_estimate_trace(cmd, trace, capacity, json);
    }
    if (!model == !config)
        return cli_usage_error(cmd, "give exactly one of --model NAME, --config config.json or --trace FILE "
                               "(see 'gpumem %s --help')", cmd);
    bool zero = !strncmp(shard, "zero", 4);
    bool given16 = torch_dtype && strcmp(torch_dtype, "fp32");
    if (!torch_dtype) torch_dtype = generate ? "bf16" : "fp32"; /* Hugging Face users load for inference in 16 bits */
    if (strcmp(torch_dtype, "fp32")) dtype16 = torch_dtype;
    if (!precision)
        precision = generate ? (strcmp(torch_dtype, "fp32") ? "bf16" : "fp32")
                    : zero || given16 ? "bf16" : "bf16-autocast";
    if (gm__est_precision_parse(precision) < 0)
        return cli_usage_error(cmd, "unknown --precision '%s': fp32, fp16-autocast, bf16-autocast or bf16 "
                               "(see 'gpumem %s --help')", precision, cmd);
    if (gm__est_optimizer_parse(optimizer) < 0)
        return cli_usage_error(cmd, "unknown --optimizer '%s': sgd, sgd-momentum, adam, adamw, adamw-8bit or "
                               "adafactor (see 'gpumem %s --help')", optimizer, cmd);
    if (fit && !capacity)
        return cli_usage_error(cmd, "--fit needs --capacity SIZE, the device memory to fit in");
    ctx *c = calloc(1, sizeof *c);
    if (!c) return cli_error(cmd, "out of memory");
    c->cmd = cmd;
    c->fit_what = -1;
    c->capacity = capacity;
    gm__est_run_init(&c->run);
    c->run.batch = batch;
    c->run.seq = seq;
    c->run.image = image;
    c->run.accum = accum;
    c->run.steps = (int)steps;
    c->run.generate = generate;
    c->run.checkpointing = ckpt;
    c->run.keep_output = keep;
    c->run.built_16bit = strcmp(torch_dtype, "fp32") != 0;
    c->run.precision = gm__est_precision_parse(precision);
    c->run.optimizer = gm__est_optimizer_parse(optimizer);
    c->run.attention = strcmp(attention, "eager") ? GM_EST_ATTN_SDPA : GM_EST_ATTN_EAGER;
    c->run.shard = gm__est_shard_parse(shard);
    c->run.world = world;
    c->run.bucket_mb = bucket;
    c->run.reshard_after_forward = !no_reshard;
    if (fit && !strcmp(fit, "world") && !c->run.shard) {
        free(c);
        return cli_usage_error(cmd, "--fit world needs --shard ddp|fsdp|zero1|zero2|zero3 (how the ranks share "
                               "the model)");
    }
    int st = model ? gm__est_builtin_find(model, &c->m) : gm__est_model_from_hf_config_file(config, &c->m);
    if (st == GM_OK) st = gm__est_check(&c->m, &c->run);
    if (st != GM_OK) {
        rc = st == GM_ENOHOSTMEM ? cli_error(cmd, "%s", gm_last_error_detail())
                                 : cli_usage_error(cmd, "%s", gm_last_error_detail());
        free(c);
        return rc;
    }
    if (gm__est_estimate(&c->m, &c->run, &c->base) != GM_OK) {
        rc = cli_error(cmd, "%s", gm_last_error_detail());
        free(c);
        return rc;
    }
    strategies(c);
    best_combination(c);
    if (fit) {
        c->fit_what = !strcmp(fit, "world") ? 2 : !strcmp(fit, "seq");
        if (c->fit_what == 2 ? fit_world(c) != GM_OK
                             : gm__est_fit(&c->m, &c->run, c->fit_what, c->capacity, &c->fit_value, &c->fit_res) != GM_OK) {
            rc = cli_usage_error(cmd, "%s", gm_last_error_detail());
            free(c);
            return rc;
        }
    }
    if (json) print_json(c);
    else print_text(c);
    free(c);
    return 0;
}
