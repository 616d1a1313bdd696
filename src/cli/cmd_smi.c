/* cmd_smi.c — placeholder until 'gpumem smi' is written. */
#include "cli.h"

int cmd_smi(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not implemented yet");
}
