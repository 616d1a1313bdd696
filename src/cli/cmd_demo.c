/* cmd_demo.c — placeholder until 'gpumem demo' is written. */
#include "cli.h"

int cmd_demo(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not implemented yet");
}
