/* config.c — the allocator configuration: PyTorch 2.11's
 * PYTORCH_CUDA_ALLOC_CONF syntax and limits (c10/core/AllocatorConfig.cpp and
 * c10/cuda/CUDAAllocatorConfig.cpp), plus gpumem's `policy:torch|gpumem`.
 *
 * The string is split into tokens like torch does (',' ':' '[' ']' are
 * tokens, spaces are dropped) and parsed into a copy of the config, which
 * replaces the caller's only when the whole string is valid. The one error
 * message names the key and the value. gm_config_format writes the non-default
 * keys back in a canonical order that gm_config_parse reads again.
 * gpumem's own keys: `policy:torch|gpumem` and `gpumem_slack:<x>|inf` (how
 * much memory the gpumem policy may hold over its need before it moves idle
 * memory instead of creating more) and `gpumem_chunks:auto|granule|run` (the
 * size of its physical chunks at slack inf); see src/policy/gpumem/gpumem.c. */
#include "frontend.h"

#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MB GM__MIB
#define MIN_SPLIT_MB 20            /* kLargeBuffer / 1 MiB: torch's lower bound */
#define MAX_REGISTER_THREADS 128   /* torch's pinned_max_register_threads() */
#define MAX_TOKENS 256
/* gpumem_slack default: chosen by measurement, bench/gpumem_policy_tradeoff.md */
#define GPUMEM_SLACK_DEFAULT GM_GPUMEM_SLACK_AUTO

void gm_config_init(gm_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->size = sizeof *cfg;
    cfg->policy = GM_POLICY_TORCH;
    cfg->max_split_size = UINT64_MAX;
    cfg->max_non_split_rounding = 20 * MB;
    cfg->garbage_collection_threshold = 0.0;
    cfg->pinned_num_register_threads = 1;
    cfg->per_process_memory_fraction = 1.0;
    snprintf(cfg->backend, sizeof cfg->backend, "native");
    cfg->gpumem_slack = GPUMEM_SLACK_DEFAULT;
    cfg->gpumem_chunks = GM_GPUMEM_CHUNKS_AUTO; /* measured: bench/gpumem_policy_tradeoff.md */
    cfg->gpumem_plan = true; /* with gpumem_slack:auto: bench/gpumem_policy_tradeoff.md, "Tight warm-up" */
}

/* ---- tokenizer ---------------------------------------------------------- */

typedef struct tokens {
    char buf[1024];
    const char *t[MAX_TOKENS];
    int n;
} tokens;

static bool is_punct(char c) { return c == ',' || c == ':' || c == '[' || c == ']'; }

static bool lex(const char *s, tokens *tk) {
    size_t used = 0;
    tk->n = 0;
    for (const char *p = s; *p;) {
        if (*p == ' ' || *p == '\t' || *p == '\n') {
            p++;
            continue;
        }
        if (tk->n == MAX_TOKENS) return false;
        tk->t[tk->n++] = &tk->buf[used];
        if (is_punct(*p)) {
            if (used + 2 > sizeof tk->buf) return false;
            tk->buf[used++] = *p++;
        } else {
            /* a word runs to the next punctuation; inner spaces are dropped */
            while (*p && !is_punct(*p)) {
                if (*p != ' ' && *p != '\t' && *p != '\n') {
                    if (used + 2 > sizeof tk->buf) return false;
                    tk->buf[used++] = *p;
                }
                p++;
            }
        }
        tk->buf[used++] = '\0';
    }
    return true;
}

/* ---- values -------------------------------------------------------------- */

typedef struct parser {
    tokens tk;
    int i;
    char *err;
    size_t errlen;
} parser;

static int fail(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser *ps, const char *fmt, ...) {
    if (ps->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err, ps->errlen, fmt, ap);
        va_end(ap);
    }
    return GM_ECONFIG;
}

