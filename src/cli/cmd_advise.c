/* cmd_advise.c — 'gpumem advise TRACE': the advice of 'gpumem estimate' from
 * a recorded snapshot. Allocator settings ranked by replay, with their speed
 * cost in device calls weighed and the best for memory and the recommended
 * setting named apart (the ranking is tune's: gm__tune_run, gm__tune_choose and
 * cli_tune.c's table); what the trace's peak holds by category (the report's
 * attribution, gm__attribute: Python frames when recorded, lifetimes
 * otherwise) and what the training strategies could free. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "report/report.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>

typedef struct advice {
    gm_tune_entry *rows;
    int n;
    gm_tune_choice choice;
    bool cats_ok, have_frames;
    int64_t peak;                   /* live requested bytes at the trace's peak */
    int64_t at_peak[GM_CAT_COUNT];  /* by category */
    char note[1024];                /* without frames: what is inferred, how to record frames */
} advice;

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
    char x1[32], x2[32];
    cli_tune_print_text(path, capacity, a->rows, a->n, &a->choice, secs);
    printf("\n");
    if (!a->cats_ok) {
        printf("memory by category: not derivable from this trace\n");
        return;
    }
    const advice *c = a;
    printf("at the trace's peak (%s live%s):", cli_format_bytes((uint64_t)c->peak, x1, sizeof x1),
           c->have_frames ? "" : "; no Python frames: inferred, see below");
    for (int k = 0; k < GM_CAT_COUNT; k++)
        printf("%s %s %s", k ? "," : "", gm_category_name(k), cli_format_bytes((uint64_t)c->at_peak[k], x2, sizeof x2));
    printf("\n");
    if (*c->note) printf("(%s)\n", c->note);
    tstrat ts[8];
    int nt = trace_strategies(c, ts);
    if (nt) printf("\n%-52s %12s   %s\n", "strategy (upper bound, from the categories)", "frees", "how");
    for (int i = 0; i < nt; i++)
        printf("%-52s %12s   %s\n", ts[i].name, cli_format_bytes((uint64_t)ts[i].saving, x1, sizeof x1), ts[i].how);
    if (nt) printf("(for a prediction of each, model the run: gpumem estimate --help)\n");
}

static void print_json(const char *path, uint64_t capacity, const advice *a, double secs) {
    printf("{\"trace\":");
    cli_json_string(stdout, path);
    printf(",\"capacity\":%llu,\"seconds\":%.3f,", (unsigned long long)capacity, secs);
    cli_tune_print_json(a->rows, a->n, &a->choice, capacity);
    printf(",\"categories\":");
    if (a->cats_ok) {
        printf("{\"peak\":%lld,\"from_frames\":%s", (long long)a->peak, a->have_frames ? "true" : "false");
        if (*a->note) {
            printf(",\"note\":");
            cli_json_string(stdout, a->note);
        }
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
    advice a;
    memset(&a, 0, sizeof a);
    gm_trace *t;
    double secs;
    int rc = cli_tune_trace(cmd, path, (int)device, &capacity, &t, &a.rows, &a.n, &a.choice, &secs);
    if (rc) return rc;
    gm_attribution *attr = NULL;
    if (gm__attribute(t, (int)device, &attr) == GM_OK) {
        a.cats_ok = true;
        a.have_frames = attr->has_frames;
        a.peak = attr->peak_bytes;
        gm__attr_frames_note(attr, a.note, sizeof a.note);
        for (int k = 0; k < GM_CAT_COUNT; k++) a.at_peak[k] = (int64_t)gm__attr_peak_cat(attr, k);
        gm__attribution_free(attr);
    }
    gm__trace_free(t);
    if (json) print_json(path, capacity, &a, secs);
    else print_text(path, capacity, &a, secs);
    free(a.rows);
    return 0;
}
