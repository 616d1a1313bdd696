/* cmd_exporter.c — placeholder until 'gpumem exporter' is written. */
#include "cli.h"

int cmd_exporter(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not implemented yet");
}
