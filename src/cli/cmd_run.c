/* cmd_run.c — `gpumem run [--conf STR] [--native] [--label L] -- COMMAND...`:
 * runs an unmodified PyTorch program on gpumem's allocator. The one
 * implementation: `python3 -m gpumem run` and the pip-installed `gpumem`
 * command exec this binary (python/gpumem/_cli.py), so its options are
 * parsed here only. It puts the gpumem package's _boot folder (whose
 * sitecustomize.py calls gpumem.torch.install() right after `import torch`)
 * and the package first on PYTHONPATH, sets GPUMEM_RUN/GPUMEM_CONF/
 * GPUMEM_PUBLISH*, and replaces itself with COMMAND (exec), so the exit
 * status and signals are COMMAND's own. PYTORCH_CUDA_ALLOC_CONF gets one line
 * on stderr saying what happens to it. Every Python process COMMAND starts
 * (torchrun's workers too) inherits that environment. A python started with
 * -I or -E ignores PYTHONPATH and so runs without gpumem. */
#include "cli.h"

#include "gpumem/gpumem.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* PYTHONPATH = boot:parent:old, without repeats of the first two. */
static int set_pythonpath(const char *pkg) {
    char boot[PATH_MAX + 8], parent[PATH_MAX];
    snprintf(boot, sizeof boot, "%s/_boot", pkg);
    snprintf(parent, sizeof parent, "%s", pkg);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) *slash = 0;
    const char *old = getenv("PYTHONPATH");
    size_t cap = strlen(boot) + strlen(parent) + (old ? strlen(old) : 0) + 4;
    char *v = malloc(cap), *copy = old ? strdup(old) : NULL;
    if (!v || (old && !copy)) {
        free(v);
        free(copy);
        return -1;
    }
    int n = snprintf(v, cap, "%s:%s", boot, parent);
    for (char *save = NULL, *p = copy ? strtok_r(copy, ":", &save) : NULL; p; p = strtok_r(NULL, ":", &save))
        if (strcmp(p, boot) && strcmp(p, parent)) n += snprintf(v + n, cap - (size_t)n, ":%s", p);
    int rc = setenv("PYTHONPATH", v, 1);
    free(v);
    free(copy);
    return rc;
}

/* Exit code of a --conf/GPUMEM_CONF that the library refuses, else 0. */
static int check_conf(const char *cmd, const char *what, const char *conf, char *eff, size_t len) {
    cli_effective_conf(conf, eff, len);
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256];
    if (cli_config_parse(&cfg, eff, err, sizeof err) == GM_OK) return 0;
    return cli_usage_error(cmd, "%s '%s': %s (see 'gpumem config --list')", what, conf, err);
}

/* One line on what gpumem does with PYTORCH_CUDA_ALLOC_CONF: PyTorch's
 * allocator reads it, and gpumem's (which replaces it) reads GPUMEM_CONF. */
static void note_torch_conf(bool native, const char *conf) {
    const char *tc = getenv("PYTORCH_CUDA_ALLOC_CONF");
    if (!tc || !*tc) return;
    if (native) {
        fprintf(stderr, "gpumem run: PYTORCH_CUDA_ALLOC_CONF=%s applies: --native keeps PyTorch's allocator, "
                        "which reads it\n", tc);
        return;
    }
    char eff[2048], err[256], with[1024];
    cli_effective_conf(conf ? conf : "", eff, sizeof eff);
    gm_config cfg;
    gm_config_init(&cfg);
    const char *policy = gm_config_parse(&cfg, eff, err, sizeof err) == GM_OK ? gm_policy_name((int)cfg.policy)
                                                                              : CLI_RUN_DEFAULT_POLICY;
    snprintf(with, sizeof with, "policy:torch,%s", tc);
    gm_config_init(&cfg);
    bool valid = cli_config_parse(&cfg, with, err, sizeof err) == GM_OK;
    fprintf(stderr, "gpumem run: PYTORCH_CUDA_ALLOC_CONF=%s is ignored: gpumem's allocator (policy:%s) replaces "
                    "PyTorch's and reads --conf/GPUMEM_CONF only; %s%s%s\n", tc, policy,
            valid ? "to keep these settings with PyTorch's behaviour: gpumem run --conf '" : "and it is not valid: ",
            valid ? with : err, valid ? "'" : "");
}

