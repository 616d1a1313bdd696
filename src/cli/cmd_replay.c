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

static int usage(const char *cmd, FILE *f) {
    fprintf(f,
            "usage: gpumem %s TRACE [--policy torch|gpumem] [--conf STR] [--capacity SIZE]\n"
            "                     [--device N] [--json]\n\n"
            "Replays TRACE (a torch.cuda.memory snapshot pickle, gzip or not, or a .gmt trace)\n"
            "on a simulated GPU of SIZE bytes (default 141GiB) and reports peak requested,\n"
            "allocated and reserved memory, segments, retries, OOM and device calls.\n"
            "  --conf STR    allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax\n"
            "  --policy P    torch (default: a model of PyTorch's caching allocator) or gpumem\n"
            "  --json        one JSON object on stdout\n"
            "Exit status: 0 replayed (even if it predicts an OOM), 1 unreadable trace, 2 bad usage.\n",
            cmd);
    return f == stdout ? 0 : 2;
}

/* A JSON string with escapes. */
static void cli_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* "device_call_sizes":{"phys_create":{"21":[calls,bytes],...},...}: calls of
 * 2^21..2^22-1 bytes and their total, so a cost model per size can be applied
 * (tools/first_pass_cost.py). */
static void print_sized(const gm_replay_result *r) {
    printf(",\"device_call_sizes\":{");
    for (int k = 0; k < GM_REPLAY_SIZED; k++) {
        printf("%s\"%s\":{", k ? "," : "", gm_replay_sized_names[k]);
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
           device, (unsigned long long)r->events, cfg->policy == GM_POLICY_GPUMEM ? "gpumem" : "torch");
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
    printf(",\"device_calls\":{\"device_alloc\":%lld,\"device_free\":%lld,\"va_reserve\":%lld,"
           "\"va_release\":%lld,\"phys_create\":%lld,\"phys_release\":%lld,\"map\":%lld,"
           "\"unmap\":%lld},\"seconds\":%.6f",
           (long long)r->num_device_alloc, (long long)r->num_device_free,
           (long long)r->num_va_reserve, (long long)r->num_va_release,
           (long long)r->num_phys_create, (long long)r->num_phys_release, (long long)r->num_map,
           (long long)r->num_unmap, r->seconds);
    print_sized(r);
    printf("}\n");
}

static void print_text(const char *path, const gm_trace *t, const gm_config *cfg, const char *conf,
                       int device, uint64_t capacity, const gm_replay_result *r) {
    char a[32], b[32], c[32];
    printf("trace           %s (%s, %llu events on device %d of %d)\n", path, t->format,
           (unsigned long long)r->events, device, t->ndevices);
    printf("policy          %s, conf \"%s\"\n", cfg->policy == GM_POLICY_GPUMEM ? "gpumem" : "torch",
           conf);
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
    printf("device calls    alloc %lld, free %lld, va_reserve %lld, va_release %lld, phys_create %lld, "
           "phys_release %lld, map %lld, unmap %lld\n",
           (long long)r->num_device_alloc, (long long)r->num_device_free,
           (long long)r->num_va_reserve, (long long)r->num_va_release,
           (long long)r->num_phys_create, (long long)r->num_phys_release, (long long)r->num_map,
           (long long)r->num_unmap);
    if (r->unknown_frees || r->double_allocs)
        printf("trace anomalies %llu frees of unknown addresses, %llu allocs of live addresses "
               "(skipped)\n", (unsigned long long)r->unknown_frees,
               (unsigned long long)r->double_allocs);
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
    const char *cmd = argv[0], *path = NULL, *conf = "", *policy = NULL;
    uint64_t capacity = 0;
    int device = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return usage(cmd, stdout);
        else if (!strcmp(o, "--json")) json = true;
        else if (!strcmp(o, "--conf") && has) conf = argv[++i];
        else if (!strcmp(o, "--policy") && has) policy = argv[++i];
        else if (!strcmp(o, "--capacity") && has) {
            if (!cli_parse_size(argv[++i], &capacity) || capacity == 0)
                return cli_usage_error(cmd, "bad --capacity '%s' (e.g. 80GiB)", argv[i]);
        } else if (!strcmp(o, "--device") && has) {
            char *end;
            long d = strtol(argv[++i], &end, 10);
            if (*end || d < 0 || d > 255) return cli_usage_error(cmd, "bad --device '%s'", argv[i]);
            device = (int)d;
        } else if (o[0] == '-' && o[1]) {
            return cli_usage_error(cmd, "unknown or incomplete option '%s' (see --help)", o);
        } else if (!path) path = o;
        else return cli_usage_error(cmd, "more than one trace given ('%s')", o);
    }
    if (!path) return usage(cmd, stderr);
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256] = "";
    if (gm_config_parse(&cfg, conf, err, sizeof err) != GM_OK)
        return cli_usage_error(cmd, "bad --conf: %s", err);
    if (policy) {
        char pol[64];
        snprintf(pol, sizeof pol, "policy:%s", policy);
        if (gm_config_parse(&cfg, pol, err, sizeof err) != GM_OK)
            return cli_usage_error(cmd, "bad --policy '%s': %s", policy, err);
    }
    gm_sim_options so;
    gm_sim_options_init(&so);
    if (!capacity) capacity = so.capacity;
    gm_trace *t;
    int rc = gm_trace_load_file(path, &t);
    if (rc) return cli_error(cmd, "%s", gm_last_error_detail());
    gm_replay_prog *p;
    rc = gm_replay_compile(t, device, &p);
    if (rc) {
        gm_trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    gm_replay_result r;
    rc = gm_replay_run(p, &cfg, capacity, &r);
    if (rc) {
        cli_error(cmd, "%s", gm_last_error_detail());
    } else {
        char canon[512];
        if (gm_config_format(&cfg, canon, sizeof canon) != GM_OK) snprintf(canon, sizeof canon, "%s", conf);
        if (json) print_json(path, t, &cfg, canon, device, capacity, &r);
        else print_text(path, t, &cfg, canon, device, capacity, &r);
        if (r.error) rc = 1;
    }
    gm_replay_prog_free(p);
    gm_trace_free(t);
    return rc ? 1 : 0;
}