static const char *peek(parser *ps) { return ps->i < ps->tk.n ? ps->tk.t[ps->i] : NULL; }
static const char *next(parser *ps) { return ps->i < ps->tk.n ? ps->tk.t[ps->i++] : NULL; }

static int expect(parser *ps, const char *tok, const char *key) {
    const char *t = next(ps);
    if (!t || strcmp(t, tok)) return fail(ps, "%s: expected '%s', got '%s'", key, tok, t ? t : "end of string");
    return GM_OK;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!s || *s < '0' || *s > '9') return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

static bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

static int value(parser *ps, const char *key, const char **out) {
    int rc = expect(ps, ":", key);
    if (rc != GM_OK) return rc;
    *out = next(ps);
    if (!*out || is_punct(**out)) return fail(ps, "%s: missing value", key);
    return GM_OK;
}

static int parse_bool(parser *ps, const char *key, bool *out) {
    const char *v;
    int rc = value(ps, key, &v);
    if (rc != GM_OK) return rc;
    if (!strcmp(v, "True")) *out = true;
    else if (!strcmp(v, "False")) *out = false;
    else return fail(ps, "%s: bad value '%s' (expected True or False)", key, v);
    return GM_OK;
}

/* max_split_size_mb / max_non_split_rounding_mb: MB, >= 20, saturating */
static int parse_mb(parser *ps, const char *key, uint64_t *bytes) {
    const char *v;
    uint64_t mb;
    int rc = value(ps, key, &v);
    if (rc != GM_OK) return rc;
    if (!parse_u64(v, &mb) || mb < MIN_SPLIT_MB)
        return fail(ps, "%s: bad value '%s' (expected an integer number of MB >= %d)", key, v, MIN_SPLIT_MB);
    if (mb > (UINT64_MAX - 1) / MB) mb = (UINT64_MAX - 1) / MB;
    *bytes = mb * MB;
    return GM_OK;
}

/* roundup_power2_divisions: N (a power of two, for every interval) or
 * [MB:N,...,>:N] with torch's fill rules: the first entry also fills the
 * intervals below it, '>' fills from the previous entry's interval on. */
static int parse_roundup(parser *ps, const char *key, uint32_t div[GM_ROUNDUP_INTERVALS]) {
    const char *v;
    uint64_t n;
    int rc = expect(ps, ":", key);
    if (rc != GM_OK) return rc;
    v = next(ps);
    if (!v || (is_punct(*v) && strcmp(v, "["))) return fail(ps, "%s: missing value", key);
    if (strcmp(v, "[")) {
        if (!parse_u64(v, &n) || !is_pow2(n) || n > UINT32_MAX)
            return fail(ps, "%s: bad value '%s' (expected a power of two)", key, v);
        for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++) div[i] = (uint32_t)n;
        return GM_OK;
    }
    bool first = true;
    int last = 0;
    for (;;) {
        const char *k = next(ps);
        if (!k) return fail(ps, "%s: missing ']'", key);
        if (!strcmp(k, "]")) break;
        if ((rc = expect(ps, ":", key)) != GM_OK) return rc;
        const char *dv = next(ps);
        if (!parse_u64(dv, &n) || (n && !is_pow2(n)) || n > UINT32_MAX)
            return fail(ps, "%s: bad divisions '%s' for '%s' (expected a power of two or 0)", key,
                        dv ? dv : "", k);
        if (!strcmp(k, ">")) {
            for (int i = last; i < GM_ROUNDUP_INTERVALS; i++) div[i] = (uint32_t)n;
        } else {
            uint64_t mb;
            if (!parse_u64(k, &mb) || !is_pow2(mb))
                return fail(ps, "%s: bad interval '%s' (expected a power of two in MB, or '>')", key, k);
            int idx = 63 - __builtin_clzll(mb);
            if (idx > GM_ROUNDUP_INTERVALS - 1) idx = GM_ROUNDUP_INTERVALS - 1;
            if (first) {
                for (int i = 0; i < idx; i++) div[i] = (uint32_t)n;
                first = false;
            }
            div[idx] = (uint32_t)n;
            last = idx;
        }
        const char *sep = peek(ps);
        if (sep && !strcmp(sep, ",")) ps->i++;
        else if (!sep || strcmp(sep, "]")) return fail(ps, "%s: expected ',' or ']' after '%s'", key, dv);
    }
    return GM_OK;
}

