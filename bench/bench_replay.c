/* bench_replay.c — replay speed: trace events per second for each policy on
 * each trace (target >= 5 M events/s per policy), the load time of each
 * trace (pickle and gmt), and the time of a tune-sized grid. Reports only;
 * never fails on timing.
 * Usage: bench_replay [TRACE...]   (default: $GPUMEM_SHARED/traces/\*.pickle.gz,
 * GPUMEM_SHARED defaulting to ../shared next to the source tree) */
#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bench_one(const char *path) {
    double t0 = now_s();
    gm_trace *t;
    if (gm__trace_load_file(path, &t)) {
        printf("%s: %s\n", path, gm_last_error_detail());
        return;
    }
    double load = now_s() - t0;
    uint8_t *buf;
    size_t len;
    double gmt_load = 0;
    if (gm__trace_encode_gmt(t, &buf, &len) == GM_OK) {
        gm_trace *t2;
        t0 = now_s();
        if (gm__trace_decode_gmt(buf, len, &t2) == GM_OK) gm__trace_free(t2);
        gmt_load = now_s() - t0;
        free(buf);
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    printf("%-34s %8zu events  load %.3f s (gmt %.3f s, %zu KiB)\n", base, t->nevents, load, gmt_load,
           len / 1024);
    gm_replay_prog *p;
    if (gm__replay_compile(t, 0, &p)) {
        printf("  compile: %s\n", gm_last_error_detail());
        gm__trace_free(t);
        return;
    }
    static const char *confs[] = {"", "expandable_segments:True", "policy:gpumem"};
    for (int c = 0; c < 3; c++) {
        gm_config cfg;
        gm_config_init(&cfg);
        char err[128];
        if (gm_config_parse(&cfg, confs[c], err, sizeof err)) continue;
        double best = 1e9;
        gm_replay_result r;
        for (int rep = 0; rep < 3; rep++) {
            gm__replay_run(p, &cfg, 0, &r);
            if (r.seconds < best) best = r.seconds;
        }
        printf("  %-28s %7.2f M events/s  (%.3f s, peak reserved %lld)%s\n",
               confs[c][0] ? confs[c] : "torch default", (double)t->nevents / best / 1e6, best,
               (long long)r.peak_reserved, r.oom || r.error ? " [OOM/error]" : "");
    }
    gm__replay_prog_free(p);
    gm__trace_free(t);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        for (int i = 1; i < argc; i++) bench_one(argv[i]);
        return 0;
    }
    const char *sh = getenv("GPUMEM_SHARED");
    char pat[4096];
    snprintf(pat, sizeof pat, "%s/traces/*.pickle.gz", sh ? sh : "../shared");
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0) {
        printf("no traces at %s (set GPUMEM_SHARED or pass paths)\n", pat);
        return 0;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) bench_one(g.gl_pathv[i]);
    globfree(&g);
    return 0;
}
