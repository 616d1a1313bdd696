/* cmd_log.c — `gpumem log`: sample GPU and allocator memory every --interval
 * seconds and append JSON lines (one object per sample) or CSV (one line per
 * process and GPU) to stdout or a file, for --count samples or until killed. */
#include "cli.h"

#include "monitor/monitor.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { stop_requested = sig; }

static void usage(FILE *f) {
    fprintf(f, "usage: gpumem log [--interval SEC] [--format jsonl|csv] [--output FILE] [--count N] [--no-nvml]\n"
               "  Sample every SEC seconds (default 1) until interrupted or N samples were written.\n");
}

static void sleep_until(const struct timespec *t) {
    while (!stop_requested && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, t, NULL) == EINTR) {
    }
}

static int run(const char *cmd, FILE *out, bool csv, double interval, long count, bool nvml) {
    gm__collector *c;
    if (gm__collector_create(&c, NULL, nvml) != 0) return cli_error(cmd, "out of memory");
    gm__sbuf b = {0};
    if (csv) gm__format_csv_header(&b);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    int code = 0;
    for (long n = 0; !stop_requested && (count <= 0 || n < count); n++) {
        if (n > 0) {
            double t = (double)next.tv_nsec + interval * 1e9;
            next.tv_sec += (time_t)(t / 1e9);
            next.tv_nsec = (long)(t - (double)(time_t)(t / 1e9) * 1e9);
            sleep_until(&next);
            if (stop_requested) break;
        }
        gm__mon_sample s;
        if (gm__collector_sample(c, &s) != 0) {
            code = cli_error(cmd, "sampling failed");
            break;
        }
        if (csv) gm__format_csv(&s, &b);
        else gm__format_json(&s, &b, true);
        gm__sample_free(&s);
        if (b.oom || fwrite(b.p, 1, b.len, out) != b.len || fflush(out) != 0) {
            code = cli_error(cmd, "cannot write the log: %s", b.oom ? "out of memory" : strerror(errno));
            break;
        }
        b.len = 0;
    }
    gm__sbuf_free(&b);
    gm__collector_destroy(c);
    return code;
}

int cmd_log(int argc, char **argv) {
    double interval = 1.0;
    const char *format = "jsonl", *output = NULL;
    long count = 0;
    bool nvml = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--interval") && v) {
            interval = strtod(v, &end);
            if (*end || !(interval >= 0.001 && interval <= 86400))
                return cli_usage_error(argv[0], "--interval must be seconds between 0.001 and 86400, not '%s'", v);
            i++;
        } else if (!strcmp(a, "--format") && v) format = argv[++i];
        else if (!strcmp(a, "--output") && v) output = argv[++i];
        else if (!strcmp(a, "--count") && v) {
            count = strtol(v, &end, 10);
            if (*end || count <= 0) return cli_usage_error(argv[0], "--count must be a positive integer, not '%s'", v);
            i++;
        } else if (!strcmp(a, "--no-nvml")) nvml = false;
        else return cli_usage_error(argv[0], "unknown or incomplete argument '%s' (see --help)", a);
    }
    bool csv = !strcmp(format, "csv");
    if (!csv && strcmp(format, "jsonl")) return cli_usage_error(argv[0], "--format must be jsonl or csv, not '%s'", format);
    FILE *out = stdout;
    if (output && !(out = fopen(output, "a")))
        return cli_error(argv[0], "cannot open '%s': %s", output, strerror(errno));
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int code = run(argv[0], out, csv, interval, count, nvml);
    if (out != stdout) fclose(out);
    return code;
}