/* ---- the settings table ----------------------------------------------------
 * Every key, once: its type (which parser, checker and formatter it uses), the
 * field it sets, the policy it applies to, its default and range as shown to
 * users, and what it does. gm_config_parse, gm__config_check, gm_config_format
 * and gm_setting_info (and through it `gpumem config --list`) all read this
 * table; its order is the canonical order of gm_config_format.
 * gm_config_init writes the typed defaults; test_config checks that each one
 * reads back as its `def` text here. */

typedef enum setting_type {
    T_POLICY,   /* a name in the policy table */
    T_BACKEND,  /* native | cudaMallocAsync, into char[32] */
    T_MB,       /* integer MB >= 20 into uint64_t bytes; UINT64_MAX = unlimited */
    T_FRACTION, /* double: (0, 1) for the GC threshold (0 = off), [0, 1] for the memory fraction */
    T_ROUNDUP,  /* roundup_power2_divisions: N or [MB:N,...,>:N] */
    T_BOOL,     /* True | False */
    T_POW2,     /* uint32_t power of two <= MAX_REGISTER_THREADS */
    T_POSINT,   /* integer > 0, validated and ignored (no field) */
    T_SLACK,    /* double >= 0, or inf */
    T_CHUNKS,   /* auto | granule | run (gm_gpumem_chunks) */
    T_ONOFF,    /* off | on, into bool */
} setting_type;

typedef struct setting {
    const char *key;
    const char *alias;  /* torch's HIP spelling, or NULL */
    setting_type type;
    size_t offset;      /* of the field in gm_config; unused for T_POSINT */
    const char *policy; /* the one policy it applies to, or NULL for all */
    const char *def;    /* default, as gm_config_get writes it */
    const char *range;
    const char *doc;
} setting;

