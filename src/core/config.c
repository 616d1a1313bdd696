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
 * size of its physical chunks at slack inf); see policy_gpumem.c. */
#include "frontend.h"

#include <errno.h>
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
#define GPUMEM_SLACK_DEFAULT INFINITY

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

static int parse_key(parser *ps, const char *key, gm_config *c) {
    const char *v;
    uint64_t n;
    double d;
    int rc;
    if (!strcmp(key, "max_split_size_mb")) return parse_mb(ps, key, &c->max_split_size);
    if (!strcmp(key, "max_non_split_rounding_mb")) return parse_mb(ps, key, &c->max_non_split_rounding);
    if (!strcmp(key, "roundup_power2_divisions")) return parse_roundup(ps, key, c->roundup_power2_divisions);
    if (!strcmp(key, "expandable_segments")) return parse_bool(ps, key, &c->expandable_segments);
    if (!strcmp(key, "release_lock_on_cudamalloc") || !strcmp(key, "release_lock_on_hipmalloc"))
        return parse_bool(ps, key, &c->release_lock_on_cudamalloc);
    if (!strcmp(key, "pinned_use_cuda_host_register") || !strcmp(key, "pinned_use_hip_host_register"))
        return parse_bool(ps, key, &c->pinned_use_cuda_host_register);
    if (!strcmp(key, "pinned_use_background_threads"))
        return parse_bool(ps, key, &c->pinned_use_background_threads);
    if (!strcmp(key, "graph_capture_record_stream_reuse"))
        return parse_bool(ps, key, &c->graph_capture_record_stream_reuse);
    if ((rc = value(ps, key, &v)) != GM_OK) return rc;
    if (!strcmp(key, "garbage_collection_threshold")) {
        if (!parse_double(v, &d) || !(d > 0.0 && d < 1.0))
            return fail(ps, "%s: bad value '%s' (expected a number in (0, 1))", key, v);
        c->garbage_collection_threshold = d;
    } else if (!strcmp(key, "per_process_memory_fraction")) {
        if (!parse_double(v, &d) || !(d >= 0.0 && d <= 1.0))
            return fail(ps, "%s: bad value '%s' (expected a number in [0, 1])", key, v);
        c->per_process_memory_fraction = d;
    } else if (!strcmp(key, "pinned_num_register_threads")) {
        if (!parse_u64(v, &n) || !is_pow2(n) || n > MAX_REGISTER_THREADS)
            return fail(ps, "%s: bad value '%s' (expected a power of two <= %d)", key, v, MAX_REGISTER_THREADS);
        c->pinned_num_register_threads = (uint32_t)n;
    } else if (!strcmp(key, "pinned_reserve_segment_size_mb")) {
        /* host-side, no field: validated like torch, then ignored */
        if (!parse_u64(v, &n) || n == 0) return fail(ps, "%s: bad value '%s' (expected an integer > 0)", key, v);
    } else if (!strcmp(key, "backend")) {
        if (strcmp(v, "native") && strcmp(v, "cudaMallocAsync"))
            return fail(ps, "%s: bad value '%s' (expected native or cudaMallocAsync)", key, v);
        snprintf(c->backend, sizeof c->backend, "%s", v);
    } else if (!strcmp(key, "gpumem_slack")) {
        if (!strcmp(v, "inf")) d = INFINITY;
        else if (!parse_double(v, &d) || !(d >= 0.0))
            return fail(ps, "%s: bad value '%s' (expected a number >= 0, or inf)", key, v);
        c->gpumem_slack = d;
    } else if (!strcmp(key, "gpumem_chunks")) {
        if (!strcmp(v, "granule")) c->gpumem_chunks = GM_GPUMEM_CHUNKS_GRANULE;
        else if (!strcmp(v, "run")) c->gpumem_chunks = GM_GPUMEM_CHUNKS_RUN;
        else if (!strcmp(v, "auto")) c->gpumem_chunks = GM_GPUMEM_CHUNKS_AUTO;
        else return fail(ps, "%s: bad value '%s' (expected granule, run or auto)", key, v);
    } else if (!strcmp(key, "policy")) {
        if (!strcmp(v, "torch")) c->policy = GM_POLICY_TORCH;
        else if (!strcmp(v, "gpumem")) c->policy = GM_POLICY_GPUMEM;
        else return fail(ps, "%s: bad value '%s' (expected torch or gpumem)", key, v);
    } else {
        return fail(ps, "unknown key '%s'", key);
    }
    return GM_OK;
}

static const char *const known_keys[] = {
    "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "expandable_segments", "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc", "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
    "pinned_num_register_threads", "pinned_use_background_threads", "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse", "per_process_memory_fraction", "backend", "policy",
    "gpumem_slack", "gpumem_chunks",
};

static bool known(const char *key) {
    for (size_t i = 0; i < sizeof known_keys / sizeof *known_keys; i++)
        if (!strcmp(known_keys[i], key)) return true;
    return false;
}

