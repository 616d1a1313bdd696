/* cmd_smi.c — `gpumem smi`: one sample of every GPU (NVML) and every process
 * that publishes allocator stats, printed once as a table, CSV or JSON. */
#include "cli.h"

#include "monitor/monitor.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: gpumem smi [--format table|csv|json] [--no-nvml]\n"
               "  One-shot view of every GPU (NVML) and every process publishing gpumem\n"
               "  allocator stats. CSV/JSON give bytes as integers, empty/null when not available.\n"
               "  --no-nvml   do not load libnvidia-ml.so.1 (allocator data only)\n");
}

int cmd_smi(int argc, char **argv) {
    const char *format = "table";
    bool nvml = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--format") && i + 1 < argc) format = argv[++i];
        else if (!strncmp(argv[i], "--format=", 9)) format = argv[i] + 9;
        else if (!strcmp(argv[i], "--no-nvml")) nvml = false;
        else return cli_usage_error(argv[0], "unknown argument '%s' (see --help)", argv[i]);
    }
    if (strcmp(format, "table") && strcmp(format, "csv") && strcmp(format, "json"))
        return cli_usage_error(argv[0], "--format must be table, csv or json, not '%s'", format);
    gm__collector *c;
    gm__mon_sample s;
    if (gm__collector_create(&c, NULL, nvml) != 0) return cli_error(argv[0], "out of memory");
    int rc = gm__collector_sample(c, &s);
    if (rc != 0) {
        gm__collector_destroy(c);
        return cli_error(argv[0], "sampling failed (status %d)", rc);
    }
    gm__sbuf b = {0};
    if (!strcmp(format, "json")) gm__format_json(&s, &b, false);
    else if (!strcmp(format, "csv")) {
        gm__format_csv_header(&b);
        gm__format_csv(&s, &b);
    } else gm__format_table(&s, &b);
    int code = 0;
    if (b.oom) code = cli_error(argv[0], "out of memory");
    else fwrite(b.p, 1, b.len, stdout);
    gm__sbuf_free(&b);
    gm__sample_free(&s);
    gm__collector_destroy(c);
    return code;
}