#define F(field) offsetof(gm_config, field)
static const setting settings[] = {
    {"policy", NULL, T_POLICY, F(policy), NULL, "torch", "a policy name (gpumem config --list)",
     "which allocator policy places blocks"},
    {"backend", NULL, T_BACKEND, F(backend), NULL, "native", "native|cudaMallocAsync",
     "torch's allocator backend; cudaMallocAsync is accepted but replayed as native (not modelled)"},
    {"max_split_size_mb", NULL, T_MB, F(max_split_size), NULL, "unlimited", "integer MB >= 20",
     "cached blocks at least this large are never split (policy:torch); both policies count "
     "allocations this large as oversize_allocations"},
    {"max_non_split_rounding_mb", NULL, T_MB, F(max_non_split_rounding), "torch", "20", "integer MB >= 20",
     "a request for an unsplittable size may take a cached block this much larger"},
    {"garbage_collection_threshold", NULL, T_FRACTION, F(garbage_collection_threshold), "torch", "0",
     "number in (0, 1)", "free cached blocks once reserved memory passes this share of the allowed memory"},
    {"roundup_power2_divisions", NULL, T_ROUNDUP, F(roundup_power2_divisions), "torch", "0",
     "power of two, or [MB:N,...,>:N]", "round request sizes up to one of N steps per power of two"},
    {"expandable_segments", NULL, T_BOOL, F(expandable_segments), "torch", "False", "True|False",
     "grow segments by mapping memory into a reserved range instead of new cudaMallocs"},
    {"release_lock_on_cudamalloc", "release_lock_on_hipmalloc", T_BOOL, F(release_lock_on_cudamalloc),
     "torch", "False", "True|False", "accepted as torch does; no effect on placement"},
    {"pinned_use_cuda_host_register", "pinned_use_hip_host_register", T_BOOL,
     F(pinned_use_cuda_host_register), NULL, "False", "True|False", "host-side (pinned memory): kept, no effect"},
    {"pinned_num_register_threads", NULL, T_POW2, F(pinned_num_register_threads), NULL, "1",
     "power of two <= 128", "host-side (pinned memory): kept, no effect"},
    {"pinned_use_background_threads", NULL, T_BOOL, F(pinned_use_background_threads), NULL, "False",
     "True|False", "host-side (pinned memory): kept, no effect"},
    {"graph_capture_record_stream_reuse", NULL, T_BOOL, F(graph_capture_record_stream_reuse), NULL, "False",
     "True|False", "accepted as torch does; no effect outside CUDA graphs"},
    {"per_process_memory_fraction", NULL, T_FRACTION, F(per_process_memory_fraction), NULL, "1",
     "number in [0, 1]", "share of the device this process may reserve"},
    {"pinned_reserve_segment_size_mb", NULL, T_POSINT, 0, NULL, "-", "integer > 0",
     "host-side (pinned memory): validated, no effect"},
    {"gpumem_slack", NULL, T_SLACK, F(gpumem_slack), "gpumem", "auto", "auto, number >= 0, or inf",
     "memory held over the peak of live granules before idle memory moves instead of growing "
     "(0: least memory, moves every step; inf: no device calls once warm; auto: 0 until a plan serves, then inf)"},
    {"gpumem_chunks", NULL, T_CHUNKS, F(gpumem_chunks), "gpumem", "auto", "auto|granule|run",
     "size of the physical chunks (gm_config.gpumem_chunks in gpumem.h)"},
    {"gpumem_plan", NULL, T_ONOFF, F(gpumem_plan), "gpumem", "on", "off|on",
     "learn the repeating step and serve its allocations at planned addresses (gm_config.gpumem_plan)"},
};
#undef F
#define NSETTINGS (sizeof settings / sizeof settings[0])

static const char *const chunk_names[] = {"granule", "run", "auto"}; /* by gm_gpumem_chunks */

static const setting *find_setting(const char *key) {
    for (size_t i = 0; i < NSETTINGS; i++)
        if (!strcmp(settings[i].key, key) || (settings[i].alias && !strcmp(settings[i].alias, key)))
            return &settings[i];
    return NULL;
}

static void *field_of(gm_config *c, const setting *s) { return (char *)c + s->offset; }
static const void *cfield_of(const gm_config *c, const setting *s) { return (const char *)c + s->offset; }
static bool is_gc(const setting *s) { return s->offset == offsetof(gm_config, garbage_collection_threshold); }

