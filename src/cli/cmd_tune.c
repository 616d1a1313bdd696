/* cmd_tune.c — 'gpumem tune': replays one trace under a grid of PyTorch
 * allocator settings (torch policy) and under gpumem's own policy, and ranks
 * them by predicted peak reserved memory, with the exact line to use and a
 * flag on settings that would run out of memory at the given capacity.
 * gpumem's policy runs at the settings its table lists (src/policy/table.c),
 * with the device calls of each: less slack = less memory, but idle memory
 * moves (unmap + map) in more steps; the default holds a 1.5% reserve budget
 * and moves idle memory past it; gpumem_slack:inf,gpumem_chunks:run moves
 * it only under memory pressure, so a warm step makes almost no device calls.
 *
 * The grid, the replays and the choice of the best and recommended settings
 * are the library's (src/trace/tune.c, from the policy table); the table is
 * cli_tune.c's, shared with 'gpumem advise'. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>

int cmd_tune(int argc, char **argv) {
    const char *cmd = argv[0];
    uint64_t capacity = 0;
    long long device = 0;
    bool json = false;
    const struct cli_opt opts[] = {
        CLI_OPT_CAPACITY(&capacity),
        CLI_OPT_DEVICE(&device),
        CLI_OPT_JSON(&json),
    };
    const struct cli_spec spec = {
        .cmd = cmd, .args = "TRACE", .opts = opts, .nopts = CLI_NOPTS(opts), .min_pos = 1, .max_pos = 1,
        .about = "Replays TRACE under a grid of PYTORCH_CUDA_ALLOC_CONF settings and under\n"
                 "gpumem's policy on a simulated GPU, and ranks them by predicted peak reserved\n"
                 "memory ('-' reads the trace from standard input).",
        .epilog = "Exit status: 0 ranked, 1 unreadable trace, 2 bad usage.",
    };
    char *path = NULL;
    int prc = cli_parse(&spec, argc, argv, &path, NULL);
    if (prc) return cli_parse_exit(prc);
    gm_tune_entry *rows;
    gm_tune_choice choice;
    int n;
    double secs;
    int rc = cli_tune_trace(cmd, path, (int)device, &capacity, NULL, &rows, &n, &choice, &secs);
    if (rc) return rc;
    if (json) {
        printf("{\"trace\":");
        cli_json_string(stdout, path);
        printf(",\"capacity\":%llu,\"seconds\":%.3f,", (unsigned long long)capacity, secs);
        cli_tune_print_json(rows, n, &choice, capacity);
        printf("}\n");
    } else {
        cli_tune_print_text(path, capacity, rows, n, &choice, secs);
    }
    free(rows);
    return 0;
}
