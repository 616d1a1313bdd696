/* cmd_replay.c — 'gpumem replay': replays a PyTorch memory snapshot or a
 * gpumem trace through one allocator policy and configuration on the
 * simulated device, and reports the peaks it predicts, whether (and where)
 * the run would run out of memory at a given capacity, and the device calls
 * it would make. The replay machinery lives in src/trace/replay.c. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>

/* "device_call_sizes":{"phys_create":{"21":[calls,bytes],...},...}: calls of
 * 2^21..2^22-1 bytes and their total, so a cost model per size can be applied
 * (tools/first_pass_cost.py). */
static void print_sized(const gm_replay_result *r) {
    printf(",\"device_call_sizes\":{");
    for (int k = 0; k < GM_REPLAY_SIZED; k++) {
        printf("%s\"%s\":{", k ? "," : "", gm__replay_sized_names[k]);
        bool first = true;
        for (int b = 0; b < GM_SIM_SIZE_BUCKETS; b++) {
            if (!r->sized_n[k][b]) continue;
            printf("%s\"%d\":[%llu,%llu]", first ? "" : ",", b, (unsigned long long)r->sized_n[k][b],
                   (unsigned long long)r->sized_bytes[k][b]);
            first = false;
        }
        printf("}");
    }
    printf("}");
}

static void print_json(const char *path, const gm_trace *t, const gm_config *cfg, const char *conf,
                       int device, uint64_t capacity, const gm_replay_result *r) {
    printf("{\"trace\":");
    cli_json_string(stdout, path);
    printf(",\"format\":\"%s\",\"device\":%d,\"events\":%llu,\"policy\":\"%s\",\"conf\":", t->format,
           device, (unsigned long long)r->events, gm_policy_name((int)cfg->policy));
    cli_json_string(stdout, conf);
    printf(",\"capacity\":%llu,\"peak_requested\":%lld,\"peak_allocated\":%lld,"
           "\"peak_reserved\":%lld,\"trace_peak_requested\":%lld,\"ratio\":%.6f,\"segments\":%lld,"
           "\"num_alloc_retries\":%lld,\"num_ooms\":%lld,\"allocs\":%llu,\"frees\":%llu,"
           "\"unknown_frees\":%llu,\"double_allocs\":%llu,\"oom\":%s",
           (unsigned long long)capacity, (long long)r->peak_requested, (long long)r->peak_allocated,
           (long long)r->peak_reserved, (long long)r->trace_peak_requested,
           r->peak_requested ? (double)r->peak_reserved / (double)r->peak_requested : 0.0,
           (long long)r->segments, (long long)r->num_alloc_retries, (long long)r->num_ooms,
           (unsigned long long)r->allocs, (unsigned long long)r->frees,
           (unsigned long long)r->unknown_frees, (unsigned long long)r->double_allocs,
           r->oom ? "true" : "false");
    if (r->private_pools) /* only then, as below */
        printf(",\"private_pools\":%u", (unsigned)r->private_pools);
    if (r->bad_events) { /* only then: a well-formed trace's output is unchanged */
        printf(",\"bad_events\":%llu,\"bad_event\":", (unsigned long long)r->bad_events);
        cli_json_string(stdout, r->bad_first);
    }
    if (r->oom) {
        printf(",\"oom_event\":%zu,\"oom_size\":%llu,\"oom_detail\":", r->oom_event,
               (unsigned long long)r->oom_size);
        cli_json_string(stdout, r->oom_detail);
    }
    if (r->error) {
        printf(",\"error\":");
        cli_json_string(stdout, r->error_detail);
    }
    int64_t calls[GM_REPLAY_CALL_KINDS];
    gm__replay_calls(r, calls);
    printf(",\"device_calls\":{");
    for (int k = 0; k < GM_REPLAY_CALL_KINDS; k++)
        printf("%s\"%s\":%lld", k ? "," : "", gm__replay_call_names[k], (long long)calls[k]);
    printf("},\"seconds\":%.6f", r->seconds);
    print_sized(r);
    printf(",\"steady_from\":%g,\"steady_peak_reserved\":%lld,\"steady_peak_requested\":%lld,"
           "\"steady_ratio\":%.6f,\"steady_device_calls\":%lld,\"steady_device_calls_by_kind\":{",
           r->steady_from, (long long)r->steady_peak_reserved, (long long)r->steady_peak_requested,
           r->steady_peak_requested ? (double)r->steady_peak_reserved / (double)r->steady_peak_requested : 0.0,
           (long long)r->steady_device_calls);
    for (int k = 0; k < GM_REPLAY_CALL_KINDS; k++)
        printf("%s\"%s\":%lld", k ? "," : "", gm__replay_call_names[k], (long long)r->steady_calls[k]);
    printf("},\"stream_waits\":%lld,\"steady_stream_waits\":%lld}\n", (long long)r->stream_waits,
           (long long)r->steady_stream_waits);
}