static int parse_setting(parser *ps, const setting *s, const char *key, gm_config *c) {
    const char *v;
    uint64_t n;
    double d;
    int rc;
    void *f = field_of(c, s);
    switch (s->type) {
    case T_MB: return parse_mb(ps, key, f);
    case T_ROUNDUP: return parse_roundup(ps, key, f);
    case T_BOOL: return parse_bool(ps, key, f);
    default: break;
    }
    if ((rc = value(ps, key, &v)) != GM_OK) return rc;
    switch (s->type) {
    case T_POLICY: {
        int k = gm_policy_find(v);
        if (k < 0) {
            char names[160];
            gm__policy_names(names, sizeof names);
            return fail(ps, "%s: bad value '%s' (expected %s)", key, v, names);
        }
        *(gm_policy_kind *)f = (gm_policy_kind)k;
        return GM_OK;
    }
    case T_BACKEND:
        if (strcmp(v, "native") && strcmp(v, "cudaMallocAsync"))
            return fail(ps, "%s: bad value '%s' (expected native or cudaMallocAsync)", key, v);
        snprintf(f, sizeof c->backend, "%s", v);
        return GM_OK;
    case T_FRACTION:
        if (!parse_double(v, &d) || !(is_gc(s) ? d > 0.0 && d < 1.0 : d >= 0.0 && d <= 1.0))
            return fail(ps, "%s: bad value '%s' (expected a %s)", key, v, s->range);
        *(double *)f = d;
        return GM_OK;
    case T_POW2:
        if (!parse_u64(v, &n) || !is_pow2(n) || n > MAX_REGISTER_THREADS)
            return fail(ps, "%s: bad value '%s' (expected a power of two <= %d)", key, v, MAX_REGISTER_THREADS);
        *(uint32_t *)f = (uint32_t)n;
        return GM_OK;
    case T_POSINT:
        if (!parse_u64(v, &n) || n == 0) return fail(ps, "%s: bad value '%s' (expected an integer > 0)", key, v);
        return GM_OK;
    case T_SLACK:
        if (!strcmp(v, "inf")) d = INFINITY;
        else if (!strcmp(v, "auto")) d = GM_GPUMEM_SLACK_AUTO;
        else if (!parse_double(v, &d) || !(d >= 0.0))
            return fail(ps, "%s: bad value '%s' (expected auto, a number >= 0, or inf)", key, v);
        *(double *)f = d;
        return GM_OK;
    case T_CHUNKS:
        for (unsigned i = 0; i < 3; i++)
            if (!strcmp(v, chunk_names[i])) {
                *(gm_gpumem_chunks *)f = (gm_gpumem_chunks)i;
                return GM_OK;
            }
        return fail(ps, "%s: bad value '%s' (expected granule, run or auto)", key, v);
    case T_ONOFF:
        if (strcmp(v, "off") && strcmp(v, "on")) return fail(ps, "%s: bad value '%s' (expected off or on)", key, v);
        *(bool *)f = !strcmp(v, "on");
        return GM_OK;
    default: return fail(ps, "%s: unhandled setting type", key);
    }
}

/* Is the field of s in range? (A config built in C may skip the parser.) */
static bool setting_ok(const gm_config *c, const setting *s) {
    const void *f = cfield_of(c, s);
    switch (s->type) {
    case T_POLICY: return gm__policy_get((int)*(const gm_policy_kind *)f) != NULL;
    case T_BACKEND: return !strcmp(f, "native") || !strcmp(f, "cudaMallocAsync");
    case T_MB: return *(const uint64_t *)f >= MIN_SPLIT_MB * MB;
    case T_FRACTION: {
        double d = *(const double *)f;
        return is_gc(s) ? d >= 0.0 && d < 1.0 : d >= 0.0 && d <= 1.0; /* gc 0 = off */
    }
    case T_ROUNDUP:
        for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++)
            if (c->roundup_power2_divisions[i] && !is_pow2(c->roundup_power2_divisions[i])) return false;
        return true;
    case T_POW2: return is_pow2(*(const uint32_t *)f) && *(const uint32_t *)f <= MAX_REGISTER_THREADS;
    case T_SLACK: /* NaN fails; +inf is valid */
        return *(const double *)f >= 0.0 || *(const double *)f == GM_GPUMEM_SLACK_AUTO;
    case T_CHUNKS: return (unsigned)*(const gm_gpumem_chunks *)f < 3u;
    default: return true;
    }
}

static bool setting_is_default(const gm_config *c, const gm_config *def, const setting *s) {
    size_t size;
    switch (s->type) {
    case T_POSINT: return true;
    case T_BACKEND: return !strcmp(cfield_of(c, s), cfield_of(def, s));
    case T_FRACTION:
    case T_SLACK: return *(const double *)cfield_of(c, s) == *(const double *)cfield_of(def, s);
    case T_POLICY: size = sizeof c->policy; break;
    case T_MB: size = sizeof(uint64_t); break;
    case T_ROUNDUP: size = sizeof c->roundup_power2_divisions; break;
    case T_BOOL:
    case T_ONOFF: size = sizeof(bool); break;
    case T_POW2: size = sizeof(uint32_t); break;
    case T_CHUNKS: size = sizeof c->gpumem_chunks; break;
    default: return true;
    }
    return !memcmp(cfield_of(c, s), cfield_of(def, s), size);
}

