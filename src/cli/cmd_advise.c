/* cmd_advise.c — 'gpumem advise TRACE': the advice of 'gpumem estimate' from
 * a recorded snapshot. Allocator settings ranked by replay (the grid and the
 * replays are tune's: gm_tune_run), with their speed cost in device calls
 * weighed: "best for memory" is the lowest peak reserved; "recommended" is
 * the lowest among settings whose device calls stay within
 * ADVISE_CALLS_FACTOR x the PyTorch default's (a setting far above it moves
 * memory in every step: gpumem_slack:0 made 118x the default's calls on the
 * GPT-2 trace and cost +74% step time on the H200, bench/RESULTS.md). What
 * the trace's peak holds by category (the report's attribution,
 * gm_attribute: Python frames when recorded, lifetimes otherwise) and what
 * the training strategies could free. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "report/report.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* a setting whose device calls exceed this multiple of the default's is
 * not recommended (its cost is per step, not per run), nor one whose
 * steady-state calls (replay's second half, after warm-up) exceed
 * ADVISE_STEADY_FACTOR x the default's, or ADVISE_STEADY_MIN */
#define ADVISE_CALLS_FACTOR 10.0
#define ADVISE_STEADY_FACTOR 4
#define ADVISE_STEADY_MIN 16

static void line_for(const gm_tune_entry *j, char *buf, size_t len) {
    if (j->cfg.policy != GM_POLICY_TORCH) snprintf(buf, len, "GPUMEM_CONF=%.160s", j->conf);
    else if (!j->conf[0]) snprintf(buf, len, "(PyTorch default: PYTORCH_CUDA_ALLOC_CONF unset)");
    else snprintf(buf, len, "PYTORCH_CUDA_ALLOC_CONF=%.160s", j->conf);
}

typedef struct advice {
    gm_tune_entry *rows;
    int n;
    int def, best, rec; /* indexes, -1 if none */
    int64_t def_calls, def_steady;
    bool cats_ok, have_frames;
    int64_t peak;                   /* live requested bytes at the trace's peak */
    int64_t at_peak[GM_CAT_COUNT];  /* by category */
} advice;

static double calls_ratio(const advice *a, const gm_tune_entry *j) {
    return (double)gm_tune_device_calls(&j->r) / (double)(a->def_calls > 0 ? a->def_calls : 1);
}

/* Strategies the categories allow, as upper bounds on bytes freed at the peak. */
typedef struct tstrat {
    const char *name, *how;
    int64_t saving;
} tstrat;

static int trace_strategies(const advice *c, tstrat *out) {
    int n = 0;
    int64_t S = c->at_peak[GM_CAT_OPTIMIZER], A = c->at_peak[GM_CAT_ACTIVATIONS];
    int64_t P = c->at_peak[GM_CAT_PARAMETERS], G = c->at_peak[GM_CAT_GRADIENTS];
    if (S > 0) {
        out[n++] = (tstrat){"optimizer without state (SGD)", "--optimizer sgd", S};
        out[n++] = (tstrat){"8-bit optimizer state (bitsandbytes AdamW8bit)", "--optimizer adamw-8bit", S * 3 / 4};
    }
    if (A > 0) {
        out[n++] = (tstrat){"gradient accumulation x2 (half the batch)", "--batch B/2 --accum 2", A / 2};
        out[n++] = (tstrat){"activation checkpointing (most of the activations)",
                            "torch.utils.checkpoint / gradient_checkpointing_enable()",
                            A * 3 / 4};
    }
    if (P + G + S > 0)
        out[n++] = (tstrat){"model in bf16 (parameters, gradients, state halve)", "--precision bf16", (P + G + S) / 2};
    return n;
}

