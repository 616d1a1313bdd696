/* cmd_tune.c — 'gpumem tune': replays one trace under a grid of PyTorch
 * allocator settings (torch policy) and under gpumem's own policy, and ranks
 * them by predicted peak reserved memory, with the exact line to use and a
 * flag on settings that would run out of memory at the given capacity.
 * gpumem's policy runs at three gpumem_slack values, with the device calls of
 * each (a cold pass): less slack = less memory, but idle memory moves
 * (unmap + map) in every later step too; the default (inf) moves it only
 * under memory pressure, so a warm step makes no device calls.
 *
 * The trace is parsed and compiled once; the grid runs on two threads (each
 * run has its own sim device and allocator, so they share only the
 * read-only compiled program). */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_GRID 32
#define THREADS 2

typedef struct job {
    char conf[160];
    gm_config cfg;
    gm_replay_result r;
    int rc;
    char err[256];
} job;

typedef struct grid {
    const gm_replay_prog *prog;
    uint64_t capacity;
    job jobs[MAX_GRID];
    int n;
    int next; /* atomic */
} grid;

static void *worker(void *arg) {
    grid *g = arg;
    for (;;) {
        int i = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED);
        if (i >= g->n) return NULL;
        job *j = &g->jobs[i];
        j->rc = gm_replay_run(g->prog, &j->cfg, g->capacity, &j->r);
        if (j->rc) snprintf(j->err, sizeof j->err, "%s", gm_last_error_detail());
    }
}

static void add(grid *g, const char *conf) {
    if (g->n >= MAX_GRID) return;
    job *j = &g->jobs[g->n];
    memset(j, 0, sizeof *j);
    snprintf(j->conf, sizeof j->conf, "%s", conf);
    gm_config_init(&j->cfg);
    char err[200];
    if (gm_config_parse(&j->cfg, conf, err, sizeof err) != GM_OK) return; /* not offered */
    g->n++;
}

/* The grid: what PyTorch users are told to try, plus gpumem. The GC
 * threshold only acts under a memory fraction, so it comes with one sized
 * to the trace (1.25x its peak requested, at this capacity). */
static void build_grid(grid *g, int64_t peak_requested, uint64_t capacity) {
    char buf[160];
    add(g, "");
    add(g, "expandable_segments:True");
    static const int splits[] = {64, 128, 256, 512};
    for (int i = 0; i < 4; i++) {
        snprintf(buf, sizeof buf, "max_split_size_mb:%d", splits[i]);
        add(g, buf);
    }
    double frac = ceil(125.0 * (double)peak_requested / (double)capacity) / 100.0;
    if (frac < 0.01) frac = 0.01;
    if (frac > 1.0) frac = 1.0;
    static const char *gc[] = {"0.6", "0.8"};
    for (int i = 0; i < 2; i++) {
        snprintf(buf, sizeof buf, "garbage_collection_threshold:%s,per_process_memory_fraction:%.2f",
                 gc[i], frac);
        add(g, buf);
    }
    add(g, "garbage_collection_threshold:0.6,max_split_size_mb:128");
    static const char *rp[] = {"4", "8", "16", "[256:1,512:2,1024:4,>:8]"};
    for (int i = 0; i < 4; i++) {
        snprintf(buf, sizeof buf, "roundup_power2_divisions:%s", rp[i]);
        add(g, buf);
    }
    add(g, "expandable_segments:True,roundup_power2_divisions:4");
    add(g, "policy:gpumem"); /* default slack: inf */
    add(g, "policy:gpumem,gpumem_slack:0.02");
    add(g, "policy:gpumem,gpumem_slack:0");
}

/* device calls of the (cold) replay: allocations, VMM creates, maps, unmaps */
static long long device_calls(const gm_replay_result *r) {
    return (long long)(r->num_device_alloc + r->num_phys_create + r->num_map + r->num_unmap);
}

static int cmp_jobs(const void *a, const void *b) {
    const job *x = a, *y = b;
    bool fx = x->rc || x->r.oom || x->r.error, fy = y->rc || y->r.oom || y->r.error;
    if (fx != fy) return fx ? 1 : -1;
    if (x->r.peak_reserved != y->r.peak_reserved) return x->r.peak_reserved < y->r.peak_reserved ? -1 : 1;
    return strcmp(x->conf, y->conf);
}

