/* cmd_smi.c — `gpumem smi`: one sample of every GPU (NVML) and every process
 * that publishes allocator stats, printed once as a table, CSV or JSON. */
#include "cli.h"

#include "monitor/monitor.h"

#include <stdlib.h>
#include <string.h>

int cmd_smi(int argc, char **argv) {
    const char *format = "table";
    bool no_nvml = false, all_users = false;
    const struct cli_opt opts[] = {
        {"format", 0, CLI_CHOICE, &format, "table|csv|json",
         "CSV/JSON give bytes as integers, empty/null when not available", "table", 0, 0},
        CLI_OPT_NO_NVML(&no_nvml),
        CLI_OPT_ALL_USERS(&all_users),
    };
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "", .opts = opts, .nopts = CLI_NOPTS(opts),
        .about = "One-shot view of every GPU (NVML) and every process publishing gpumem\n"
                 "allocator stats.",
    };
    int prc = cli_parse(&spec, argc, argv, NULL, NULL);
    if (prc) return cli_parse_exit(prc);
    bool nvml = !no_nvml;
    gm__collector *c;
    gm__mon_sample s;
    if (gm__collector_create(&c, NULL, nvml) != 0) return cli_error(argv[0], "out of memory");
    gm__collector_all_users(c, all_users);
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
