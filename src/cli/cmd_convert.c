/* cmd_convert.c — 'gpumem convert': turns a PyTorch memory snapshot (or a
 * gmt trace) into gpumem's own trace format (docs/trace-format.md), which
 * is several times smaller and loads without unpickling. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <string.h>

int cmd_convert(int argc, char **argv) {
    const char *cmd = argv[0], *in = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            printf("usage: gpumem %s SNAPSHOT -o OUT.gmt\n\n"
                   "Writes SNAPSHOT (a torch.cuda.memory snapshot pickle, gzip or not, or a gmt\n"
                   "trace) in the gpumem trace format; 'gpumem replay' and 'tune' read both.\n", cmd);
            return 0;
        } else if ((!strcmp(o, "-o") || !strcmp(o, "--output")) && i + 1 < argc) out = argv[++i];
        else if (o[0] == '-' && o[1]) return cli_usage_error(cmd, "unknown or incomplete option '%s'", o);
        else if (!in) in = o;
        else return cli_usage_error(cmd, "more than one input given ('%s')", o);
    }
    if (!in || !out) return cli_usage_error(cmd, "usage: gpumem convert SNAPSHOT -o OUT.gmt");
    gm_trace *t;
    if (gm_trace_load_file(in, &t)) return cli_error(cmd, "%s", gm_last_error_detail());
    int rc = gm_trace_write_gmt(t, out);
    if (rc) {
        gm_trace_free(t);
        return cli_error(cmd, "%s", gm_last_error_detail());
    }
    fprintf(stderr, "gpumem convert: %s -> %s: %zu events on %d device(s), %u stacks, %zu segments\n",
            in, out, t->nevents, t->ndevices, t->nstacks, t->nsegments);
    gm_trace_free(t);
    return 0;
}
