/* cli.h — the gpumem command-line tool: one cmd_<name>() per subcommand
 * (each in its own cmd_<name>.c), listed in the dispatch table in gpumem.c,
 * plus the small helpers they share (cli_util.c). */
#ifndef GPUMEM_CLI_H
#define GPUMEM_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "trace/trace.h"

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
    X(demo, "run a synthetic training-like workload on the simulated device")             \
    X(config, "list the allocator policies and settings, or check a settings string")     \
    X(run, "run a PyTorch program on gpumem's allocator, unmodified (python3 -m gpumem run too)") \
    X(report, "where the memory went: categories, timeline, frames (HTML, text, Perfetto)") \
    X(estimate, "predict a training run's GPU memory and what each strategy would save") \
    X(advise, "advice from a recorded snapshot: allocator settings by memory and cost, strategies") \
    X(doctor, "check what works (library, Python package, shim, torch, driver, NVML) and how to fix the rest")

#define GM__CLI_DECL(name, help) int cmd_##name(int argc, char **argv);
GM_CLI_COMMANDS(GM__CLI_DECL)
#undef GM__CLI_DECL

/* The policy `gpumem run` and gpumem.torch.install() use when the settings
 * name none (python/gpumem/torch.py's DEFAULT_POLICY; tests/cli/help_all.sh
 * checks that they agree). replay/tune/report model PyTorch, policy torch,
 * unless told otherwise: they predict what PyTorch's own allocator does. */
#define CLI_RUN_DEFAULT_POLICY "gpumem"

/* Where `gpumem run` and `gpumem doctor` find their pieces (cli_pkg.c); each
 * writes a path into buf and returns true, or returns false. */
bool cli_exe_dir(char *buf, size_t len);
bool cli_python_package(char *buf, size_t len);          /* the gpumem package folder */
bool cli_torch_library(const char *pkg, char *buf, size_t len); /* libgpumem_torch.so (pkg NULL: beside the exe) */
bool cli_shim(const char *pkg, char *buf, size_t len);   /* gpumem/_C.*.so */
/* conf with policy:CLI_RUN_DEFAULT_POLICY ahead when it names no policy */
void cli_effective_conf(const char *conf, char *buf, size_t len);
/* gm_config_parse, with "did you mean 'KEY'?" added to an unknown key's error */
#include "gpumem/gpumem.h"
int cli_config_parse(gm_config *cfg, const char *str, char *err, size_t len);
/* The closest of n names to s (edit distance at most 2 + len/4), or NULL. */
const char *cli_closest(const char *s, const char *const *names, size_t n);

/* "141GiB", "80G", "512MiB", "1.5TB", "123456" (bytes). Binary units for
 * K/M/G/T with or without "iB"; "KB"/"MB"/"GB"/"TB" are decimal.
 * Returns false on malformed input. */
bool cli_parse_size(const char *s, uint64_t *out);
/* The ranking of allocator settings (cli_tune.c), shared by tune and advise. */
struct gm_tune_entry;
struct gm_tune_choice;
void cli_tune_line(const struct gm_tune_entry *e, char *buf, size_t len);
void cli_tune_print_text(const char *path, uint64_t capacity, const struct gm_tune_entry *e, int n,
                         const struct gm_tune_choice *c, double secs);
/* "calls_factor":..,"results":[..],"default":..,"best_for_memory":..,"recommended":.. (no braces) */
void cli_tune_print_json(const struct gm_tune_entry *e, int n, const struct gm_tune_choice *c, uint64_t capacity);
/* Load, compile and tune path; 0, or the exit code after printing the
 * error. *capacity 0 means the sim's default. *trace (if asked) is the
 * loaded trace, for the caller to free. */
struct gm_trace;
int cli_tune_trace(const char *cmd, const char *path, int device, uint64_t *capacity, struct gm_trace **trace,
                   struct gm_tune_entry **rows, int *n, struct gm_tune_choice *choice, double *secs);

/* 'gpumem estimate --trace TRACE' (cli_estimate_trace.c): replays under each
 * allocator model, categories at the peak, the verdict against capacity (0: none). */
int cli_estimate_trace(const char *cmd, const char *path, uint64_t capacity, bool json);

/* ---- output files (cli_util.c) -----------------------------------------
 * Every file a command writes goes through these: nothing is written
 * through a symbolic link or over an input, a regular file is written to a
 * temporary file beside it and renamed into place only when every write,
 * flush and close succeeded (a failure leaves the old file as it was), and
 * the command says what it wrote and where. */
typedef struct cli_out {
    gm__outfile o;
    const char *cmd;
} cli_out;
/* Open path for writing; inputs: the files read, NULL-terminated (may be
 * NULL). Returns 0, or the exit code after printing why not. */
int cli_out_open(cli_out *o, const char *cmd, const char *path, const char *const *inputs);
/* Open path to append to (gpumem log): never through a link. */
int cli_out_append(cli_out *o, const char *cmd, const char *path);
/* Finish: wrc is the writer's own status (non-zero: it failed). Prints
 * "gpumem CMD: wrote PATH (SIZE): what"; returns 0, or 1 after printing the
 * error (and removing the temporary file). */
