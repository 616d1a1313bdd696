/* cmd_top.c — placeholder until 'gpumem top' is written. */
#include "cli.h"

int cmd_top(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not implemented yet");
}