static void print_text(const char *path, uint64_t capacity, const advice *a, double secs) {
    char x1[32], x2[32], line[256];
    printf("trace %s: %d allocator settings replayed on a %s device in %.2f s\n\n", path, a->n,
           cli_format_bytes(capacity, x1, sizeof x1), secs);
    printf("%4s  %-13s %-17s %-7s %-6s %s\n", "rank", "peak reserved", "device calls", "steady", "", "setting");
    for (int i = 0; i < a->n; i++) {
        const gm_tune_entry *j = &a->rows[i];
        line_for(j, line, sizeof line);
        char calls[32];
        snprintf(calls, sizeof calls, "%lld (%.1fx)", (long long)gm_tune_device_calls(&j->r), calls_ratio(a, j));
        const char *flag = gm_tune_failed(j) ? (j->r.oom ? "OOM" : "FAILED") : "";
        printf("%4d  %-13s %-17s %-7lld %-6s %s%s%s\n", i + 1, cli_format_bytes((uint64_t)j->r.peak_reserved, x1, sizeof x1),
               calls, (long long)j->r.steady_device_calls, flag, line, i == a->best ? "   <- best for memory" : "",
               i == a->rec ? "   <- recommended" : "");
    }
    printf("\n");
    if (a->def >= 0 && a->best >= 0) {
        const gm_tune_entry *d = &a->rows[a->def], *b = &a->rows[a->best];
        line_for(b, line, sizeof line);
        int64_t s = d->r.peak_reserved - b->r.peak_reserved;
        printf("best for memory: %s\n  peak reserved %s, %s less than PyTorch's default (%.1f%%), %.1fx its device "
               "calls\n", line, cli_format_bytes((uint64_t)b->r.peak_reserved, x1, sizeof x1),
               cli_format_bytes((uint64_t)(s > 0 ? s : 0), x2, sizeof x2),
               d->r.peak_reserved ? 100.0 * (double)s / (double)d->r.peak_reserved : 0.0, calls_ratio(a, b));
    }
    if (a->def >= 0 && a->rec >= 0) {
        const gm_tune_entry *d = &a->rows[a->def], *r = &a->rows[a->rec];
        line_for(r, line, sizeof line);
        int64_t s = d->r.peak_reserved - r->r.peak_reserved;
        printf("recommended:     %s\n  peak reserved %s, %s less than PyTorch's default (%.1f%%), %.1fx its device "
               "calls\n", line, cli_format_bytes((uint64_t)r->r.peak_reserved, x1, sizeof x1),
               cli_format_bytes((uint64_t)(s > 0 ? s : 0), x2, sizeof x2),
               d->r.peak_reserved ? 100.0 * (double)s / (double)d->r.peak_reserved : 0.0, calls_ratio(a, r));
    } else if (a->best < 0) {
        printf("every setting runs out of memory at %s\n", cli_format_bytes(capacity, x1, sizeof x1));
    }
    printf("(device calls = the replay's mallocs, or VMM creates + maps + unmaps; steady = those in its second\n"
           " half, after warm-up, what every later step pays. Recommended keeps them within %.0fx and %dx (or %d)\n"
           " PyTorch's default's: settings far above move memory in every step; gpumem_slack:0 cost +74%% step\n"
           " time on GPT-2 on an H200, bench/RESULTS.md.)\n", ADVISE_CALLS_FACTOR, ADVISE_STEADY_FACTOR,
           ADVISE_STEADY_MIN);
    printf("\n");
    if (!a->cats_ok) {
        printf("memory by category: not derivable from this trace\n");
        return;
    }
    const advice *c = a;
    printf("at the trace's peak (%s live%s):", cli_format_bytes((uint64_t)c->peak, x1, sizeof x1),
           c->have_frames ? "" : "; no Python stacks recorded, so decided by lifetimes: approximate");
    for (int k = 0; k < GM_CAT_COUNT; k++)
        printf("%s %s %s", k ? "," : "", gm_category_name(k), cli_format_bytes((uint64_t)c->at_peak[k], x2, sizeof x2));
    printf("\n");
    tstrat ts[8];
    int nt = trace_strategies(c, ts);
    if (nt) printf("\n%-52s %12s   %s\n", "strategy (upper bound, from the categories)", "frees", "how");
    for (int i = 0; i < nt; i++)
        printf("%-52s %12s   %s\n", ts[i].name, cli_format_bytes((uint64_t)ts[i].saving, x1, sizeof x1), ts[i].how);
    if (nt) printf("(for a prediction of each, model the run: gpumem estimate --help)\n");
}