int cli_out_close(cli_out *o, int wrc, const char *what);
/* Flush standard output and check it (main, after every command): a full
 * disk or a closed pipe is an error, not exit 0. */
int cli_close_stdout(const char *cmd);

/* 0 if device `device` of t has events; else prints what is missing and
 * how to record it (a snapshot taken without _record_memory_history has
 * segments but no events) and returns 1. */
int cli_require_history(const char *cmd, const char *path, const struct gm_trace *t, int device);

/* s as a JSON string, quoted and escaped. */
void cli_json_string(FILE *f, const char *s);
/* "13.24 GiB" style, into buf; returns buf. */
const char *cli_format_bytes(uint64_t bytes, char *buf, size_t len);
/* Print "gpumem NAME: message" to stderr; returns exit code 2 (usage) or 1. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- options (cli_opt.c): one table per command, one parser for all ----- */
enum cli_opt_kind {
    CLI_FLAG,   /* bool *out = true */
    CLI_STR,    /* const char **out */
    CLI_CHOICE, /* const char **out, one of metavar's "a|b|c" */
    CLI_SIZE,   /* uint64_t *out, parsed by cli_parse_size */
    CLI_INT,    /* long long *out */
    CLI_DOUBLE, /* double *out */
};

struct cli_opt {
    const char *name;      /* "capacity" for --capacity */
    char short_name;       /* 'o' for -o, or 0 */
    enum cli_opt_kind kind;
    void *out;
    const char *metavar;   /* shown in --help ("SIZE"); the choices for CLI_CHOICE */
    const char *help;
    const char *def;       /* default shown in --help, or NULL */
    double min, max;       /* accepted range of numeric kinds when min < max */
};

struct cli_spec {
    const char *cmd;    /* "replay" */
    const char *args;   /* positional synopsis, "TRACE" */
    const char *about;  /* what the command does, shown by --help */
    const struct cli_opt *opts;
    size_t nopts;
    int min_pos, max_pos;
    const char *epilog; /* exit statuses and the like */
    bool stop_at_positional; /* the first positional ends the options (a command to run) */
};

#define CLI_NOPTS(a) (sizeof(a) / sizeof((a)[0]))
#define CLI_HELP (-1) /* cli_parse printed --help: exit 0 */

/* Parse argv[1..] against spec: options into their outs, positionals into
 * pos[0..max_pos). Returns 0, CLI_HELP, or 2 after printing one line naming
 * what is wrong and "see 'gpumem CMD --help'". */
int cli_parse(const struct cli_spec *spec, int argc, char **argv, char **pos, int *npos);
void cli_print_help(const struct cli_spec *spec, FILE *f);
/* The exit code of cli_parse's result for a command that should stop. */
static inline int cli_parse_exit(int rc) { return rc == CLI_HELP ? 0 : rc; }

/* The options several commands share: one name, one range, one help line. */
#define CLI_CAPACITY_MIN 1048576.0      /* 1 MiB: "--capacity 80" is a typo for 80GiB */
#define CLI_CAPACITY_MAX 1099511627776.0 * 64
#define CLI_DEVICE_MAX 255.0
#define CLI_INTERVAL_MIN 0.01
#define CLI_INTERVAL_MAX 3600.0
#define CLI_OPT_CAPACITY(p)                                                                        \
    {"capacity", 0, CLI_SIZE, (p), "SIZE", "memory of the simulated GPU, with a unit (80GiB)",     \
     "141GiB", CLI_CAPACITY_MIN, CLI_CAPACITY_MAX}
#define CLI_OPT_DEVICE(p)                                                                          \
    {"device", 0, CLI_INT, (p), "N", "CUDA device index", "0", 0, CLI_DEVICE_MAX}
#define CLI_OPT_CONF(p)                                                                            \
    {"conf", 0, CLI_STR, (p), "STR", "allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, "     \
     "plus policy:NAME (see 'gpumem config --list')", NULL, 0, 0}
#define CLI_OPT_JSON(p) {"json", 0, CLI_FLAG, (p), NULL, "one JSON object on stdout", NULL, 0, 0}
#define CLI_OPT_INTERVAL(p, def)                                                                   \
    {"interval", 0, CLI_DOUBLE, (p), "SEC", "seconds between samples", def, CLI_INTERVAL_MIN,      \
     CLI_INTERVAL_MAX}
#define CLI_OPT_ALL_USERS(p)                                                                       \
    {"all-users", 0, CLI_FLAG, (p), NULL,                                                          \
     "node mode: every user's processes (as root; in a pod, with hostPID)", NULL, 0, 0}
#define CLI_OPT_NO_NVML(p)                                                                         \
    {"no-nvml", 0, CLI_FLAG, (p), NULL, "do not load libnvidia-ml.so.1 (allocator data only)",    \
     NULL, 0, 0}

#endif
