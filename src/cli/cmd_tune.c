/* cmd_tune.c — 'gpumem tune': replays one trace under a grid of PyTorch
 * allocator settings (torch policy) and under gpumem's own policy, and ranks
 * them by predicted peak reserved memory, with the exact line to use and a
 * flag on settings that would run out of memory at the given capacity.
 * gpumem's policy runs at three gpumem_slack values, with the device calls of
 * each (a cold pass): less slack = less memory, but idle memory moves
 * (unmap + map) in every later step too; the default (inf) moves it only
 * under memory pressure, so a warm step makes no device calls.
 *
 * The grid and the replays are the library's (src/trace/tune.c, from the
 * policy table); this file prints them. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The table's view of one tune run. */
typedef struct grid {
    uint64_t capacity;
    gm_tune_entry *jobs;
    int n;
} grid;
typedef gm_tune_entry job;

static long long device_calls(const gm_replay_result *r) { return (long long)gm_tune_device_calls(r); }

static void line_for(const job *j, char *buf, size_t len) {
    if (j->cfg.policy != GM_POLICY_TORCH)
        snprintf(buf, len, "GPUMEM_CONF=%.160s  (python: import gpumem.torch; gpumem.torch.install())",
                 j->conf);
    else if (!j->conf[0])
        snprintf(buf, len, "(PyTorch default: PYTORCH_CUDA_ALLOC_CONF unset)");
    else
        snprintf(buf, len, "PYTORCH_CUDA_ALLOC_CONF=%.160s", j->conf);
}

static void print_json(const char *path, const grid *g, double seconds) {
    printf("{\"trace\":");
    cli_json_string(stdout, path);
    printf(",\"capacity\":%llu,\"seconds\":%.3f,\"results\":[", (unsigned long long)g->capacity, seconds);
    for (int i = 0; i < g->n; i++) {
        const job *j = &g->jobs[i];
        char line[320];
        line_for(j, line, sizeof line);
        printf("%s{\"rank\":%d,\"policy\":\"%s\",\"conf\":", i ? "," : "", i + 1,
               gm_policy_name((int)j->cfg.policy));
        cli_json_string(stdout, j->conf);
        printf(",\"peak_reserved\":%lld,\"peak_allocated\":%lld,\"peak_requested\":%lld,"
               "\"ratio\":%.6f,\"segments\":%lld,\"num_alloc_retries\":%lld,\"oom\":%s,"
               "\"failed\":%s,\"device_calls\":%lld,\"line\":",
               (long long)j->r.peak_reserved, (long long)j->r.peak_allocated,
               (long long)j->r.peak_requested,
               j->r.peak_requested ? (double)j->r.peak_reserved / (double)j->r.peak_requested : 0.0,
               (long long)j->r.segments, (long long)j->r.num_alloc_retries,
               j->r.oom ? "true" : "false", (j->rc || j->r.error) ? "true" : "false", device_calls(&j->r));
        cli_json_string(stdout, line);
        printf("}");
    }
    printf("]}\n");
}

static void print_table(const char *path, const grid *g, double seconds) {
    char cap[32], pk[32];
    printf("trace %s, capacity %s: %d settings replayed in %.2f s\n\n", path,
           cli_format_bytes(g->capacity, cap, sizeof cap), g->n, seconds);
    printf("%4s  %-13s %-7s %-6s %-8s %s\n", "rank", "peak reserved", "ratio", "calls", "", "setting");
    for (int i = 0; i < g->n; i++) {
        const job *j = &g->jobs[i];
        char line[320];
        line_for(j, line, sizeof line);
        const char *flag = j->rc || j->r.error ? "FAILED" : j->r.oom ? "OOM" : "";
        printf("%4d  %-13s %-7.4f %-6lld %-8s %s\n", i + 1,
               cli_format_bytes((uint64_t)j->r.peak_reserved, pk, sizeof pk),
               j->r.peak_requested ? (double)j->r.peak_reserved / (double)j->r.peak_requested : 0.0,
               device_calls(&j->r), flag, line);
        if (j->rc) printf("      (%s)\n", j->err);
    }
    if (g->n && !g->jobs[0].r.oom && !g->jobs[0].rc) {
        char line[320];
        line_for(&g->jobs[0], line, sizeof line);
        printf("\nbest: %s\n", line);
    } else {
        printf("\nevery setting runs out of memory at this capacity\n");
    }
    printf("(a row marked OOM would run out of memory at %s; ratio = peak reserved / peak requested;\n"
           " calls = device calls of this first pass: mallocs, or VMM creates + maps + unmaps.\n"
           " gpumem_slack below inf trades memory for calls in every later step too:\n"
           " see bench/gpumem_policy_tradeoff.md)\n", cap);
}

int cmd_tune(int argc, char **argv) {
    const char *cmd = argv[0];
    uint64_t capacity = 0;
    long long device = 0;
    bool json = false;
    const struct cli_opt opts[] = {
        CLI_OPT_CAPACITY(&capacity),
        CLI_OPT_DEVICE(&device),
        CLI_OPT_JSON(&json),
    };
    const struct cli_spec spec = {
        .cmd = cmd, .args = "TRACE", .opts = opts, .nopts = CLI_NOPTS(opts), .min_pos = 1, .max_pos = 1,
        .about = "Replays TRACE under a grid of PYTORCH_CUDA_ALLOC_CONF settings and under\n"
                 "gpumem's policy on a simulated GPU, and ranks them by predicted peak reserved\n"
                 "memory ('-' reads the trace from standard input).",
        .epilog = "Exit status: 0 ranked, 1 unreadable trace, 2 bad usage.",
    };
    char *path = NULL;
    int prc = cli_parse(&spec, argc, argv, &path, NULL);
    if (prc) return cli_parse_exit(prc);
    gm_sim_options so;
    gm_sim_options_init(&so);
    if (!capacity) capacity = so.capacity;
    gm_trace *t;
    if (gm_trace_load_file(path, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    gm_replay_prog *prog;
    int rc = gm_replay_compile(t, (int)device, &prog);
    gm_trace_free(t);
    if (rc) return cli_error(cmd, "%s", gm_last_error_detail());
    const char *bad_first;
    uint64_t nbad = gm_replay_prog_bad_events(prog, &bad_first);
    if (nbad)
        fprintf(stderr, "gpumem %s: warning: %llu trace events no device could have made were "
                "skipped (first: %s); the recommendation covers the rest of the trace\n",
                cmd, (unsigned long long)nbad, bad_first);
    grid gr = {.capacity = capacity}, *g = &gr;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = gm_tune_run(prog, capacity, 2, &g->jobs, &g->n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    gm_replay_prog_free(prog);
    if (rc) return cli_error(cmd, "%s", gm_last_error_detail());
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (json) print_json(path, g, secs);
    else print_table(path, g, secs);
    free(g->jobs);
    return 0;
}
