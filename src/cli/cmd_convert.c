/* cmd_convert.c — placeholder until 'gpumem convert' is written. */
#include "cli.h"

int cmd_convert(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not implemented yet");
}
