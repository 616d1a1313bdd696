/* cli_tune.c — the ranking of allocator settings as `gpumem tune` and
 * `gpumem advise` print it (text and JSON), over the library's replays
 * (gm__tune_run) and choice (gm__tune_choose): one table, so both commands
 * show the same columns and name the same best and recommended settings. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The exact line a user sets for entry e. */
void cli_tune_line(const gm_tune_entry *e, char *buf, size_t len) {
    if (e->cfg.policy != GM_POLICY_TORCH)
        snprintf(buf, len, "GPUMEM_CONF=%.160s  (then: gpumem run -- python3 train.py)", e->conf);
    else if (!e->conf[0])
        snprintf(buf, len, "(PyTorch default: PYTORCH_CUDA_ALLOC_CONF unset)");
    else
        snprintf(buf, len, "PYTORCH_CUDA_ALLOC_CONF=%.160s", e->conf);
}

/* A per_process_memory_fraction is a share of the device it runs on: the
 * cap in bytes at the capacity replayed, and what it means elsewhere
 * (0.07 of the simulated 141 GiB is 9.87 GiB, of a 24 GiB card 1.7 GiB:
 * the fraction alone would mislead). Empty when e sets no fraction. */
static void fraction_note(const gm_tune_entry *e, uint64_t capacity, char *buf, size_t len) {
    double f = e->cfg.per_process_memory_fraction;
    buf[0] = 0;
    if (!(f > 0.0 && f < 1.0)) return;
    gm_sim_options so;
    gm_sim_options_init(&so);
    char cap[32], dev[32];
    cli_format_bytes((uint64_t)(f * (double)capacity), cap, sizeof cap);
    cli_format_bytes(capacity, dev, sizeof dev);
    if (capacity == so.capacity)
        snprintf(buf, len, "the fraction caps the process at %s of the simulated %s device; for your GPU rerun with "
                 "--capacity its memory, or set the fraction to %s / its memory", cap, dev, cap);
    else
        snprintf(buf, len, "the fraction caps the process at %s of the %s --capacity device", cap, dev);
}

static const gm_tune_entry *def_of(const gm_tune_entry *e, const gm_tune_choice *c) {
    return c->def >= 0 ? &e[c->def] : NULL;
}

static void explain(const char *what, const gm_tune_entry *x, const gm_tune_entry *d, const char *why) {
    char line[320], b1[32], b2[32], vs[96];
    cli_tune_line(x, line, sizeof line);
    int64_t s = d ? d->r.peak_reserved - x->r.peak_reserved : 0;
    /* below 0.05% (printed as 0.0%) a difference is noise, not a saving */
    if (!d || !d->r.peak_reserved || llabs(s) * 2000 < d->r.peak_reserved)
        snprintf(vs, sizeof vs, "%s", x == d ? "PyTorch's default itself" : "the same as PyTorch's default");
    else
        snprintf(vs, sizeof vs, "%s %s than PyTorch's default (%.1f%%)",
                 cli_format_bytes((uint64_t)llabs(s), b2, sizeof b2), s > 0 ? "less" : "more",
                 100.0 * (double)llabs(s) / (double)d->r.peak_reserved);
    printf("%-16s %s\n  peak reserved %s, %s, %.1fx its device calls, %lld in the steady state: %s\n", what, line,
           cli_format_bytes((uint64_t)x->r.peak_reserved, b1, sizeof b1), vs, gm__tune_calls_ratio(x, d),
           (long long)x->r.steady_device_calls, why);
}

void cli_tune_print_text(const char *path, uint64_t capacity, const gm_tune_entry *e, int n,
                         const gm_tune_choice *c, double secs) {
    char cap[32], pk[32], line[320], calls[48];
    const gm_tune_entry *d = def_of(e, c);
    printf("trace %s, capacity %s: %d settings replayed in %.2f s\n\n", path,
           cli_format_bytes(capacity, cap, sizeof cap), n, secs);
    printf("%4s  %-13s %-7s %-17s %-7s %-6s %s\n", "rank", "peak reserved", "ratio", "device calls", "steady", "",
           "setting");
    for (int i = 0; i < n; i++) {
        const gm_tune_entry *j = &e[i];
        cli_tune_line(j, line, sizeof line);
        snprintf(calls, sizeof calls, "%lld (%.1fx)", (long long)gm__tune_device_calls(&j->r),
                 gm__tune_calls_ratio(j, d));
        const char *flag = j->rc || j->r.error ? "FAILED" : j->r.oom ? "OOM" : "";
        printf("%4d  %-13s %-7.4f %-17s %-7lld %-6s %s%s%s\n", i + 1,
               cli_format_bytes((uint64_t)j->r.peak_reserved, pk, sizeof pk),
               j->r.peak_requested ? (double)j->r.peak_reserved / (double)j->r.peak_requested : 0.0, calls,
               (long long)j->r.steady_device_calls, flag, line, i == c->best ? "   <- best for memory" : "",
               i == c->rec ? "   <- recommended" : "");
        if (j->rc) printf("      (%s)\n", j->err);
        fraction_note(j, capacity, line, sizeof line);
        if (*line) printf("      (%s)\n", line);
    }
    printf("\n");
    if (c->best >= 0) explain("best for memory:", &e[c->best], d, "the least memory, whatever it costs in calls");
    if (c->rec >= 0)
        explain("recommended:", &e[c->rec], d,
                c->rec == c->best ? "the least memory, and its device calls stay low"
                                  : "the least memory among settings whose device calls stay low");
    if (c->best < 0) printf("every setting runs out of memory at %s\n", cap);
    printf("(ratio = peak reserved / peak requested; device calls = the replay's mallocs, or VMM creates + maps +\n"
           " unmaps, and the multiple of PyTorch default's; steady = those in the replay's second half, after\n"
           " warm-up: what every later step pays, each a driver call of tens of microseconds (bench/RESULTS.md).\n"
           " Recommended keeps them within %.0fx PyTorch default's (or %d, a warm-up paid once) and the steady\n"
           " ones within %dx (or %d); an OOM row would run out of memory at %s. The trade-off:\n"
           " bench/gpumem_policy_tradeoff.md)\n",
           GM_TUNE_CALLS_FACTOR, GM_TUNE_CALLS_ONCE, GM_TUNE_STEADY_FACTOR, GM_TUNE_STEADY_MIN, cap);
}

