/* cli_opt.c — the one option parser every subcommand uses: a table of
 * options (struct cli_opt) read from argv in the GNU style (`--opt value`,
 * `--opt=value`, `-o value`, `--` ends the options, `-` is a positional that
 * means stdin), with the same --help layout and the same one-line errors
 * ("... (see 'gpumem CMD --help')") for every command. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_metavar(const struct cli_opt *o) {
    if (o->metavar) return o->metavar;
    switch (o->kind) {
    case CLI_SIZE: return "SIZE";
    case CLI_INT: return "N";
    case CLI_DOUBLE: return "X";
    default: return "STR";
    }
}

static int bad(const struct cli_spec *spec, const char *fmt, const char *a, const char *b);

void cli_print_help(const struct cli_spec *spec, FILE *f) {
    fprintf(f, "usage: gpumem %s", spec->cmd);
    if (spec->nopts) fprintf(f, " [options]");
    if (spec->args && *spec->args) fprintf(f, " %s", spec->args);
    fprintf(f, "\n");
    if (spec->about) fprintf(f, "\n%s\n", spec->about);
    if (spec->nopts) fprintf(f, "\noptions:\n");
    for (size_t i = 0; i < spec->nopts; i++) {
        const struct cli_opt *o = &spec->opts[i];
        char left[64];
        int n = o->short_name ? snprintf(left, sizeof left, "-%c, --%s", o->short_name, o->name)
                              : snprintf(left, sizeof left, "    --%s", o->name);
        if (o->kind != CLI_FLAG && n > 0 && (size_t)n < sizeof left)
            snprintf(left + n, sizeof left - (size_t)n, " %s", kind_metavar(o));
        /* a long option gets its description on the next line, never run into it */
        if (strlen(left) >= 26) fprintf(f, "  %s\n  %-26s %s", left, "", o->help ? o->help : "");
        else fprintf(f, "  %-26s %s", left, o->help ? o->help : "");
        if (o->def) fprintf(f, " (default %s)", o->def);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-26s %s\n", "-h, --help", "show this help and exit");
    if (spec->epilog) fprintf(f, "\n%s\n", spec->epilog);
    /* every command's help ends with its exit statuses */
    if (!spec->epilog || !strstr(spec->epilog, "Exit status:"))
        fprintf(f, "%sExit status: 0 success, 1 failure (a message says why), 2 bad usage.\n",
                spec->epilog ? "" : "\n");
}

/* "unknown option '--x'", with the closest option's name when one is near */
static int unknown_option(const struct cli_spec *spec, const char *a) {
    const char *names[64];
    size_t n = 0;
    for (size_t i = 0; i < spec->nopts && n < 63; i++) names[n++] = spec->opts[i].name;
    names[n++] = "help";
    const char *dashes = a[1] == '-' ? a + 2 : a + 1;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(dashes, "="), dashes);
    const char *near = cli_closest(name, names, n);
    if (near) return bad(spec, "unknown option '%s'; did you mean '--%s'?", a, near);
    return bad(spec, "unknown option '%s'%s", a, "");
}

static int bad(const struct cli_spec *spec, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "gpumem %s: ", spec->cmd);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (see 'gpumem %s --help')\n", spec->cmd);
    return 2;
}

/* The range check shared by the numeric kinds: [min, max] when min < max. */
static bool in_range(const struct cli_opt *o, double v) {
    return !(o->min < o->max) || (v >= o->min && v <= o->max);
}

static int range_error(const struct cli_spec *spec, const struct cli_opt *o, const char *v) {
    char what[160];
    if (o->kind == CLI_SIZE) {
        char lo[32], hi[32];
        cli_format_bytes((uint64_t)o->min, lo, sizeof lo);
        cli_format_bytes((uint64_t)o->max, hi, sizeof hi);
        snprintf(what, sizeof what, "a size between %s and %s with a unit (e.g. 80GiB), not '%%s'", lo,
                 hi);
    } else if (o->kind == CLI_INT) {
        snprintf(what, sizeof what, "an integer from %.0f to %.0f, not '%%s'", o->min, o->max);
    } else {
        snprintf(what, sizeof what, "a number from %g to %g, not '%%s'", o->min, o->max);
    }
    char fmt[256];
    snprintf(fmt, sizeof fmt, "--%%s wants %s", what);
    return bad(spec, fmt, o->name, v);
}