int gm_config_parse(gm_config *cfg, const char *str, char *err, size_t errlen) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (errlen) err[0] = '\0';
    if (!cfg) return GM_EINVAL;
    if (!str || !*str) return GM_OK;
    parser ps = {.err = err, .errlen = errlen};
    if (strlen(str) >= sizeof ps.tk.buf / 2 || !lex(str, &ps.tk)) {
        fail(&ps, "configuration string too long");
        return gm__set_error(GM_ECONFIG, "%s", errlen ? err : "configuration string too long");
    }
    gm_config c = *cfg;
    int rc = GM_OK;
    /* which keys this string set (a key may repeat: the last value wins) */
    bool seen[NSETTINGS] = {false};
    const setting *st;
    while (rc == GM_OK && peek(&ps)) {
        const char *key = next(&ps);
        if (is_punct(*key)) rc = fail(&ps, "unexpected '%s'", key);
        else if (!(st = find_setting(key))) rc = fail(&ps, "unknown key '%s'", key);
        else {
            rc = parse_setting(&ps, st, key, &c);
            seen[st - settings] = true;
        }
        if (rc == GM_OK && peek(&ps)) rc = expect(&ps, ",", key);
    }
    /* A key of another policy would be silently ignored: refuse it instead. */
    const char *pol = gm_policy_name((int)c.policy);
    for (size_t i = 0; rc == GM_OK && i < NSETTINGS; i++) {
        const setting *k = &settings[i];
        if (seen[i] && k->policy && pol && strcmp(k->policy, pol))
            rc = fail(&ps, "%s applies to policy:%s only (the policy here is %s); add policy:%s or drop it",
                      k->key, k->policy, pol, k->policy);
    }
    if (rc != GM_OK) return gm__set_error(rc, "%s", errlen ? err : "invalid allocator configuration");
    *cfg = c;
    return GM_OK;
}

/* Keys an allocator's policy state and statistics are built from when it
 * is made: gm_allocator_set_settings refuses to change them. Every other
 * key is read on each call (or has no effect) and may change live. */
static const char *const fixed_at_start[] = {"policy", "backend", "max_split_size_mb", "gpumem_slack",
                                              "gpumem_chunks", "gpumem_plan"};

const char *gm__config_fixed_change(const gm_config *was, const gm_config *now) {
    for (size_t i = 0; i < sizeof fixed_at_start / sizeof *fixed_at_start; i++) {
        const setting *s = find_setting(fixed_at_start[i]);
        if (s && !setting_is_default(now, was, s)) return s->key;
    }
    return NULL;
}

int gm__config_check(const gm_config *c, char *err, size_t errlen) {
    for (size_t i = 0; i < NSETTINGS; i++) {
        if (setting_ok(c, &settings[i])) continue;
        if (errlen && settings[i].type == T_POLICY && !gm_policy_count())
            snprintf(err, errlen, "invalid configuration: %s: %s", settings[i].key, GM__POLICY_NONE);
        else if (errlen) snprintf(err, errlen, "invalid configuration: %s out of range", settings[i].key);
        return GM_ECONFIG;
    }
    return GM_OK;
}

/* ---- format -------------------------------------------------------------- */

