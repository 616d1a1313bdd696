/* scopes.c — the timeline stacked by scope (report.h, docs/report.md): live
 * requested bytes per scope at the timeline's points, for every depth of
 * the module path, the top N scopes of each depth by their bytes at the
 * peak and one "other scopes" series for the rest, so the series count
 * stays small. The HTML's "stack by" control and --json write the same
 * series (gm__scope_series_json).
 *
 * An allocation's scope at depth d:
 *  - gpumem scopes (history dumps, .gmt, gpumem.torch.track): its innermost
 *    scope that is not a phase scope (forward, backward, optimizer.step,
 *    untracked) is a module path; cut to d dot-separated components
 *    ("transformer.h.3.attn" at depth 3 is "transformer.h.3");
 *  - else Python frames (torch snapshots): torch records function names,
 *    not module instances, so the scope is the call path through the
 *    module `forward` frames on the stack, outermost first, as file:line of
 *    each call: at depth d the first d forward frames. Every instance of a
 *    module class called from one line (the blocks of a loop) shares it;
 *    an allocation made in a forward's own code (fewer than d forward
 *    frames below) ends with that file and "(self)";
 *  - else its phase in brackets ("[backward]", "[untracked]", "[no frames]"). */
#include "report.h"

#include "internal.h"
#include "util/idmap.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define OP_NONE UINT32_MAX
#define OP_FREE 0x80000000u
#define NO_KEY UINT32_MAX

/* interned key strings */
typedef struct keys {
    char **s;
    uint32_t n, cap;
    uint32_t *h; /* open addressing: 1 + id, 0 empty */
    uint32_t hcap;
} keys;

/* keyed (util/idmap.h): the keys are file names and module paths from the
 * trace, and crafted ones sharing one chain of the plain FNV-1a this was
 * made the work quadratic (bench/RESULTS.md, "crafted inputs") */
static uint64_t hash_str(const char *s) { return gm__hash_bytes(s, strlen(s)); }

static int keys_intern(keys *k, const char *s, uint32_t *id) {
    if ((k->n + 1) * 2 > k->hcap) {
        uint32_t ncap = k->hcap ? k->hcap * 2 : 256;
        uint32_t *nh = calloc(ncap, sizeof *nh);
        if (!nh) return GM_ENOHOSTMEM;
        for (uint32_t i = 0; i < k->n; i++) {
            uint32_t j = (uint32_t)hash_str(k->s[i]) & (ncap - 1);
            while (nh[j]) j = (j + 1) & (ncap - 1);
            nh[j] = i + 1;
        }
        free(k->h);
        k->h = nh;
        k->hcap = ncap;
    }
    uint32_t j = (uint32_t)hash_str(s) & (k->hcap - 1);
    for (; k->h[j]; j = (j + 1) & (k->hcap - 1), gm__work_steps++)
        if (!strcmp(k->s[k->h[j] - 1], s)) {
            *id = k->h[j] - 1;
            return GM_OK;
        }
    if (k->n == k->cap) {
        uint32_t nc = k->cap ? k->cap * 2 : 64;
        char **ns = realloc(k->s, nc * sizeof *ns);
        if (!ns) return GM_ENOHOSTMEM;
        k->s = ns;
        k->cap = nc;
    }
    if (!(k->s[k->n] = strdup(s))) return GM_ENOHOSTMEM;
    k->h[j] = k->n + 1;
    *id = k->n++;
    return GM_OK;
}

static void keys_free(keys *k) {
    for (uint32_t i = 0; i < k->n; i++) free(k->s[i]);
    free(k->s);
    free(k->h);
}

static bool phase_scope(const char *name) {
    return !strcmp(name, GM_SCOPE_FORWARD) || !strcmp(name, GM_SCOPE_BACKWARD) ||
           !strcmp(name, GM_SCOPE_OPTIMIZER) || !strcmp(name, GM_SCOPE_UNTRACKED);
}

/* What a stack says about scopes: its module path (gpumem scope), else its
 * forward frames (outermost first), else the innermost phase-like scope. */
typedef struct stack_info {
    const char *path;         /* innermost non-phase gpumem scope */
    const char *phase_scope;  /* innermost phase-like gpumem scope */
    uint32_t fwd[GM_SCOPE_DEPTH_MAX + 1], nfwd; /* frame ids, outermost first (first DEPTH_MAX + 1) */
    uint32_t nfwd_all;
} stack_info;

