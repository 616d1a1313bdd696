/* cli_estimate_trace.c — 'gpumem estimate --trace TRACE': the estimate of a
 * step traced from the user's own code (python/gpumem/estimate.py writes it
 * as a memory snapshot, each allocation tagged with its category), or of any
 * recorded trace. One replay per allocator model (PyTorch's default,
 * expandable_segments:True, gpumem's policy) gives peak allocated and
 * reserved; the report's attribution (gm__attribute: the tags) gives the
 * categories at the peak; the verdict is the block models' rule (peak
 * reserved under PyTorch's default, plus GM_EST_FIT_MARGIN, plus the CUDA
 * context, against --capacity). So estimate, replay and report read the same
 * events and cannot disagree. */
#include "cli.h"

#include "estimate/estimate.h"
#include "gpumem/gpumem.h"
#include "report/report.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>

/* The allocator models replayed, first the one the verdict uses. */
static const struct {
    const char *key, *conf, *label;
} models[] = {
    {"torch", "", "PyTorch's default"},
    {"expandable_segments", "expandable_segments:True", "expandable_segments:True"},
    {"gpumem", "policy:gpumem", "gpumem's policy"},
};
#define NMODELS (sizeof models / sizeof models[0])

typedef struct tres {
    gm_replay_result r[NMODELS];
    int64_t peak_requested;
    int64_t at_peak[GM_CAT_COUNT];
    bool tagged; /* every byte at the peak had a category tag */
    size_t events;
} tres;

static int64_t device_total(const tres *x) { return x->r[0].peak_reserved + GM_EST_CUDA_CONTEXT; }

static int fits(const tres *x, uint64_t capacity) {
    if (!capacity) return -1;
    return (double)x->r[0].peak_reserved * (1.0 + GM_EST_FIT_MARGIN) + (double)GM_EST_CUDA_CONTEXT <=
           (double)capacity;
}

