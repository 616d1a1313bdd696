/* cmd_run.c — `gpumem run [--conf STR] [--native] [--label L] -- COMMAND...`:
 * runs an unmodified PyTorch program on gpumem's allocator. The work is done
 * by the Python package (python/gpumem/run.py: environment, sitecustomize
 * hook, exec), so this replaces itself with `$GPUMEM_PYTHON -m gpumem run
 * ARGS` (default python3); the exit status and signals are COMMAND's own. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cmd_run(int argc, char **argv) {
    /* The options are parsed here too, for --help and one-line errors like
     * every command's; python/gpumem/run.py reads the same ones. */
    const char *conf = NULL, *label = NULL, *oom_report = NULL;
    bool native = false, no_publish = false;
    const struct cli_opt opts[] = {
        CLI_OPT_CONF(&conf),
        {"native", 0, CLI_FLAG, &native, NULL, "keep PyTorch's allocator; only publish its statistics", NULL, 0, 0},
        {"label", 0, CLI_STR, &label, "L",
         "the name gpumem smi/top show for the process, and its job's run id unless torchrun or SLURM set one",
         "the command name", 0, 0},
        {"no-publish", 0, CLI_FLAG, &no_publish, NULL, "do not publish statistics for gpumem smi/top", NULL, 0, 0},
        {"oom-report", 0, CLI_STR, &oom_report, "DIR",
         "on out of memory, leave a report (verdict: capacity, fragmentation or memory outside the allocator) "
         "and a snapshot in DIR, then raise as usual", NULL, 0, 0},
    };
    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    if (!pos) return cli_error("run", "out of memory");
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "[--] COMMAND [ARGS...]", .opts = opts, .nopts = CLI_NOPTS(opts),
        .min_pos = 1, .max_pos = argc, .stop_at_positional = true,
        .about = "Runs COMMAND (python train.py, torchrun ...) with every Python process it starts on\n"
                 "gpumem's allocator, unmodified; the exit status and signals are COMMAND's own.\n"
                 "Hands over to $GPUMEM_PYTHON -m gpumem run (default python3).",
    };
    int prc = cli_parse(&spec, argc, argv, pos, NULL);
    free(pos);
    if (prc) return cli_parse_exit(prc);
    const char *py = getenv("GPUMEM_PYTHON");
    if (!py || !*py) py = "python3";
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (!args) return cli_error("run", "out of memory");
    args[0] = (char *)py;
    args[1] = "-m";
    args[2] = "gpumem";
    args[3] = "run";
    for (int i = 1; i < argc; i++) args[3 + i] = argv[i];
    fflush(NULL);
    execvp(py, args);
    int e = errno;
    free(args);
    cli_error("run", "cannot start %s (%s): set GPUMEM_PYTHON to the Python that has the gpumem package "
                     "(pip install --no-build-isolation ./python)", py, strerror(e));
    return e == ENOENT ? 127 : 126;
}
