/* cli.h — the gpumem command-line tool: one cmd_<name>() per subcommand
 * (each in its own cmd_<name>.c), listed in the dispatch table in gpumem.c,
 * plus the small helpers they share (cli_util.c). */
#ifndef GPUMEM_CLI_H
#define GPUMEM_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Each subcommand gets argv with argv[0] == its own name; returns the exit
 * code (0 ok, 1 failure of the job, 2 bad usage). */
#define GM_CLI_COMMANDS(X)                                                              \
    X(replay, "replay a PyTorch memory snapshot or gpumem trace under an allocator policy") \
    X(tune, "rank allocator settings for a trace by predicted peak reserved memory")      \
    X(convert, "convert a PyTorch memory snapshot to the gpumem trace format")            \
    X(smi, "one-shot view of every GPU and every gpumem process, like nvidia-smi")        \
    X(top, "live terminal view of GPU memory per device and per process")                 \
    X(log, "sample GPU and allocator memory periodically as JSON lines or CSV")           \
    X(exporter, "serve GPU and allocator memory metrics for Prometheus")                  \
    X(demo, "run a synthetic training-like workload on the simulated device")

#define GM__CLI_DECL(name, help) int cmd_##name(int argc, char **argv);
GM_CLI_COMMANDS(GM__CLI_DECL)
#undef GM__CLI_DECL

/* "141GiB", "80G", "512MiB", "1.5TB", "123456" (bytes). Binary units for
 * K/M/G/T with or without "iB"; "KB"/"MB"/"GB"/"TB" are decimal.
 * Returns false on malformed input. */
bool cli_parse_size(const char *s, uint64_t *out);
/* After cli_parse_size of a device size: warn on stderr when ARG had no unit
 * and means less than 1 MiB ("--capacity 80" is 80 bytes: 80GiB meant?).
 * Returns true when it warned. */
bool cli_warn_unitless_size(const char *cmd, const char *opt, const char *arg, uint64_t bytes);
/* "13.24 GiB" style, into buf; returns buf. */
const char *cli_format_bytes(uint64_t bytes, char *buf, size_t len);
/* Print "gpumem NAME: message" to stderr; returns exit code 2 (usage) or 1. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