static int replay_all(const char *cmd, const char *path, tres *x) {
    gm_trace *t;
    if (gm__trace_load_file(path, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    if (cli_require_history(cmd, path, t, 0)) {
        gm__trace_free(t);
        return 1;
    }
    gm_attribution *a = NULL;
    int rc = gm__attribute(t, 0, &a);
    if (rc) {
        gm__trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    x->peak_requested = a->peak_bytes;
    x->events = a->nevents;
    x->tagged = a->peak_bytes == (int64_t)gm__attr_peak_method(a, GM_AM_TAGGED);
    for (int k = 0; k < GM_CAT_COUNT; k++) x->at_peak[k] = (int64_t)gm__attr_peak_cat(a, k);
    gm__attribution_free(a);
    gm_replay_prog *p;
    rc = gm__replay_compile(t, 0, &p);
    if (rc) {
        gm__trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    /* a device big enough that the replay never runs out: the verdict is --capacity's */
    gm_sim_options so;
    gm_sim_options_init(&so);
    uint64_t cap = so.capacity, need = 2 * (uint64_t)x->peak_requested + ((uint64_t)2 << 30);
    if (need > cap) cap = need;
    for (size_t m = 0; m < NMODELS && !rc; m++) {
        gm_config cfg;
        gm_config_init(&cfg);
        char err[256] = "";
        if (cli_config_parse(&cfg, models[m].conf, err, sizeof err) != GM_OK) {
            rc = cli_error(cmd, "internal: bad setting %s: %s", models[m].conf, err);
            break;
        }
        if (gm__replay_run(p, &cfg, cap, &x->r[m]) != GM_OK) rc = cli_error(cmd, "%s", gm_last_error_detail());
        else if (x->r[m].oom || x->r[m].error)
            rc = cli_error(cmd, "the replay of %s under %s failed: %s", path, models[m].label,
                           x->r[m].oom ? x->r[m].oom_detail : x->r[m].error_detail);
    }
    gm__replay_prog_free(p);
    gm__trace_free(t);
    return rc;
}

static void print_json(const char *path, uint64_t capacity, const tres *x) {
    printf("{\"trace\":");
    cli_json_string(stdout, path);
    printf(",\"events\":%zu,\"peak_requested\":%lld,\"peak_allocated\":%lld,\"peak_reserved\":{", x->events,
           (long long)x->peak_requested, (long long)x->r[0].peak_allocated);
    for (size_t m = 0; m < NMODELS; m++)
        printf("%s\"%s\":%lld", m ? "," : "", models[m].key, (long long)x->r[m].peak_reserved);
    printf("},\"cuda_context\":%lld,\"device_total\":%lld,\"categories_tagged\":%s,\"at_peak\":{",
           (long long)GM_EST_CUDA_CONTEXT, (long long)device_total(x), x->tagged ? "true" : "false");
    for (int k = 0; k < GM_CAT_COUNT; k++)
        printf("%s\"%s\":%lld", k ? "," : "", gm_category_name(k), (long long)x->at_peak[k]);
    int f = fits(x, capacity);
    printf("},\"capacity\":%llu,\"margin\":%.2f,\"fits\":%s,\"verdict\":", (unsigned long long)capacity,
           GM_EST_FIT_MARGIN, f < 0 ? "null" : f ? "true" : "false");
    char v[256], a[32], b[32];
    if (f < 0) snprintf(v, sizeof v, "no --capacity given");
    else
        snprintf(v, sizeof v, "%s %s: peak reserved + %.0f%% + context = %s", f ? "fits" : "does NOT fit",
                 cli_format_bytes(capacity, a, sizeof a), GM_EST_FIT_MARGIN * 100.0,
                 cli_format_bytes((uint64_t)((double)x->r[0].peak_reserved * (1.0 + GM_EST_FIT_MARGIN)) +
                                      (uint64_t)GM_EST_CUDA_CONTEXT, b, sizeof b));
    cli_json_string(stdout, v);
    printf("}\n");
}

static void print_text(const char *path, uint64_t capacity, const tres *x) {
    char a[32], b[32];
    printf("trace            %s (%zu events)\n", path, x->events);
    printf("peak allocated   %-11s (torch.cuda.max_memory_allocated())\n",
           cli_format_bytes((uint64_t)x->r[0].peak_allocated, a, sizeof a));
    for (size_t m = 0; m < NMODELS; m++)
        printf("%-16s %-11s under %s\n", m ? "" : "peak reserved", cli_format_bytes((uint64_t)x->r[m].peak_reserved, a, sizeof a),
               models[m].label);
    printf("whole device     %-11s (reserved + %s CUDA context)\n",
           cli_format_bytes((uint64_t)device_total(x), a, sizeof a),
           cli_format_bytes((uint64_t)GM_EST_CUDA_CONTEXT, b, sizeof b));
    printf("\nat the peak      ");
    for (int k = 0; k < GM_CAT_COUNT; k++)
        printf("%s%s %s", k ? ", " : "", gm_category_name(k), cli_format_bytes((uint64_t)x->at_peak[k], a, sizeof a));
    printf("\n%s", x->tagged ? "" : "                 (not every allocation is tagged: the rest is decided as "
                                   "'gpumem report' decides it)\n");
    int f = fits(x, capacity);
    if (f >= 0)
        printf("\ncapacity %s: %s (peak reserved + %.0f%% margin + context = %s)\n", cli_format_bytes(capacity, a, sizeof a),
               f ? "fits" : "does NOT fit (predicted out of memory)", GM_EST_FIT_MARGIN * 100.0,
               cli_format_bytes((uint64_t)((double)x->r[0].peak_reserved * (1.0 + GM_EST_FIT_MARGIN)) +
                                    (uint64_t)GM_EST_CUDA_CONTEXT, b, sizeof b));
    printf("\n(one replay of the trace per allocator model; the same events 'gpumem replay', 'tune'\n"
           " and 'report' read. Tracer and accuracy: docs/estimate.md)\n");
}

int cli_estimate_trace(const char *cmd, const char *path, uint64_t capacity, bool json) {
    tres *x = calloc(1, sizeof *x);
    if (!x) return cli_error(cmd, "out of memory");
    int rc = replay_all(cmd, path, x);
    if (!rc) {
        if (json) print_json(path, capacity, x);
        else print_text(path, capacity, x);
    }
    free(x);
    return rc;
}
