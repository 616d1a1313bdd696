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
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f, "usage: gpumem [--version] [--help] <command> [<args>]\n\n"
               "The gpumem CLI: GPU memory for PyTorch users (allocator, monitoring, replay,\n"
               "reports, estimates).\n\ncommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'gpumem help <command>' or 'gpumem <command> --help' describes a command.\n"
               "\nExit status: the command's own; 2 bad usage or an unknown command.\n");
}

static const struct command *find(const char *name) {
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(name, commands[i].name)) return &commands[i];
    return NULL;
}

static int unknown(const char *name) {
    const char *names[NCOMMANDS];
    for (size_t i = 0; i < NCOMMANDS; i++) names[i] = commands[i].name;
    const char *near = cli_closest(name, names, NCOMMANDS);
    fprintf(stderr, "gpumem: '%s' is not a gpumem command", name);
    if (near) fprintf(stderr, "; did you mean '%s'?", near);
    fprintf(stderr, " (see 'gpumem --help')\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (argc < 3 || argv[1][0] == '-') {
            usage(stdout);
            return cli_close_stdout("--help") ? 1 : 0;
        }
        /* gpumem help CMD is gpumem CMD --help */
        const struct command *c = find(argv[2]);
        if (!c) return unknown(argv[2]);
        char *args[] = {argv[2], "--help", NULL};
        int rc = c->run(2, args);
        return cli_close_stdout(argv[2]) && rc == 0 ? 1 : rc;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("gpumem %s\n", gm_version());
        return cli_close_stdout("--version") ? 1 : 0;
    }
    /* every command's standard output is checked once it is done: `> /dev/full` is an error */
    const struct command *c = find(argv[1]);
    if (!c) return unknown(argv[1]);
    int rc = c->run(argc - 1, argv + 1);
    return cli_close_stdout(argv[1]) && rc == 0 ? 1 : rc;
}