int gm_config_parse(gm_config *cfg, const char *str, char *err, size_t errlen) {
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
    while (rc == GM_OK && peek(&ps)) {
        const char *key = next(&ps);
        if (is_punct(*key)) rc = fail(&ps, "unexpected '%s'", key);
        else if (!known(key)) rc = fail(&ps, "unknown key '%s'", key);
        else rc = parse_key(&ps, key, &c);
        if (rc == GM_OK && peek(&ps)) rc = expect(&ps, ",", key);
    }
    if (rc != GM_OK) return gm__set_error(rc, "%s", errlen ? err : "invalid allocator configuration");
    *cfg = c;
    return GM_OK;
}

int gm__config_check(const gm_config *c, char *err, size_t errlen) {
    const char *bad = NULL;
    if (c->policy != GM_POLICY_TORCH && c->policy != GM_POLICY_GPUMEM) bad = "policy";
    else if (c->max_split_size < MIN_SPLIT_MB * MB) bad = "max_split_size";
    else if (c->max_non_split_rounding < MIN_SPLIT_MB * MB) bad = "max_non_split_rounding";
    else if (!(c->garbage_collection_threshold >= 0.0 && c->garbage_collection_threshold < 1.0))
        bad = "garbage_collection_threshold";
    else if (!(c->per_process_memory_fraction >= 0.0 && c->per_process_memory_fraction <= 1.0))
        bad = "per_process_memory_fraction";
    else if (strcmp(c->backend, "native") && strcmp(c->backend, "cudaMallocAsync")) bad = "backend";
    else if (!(c->gpumem_slack >= 0.0)) bad = "gpumem_slack"; /* NaN too; +inf is valid */
    else if (c->gpumem_chunks != GM_GPUMEM_CHUNKS_GRANULE && c->gpumem_chunks != GM_GPUMEM_CHUNKS_RUN &&
             c->gpumem_chunks != GM_GPUMEM_CHUNKS_AUTO)
        bad = "gpumem_chunks";
    for (int i = 0; !bad && i < GM_ROUNDUP_INTERVALS; i++)
        if (c->roundup_power2_divisions[i] && !is_pow2(c->roundup_power2_divisions[i]))
            bad = "roundup_power2_divisions";
    if (!bad) return GM_OK;
    if (errlen) snprintf(err, errlen, "invalid configuration: %s out of range", bad);
    return GM_ECONFIG;
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

int gm_config_format(const gm_config *cfg, char *buf, size_t len) {
    if (!cfg || (!buf && len)) return GM_EINVAL;
    gm_config def;
    gm_config_init(&def);
    gm__putbuf o = {buf, len, 0, false};
    if (len) buf[0] = '\0';
    if (cfg->policy != def.policy) gm__put(&o, "policy:%s", cfg->policy == GM_POLICY_GPUMEM ? "gpumem" : "torch");
    if (strcmp(cfg->backend, def.backend)) sep(&o), gm__put(&o, "backend:%s", cfg->backend);
    if (cfg->max_split_size != def.max_split_size)
        sep(&o), gm__put(&o, "max_split_size_mb:%llu", (unsigned long long)(cfg->max_split_size / MB));
    if (cfg->max_non_split_rounding != def.max_non_split_rounding)
        sep(&o), gm__put(&o, "max_non_split_rounding_mb:%llu", (unsigned long long)(cfg->max_non_split_rounding / MB));
    if (cfg->garbage_collection_threshold != def.garbage_collection_threshold)
        sep(&o), gm__put(&o, "garbage_collection_threshold:"), put_double(&o, cfg->garbage_collection_threshold);
    if (memcmp(cfg->roundup_power2_divisions, def.roundup_power2_divisions, sizeof def.roundup_power2_divisions))
        format_roundup(&o, cfg->roundup_power2_divisions);
#define GM__FMT_BOOL(field, key)                                               \
    if (cfg->field != def.field) sep(&o), gm__put(&o, key ":%s", cfg->field ? "True" : "False");
    GM__FMT_BOOL(expandable_segments, "expandable_segments")
    GM__FMT_BOOL(release_lock_on_cudamalloc, "release_lock_on_cudamalloc")
    GM__FMT_BOOL(pinned_use_cuda_host_register, "pinned_use_cuda_host_register")
#undef GM__FMT_BOOL
    if (cfg->pinned_num_register_threads != def.pinned_num_register_threads)
        sep(&o), gm__put(&o, "pinned_num_register_threads:%u", cfg->pinned_num_register_threads);
    if (cfg->pinned_use_background_threads)
        sep(&o), gm__put(&o, "pinned_use_background_threads:True");
    if (cfg->graph_capture_record_stream_reuse)
        sep(&o), gm__put(&o, "graph_capture_record_stream_reuse:True");
    if (cfg->per_process_memory_fraction != def.per_process_memory_fraction)
        sep(&o), gm__put(&o, "per_process_memory_fraction:"), put_double(&o, cfg->per_process_memory_fraction);
    if (cfg->gpumem_slack != def.gpumem_slack) {
        sep(&o), gm__put(&o, "gpumem_slack:");
        if (isinf(cfg->gpumem_slack)) gm__put(&o, "inf");
        else put_double(&o, cfg->gpumem_slack);
    }
    if (cfg->gpumem_chunks != def.gpumem_chunks) {
        static const char *const names[] = {"granule", "run", "auto"};
        sep(&o), gm__put(&o, "gpumem_chunks:%s", names[(unsigned)cfg->gpumem_chunks % 3u]);
    }
    return gm__put_finish(&o, "gm_config_format");
}