static stack_info stack_scopes(const gm_trace *t, uint32_t s) {
    stack_info si = {0};
    uint32_t lo = t->stack_off[s], hi = t->stack_off[s + 1];
    for (uint32_t k = lo; k < hi; k++) {
        const gm_trace_frame *f = &t->frames[t->stack_frames[k]];
        const char *file = t->strings[f->filename], *name = t->strings[f->name];
        if (!strcmp(file, GM_TAG_SCOPE_FILE)) {
            if (phase_scope(name)) {
                if (!si.phase_scope) si.phase_scope = name;
            } else if (!si.path) {
                si.path = name;
            }
        }
    }
    for (uint32_t k = hi; k-- > lo;) { /* outermost first */
        const gm_trace_frame *f = &t->frames[t->stack_frames[k]];
        if (strcmp(t->strings[f->name], "forward") || !strcmp(t->strings[f->filename], GM_TAG_SCOPE_FILE))
            continue;
        if (si.nfwd < GM_SCOPE_DEPTH_MAX + 1) si.fwd[si.nfwd++] = t->stack_frames[k];
        si.nfwd_all++;
    }
    return si;
}

/* Dot-separated components of a module path. */
static int path_depth(const char *p) {
    int n = 1;
    for (; *p; p++) n += *p == '.';
    return n;
}

static const char *base_name(const char *file) {
    const char *s = strrchr(file, '/');
    return s ? s + 1 : file;
}

/* The key of a stack at depth d into buf. */
static void stack_key(const gm_trace *t, const stack_info *si, int phase, int d, char *buf, size_t len) {
    if (si->path) {
        const char *p = si->path;
        int c = 0;
        size_t n = 0;
        while (p[n] && !(p[n] == '.' && ++c == d)) n++;
        snprintf(buf, len, "%.*s", (int)n, p);
    } else if (si->nfwd) {
        size_t w = 0;
        uint32_t n = si->nfwd < (uint32_t)d ? si->nfwd : (uint32_t)d;
        bool self = si->nfwd_all <= (uint32_t)d; /* the allocation is in the last one's own code */
        const char *prev = NULL;
        for (uint32_t j = 0; j < n && w < len; j++) {
            const gm_trace_frame *f = &t->frames[si->fwd[j]];
            const char *file = base_name(t->strings[f->filename]);
            bool same = prev && !strcmp(prev, file);
            int r;
            if (self && j + 1 == n)
                r = snprintf(buf + w, len - w, "%s%s (self)", j ? " > " : "", file);
            else
                r = snprintf(buf + w, len - w, "%s%s:%d", j ? " > " : "", same ? "" : file, (int)f->line);
            if (r < 0) break;
            w += (size_t)r;
            prev = file;
        }
        if (w >= len && len > 4) strcpy(buf + len - 4, "...");
    } else if (si->phase_scope && !strcmp(si->phase_scope, GM_SCOPE_UNTRACKED)) {
        snprintf(buf, len, "[%s]", GM_SCOPE_UNTRACKED);
    } else {
        snprintf(buf, len, "[%s]", phase == GM_PH_NONE ? "no frames" : gm__phase_name(phase));
    }
}

static int stack_depth(const stack_info *si) {
    if (si->path) return path_depth(si->path);
    return (int)si->nfwd_all;
}

typedef struct rank {
    uint32_t key;
    int64_t at_peak, max;
} rank;

static int cmp_rank(const void *x, const void *y) {
    const rank *a = x, *b = y;
    if (a->at_peak != b->at_peak) return a->at_peak > b->at_peak ? -1 : 1;
    if (a->max != b->max) return a->max > b->max ? -1 : 1;
    return a->key < b->key ? -1 : a->key > b->key;
}

/* Live bytes per key over the events: its maximum and its value at the
 * peak (vals == NULL), or at the timeline's points (vals[series][point]). */
static void sweep(const gm_attribution *a, const gm_timeline *tl, const uint32_t *op, const uint32_t *key_of,
                  int64_t *cur, int64_t *max, int64_t *at_peak, const uint32_t *series_of, int64_t *vals,
                  size_t nseries) {
    size_t p = 0;
    for (size_t i = 0; i < a->nevents; i++) {
        uint32_t o = op[i];
        if (o != OP_NONE) {
            uint32_t k = o & ~OP_FREE;
            uint32_t key = key_of[k];
            uint32_t x = series_of ? series_of[key] : key;
            int64_t sz = (int64_t)a->allocs[k].size;
            cur[x] += o & OP_FREE ? -sz : sz;
            if (max && cur[x] > max[x]) max[x] = cur[x];
        }
        if (at_peak && i == a->peak_ev && a->peak_bytes) {
            /* at_peak is per key: cur is too when series_of is NULL */
            for (size_t j = 0; j < nseries; j++) at_peak[j] = cur[j];
        }
        for (; vals && p < tl->npts && tl->pts[p].ev == i; p++)
            for (size_t j = 0; j < nseries; j++) vals[j * tl->npts + p] = cur[j];
    }
}