static void print_text(const char *path, const gm_trace *t, const gm_config *cfg, const char *conf,
                       int device, uint64_t capacity, const gm_replay_result *r) {
    char a[32], b[32], c[32];
    printf("trace           %s (%s, %llu events on device %d of %d)\n", path, t->format,
           (unsigned long long)r->events, device, t->ndevices);
    printf("policy          %s, conf \"%s\"\n", gm_policy_name((int)cfg->policy), conf);
    printf("capacity        %s\n", cli_format_bytes(capacity, a, sizeof a));
    printf("peak requested  %-12s (%lld bytes)\n", cli_format_bytes((uint64_t)r->peak_requested, a, sizeof a),
           (long long)r->peak_requested);
    printf("peak allocated  %-12s (%lld bytes)\n", cli_format_bytes((uint64_t)r->peak_allocated, b, sizeof b),
           (long long)r->peak_allocated);
    printf("peak reserved   %-12s (%lld bytes)\n", cli_format_bytes((uint64_t)r->peak_reserved, c, sizeof c),
           (long long)r->peak_reserved);
    printf("reserved/requested  %.4f\n",
           r->peak_requested ? (double)r->peak_reserved / (double)r->peak_requested : 0.0);
    printf("segments        %lld allocated, retries %lld\n", (long long)r->segments,
           (long long)r->num_alloc_retries);
    int64_t calls[GM_REPLAY_CALL_KINDS];
    gm__replay_calls(r, calls);
    printf("device calls   ");
    for (int k = 0; k < GM_REPLAY_CALL_KINDS; k++) { /* "device_alloc" reads "alloc" here */
        const char *name = gm__replay_call_names[k];
        if (!strncmp(name, "device_", 7)) name += 7;
        printf("%s %s %lld", k ? "," : "", name, (long long)calls[k]);
    }
    printf("\n");
    if (r->stream_waits) /* policy:gpumem's moves of memory freed since its stream last ran dry */
        printf("stream waits    %lld (the host waited for a stream before memory moved)\n",
               (long long)r->stream_waits);
    if (r->steady_started) {
        printf("steady state    from %.0f%% of the trace: peak reserved %s, requested %s (%.4f), "
               "device calls %lld",
               r->steady_from * 100.0, cli_format_bytes((uint64_t)r->steady_peak_reserved, a, sizeof a),
               cli_format_bytes((uint64_t)r->steady_peak_requested, b, sizeof b),
               r->steady_peak_requested ? (double)r->steady_peak_reserved / (double)r->steady_peak_requested : 0.0,
               (long long)r->steady_device_calls);
        if (r->stream_waits) printf(", stream waits %lld", (long long)r->steady_stream_waits);
        printf("\n");
    }
    if (r->unknown_frees || r->double_allocs)
        printf("trace anomalies %llu frees of unknown addresses, %llu allocs of live addresses "
               "(skipped)\n", (unsigned long long)r->unknown_frees,
               (unsigned long long)r->double_allocs);
    if (r->private_pools)
        printf("private pools   %u (CUDA graphs, MemPools: allocations in their segments replay into them)\n",
               (unsigned)r->private_pools);
    if (r->bad_events)
        printf("trace anomalies %llu events no device could have made (skipped); first: %s\n",
               (unsigned long long)r->bad_events, r->bad_first);
    if (r->oom)
        printf("OOM             YES at event %zu asking %s: %s\n", r->oom_event,
               cli_format_bytes(r->oom_size, a, sizeof a), r->oom_detail);
    else
        printf("OOM             no\n");
    if (r->error) printf("replay error    %s\n", r->error_detail);
    printf("replay          %.3f s, %.2f M events/s\n", r->seconds,
           r->seconds > 0 ? (double)r->events / r->seconds / 1e6 : 0.0);
}