/* Store value v for option o; returns 0 or the exit code of the error. */
static int set_value(const struct cli_spec *spec, const struct cli_opt *o, const char *v) {
    char *end;
    switch (o->kind) {
    case CLI_FLAG: *(bool *)o->out = true; return 0;
    case CLI_STR: *(const char **)o->out = v; return 0;
    case CLI_CHOICE: {
        /* metavar is "a|b|c": v must be one of them. */
        const char *c = o->metavar;
        size_t len = strlen(v);
        while (c && *c) {
            const char *bar = strchr(c, '|');
            size_t n = bar ? (size_t)(bar - c) : strlen(c);
            if (n == len && !strncmp(c, v, n)) {
                *(const char **)o->out = v;
                return 0;
            }
            c = bar ? bar + 1 : NULL;
        }
        char fmt[200];
        snprintf(fmt, sizeof fmt, "--%%s must be one of %s, not '%%s'", o->metavar);
        return bad(spec, fmt, o->name, v);
    }
    case CLI_SIZE: {
        uint64_t bytes;
        if (!cli_parse_size(v, &bytes) || !in_range(o, (double)bytes)) return range_error(spec, o, v);
        *(uint64_t *)o->out = bytes;
        return 0;
    }
    case CLI_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno || !in_range(o, (double)x)) return range_error(spec, o, v);
        *(long long *)o->out = x;
        return 0;
    }
    case CLI_DOUBLE: {
        errno = 0;
        double x = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(x) || !in_range(o, x)) return range_error(spec, o, v);
        *(double *)o->out = x;
        return 0;
    }
    }
    return bad(spec, "option --%s has an unknown kind%s", o->name, "");
}

static const struct cli_opt *find_long(const struct cli_spec *spec, const char *name, size_t len) {
    for (size_t i = 0; i < spec->nopts; i++)
        if (strlen(spec->opts[i].name) == len && !strncmp(spec->opts[i].name, name, len))
            return &spec->opts[i];
    return NULL;
}

static const struct cli_opt *find_short(const struct cli_spec *spec, char c) {
    for (size_t i = 0; i < spec->nopts; i++)
        if (spec->opts[i].short_name == c) return &spec->opts[i];
    return NULL;
}

int cli_parse(const struct cli_spec *spec, int argc, char **argv, char **pos, int *npos) {
    int n = 0;
    bool options_done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options_done || a[0] != '-' || !a[1]) {
            if (n >= spec->max_pos) {
                if (spec->max_pos == 0) return bad(spec, "takes no argument, not '%s'%s", a, "");
                return bad(spec, "one %s at most; extra argument '%s'", spec->args, a);
            }
            pos[n++] = argv[i];
            if (spec->stop_at_positional) options_done = true;
            continue;
        }
        if (!strcmp(a, "--")) {
            options_done = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_print_help(spec, stdout);
            return CLI_HELP;
        }
        const struct cli_opt *o;
        const char *v = NULL;
        if (a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            o = find_long(spec, a + 2, len);
            if (!o) return unknown_option(spec, a);
            if (eq) {
                if (o->kind == CLI_FLAG) return bad(spec, "--%s takes no value ('%s')", o->name, a);
                v = eq + 1;
            }
        } else {
            o = a[2] ? NULL : find_short(spec, a[1]);
            if (!o) return unknown_option(spec, a);
        }
        if (o->kind != CLI_FLAG && !v) {
            if (i + 1 >= argc) return bad(spec, "--%s needs a value (%s)", o->name, kind_metavar(o));
            v = argv[++i];
        }
        int rc = set_value(spec, o, v);
        if (rc) return rc;
    }
    if (n < spec->min_pos) {
        fprintf(stderr, "gpumem %s: missing %s\n", spec->cmd, spec->args);
        fprintf(stderr, "usage: gpumem %s [options] %s (see 'gpumem %s --help')\n", spec->cmd,
                spec->args, spec->cmd);
        return 2;
    }
    if (npos) *npos = n;
    return 0;
}
