/* cmd_log.c — placeholder until 'gpumem log' is written. */
#include "cli.h"

int cmd_log(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not implemented yet");
}