int gm__scope_series_build(const gm_attribution *a, const gm_timeline *tl, size_t top_n, gm_scope_series **out) {
    *out = NULL;
    const gm_trace *t = a->trace;
    if (top_n < 1) top_n = 1;
    gm_scope_series *ss = calloc(1, sizeof *ss);
    uint32_t *op = malloc((a->nevents ? a->nevents : 1) * sizeof *op);
    uint8_t *done = calloc((size_t)t->nstacks + 1, 1);
    stack_info *si = malloc(((size_t)t->nstacks + 1) * sizeof *si);
    uint8_t *phase_of = malloc((size_t)t->nstacks + 1); /* a stack's phase (that of its first alloc) */
    uint32_t *key_of_stack = malloc(((size_t)t->nstacks + GM_PH_COUNT) * sizeof *key_of_stack);
    uint32_t *key_of = malloc((a->nallocs ? a->nallocs : 1) * sizeof *key_of);
    keys K = {0};
    int64_t *cur = NULL, *max = NULL, *at_peak = NULL;
    uint32_t *series_of = NULL;
    rank *rk = NULL;
    char buf[512];
    int rc = GM_OK;
    if (!ss || !op || !done || !si || !phase_of || !key_of_stack || !key_of) goto oom;
    ss->npts = tl->npts;
    for (size_t i = 0; i < a->nevents; i++) op[i] = OP_NONE;
    for (size_t k = 0; k < a->nallocs; k++) {
        op[a->allocs[k].ev] = (uint32_t)k;
        if (a->allocs[k].end != GM_ATTR_ALIVE) op[a->allocs[k].end] = (uint32_t)k | OP_FREE;
    }
    /* the stacks the allocations use, and the deepest path among them */
    int maxd = 1;
    bool by_scope = false, by_frames = false;
    for (size_t k = 0; k < a->nallocs; k++) {
        uint32_t s = a->allocs[k].stack;
        if (!s || done[s]) continue;
        done[s] = 1;
        si[s] = stack_scopes(t, s - 1);
        phase_of[s] = a->allocs[k].phase;
        int d = stack_depth(&si[s]);
        if (d > maxd) maxd = d;
        by_scope |= si[s].path != NULL;
        by_frames |= !si[s].path && si[s].nfwd;
    }
    if (maxd > GM_SCOPE_DEPTH_MAX) maxd = GM_SCOPE_DEPTH_MAX;
    ss->source = by_scope && by_frames ? "gpumem scopes (module paths) and Python forward frames (call paths)"
                 : by_scope            ? "gpumem scopes (module paths)"
                 : by_frames           ? "Python forward frames (call paths: torch records no module names)"
                                       : "phases only (the trace has no scopes and no forward frames)";
    ss->by_scope = by_scope;
    ss->by_frames = by_frames;
    for (int d = 1; d <= maxd; d++) {
        /* keys: stacks, then frameless allocations by phase */
        for (uint32_t s = 1; s <= t->nstacks; s++) {
            key_of_stack[s - 1] = NO_KEY;
            if (!done[s]) continue;
            stack_key(t, &si[s], phase_of[s], d, buf, sizeof buf);
            if ((rc = keys_intern(&K, buf, &key_of_stack[s - 1]))) goto oom;
        }
        for (int p = 0; p < GM_PH_COUNT; p++) {
            stack_info none = {0};
            stack_key(t, &none, p, d, buf, sizeof buf);
            if ((rc = keys_intern(&K, buf, &key_of_stack[t->nstacks + p]))) goto oom;
        }
        for (size_t k = 0; k < a->nallocs; k++) {
            const gm_attr_alloc *al = &a->allocs[k];
            key_of[k] = al->stack ? key_of_stack[al->stack - 1] : key_of_stack[t->nstacks + al->phase];
        }
        free(cur);
        free(max);
        free(at_peak);
        free(series_of);
        free(rk);
        cur = calloc(K.n, sizeof *cur);
        max = calloc(K.n, sizeof *max);
        at_peak = calloc(K.n, sizeof *at_peak);
        series_of = malloc(K.n * sizeof *series_of);
        rk = malloc(K.n * sizeof *rk);
        if (!cur || !max || !at_peak || !series_of || !rk) goto oom;
        sweep(a, tl, op, key_of, cur, max, at_peak, NULL, NULL, K.n);
        /* rank the keys of this depth */
        uint32_t nused = 0;
        for (uint32_t key = 0; key < K.n; key++) series_of[key] = 0; /* scratch: used at this depth */
        for (size_t k = 0; k < a->nallocs; k++) series_of[key_of[k]] = 1;
        for (uint32_t key = 0; key < K.n; key++)
            if (series_of[key]) rk[nused++] = (rank){key, at_peak[key], max[key]};
        if (nused > 1) qsort(rk, nused, sizeof *rk, cmp_rank);
        size_t top = nused <= top_n + 1 ? nused : top_n; /* no "other" for a single leftover */
        gm_scope_view *v = &ss->views[ss->nviews++];
        v->depth = d;
        v->nscopes = nused;
        v->nseries = top + (nused > top);
        v->names = calloc(v->nseries ? v->nseries : 1, sizeof *v->names);
        v->at_peak = calloc(v->nseries ? v->nseries : 1, sizeof *v->at_peak);
        v->max = calloc(v->nseries ? v->nseries : 1, sizeof *v->max);
        v->values = calloc((v->nseries ? v->nseries : 1) * (tl->npts ? tl->npts : 1), sizeof *v->values);
        if (!v->names || !v->at_peak || !v->max || !v->values) goto oom;
        for (uint32_t key = 0; key < K.n; key++) series_of[key] = (uint32_t)top; /* "other scopes" */
        for (size_t j = 0; j < top; j++) {
            series_of[rk[j].key] = (uint32_t)j;
            if (!(v->names[j] = strdup(K.s[rk[j].key]))) goto oom;
        }
        if (v->nseries > top && !(v->names[top] = strdup(GM_SCOPE_OTHERS))) goto oom;
        memset(cur, 0, v->nseries * sizeof *cur);
        sweep(a, tl, op, key_of, cur, v->max, v->at_peak, series_of, v->values, v->nseries);
    }
    goto out;
oom:
    rc = gm__set_error(GM_ENOHOSTMEM, "out of host memory for the scope series");
out:
    free(op);
    free(done);
    free(si);
    free(phase_of);
    free(key_of_stack);
    free(key_of);
    free(cur);
    free(max);
    free(at_peak);
    free(series_of);
    free(rk);
    keys_free(&K);
    if (rc) {
        gm__scope_series_free(ss);
        return rc;
    }
    *out = ss;
    return GM_OK;
}