static void line_for(const job *j, char *buf, size_t len) {
    if (j->cfg.policy == GM_POLICY_GPUMEM)
        snprintf(buf, len, "GPUMEM_CONF=%.160s  (python: import gpumem.torch; gpumem.torch.install())",
                 j->conf);
    else if (!j->conf[0])
        snprintf(buf, len, "(PyTorch default: PYTORCH_CUDA_ALLOC_CONF unset)");
    else
        snprintf(buf, len, "PYTORCH_CUDA_ALLOC_CONF=%.160s", j->conf);
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned char)*s);
        else putchar(*s);
    }
    putchar('"');
}

static void print_json(const char *path, const grid *g, double seconds) {
    printf("{\"trace\":");
    json_str(path);
    printf(",\"capacity\":%llu,\"seconds\":%.3f,\"results\":[", (unsigned long long)g->capacity, seconds);
    for (int i = 0; i < g->n; i++) {
        const job *j = &g->jobs[i];
        char line[320];
        line_for(j, line, sizeof line);
        printf("%s{\"rank\":%d,\"policy\":\"%s\",\"conf\":", i ? "," : "", i + 1,
               j->cfg.policy == GM_POLICY_GPUMEM ? "gpumem" : "torch");
        json_str(j->conf);
        printf(",\"peak_reserved\":%lld,\"peak_allocated\":%lld,\"peak_requested\":%lld,"
               "\"ratio\":%.6f,\"segments\":%lld,\"num_alloc_retries\":%lld,\"oom\":%s,"
               "\"failed\":%s,\"device_calls\":%lld,\"line\":",
               (long long)j->r.peak_reserved, (long long)j->r.peak_allocated,
               (long long)j->r.peak_requested,
               j->r.peak_requested ? (double)j->r.peak_reserved / (double)j->r.peak_requested : 0.0,
               (long long)j->r.segments, (long long)j->r.num_alloc_retries,
               j->r.oom ? "true" : "false", (j->rc || j->r.error) ? "true" : "false", device_calls(&j->r));
        json_str(line);
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
    const char *cmd = argv[0], *path = NULL;
    uint64_t capacity = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            printf("usage: gpumem %s TRACE [--capacity SIZE] [--json]\n\n"
                   "Replays TRACE under a grid of PYTORCH_CUDA_ALLOC_CONF settings and under\n"
                   "gpumem's policy on a simulated GPU of SIZE bytes (default 141GiB), and ranks\n"
                   "them by predicted peak reserved memory.\n", cmd);
            return 0;
        } else if (!strcmp(o, "--json")) json = true;
        else if (!strcmp(o, "--capacity") && i + 1 < argc) {
            if (!cli_parse_size(argv[++i], &capacity) || capacity == 0)
                return cli_usage_error(cmd, "bad --capacity '%s' (e.g. 80GiB)", argv[i]);
        } else if (o[0] == '-' && o[1]) return cli_usage_error(cmd, "unknown or incomplete option '%s'", o);
        else if (!path) path = o;
        else return cli_usage_error(cmd, "more than one trace given ('%s')", o);
    }
    if (!path) return cli_usage_error(cmd, "usage: gpumem tune TRACE [--capacity SIZE] [--json]");
    gm_sim_options so;
    gm_sim_options_init(&so);
    if (!capacity) capacity = so.capacity;
    gm_trace *t;
    if (gm_trace_load_file(path, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    gm_replay_prog *prog;
    int rc = gm_replay_compile(t, 0, &prog);
    gm_trace_free(t);
    if (rc) return cli_error(cmd, "%s", gm_last_error_detail());
    const char *bad_first;
    uint64_t nbad = gm_replay_prog_bad_events(prog, &bad_first);
    if (nbad)
        fprintf(stderr, "gpumem %s: warning: %llu trace events no device could have made were "
                "skipped (first: %s); the recommendation covers the rest of the trace\n",
                cmd, (unsigned long long)nbad, bad_first);
    grid *g = calloc(1, sizeof *g);
    if (!g) {
        gm_replay_prog_free(prog);
        return cli_error(cmd, "out of memory");
    }
    g->prog = prog;
    g->capacity = capacity;
    /* the trace's own peak requested sizes the GC settings' memory fraction */
    build_grid(g, gm_replay_prog_peak_requested(prog), capacity);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t th[THREADS];
    int started = 0;
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&th[i], NULL, worker, g) == 0) started++;
    if (!started) worker(g);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    qsort(g->jobs, (size_t)g->n, sizeof g->jobs[0], cmp_jobs);
    if (json) print_json(path, g, secs);
    else print_table(path, g, secs);
    gm_replay_prog_free(prog);
    free(g);
    return 0;
}
