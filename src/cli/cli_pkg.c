/* cli_pkg.c — where the pieces `gpumem run` and `gpumem doctor` need are:
 * the gpumem Python package (its _boot/sitecustomize.py hooks `import torch`),
 * libgpumem_torch.so and the C++ shim gpumem._C. One search, three layouts:
 *   pip:          <site-packages>/gpumem/bin/gpumem, the package one folder up
 *   cmake install: <prefix>/bin/gpumem, <prefix>/share/gpumem/python/gpumem,
 *                 <prefix>/<libdir>/libgpumem_torch.so
 *   build tree:   <build>/gpumem, <build>/libgpumem_torch.so, and the source
 *                 tree's python/gpumem (GM_SOURCE_DIR, set by CMake). */
#include "cli.h"

#include "gpumem/gpumem.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef GM_SOURCE_DIR
#define GM_SOURCE_DIR ""
#endif
#ifndef GM_INSTALL_LIBDIR
#define GM_INSTALL_LIBDIR "lib"
#endif

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

bool cli_exe_dir(char *buf, size_t len) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return false;
    *slash = 0;
    return (size_t)snprintf(buf, len, "%s", exe) < len;
}

/* dir holds the gpumem package: __init__.py and _boot/sitecustomize.py */
static bool is_package(const char *dir) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/__init__.py", dir);
    if (!is_file(p)) return false;
    snprintf(p, sizeof p, "%s/_boot/sitecustomize.py", dir);
    return is_file(p);
}

bool cli_python_package(char *buf, size_t len) {
    char exe[PATH_MAX];
    if (!cli_exe_dir(exe, sizeof exe)) exe[0] = 0;
    char cand[3][PATH_MAX + 64];
    int n = 0;
    if (*exe) {
        snprintf(cand[n++], sizeof cand[0], "%s/..", exe);
        snprintf(cand[n++], sizeof cand[0], "%s/../share/gpumem/python/gpumem", exe);
    }
    if (*GM_SOURCE_DIR) snprintf(cand[n++], sizeof cand[0], "%s/python/gpumem", GM_SOURCE_DIR);
    for (int i = 0; i < n; i++) {
        char real[PATH_MAX];
        if (!realpath(cand[i], real) || !is_package(real)) continue;
        if ((size_t)snprintf(buf, len, "%s", real) < len) return true;
    }
    return false;
}

bool cli_torch_library(const char *pkg, char *buf, size_t len) {
    char exe[PATH_MAX];
    char cand[3][PATH_MAX + 64];
    int n = 0;
    if (pkg) snprintf(cand[n++], sizeof cand[0], "%s/libgpumem_torch.so", pkg);
    if (cli_exe_dir(exe, sizeof exe)) {
        snprintf(cand[n++], sizeof cand[0], "%s/libgpumem_torch.so", exe);
        snprintf(cand[n++], sizeof cand[0], "%s/../%s/libgpumem_torch.so", exe, GM_INSTALL_LIBDIR);
    }
    for (int i = 0; i < n; i++) {
        char real[PATH_MAX];
        if (realpath(cand[i], real) && is_file(real) && (size_t)snprintf(buf, len, "%s", real) < len)
            return true;
    }
    return false;
}

bool cli_shim(const char *pkg, char *buf, size_t len) {
    DIR *d = pkg ? opendir(pkg) : NULL;
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (!strncmp(e->d_name, "_C.", 3) && l > 3 && !strcmp(e->d_name + l - 3, ".so"))
            found = (size_t)snprintf(buf, len, "%s/%s", pkg, e->d_name) < len;
    }
    closedir(d);
    return found;
}

void cli_effective_conf(const char *conf, char *buf, size_t len) {
    bool named = false;
    for (const char *p = conf; *p && !named; p++)
        named = !strncmp(p, "policy", 6) && (p[6] == ':' || p[6] == ' ');
    if (named) snprintf(buf, len, "%s", conf);
    else snprintf(buf, len, "policy:%s%s%s", CLI_RUN_DEFAULT_POLICY, *conf ? "," : "", conf);
}

/* Levenshtein distance of a and b (names are short: at most 63 chars). */
static size_t distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *cli_closest(const char *s, const char *const *names, size_t n) {
    const char *best = NULL;
    size_t bestd = 2 + strlen(s) / 4 + 1;
    for (size_t i = 0; i < n; i++) {
        size_t d = distance(s, names[i]);
        if (d < bestd) {
            bestd = d;
            best = names[i];
        }
    }
    return best;
}

int cli_config_parse(gm_config *cfg, const char *str, char *err, size_t len) {
    int rc = gm_config_parse(cfg, str, err, len);
    const char *k = rc == GM_OK ? NULL : strstr(err, "unknown key '");
    if (!k) return rc;
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)strcspn(k + 13, "'"), k + 13);
    const char *names[256];
    size_t n = 0;
    names[n++] = "policy";
    for (int i = 0; i < gm_setting_count() && n + 2 < 256; i++) {
        gm_setting_desc s;
        if (gm_setting_info(i, &s) != GM_OK) continue;
        names[n++] = s.key;
        if (s.alias) names[n++] = s.alias;
    }
    const char *near = cli_closest(key, names, n);
    size_t used = strlen(err);
    if (near && used < len) snprintf(err + used, len - used, "; did you mean '%s'?", near);
    return rc;
}
