/* gpumem.c — entry point of the gpumem CLI: a dispatch table of subcommands. */
#include "cli.h"

#include "gpumem/gpumem.h"

#include <string.h>

struct command {
    const char *name;
    const char *help;
    int (*run)(int argc, char **argv);
};

static const struct command commands[] = {
#define GM__CLI_ENTRY(name, help) {#name, help, cmd_##name},
    GM_CLI_COMMANDS(GM__CLI_ENTRY)
#undef GM__CLI_ENTRY
};

static void usage(FILE *f) {
    fprintf(f, "usage: gpumem [--version] [--help] <command> [<args>]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'gpumem <command> --help' describes a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return cli_close_stdout("--help") ? 1 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("gpumem %s\n", gm_version());
        return cli_close_stdout("--version") ? 1 : 0;
    }
    /* every command's standard output is checked once it is done: `> /dev/full` is an error */
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = commands[i].run(argc - 1, argv + 1);
            return cli_close_stdout(argv[1]) && rc == 0 ? 1 : rc;
        }
    fprintf(stderr, "gpumem: '%s' is not a gpumem command; see 'gpumem --help'\n", argv[1]);
    return 2;
}