void cli_tune_print_json(const gm_tune_entry *e, int n, const gm_tune_choice *c, uint64_t capacity) {
    const gm_tune_entry *d = def_of(e, c);
    char line[320];
    printf("\"calls_factor\":%.1f,\"results\":[", GM_TUNE_CALLS_FACTOR);
    for (int i = 0; i < n; i++) {
        const gm_tune_entry *j = &e[i];
        cli_tune_line(j, line, sizeof line);
        printf("%s{\"rank\":%d,\"policy\":\"%s\",\"conf\":", i ? "," : "", i + 1, gm_policy_name((int)j->cfg.policy));
        cli_json_string(stdout, j->conf);
        printf(",\"peak_reserved\":%lld,\"peak_allocated\":%lld,\"peak_requested\":%lld,"
               "\"ratio\":%.6f,\"segments\":%lld,\"num_alloc_retries\":%lld,\"oom\":%s,"
               "\"failed\":%s,\"device_calls\":%lld,\"calls_vs_default\":%.3f,\"steady_device_calls\":%lld,"
               "\"line\":",
               (long long)j->r.peak_reserved, (long long)j->r.peak_allocated, (long long)j->r.peak_requested,
               j->r.peak_requested ? (double)j->r.peak_reserved / (double)j->r.peak_requested : 0.0,
               (long long)j->r.segments, (long long)j->r.num_alloc_retries, j->r.oom ? "true" : "false",
               j->rc || j->r.error ? "true" : "false", (long long)gm__tune_device_calls(&j->r),
               gm__tune_calls_ratio(j, d), (long long)j->r.steady_device_calls);
        cli_json_string(stdout, line);
        double f = j->cfg.per_process_memory_fraction;
        if (f > 0.0 && f < 1.0) /* the cap the fraction sets on the device replayed */
            printf(",\"memory_fraction\":%.4g,\"memory_cap_bytes\":%llu", f,
                   (unsigned long long)(f * (double)capacity));
        printf("}");
    }
    const int idx[3] = {c->def, c->best, c->rec};
    const char *names[3] = {"default", "best_for_memory", "recommended"};
    printf("]");
    for (int k = 0; k < 3; k++) {
        printf(",\"%s\":", names[k]);
        if (idx[k] >= 0) cli_json_string(stdout, e[idx[k]].conf);
        else printf("null");
    }
}

int cli_tune_trace(const char *cmd, const char *path, int device, uint64_t *capacity, struct gm_trace **trace,
                   gm_tune_entry **rows, int *n, gm_tune_choice *choice, double *secs) {
    gm_sim_options so;
    gm_sim_options_init(&so);
    if (!*capacity) *capacity = so.capacity;
    gm_trace *t;
    if (gm__trace_load_file(path, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    if (cli_require_history(cmd, path, t, device)) {
        gm__trace_free(t);
        return 1;
    }
    gm_replay_prog *prog;
    int rc = gm__replay_compile(t, device, &prog);
    if (rc) {
        gm__trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    const char *bad_first;
    uint64_t nbad = gm__replay_prog_bad_events(prog, &bad_first);
    if (nbad)
        fprintf(stderr, "gpumem %s: warning: %llu trace events no device could have made were "
                "skipped (first: %s); the recommendation covers the rest of the trace\n",
                cmd, (unsigned long long)nbad, bad_first);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = gm__tune_run(prog, *capacity, 2, rows, n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    gm__replay_prog_free(prog);
    if (rc) {
        gm__trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    if (trace) *trace = t;
    else gm__trace_free(t);
    *secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    gm__tune_choose(*rows, *n, choice);
    return 0;
}
