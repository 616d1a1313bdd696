/* cli_util.c — helpers shared by the subcommands: sizes and error messages. */
#include "cli.h"

#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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


void cli_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

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
