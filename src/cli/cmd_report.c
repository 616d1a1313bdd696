/* cmd_report.c — 'gpumem report': where the memory went, from a PyTorch
 * memory snapshot or a gpumem trace. Attribution by category, the timeline
 * replayed under the torch policy, the frame/scope table, as one
 * self-contained HTML file, as text, or as a Chrome/Perfetto trace. The
 * work lives in src/report/. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "report/report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int usage(const char *cmd, FILE *f) {
    fprintf(f,
            "usage: gpumem %s TRACE [-o FILE.html] [--text | --json] [--perfetto FILE.json]\n"
            "                     [--conf STR] [--device N] [--points N] [--rows N]\n\n"
            "Attributes every allocation of TRACE (a torch.cuda.memory snapshot pickle, gzip or\n"
            "not, or a .gmt trace) to parameters, gradients, optimizer state, activations,\n"
            "temporaries or other, replays it under the torch policy for reserved memory, and\n"
            "writes the report.\n"
            "  -o FILE        self-contained HTML report (no network needed to view it)\n"
            "  --text         the tables on stdout (the default when neither -o nor --perfetto)\n"
            "  --json         the peak breakdown as one JSON object on stdout (instead of --text)\n"
            "  --perfetto F   Chrome trace JSON: counter tracks per category, phase slices\n"
            "  --conf STR     allocator settings to replay under (PYTORCH_CUDA_ALLOC_CONF syntax;\n"
            "                 default: the settings recorded in the trace)\n"
            "  --device N     device of the trace (default 0)\n"
            "  --points N     timeline points kept (default 6000; peaks are never dropped)\n"
            "  --rows N       frame table rows (default 30 in text, 300 in HTML)\n"
            "Exit status: 0 written, 1 unreadable trace or unwritable output, 2 bad usage.\n",
            cmd);
    return f == stdout ? 0 : 2;
}

static bool parse_count(const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || !*s || v < min || v > max) return false;
    *out = v;
    return true;
}

static FILE *open_out(const char *cmd, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) cli_error(cmd, "cannot write '%s': %s", path, strerror(errno));
    return f;
}

static int close_out(const char *cmd, const char *path, FILE *f, int wrc) {
    int rc = fclose(f);
    if (wrc || rc) return cli_error(cmd, "writing '%s' failed: %s", path, strerror(errno));
    return 0;
}

int cmd_report(int argc, char **argv) {
    const char *cmd = argv[0], *path = NULL, *html = NULL, *perfetto = NULL, *conf = NULL;
    bool text = false, json = false;
    long device = 0, points = 6000, rows_max = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return usage(cmd, stdout);
        else if (!strcmp(o, "--text")) text = true;
        else if (!strcmp(o, "--json")) json = true;
        else if ((!strcmp(o, "-o") || !strcmp(o, "--output")) && has) html = argv[++i];
        else if (!strcmp(o, "--perfetto") && has) perfetto = argv[++i];
        else if (!strcmp(o, "--conf") && has) conf = argv[++i];
        else if (!strcmp(o, "--device") && has) {
            if (!parse_count(argv[++i], 0, 255, &device))
                return cli_usage_error(cmd, "bad --device '%s' (0..255)", argv[i]);
        } else if (!strcmp(o, "--points") && has) {
            if (!parse_count(argv[++i], 6, 10000000, &points))
                return cli_usage_error(cmd, "bad --points '%s' (6..10000000)", argv[i]);
        } else if (!strcmp(o, "--rows") && has) {
            if (!parse_count(argv[++i], 1, 1000000, &rows_max))
                return cli_usage_error(cmd, "bad --rows '%s' (1..1000000)", argv[i]);
        } else if (o[0] == '-' && o[1]) {
            return cli_usage_error(cmd, "unknown or incomplete option '%s'; see 'gpumem %s --help'", o, cmd);
        } else if (!path) path = o;
        else return cli_usage_error(cmd, "more than one trace given ('%s')", o);
    }
    if (!path) return usage(cmd, stderr);
    if (text && json) return cli_usage_error(cmd, "--text and --json both write to stdout; choose one");
    if (!html && !perfetto && !json) text = true;

    gm_trace *t;
    if (gm_trace_load_file(path, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256] = "";
    const char *use_conf = conf ? conf : t->alloc_conf ? t->alloc_conf : "";
    if (gm_config_parse(&cfg, use_conf, err, sizeof err) != GM_OK) {
        if (conf) {
            gm_trace_free(t);
            return cli_usage_error(cmd, "bad --conf: %s", err);
        }
        fprintf(stderr, "gpumem %s: the trace's recorded settings \"%s\" do not parse (%s); replaying "
                        "under the defaults (choose with --conf)\n", cmd, use_conf, err);
        gm_config_init(&cfg);
    }
    if (cfg.policy != GM_POLICY_TORCH) gm_config_parse(&cfg, "policy:torch", err, sizeof err);

    gm_attribution *a = NULL;
    gm_timeline *tl = NULL;
    gm_frame_row *rows = NULL;
    size_t nrows = 0;
    int rc = gm_attribute(t, (int)device, &a);
    if (!rc) rc = gm_timeline_build(a, &cfg, (size_t)points, &tl);
    if (!rc) rc = gm_frame_table(a, &rows, &nrows);
    if (rc) {
        rc = cli_error(cmd, "%s: %s", path, gm_last_error_detail());
        goto out;
    }
    gm_report_opts ro = {path, (size_t)rows_max};
    if (html) {
        FILE *f = open_out(cmd, html);
        if (!f || (rc = close_out(cmd, html, f, gm_report_write_html(f, a, tl, rows, nrows, &ro)))) {
            rc = 1;
            goto out;
        }
    }
    if (perfetto) {
        FILE *f = open_out(cmd, perfetto);
        if (!f || (rc = close_out(cmd, perfetto, f, gm_report_write_perfetto(f, a, tl)))) {
            rc = 1;
            goto out;
        }
    }
    if (text) gm_report_write_text(stdout, a, tl, rows, nrows, &ro);
    if (json) gm_report_write_json(stdout, a, tl, &ro);
out:
    free(rows);
    gm_timeline_free(tl);
    gm_attribution_free(a);
    gm_trace_free(t);
    return rc;
}
