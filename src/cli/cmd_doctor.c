/* cmd_doctor.c — `gpumem doctor`: what works and what does not, each with
 * its fix: the library, the Python package, libgpumem_torch.so, the C++
 * shim, the torch it was built for and the one present, the CUDA driver,
 * NVML, the publication directory and the default policy. Read-only: it
 * loads and closes the driver and NVML, nothing else. */
#include "cli.h"

#include "gpumem/gpumem.h"
#include "monitor/monitor.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct check {
    FILE *out;
    bool json;
    int n, problems;
};

/* One line: "  ok   NAME  WHAT" or "  no   NAME  WHAT\n       fix: FIX". */
static void line(struct check *c, bool ok, const char *name, const char *what, const char *fix) {
    if (!ok) c->problems++;
    if (c->json) {
        fprintf(c->out, "%s{\"check\":\"%s\",\"ok\":%s,\"detail\":", c->n++ ? "," : "", name, ok ? "true" : "false");
        cli_json_string(c->out, what);
        fprintf(c->out, ",\"fix\":");
        if (ok || !fix) fprintf(c->out, "null");
        else cli_json_string(c->out, fix);
        fprintf(c->out, "}");
        return;
    }
    fprintf(c->out, "  %-4s %-15s %s\n", ok ? "ok" : "no", name, what);
    if (!ok && fix) fprintf(c->out, "  %-4s %-15s fix: %s\n", "", "", fix);
}

/* value of "key=value" in the package's _build_info.txt (setup.py writes it) */
static bool build_info(const char *pkg, const char *key, char *buf, size_t len) {
    char path[PATH_MAX + 32], l[1024];
    snprintf(path, sizeof path, "%s/_build_info.txt", pkg);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool found = false;
    size_t kl = strlen(key);
    while (!found && fgets(l, sizeof l, f))
        if (!strncmp(l, key, kl) && l[kl] == '=') {
            l[strcspn(l, "\n")] = 0;
            found = (size_t)snprintf(buf, len, "%s", l + kl + 1) < len;
        }
    fclose(f);
    return found;
}

/* torch.__version__ as `python` imports it, or "" */
static void torch_present(const char *python, char *buf, size_t len) {
    buf[0] = 0;
    if (strchr(python, '\'')) return;
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch; print(torch.__version__)' 2>/dev/null", python);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(buf, (int)len, p)) buf[0] = 0;
    buf[strcspn(buf, "\n")] = 0;
    pclose(p);
}

/* Can `python` build gpumem's wheel (pip install ./python)? The package's
 * _wheelcheck.py decides and names the fix, as setup.py does (one source). */
static void pip_check(struct check *c, const char *pkg, const char *python) {
    char cmd[2 * PATH_MAX + 64], why[1024] = "", fix[1024] = "";
    if (strchr(python, '\'') || strchr(pkg, '\'')) return;
    snprintf(cmd, sizeof cmd, "'%s' '%s/_wheelcheck.py' 2>/dev/null", python, pkg);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(why, sizeof why, p)) why[0] = 0;
    if (!fgets(fix, sizeof fix, p)) fix[0] = 0;
    int st = pclose(p);
    why[strcspn(why, "\n")] = 0;
    fix[strcspn(fix, "\n")] = 0;
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) > 1 || (WEXITSTATUS(st) == 1 && !*fix)) return; /* no answer */
    char what[PATH_MAX + 64];
    snprintf(what, sizeof what, "%s can build gpumem's wheel (python3 -m pip install --no-build-isolation ./python)",
             python);
    line(c, WEXITSTATUS(st) == 0, "pip build", WEXITSTATUS(st) ? why : what, fix);
}

