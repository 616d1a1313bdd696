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
#include <strings.h>

int cmd_report(int argc, char **argv) {
    const char *cmd = argv[0], *html = NULL, *perfetto = NULL, *conf = NULL;
    char *path = NULL;
    bool text = false, json = false;
    long long device = 0, points = 6000, rows_max = 0, top_scopes = 10;
    const struct cli_opt opts[] = {
        {"output", 'o', CLI_STR, &html, "FILE.html|FILE.txt",
         "the report, by extension: .html a self-contained HTML page (no network needed to view it), .txt the "
         "text tables", NULL, 0, 0},
        {"text", 0, CLI_FLAG, &text, NULL, "the tables on stdout (the default when no other output is asked for)",
         NULL, 0, 0},
        {"json", 0, CLI_FLAG, &json, NULL, "the peak breakdown by category and rule as one JSON object on stdout",
         NULL, 0, 0},
        {"perfetto", 0, CLI_STR, &perfetto, "FILE.json",
         "Chrome trace JSON for ui.perfetto.dev: counter tracks per category, phase and scope slices", NULL, 0, 0},
        {"conf", 0, CLI_STR, &conf, "STR",
         "allocator settings to replay under (PYTORCH_CUDA_ALLOC_CONF syntax); default: those recorded in the trace",
         NULL, 0, 0},
        CLI_OPT_DEVICE(&device),
        {"points", 0, CLI_INT, &points, "N", "timeline points kept (peaks are never dropped)", "6000", 6, 1e7},
        {"rows", 0, CLI_INT, &rows_max, "N", "frame table rows", "30 in text, 300 in HTML", 1, 1e6},
        {"scopes", 0, CLI_INT, &top_scopes, "N",
         "scopes per depth in the timeline stacked by scope (HTML, --json), the rest summed as \"" GM_SCOPE_OTHERS
         "\"", "10", 1, 64},
    };
    const struct cli_spec spec = {
        .cmd = cmd, .args = "TRACE", .opts = opts, .nopts = CLI_NOPTS(opts), .min_pos = 1, .max_pos = 1,
        .about = "Attributes every allocation of TRACE (a torch.cuda.memory snapshot pickle, gzip or not, a\n"
                 ".gmt trace, or a gpumem history dump) to parameters, gradients, optimizer state,\n"
                 "activations, temporaries or other, replays it under the torch policy for reserved\n"
                 "memory, and writes the report (docs/report.md).",
        .epilog = "Exit status: 0 written, 1 unreadable trace or unwritable output, 2 bad usage.",
    };
    int prc = cli_parse(&spec, argc, argv, &path, NULL);
    if (prc) return cli_parse_exit(prc);
    if (text && json) return cli_usage_error(cmd, "--text and --json both write to stdout; choose one");
    /* -o's format follows its extension; any other is refused before any work */
    const char *txt = NULL;
    if (html) {
        const char *dot = strrchr(html, '.'), *slash = strrchr(html, '/');
        const char *ext = dot && (!slash || dot > slash) ? dot + 1 : "";
        if (!strcasecmp(ext, "txt") || !strcasecmp(ext, "text")) {
            txt = html;
            html = NULL;
        } else if (strcasecmp(ext, "html") && strcasecmp(ext, "htm")) {
            return cli_usage_error(cmd, "-o %s: the format follows the extension: FILE.html (the HTML page) or "
                                   "FILE.txt (the text tables); for ui.perfetto.dev use --perfetto FILE.json, "
                                   "for JSON --json > FILE.json", html);
        }
    }
    if (!html && !txt && !perfetto && !json) text = true;

    gm_trace *t;
    if (gm__trace_load_file(path, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    if (cli_require_history(cmd, path, t, (int)device)) {
        gm__trace_free(t);
        return 1;
    }
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256] = "";
    const char *use_conf = conf ? conf : t->alloc_conf ? t->alloc_conf : "";
    if (gm_config_parse(&cfg, use_conf, err, sizeof err) != GM_OK) {
        if (conf) {
            gm__trace_free(t);
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
    gm_scope_series *ss = NULL;
    size_t nrows = 0;
    int rc = gm__attribute(t, (int)device, &a);
    if (!rc) rc = gm__timeline_build(a, &cfg, (size_t)points, &tl);
    if (!rc) rc = gm__frame_table(a, &rows, &nrows);
    if (!rc && (html || json)) rc = gm__scope_series_build(a, tl, (size_t)top_scopes, &ss);
    if (rc) {
        rc = cli_error(cmd, "%s: %s", path, gm_last_error_detail());
        goto out;
    }
    gm_report_opts ro = {path, (size_t)rows_max, ss};
    const char *outfile = html ? html : txt;
    const char *inputs[] = {path, outfile, perfetto, NULL}; /* and never one output over the other */
    if (outfile && perfetto && !strcmp(outfile, perfetto)) {
        rc = cli_usage_error(cmd, "-o and --perfetto name the same file '%s'", outfile);
        goto out;
    }
    cli_out o;
    if (txt) {
        inputs[1] = NULL;
        if ((rc = cli_out_open(&o, cmd, txt, inputs)) ||
            (rc = cli_out_close(&o, gm__report_write_text(o.o.f, a, tl, rows, nrows, &ro), "text report")))
            goto out;
    }
    if (html) {
        inputs[1] = NULL;
        if ((rc = cli_out_open(&o, cmd, html, inputs)) ||
            (rc = cli_out_close(&o, gm__report_write_html(o.o.f, a, tl, rows, nrows, &ro), "HTML report")))
            goto out;
    }
    if (perfetto) {
        inputs[1] = NULL;
        if ((rc = cli_out_open(&o, cmd, perfetto, inputs)) ||
            (rc = cli_out_close(&o, gm__report_write_perfetto(o.o.f, a, tl), "Chrome/Perfetto trace (ui.perfetto.dev)")))
            goto out;
    }
    if (text) gm__report_write_text(stdout, a, tl, rows, nrows, &ro);
    if (json) gm__report_write_json(stdout, a, tl, &ro);
out:
    gm__scope_series_free(ss);
    free(rows);
    gm__timeline_free(tl);
    gm__attribution_free(a);
    gm__trace_free(t);
    return rc;
}
