/* cmd_convert.c — 'gpumem convert': turns a PyTorch memory snapshot (or a
 * gmt trace) into gpumem's own trace format (docs/trace-format.md), which
 * is several times smaller and loads without unpickling. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <stdlib.h>


int cmd_convert(int argc, char **argv) {
    const char *cmd = argv[0], *out = NULL;
    const struct cli_opt opts[] = {
        {"output", 'o', CLI_STR, &out, "OUT.gmt", "where to write the gpumem trace (required)", NULL, 0, 0},
    };
    const struct cli_spec spec = {
        .cmd = cmd, .args = "SNAPSHOT", .opts = opts, .nopts = CLI_NOPTS(opts), .min_pos = 1, .max_pos = 1,
        .about = "Writes SNAPSHOT (a torch.cuda.memory snapshot pickle, gzip or not, or a gmt\n"
                 "trace; '-' reads standard input) in the gpumem trace format; 'gpumem replay'\n"
                 "and 'tune' read both.",
    };
    char *in = NULL;
    int prc = cli_parse(&spec, argc, argv, &in, NULL);
    if (prc) return cli_parse_exit(prc);
    if (!out) return cli_usage_error(cmd, "-o OUT.gmt is required (see 'gpumem %s --help')", cmd);
    gm_trace *t;
    if (gm__trace_load_file(in, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = gm__trace_encode_gmt(t, &buf, &len);
    if (rc) {
        gm__trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    const char *inputs[] = {in, NULL};
    cli_out o;
    rc = cli_out_open(&o, cmd, out, inputs);
    if (!rc) {
        char what[160];
        snprintf(what, sizeof what, "%zu events on %d device(s), %u stacks, %zu segments from %s", t->nevents,
                 t->ndevices, t->nstacks, t->nsegments, in);
        rc = cli_out_close(&o, fwrite(buf, 1, len, o.o.f) != len, what);
    }
    free(buf);
    gm__trace_free(t);
    return rc;
}