static void python_checks(struct check *c) {
    const char *pip = "python3 -m pip install --no-build-isolation ./python (from the gpumem source tree)";
    char pkg[PATH_MAX], lib[PATH_MAX], shim[PATH_MAX], what[PATH_MAX + 200];
    if (!cli_python_package(pkg, sizeof pkg)) {
        line(c, false, "python package", "gpumem package not found beside this gpumem (gpumem run needs it)", pip);
        return;
    }
    line(c, true, "python package", pkg, NULL);
    const char *envlib = getenv("GPUMEM_LIB");
    if (envlib && *envlib) {
        snprintf(what, sizeof what, "$GPUMEM_LIB=%s", envlib);
        line(c, access(envlib, R_OK) == 0, "torch library", what, "unset GPUMEM_LIB or point it at libgpumem_torch.so");
    } else {
        bool ok = cli_torch_library(pkg, lib, sizeof lib) || cli_torch_library(NULL, lib, sizeof lib);
        line(c, ok, "torch library", ok ? lib : "libgpumem_torch.so not found", pip);
    }
    char built[128] = "", python[PATH_MAX] = "python3", present[128];
    bool have_info = build_info(pkg, "torch", built, sizeof built);
    build_info(pkg, "python", python, sizeof python);
    bool have_shim = cli_shim(pkg, shim, sizeof shim);
    snprintf(what, sizeof what, "%s%s%s", have_shim ? shim : "gpumem._C not built",
             have_info && *built && strcmp(built, "none") ? " for torch " : "",
             have_info && strcmp(built, "none") ? built : "");
    line(c, have_shim, "shim", what,
         "install torch, then reinstall: python3 -m pip install --no-build-isolation ./python");
    pip_check(c, pkg, python);
    torch_present(python, present, sizeof present);
    bool match = *present && (!have_shim || !have_info || !strcmp(present, built));
    snprintf(what, sizeof what, "%s %s%s%s", python, *present ? "has torch " : "cannot import torch",
             present, *present && have_shim && have_info && strcmp(present, built) ? " (the shim was built for another)" : "");
    line(c, match, "torch", what,
         *present ? "reinstall gpumem against this torch: python3 -m pip install --no-build-isolation ./python"
                  : "install PyTorch for this python (pip install torch)");
}

int cmd_doctor(int argc, char **argv) {
    bool json = false;
    const struct cli_opt opts[] = {CLI_OPT_JSON(&json)};
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "", .opts = opts, .nopts = CLI_NOPTS(opts),
        .about = "Checks what gpumem needs and says, for each part that does not work, how to fix it:\n"
                 "the library, the Python package and libgpumem_torch.so, the C++ shim, the torch it\n"
                 "was built for and the one present, the CUDA driver, NVML, the publication\n"
                 "directory (/dev/shm) and the default policy.",
        .epilog = "Exit status: 0 everything works; 1 at least one check failed (each says its fix);\n"
                  "2 bad usage.",
    };
    int prc = cli_parse(&spec, argc, argv, NULL, NULL);
    if (prc) return cli_parse_exit(prc);
    struct check c = {.out = stdout, .json = json};
    if (json) printf("{\"checks\":[");
    char what[512];
    snprintf(what, sizeof what, "libgpumem %s", gm_version());
    line(&c, true, "library", what, NULL);
    python_checks(&c);
    gm_backend *b = NULL;
    bool cuda = gm_cuda_create(&b) == GM_OK;
    line(&c, cuda, "cuda driver", cuda ? "libcuda.so.1 loaded, a device found" : gm_last_error_detail(),
         "install the NVIDIA driver (gpumem replay/tune/estimate/report work without it)");
    if (b) gm_backend_destroy(b);
    gm__nvml *nv = NULL;
    char why[256] = "";
    bool nvml = gm__nvml_open(&nv, NULL, why, sizeof why) == 0;
    line(&c, nvml, "nvml", nvml ? "libnvidia-ml.so.1 loaded" : why,
         "install the NVIDIA driver's NVML (smi/top then show allocator data only)");
    if (nv) gm__nvml_close(nv);
    bool shm = access("/dev/shm", W_OK | X_OK) == 0;
    line(&c, shm, "publication", shm ? "/dev/shm is writable (smi/top/log/exporter see processes)" : "/dev/shm is not writable",
         "mount a tmpfs on /dev/shm (docker: --ipc=host or --shm-size)");
#ifdef GM_HAVE_CJSON
    line(&c, true, "config.json", "cJSON built in: gpumem estimate --config reads Hugging Face config.json", NULL);
#else
    line(&c, false, "config.json", "built without cJSON: gpumem estimate --config cannot read config.json",
         "install cJSON (Debian/Ubuntu: apt install libcjson-dev) and rebuild or reinstall "
         "(pip install --no-build-isolation ./python); meanwhile use gpumem estimate --model");
#endif
    const char *conf = getenv("GPUMEM_CONF");
    snprintf(what, sizeof what, "policy:%s for gpumem run and install() unless the settings name one; GPUMEM_CONF=%s",
             CLI_RUN_DEFAULT_POLICY, conf && *conf ? conf : "(unset)");
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256], eff[1024];
    cli_effective_conf(conf ? conf : "", eff, sizeof eff);
    bool conf_ok = cli_config_parse(&cfg, eff, err, sizeof err) == GM_OK;
    line(&c, conf_ok, "default policy", conf_ok ? what : err, "fix GPUMEM_CONF ('gpumem config --list' lists the keys)");
    if (json) printf("],\"problems\":%d}\n", c.problems);
    else printf("%d problem%s\n", c.problems, c.problems == 1 ? "" : "s");
    return c.problems ? 1 : 0;
}
