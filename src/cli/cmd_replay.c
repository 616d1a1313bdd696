/* cmd_replay.c — placeholder until 'gpumem replay' is written. */
#include "cli.h"

int cmd_replay(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not implemented yet");
}
