/* cli_util.c — helpers shared by the subcommands: sizes, error messages and
 * output files (cli.h). */
#include "cli.h"

#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

bool cli_parse_size(const char *s, uint64_t *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || !isfinite(v)) return false;
    while (*end == ' ') end++;
    double mult = 1;
    if (*end) {
        static const struct { const char *suffix; double mult; } units[] = {
            {"", 1}, {"b", 1},
            {"k", 1024.0}, {"kib", 1024.0}, {"kb", 1e3},
            {"m", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
            {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
            {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
        };
        bool found = false;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (!strcasecmp(end, units[i].suffix)) {
                mult = units[i].mult;
                found = true;
                break;
            }
        if (!found) return false;
    }
    double bytes = v * mult;
    if (bytes >= 18446744073709551615.0) return false;
    *out = (uint64_t)llround(bytes);
    return true;
}


void cli_json_string(FILE *f, const char *s) { gm__json_string(f, s, false); }

const char *cli_format_bytes(uint64_t bytes, char *buf, size_t len) {
    return gm__format_bytes(bytes > INT64_MAX ? INT64_MAX : (int64_t)bytes, buf, len);
}

static int vreport(int code, const char *cmd, const char *fmt, va_list ap) {
    fprintf(stderr, "gpumem %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    return code;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = vreport(2, cmd, fmt, ap);
    va_end(ap);
    return rc;
}

int cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = vreport(1, cmd, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- output files (the rules are gm__outfile's, trace.h) ------------------ */

int cli_out_open(cli_out *o, const char *cmd, const char *path, const char *const *inputs) {
    o->cmd = cmd;
    struct stat st, is;
    for (size_t i = 0; inputs && inputs[i]; i++)
        if (strcmp(inputs[i], "-") && stat(path, &st) == 0 && stat(inputs[i], &is) == 0 &&
            is.st_dev == st.st_dev && is.st_ino == st.st_ino)
            return cli_error(cmd, "'%s' is the input '%s': refusing to write over it; give another output name",
                             path, inputs[i]);
    if (gm__outfile_open(&o->o, path, false)) return cli_error(cmd, "%s", gm_last_error_detail());
    return 0;
}

int cli_out_append(cli_out *o, const char *cmd, const char *path) {
    o->cmd = cmd;
    if (gm__outfile_open(&o->o, path, true)) return cli_error(cmd, "%s", gm_last_error_detail());
    fprintf(stderr, "gpumem %s: %s %s\n", cmd, o->o.replaced ? "appending to" : "writing", path);
    return 0;
}

int cli_out_close(cli_out *o, int wrc, const char *what) {
    bool replaced = o->o.replaced && !o->o.append && o->o.tmp[0];
    if (gm__outfile_close(&o->o, wrc == 0))
        return cli_error(o->cmd, "%s%s", gm_last_error_detail(),
                         replaced ? " (the previous file is unchanged)" : "");
    struct stat st;
    char sz[32] = "?";
    if (stat(o->o.path, &st) == 0) cli_format_bytes((uint64_t)st.st_size, sz, sizeof sz);
    fprintf(stderr, "gpumem %s: wrote %s (%s%s)%s%s\n", o->cmd, o->o.path, sz,
            replaced ? ", replacing the previous file" : "", what ? ": " : "", what ? what : "");
    return 0;
}

int cli_close_stdout(const char *cmd) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    return cli_error(cmd, "error writing standard output: %s", strerror(errno ? errno : EIO));
}

int cli_require_history(const char *cmd, const char *path, const gm_trace *t, int device) {
    if (device < 0 || (device >= t->ndevices && t->nevents)) return 0; /* the caller's own check names it */
    if (device < t->ndevices && t->dev_off[device + 1] > t->dev_off[device]) return 0;
    return cli_error(cmd, "%s has no allocation history for device %d (0 events%s; %zu segments, %zu events "
                     "in all): it was recorded without torch.cuda.memory._record_memory_history(). Call "
                     "torch.cuda.memory._record_memory_history(max_entries=1000000) before the run and "
                     "torch.cuda.memory._dump_snapshot(\"snapshot.pickle\") after it (or record with "
                     "gpumem.torch), then try again", path, device,
                     t->skipped ? ", some entries were not allocator events" : "", t->nsegments, t->nevents);
}
