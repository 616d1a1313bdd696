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

static void sleep_until(const struct timespec *t) {
    while (!stop_requested && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, t, NULL) == EINTR) {
    }
}

static int run(const char *cmd, FILE *out, bool csv, double interval, long long count, bool nvml, bool all_users) {
    gm__collector *c;
    if (gm__collector_create(&c, NULL, nvml) != 0) return cli_error(cmd, "out of memory");
    gm__collector_all_users(c, all_users);
    gm__sbuf b = {0};
    if (csv) gm__format_csv_header(&b);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    int code = 0;
    for (long long n = 0; !stop_requested && (count <= 0 || n < count); n++) {
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
    long long count = 0;
    bool no_nvml = false, all_users = false;
    const struct cli_opt opts[] = {
        CLI_OPT_INTERVAL(&interval, "1"),
        {"format", 0, CLI_CHOICE, &format, "jsonl|csv", "one JSON object per sample, or CSV rows", "jsonl", 0, 0},
        {"output", 'o', CLI_STR, &output, "FILE", "append to FILE instead of standard output", NULL, 0, 0},
        {"count", 0, CLI_INT, &count, "N", "stop after N samples (default: until interrupted)", NULL, 1, 1e12},
        CLI_OPT_NO_NVML(&no_nvml),
        CLI_OPT_ALL_USERS(&all_users),
    };
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "", .opts = opts, .nopts = CLI_NOPTS(opts),
        .about = "Samples every GPU (NVML) and every process publishing gpumem allocator stats\n"
                 "every SEC seconds until interrupted or N samples were written.",
    };
    int prc = cli_parse(&spec, argc, argv, NULL, NULL);
    if (prc) return cli_parse_exit(prc);
    bool csv = !strcmp(format, "csv"), nvml = !no_nvml;
    FILE *out = stdout;
    cli_out o;
    if (output) {
        if (cli_out_append(&o, argv[0], output)) return 1;
        out = o.o.f;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int code = run(argv[0], out, csv, interval, count, nvml, all_users);
    if (output && cli_out_close(&o, 0, csv ? "CSV rows" : "JSON lines")) code = 1;
    return code;
}
