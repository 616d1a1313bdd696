/* cmd_tune.c — placeholder until 'gpumem tune' is written. */
#include "cli.h"

int cmd_tune(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not implemented yet");
}