/* the shortest %g that reads back as the same double */
static void put_double(gm__putbuf *o, double v) {
    char b[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    gm__put(o, "%s", b);
}

static void sep(gm__putbuf *o) {
    if (o->pos) gm__put(o, ",");
}

static void format_roundup(gm__putbuf *o, const uint32_t *d) {
    bool uniform = true;
    for (int i = 1; i < GM_ROUNDUP_INTERVALS; i++) uniform &= d[i] == d[0];
    sep(o);
    if (uniform) {
        gm__put(o, "roundup_power2_divisions:%u", d[0]);
        return;
    }
    /* the first entry also fills the intervals below it */
    int start = 0;
    while (start + 1 < GM_ROUNDUP_INTERVALS && d[start + 1] == d[0]) start++;
    gm__put(o, "roundup_power2_divisions:[");
    for (int i = start; i < GM_ROUNDUP_INTERVALS; i++)
        gm__put(o, "%s%llu:%u", i == start ? "" : ",", 1ull << i, d[i]);
    gm__put(o, "]");
}

/* "key:value" for one setting, whatever its value (roundup: "key:..." too). */
static void format_setting(gm__putbuf *o, const gm_config *cfg, const setting *s) {
    const void *f = cfield_of(cfg, s);
    if (s->type == T_POSINT) return;
    if (s->type == T_ROUNDUP) {
        format_roundup(o, f);
        return;
    }
    sep(o);
    gm__put(o, "%s:", s->key);
    switch (s->type) {
    case T_POLICY: {
        const char *name = gm_policy_name((int)*(const gm_policy_kind *)f);
        gm__put(o, "%s", name ? name : "?");
        break;
    }
    case T_BACKEND: gm__put(o, "%s", (const char *)f); break;
    case T_MB: {
        uint64_t v = *(const uint64_t *)f;
        if (v == UINT64_MAX) gm__put(o, "unlimited");
        else gm__put(o, "%llu", (unsigned long long)(v / MB));
        break;
    }
    case T_FRACTION: put_double(o, *(const double *)f); break;
    case T_BOOL: gm__put(o, "%s", *(const bool *)f ? "True" : "False"); break;
    case T_POW2: gm__put(o, "%u", *(const uint32_t *)f); break;
    case T_SLACK:
        if (isinf(*(const double *)f)) gm__put(o, "inf");
        else if (*(const double *)f == GM_GPUMEM_SLACK_AUTO) gm__put(o, "auto");
        else put_double(o, *(const double *)f);
        break;
    case T_CHUNKS: gm__put(o, "%s", chunk_names[(unsigned)*(const gm_gpumem_chunks *)f % 3u]); break;
    case T_ONOFF: gm__put(o, "%s", *(const bool *)f ? "on" : "off"); break;
    default: break;
    }
}

int gm_config_format(const gm_config *cfg, char *buf, size_t len) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!cfg || (!buf && len)) return GM_EINVAL;
    gm_config def;
    gm_config_init(&def);
    gm__putbuf o = {buf, len, 0, false};
    if (len) buf[0] = '\0';
    for (size_t i = 0; i < NSETTINGS; i++)
        if (!setting_is_default(cfg, &def, &settings[i])) format_setting(&o, cfg, &settings[i]);
    return gm__put_finish(&o, "gm_config_format");
}

/* ---- the table, for front ends (gpumem config --list, Python) ------------ */

int gm_setting_count(void) { return (int)NSETTINGS; }

int gm_setting_info(int i, gm_setting_desc *out) {
    if (i < 0 || (size_t)i >= NSETTINGS || !out) return gm__set_error(GM_EINVAL, "gm_setting_info: no setting %d", i);
    const setting *s = &settings[i];
    *out = (gm_setting_desc){s->key, s->alias, s->policy, s->def, s->range, s->doc};
    return GM_OK;
}

int gm_config_get(const gm_config *cfg, const char *key, char *buf, size_t len) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    const setting *s = key ? find_setting(key) : NULL;
    if (!cfg || !s || !buf || !len)
        return gm__set_error(GM_EINVAL, "gm_config_get: unknown key '%s'", key ? key : "(null)");
    char tmp[512];
    gm__putbuf t = {tmp, sizeof tmp, 0, false};
    tmp[0] = '\0';
    format_setting(&t, cfg, s);
    int rc = gm__put_finish(&t, "gm_config_get");
    if (rc != GM_OK) return rc;
    const char *colon = strchr(tmp, ':');
    gm__putbuf o = {buf, len, 0, false};
    gm__put(&o, "%s", s->type == T_POSINT ? s->def : colon ? colon + 1 : tmp);
    return gm__put_finish(&o, "gm_config_get");
}