int cmd_run(int argc, char **argv) {
    const char *conf = NULL, *label = NULL, *oom_report = NULL;
    bool native = false, no_publish = false;
    const struct cli_opt opts[] = {
        CLI_OPT_CONF(&conf),
        {"native", 0, CLI_FLAG, &native, NULL, "keep PyTorch's allocator; only publish its statistics", NULL, 0, 0},
        {"label", 0, CLI_STR, &label, "L",
         "the name gpumem smi/top show for the process, and its job's run id unless torchrun or SLURM set one",
         "the command name", 0, 0},
        {"no-publish", 0, CLI_FLAG, &no_publish, NULL, "do not publish statistics for gpumem smi/top", NULL, 0, 0},
        {"oom-report", 0, CLI_STR, &oom_report, "DIR",
         "on out of memory, leave a report (verdict: capacity, fragmentation or memory outside the allocator) "
         "and a snapshot in DIR, then raise as usual", NULL, 0, 0},
    };
    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    if (!pos) return cli_error("run", "out of memory");
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "[--] COMMAND [ARGS...]", .opts = opts, .nopts = CLI_NOPTS(opts),
        .min_pos = 1, .max_pos = argc, .stop_at_positional = true,
        .about = "Runs COMMAND (python3 train.py, torchrun ...) with every Python process it starts\n"
                 "on gpumem's allocator (policy:" CLI_RUN_DEFAULT_POLICY " unless --conf or GPUMEM_CONF names one),\n"
                 "unmodified. --native keeps PyTorch's allocator and only publishes its statistics.\n"
                 "Warns when the C++ shim gpumem._C is missing (torch's memory API then does not\n"
                 "answer); 'gpumem doctor' says what is installed.",
        .epilog = "Exit status: COMMAND's own (a signal too); 2 bad usage or settings; 126 COMMAND\n"
                  "cannot be run; 127 COMMAND not found; 1 the gpumem Python package is missing.",
    };
    int npos = 0;
    int prc = cli_parse(&spec, argc, argv, pos, &npos);
    if (prc) {
        free(pos);
        return cli_parse_exit(prc);
    }
    char **cmd = pos; /* cmd[0..npos) is COMMAND, NULL-terminated (calloc) */
    char eff[2048];
    const char *envconf = getenv("GPUMEM_CONF");
    int rc = 0;
    if (oom_report && native) rc = cli_usage_error(argv[0], "--oom-report needs gpumem's allocator; drop --native");
    else if (oom_report && !*oom_report) rc = cli_usage_error(argv[0], "--oom-report needs a directory");
    if (rc) {
        free(pos);
        return rc;
    }
    if (!native && conf) {
        if (!(rc = check_conf(argv[0], "--conf", conf, eff, sizeof eff))) setenv("GPUMEM_CONF", eff, 1);
    } else if (!native && envconf && *envconf) {
        rc = check_conf(argv[0], "GPUMEM_CONF", envconf, eff, sizeof eff);
    }
    char pkg[PATH_MAX], lib[PATH_MAX], shim[PATH_MAX];
    if (!rc && !cli_python_package(pkg, sizeof pkg))
        rc = cli_error(argv[0], "the gpumem Python package was not found beside this gpumem; install it: "
                                "python3 -m pip install --no-build-isolation ./python");
    if (rc) {
        free(pos);
        return rc;
    }
    if (set_pythonpath(pkg) != 0) {
        free(pos);
        return cli_error(argv[0], "out of memory");
    }
    setenv("GPUMEM_RUN", native ? "native" : "gpumem", 1);
    if (no_publish) {
        setenv("GPUMEM_PUBLISH", "0", 1);
    } else {
        setenv("GPUMEM_PUBLISH", "1", 0);
        const char *base = strrchr(cmd[0], '/');
        setenv("GPUMEM_PUBLISH_LABEL", label ? label : base ? base + 1 : cmd[0], label != NULL);
    }
    if (label) setenv("GPUMEM_RUN_ID", label, 0); /* the job's run id, unless a launcher gave one */
    if (oom_report) { /* absolute: the command may change directory */
        char abs[PATH_MAX], cwd[PATH_MAX];
        if (oom_report[0] != '/' && getcwd(cwd, sizeof cwd) &&
            snprintf(abs, sizeof abs, "%s/%s", cwd, oom_report) < (int)sizeof abs)
            oom_report = abs;
        setenv("GPUMEM_OOM_REPORT", oom_report, 1);
    }
#ifndef __SANITIZE_ADDRESS__ /* an ASan build's library cannot load into a plain python */
    if (!getenv("GPUMEM_LIB") && cli_torch_library(NULL, lib, sizeof lib) && !cli_torch_library(pkg, shim, sizeof shim))
        setenv("GPUMEM_LIB", lib, 1);
#endif
    if (!native && !cli_shim(pkg, shim, sizeof shim))
        fprintf(stderr, "gpumem run: WARNING: the C++ shim gpumem._C is not installed in %s: under gpumem,\n"
                        "  torch.cuda.memory_allocated/stats/summary and record_stream do not answer. Install\n"
                        "  torch first, then: python3 -m pip install --no-build-isolation ./python\n"
                        "  ('gpumem doctor' checks; --native keeps PyTorch's allocator)\n", pkg);
    (void)lib;
    note_torch_conf(native, getenv("GPUMEM_CONF"));
    fflush(NULL);
    execvp(cmd[0], cmd);
    int e = errno;
    cli_error(argv[0], "cannot run %s: %s", cmd[0], strerror(e));
    free(pos);
    return e == ENOENT ? 127 : 126;
}