static void print_json(const char *path, uint64_t capacity, const advice *a, double secs) {
    char line[256];
    printf("{\"trace\":");
    cli_json_string(stdout, path);
    printf(",\"capacity\":%llu,\"seconds\":%.3f,\"calls_factor\":%.1f,\"settings\":[", (unsigned long long)capacity,
           secs, ADVISE_CALLS_FACTOR);
    for (int i = 0; i < a->n; i++) {
        const gm_tune_entry *j = &a->rows[i];
        line_for(j, line, sizeof line);
        printf("%s{\"rank\":%d,\"steady_device_calls\":%lld,\"conf\":", i ? "," : "", i + 1,
               (long long)j->r.steady_device_calls);
        cli_json_string(stdout, j->conf);
        printf(",\"policy\":\"%s\",\"peak_reserved\":%lld,\"peak_allocated\":%lld,\"device_calls\":%lld,"
               "\"calls_vs_default\":%.3f,\"oom\":%s,\"failed\":%s,\"line\":",
               gm_policy_name((int)j->cfg.policy), (long long)j->r.peak_reserved, (long long)j->r.peak_allocated,
               (long long)gm_tune_device_calls(&j->r), calls_ratio(a, j), j->r.oom ? "true" : "false",
               gm_tune_failed(j) ? "true" : "false");
        cli_json_string(stdout, line);
        printf("}");
    }
    printf("],\"default\":");
    if (a->def >= 0) cli_json_string(stdout, a->rows[a->def].conf);
    else printf("null");
    printf(",\"best_for_memory\":");
    if (a->best >= 0) cli_json_string(stdout, a->rows[a->best].conf);
    else printf("null");
    printf(",\"recommended\":");
    if (a->rec >= 0) cli_json_string(stdout, a->rows[a->rec].conf);
    else printf("null");
    printf(",\"categories\":");
    if (a->cats_ok) {
        printf("{\"peak\":%lld,\"from_frames\":%s", (long long)a->peak, a->have_frames ? "true" : "false");
        for (int k = 0; k < GM_CAT_COUNT; k++)
            printf(",\"%s\":%lld", gm_category_name(k), (long long)a->at_peak[k]);
        printf("},\"strategies\":[");
        tstrat ts[8];
        int nt = trace_strategies(a, ts);
        for (int i = 0; i < nt; i++) {
            printf("%s{\"name\":", i ? "," : "");
            cli_json_string(stdout, ts[i].name);
            printf(",\"how\":");
            cli_json_string(stdout, ts[i].how);
            printf(",\"saving_bytes_upper_bound\":%lld}", (long long)ts[i].saving);
        }
        printf("]");
    } else {
        printf("null,\"strategies\":[]");
    }
    printf("}\n");
}

int cmd_advise(int argc, char **argv) {
    const char *cmd = argv[0];
    uint64_t capacity = 0;
    long long device = 0;
    bool json = false;
    const struct cli_opt opts[] = {CLI_OPT_CAPACITY(&capacity), CLI_OPT_DEVICE(&device), CLI_OPT_JSON(&json)};
    const struct cli_spec spec = {
        .cmd = cmd, .args = "TRACE", .opts = opts, .nopts = CLI_NOPTS(opts), .min_pos = 1, .max_pos = 1,
        .about = "Advice from a recorded PyTorch memory snapshot (or .gmt trace): allocator settings\n"
                 "ranked by replay with their device calls, the best for memory and the recommended one\n"
                 "(few device calls), and its peak by category (as 'gpumem report' attributes it) with\n"
                 "what each training strategy could free.",
        .epilog = "Exit status: 0 advised, 1 unreadable trace, 2 bad usage.",
    };
    char *path = NULL;
    int prc = cli_parse(&spec, argc, argv, &path, NULL);
    if (prc) return cli_parse_exit(prc);
    gm_sim_options so;
    gm_sim_options_init(&so);
    if (!capacity) capacity = so.capacity;
    gm_trace *t;
    if (gm_trace_load_file(path, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    advice a;
    memset(&a, 0, sizeof a);
    a.def = a.best = a.rec = -1;
    gm_replay_prog *prog;
    int rc = gm_replay_compile(t, (int)device, &prog);
    if (rc) {
        gm_trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    gm_attribution *attr = NULL;
    if (gm_attribute(t, (int)device, &attr) == GM_OK) {
        a.cats_ok = true;
        a.have_frames = attr->has_frames;
        a.peak = attr->peak_bytes;
        for (int k = 0; k < GM_CAT_COUNT; k++) a.at_peak[k] = (int64_t)gm_attr_peak_cat(attr, k);
        gm_attribution_free(attr);
    }
    gm_trace_free(t);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = gm_tune_run(prog, capacity, 2, &a.rows, &a.n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    gm_replay_prog_free(prog);
    if (rc) return cli_error(cmd, "%s", gm_last_error_detail());
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    for (int i = 0; i < a.n; i++)
        if (!a.rows[i].conf[0]) {
            a.def = i;
            a.def_calls = gm_tune_device_calls(&a.rows[i].r);
            a.def_steady = a.rows[i].r.steady_device_calls;
        }
    for (int i = 0; i < a.n; i++) { /* rows are ranked: those that fit first, by peak reserved */
        if (gm_tune_failed(&a.rows[i])) continue;
        if (a.best < 0) a.best = i;
        int64_t steady_cap = a.def_steady * ADVISE_STEADY_FACTOR;
        if (steady_cap < ADVISE_STEADY_MIN) steady_cap = ADVISE_STEADY_MIN;
        if (a.rec < 0 && calls_ratio(&a, &a.rows[i]) <= ADVISE_CALLS_FACTOR &&
            a.rows[i].r.steady_device_calls <= steady_cap)
            a.rec = i;
    }
    if (json) print_json(path, capacity, &a, secs);
    else print_text(path, capacity, &a, secs);
    free(a.rows);
    return 0;
}