void gm__scope_series_free(gm_scope_series *ss) {
    if (!ss) return;
    for (int i = 0; i < ss->nviews; i++) {
        gm_scope_view *v = &ss->views[i];
        for (size_t j = 0; v->names && j < v->nseries; j++) free(v->names[j]);
        free(v->names);
        free(v->at_peak);
        free(v->max);
        free(v->values);
    }
    free(ss);
}


void gm__scope_series_json(FILE *f, const gm_scope_series *ss, bool deltas) {
    fprintf(f, "{\"source\":");
    gm__json_string(f, ss->source, true); /* also inside the HTML's <script> */
    fprintf(f, ",\"points\":%zu,\"encoding\":\"%s\",\"views\":[", ss->npts,
            deltas ? "deltas: value[i] = value[i-1] + deltas[i], value[-1] = 0" : "values");
    for (int i = 0; i < ss->nviews; i++) {
        const gm_scope_view *v = &ss->views[i];
        fprintf(f, "%s{\"depth\":%d,\"scopes\":%zu,\"series\":[", i ? "," : "", v->depth, v->nscopes);
        for (size_t j = 0; j < v->nseries; j++) {
            fprintf(f, "%s{\"name\":", j ? "," : "");
            gm__json_string(f, v->names[j], true);
            fprintf(f, ",\"at_peak\":%" PRId64 ",\"max\":%" PRId64 ",\"%s\":[", v->at_peak[j], v->max[j],
                    deltas ? "deltas" : "values");
            const int64_t *x = v->values + j * ss->npts;
            for (size_t p = 0; p < ss->npts; p++)
                fprintf(f, "%s%" PRId64, p ? "," : "", deltas && p ? x[p] - x[p - 1] : x[p]);
            fprintf(f, "]}");
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]}");
}