int cmd_replay(int argc, char **argv) {
    const char *cmd = argv[0], *conf = "", *policy = NULL;
    uint64_t capacity = 0;
    double steady_from = GM_REPLAY_STEADY_FROM;
    long long device = 0;
    bool json = false;
    const struct cli_opt opts[] = {
        {"policy", 0, CLI_STR, &policy, "NAME", "allocator policy (same as --conf policy:NAME)", "torch", 0, 0},
        CLI_OPT_CONF(&conf),
        CLI_OPT_CAPACITY(&capacity),
        CLI_OPT_DEVICE(&device),
        {"steady-from", 0, CLI_DOUBLE, &steady_from, "F",
         "the steady state (steady_* figures) starts at this fraction of the trace", "0.5", 0, 0.999},
        CLI_OPT_JSON(&json),
    };
    const struct cli_spec spec = {
        .cmd = cmd, .args = "TRACE", .opts = opts, .nopts = CLI_NOPTS(opts), .min_pos = 1, .max_pos = 1,
        .about = "Replays TRACE (a torch.cuda.memory snapshot pickle, gzip or not, or a .gmt trace;\n"
                 "'-' reads standard input) on a simulated GPU and reports peak requested,\n"
                 "allocated and reserved memory, segments, retries, OOM and device calls.",
        .epilog = "Exit status: 0 replayed (even if it predicts an OOM), 1 unreadable trace, 2 bad usage.",
    };
    char *path = NULL;
    int prc = cli_parse(&spec, argc, argv, &path, NULL);
    if (prc) return cli_parse_exit(prc);
    if (policy && strstr(conf, "policy")) /* one source for the policy, not a silent override */
        return cli_usage_error(cmd, "the policy is given twice (--policy %s and in --conf); give it once",
                               policy);
    /* --policy P is policy:P ahead of --conf, so P's own keys are accepted after it */
    char full[1024];
    snprintf(full, sizeof full, "%s%s%s%s", policy ? "policy:" : "", policy ? policy : "",
             policy && *conf ? "," : "", conf);
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256] = "";
    if (cli_config_parse(&cfg, full, err, sizeof err) != GM_OK)
        return cli_usage_error(cmd, "bad %s: %s", policy ? "--policy/--conf" : "--conf", err);
    if (!strcmp(cfg.backend, "cudaMallocAsync"))
        fprintf(stderr, "gpumem %s: note: backend:cudaMallocAsync is not modelled; replaying torch's "
                        "caching allocator (backend:native) instead\n", cmd);
    gm_sim_options so;
    gm_sim_options_init(&so);
    if (!capacity) capacity = so.capacity;
    gm_trace *t;
    int rc = gm__trace_load_file(path, &t);
    if (rc) return cli_error(cmd, "%s", gm_last_error_detail());
    if (cli_require_history(cmd, path, t, device)) {
        gm__trace_free(t);
        return 1;
    }
    gm_replay_prog *p;
    rc = gm__replay_compile(t, device, &p);
    if (rc) {
        gm__trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    gm_replay_result r;
    rc = gm__replay_run_steady(p, &cfg, capacity, steady_from, &r);
    if (rc) {
        cli_error(cmd, "%s", gm_last_error_detail());
    } else {
        char canon[512];
        if (gm_config_format(&cfg, canon, sizeof canon) != GM_OK) snprintf(canon, sizeof canon, "%s", conf);
        if (json) print_json(path, t, &cfg, canon, device, capacity, &r);
        else print_text(path, t, &cfg, canon, device, capacity, &r);
        if (r.error) rc = 1;
    }
    gm__replay_prog_free(p);
    gm__trace_free(t);
    return rc ? 1 : 0;
}
