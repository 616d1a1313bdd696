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
