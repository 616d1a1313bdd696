/* tune.c — the engine of `gpumem tune` (and `gpumem advise`): replays one
 * compiled trace under every setting the policy table lists for tune
 * (gm_policy_info(...).tune) and ranks them by predicted peak reserved
 * memory. Each run has its own sim device and allocator, so worker threads
 * share only the read-only program. */
#include "trace.h"

#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tune_grid {
    const gm_replay_prog *prog;
    uint64_t capacity;
    gm_tune_entry *e;
    int n, cap;
    int next; /* atomic: the next entry a worker takes */
} tune_grid;

static void *worker(void *arg) {
    tune_grid *g = arg;
    for (;;) {
        int i = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED);
        if (i >= g->n) return NULL;
        gm_tune_entry *j = &g->e[i];
        j->rc = gm__replay_run(g->prog, &j->cfg, g->capacity, &j->r);
        if (j->rc) snprintf(j->err, sizeof j->err, "%s", gm_last_error_detail());
    }
}

/* A setting the library would refuse is not offered. */
static void add(tune_grid *g, const char *conf) {
    if (g->n >= g->cap) return;
    gm_tune_entry *j = &g->e[g->n];
    memset(j, 0, sizeof *j);
    snprintf(j->conf, sizeof j->conf, "%s", conf);
    gm_config_init(&j->cfg);
    char err[200];
    if (gm_config_parse(&j->cfg, conf, err, sizeof err) != GM_OK) return;
    g->n++;
}

/* Under the default policy as written, under the others with policy:NAME in
 * front. "{fit}" becomes a memory fraction sized to the trace (1.25x its
 * peak requested at this capacity), under which a GC threshold acts. */
static void build(tune_grid *g) {
    int64_t peak = gm__replay_prog_peak_requested(g->prog);
    double frac = ceil(125.0 * (double)peak / (double)g->capacity) / 100.0;
    if (frac < 0.01) frac = 0.01;
    if (frac > 1.0) frac = 1.0;
    char fit[16];
    snprintf(fit, sizeof fit, "%.2f", frac);
    for (int k = 0; k < gm_policy_count(); k++) {
        gm_policy_desc pd;
        if (gm_policy_info(k, &pd) != GM_OK || !pd.tune) continue;
        for (const char *const *t = pd.tune; *t; t++) {
            char expanded[160], conf[sizeof g->e[0].conf];
            const char *at = strstr(*t, "{fit}");
            if (at) snprintf(expanded, sizeof expanded, "%.*s%s%s", (int)(at - *t), *t, fit, at + 5);
            else snprintf(expanded, sizeof expanded, "%s", *t);
            if (k == GM_POLICY_TORCH) snprintf(conf, sizeof conf, "%s", expanded);
            else snprintf(conf, sizeof conf, "policy:%s%s%.160s", pd.name, *expanded ? "," : "", expanded);
            add(g, conf);
        }
    }
}

int64_t gm__tune_device_calls(const gm_replay_result *r) {
    return r->num_device_alloc + r->num_phys_create + r->num_map + r->num_unmap;
}

bool gm__tune_failed(const gm_tune_entry *e) { return e->rc || e->r.oom || e->r.error; }

static int cmp(const void *a, const void *b) {
    const gm_tune_entry *x = a, *y = b;
    bool fx = gm__tune_failed(x), fy = gm__tune_failed(y);
    if (fx != fy) return fx ? 1 : -1;
    if (x->r.peak_reserved != y->r.peak_reserved) return x->r.peak_reserved < y->r.peak_reserved ? -1 : 1;
    return strcmp(x->conf, y->conf);
}

int gm__tune_run(const gm_replay_prog *p, uint64_t capacity, int threads, gm_tune_entry **out, int *n) {
    *out = NULL;
    *n = 0;
    if (!p || !capacity) return gm__set_error(GM_EINVAL, "gm__tune_run: no program or zero capacity");
    tune_grid g = {.prog = p, .capacity = capacity, .cap = 0};
    for (int k = 0; k < gm_policy_count(); k++) {
        gm_policy_desc pd;
        if (gm_policy_info(k, &pd) == GM_OK && pd.tune)
            for (const char *const *t = pd.tune; *t; t++) g.cap++;
    }
    g.e = calloc((size_t)(g.cap ? g.cap : 1), sizeof *g.e);
    if (!g.e) return gm__set_error(GM_ENOHOSTMEM, "gm__tune_run: out of host memory");
    build(&g);
    if (threads < 1) threads = 1;
    if (threads > 16) threads = 16;
    pthread_t th[16];
    int started = 0;
    for (int i = 0; i < threads; i++)
        if (pthread_create(&th[i], NULL, worker, &g) == 0) started++;
    if (!started) worker(&g);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    qsort(g.e, (size_t)g.n, sizeof g.e[0], cmp);
    *out = g.e;
    *n = g.n;
    return GM_OK;
}

double gm__tune_calls_ratio(const gm_tune_entry *e, const gm_tune_entry *def) {
    int64_t d = def ? gm__tune_device_calls(&def->r) : 0;
    return (double)gm__tune_device_calls(&e->r) / (double)(d > 0 ? d : 1);
}

void gm__tune_choose(const gm_tune_entry *e, int n, gm_tune_choice *out) {
    out->def = out->best = out->rec = -1;
    for (int i = 0; i < n; i++)
        if (!e[i].conf[0]) out->def = i;
    const gm_tune_entry *def = out->def >= 0 ? &e[out->def] : NULL;
    int64_t steady_cap = def ? def->r.steady_device_calls * GM_TUNE_STEADY_FACTOR : 0;
    if (steady_cap < GM_TUNE_STEADY_MIN) steady_cap = GM_TUNE_STEADY_MIN;
    for (int i = 0; i < n; i++) { /* ranked: those that fit first, by peak reserved */
        if (gm__tune_failed(&e[i])) continue;
        if (out->best < 0) out->best = i;
        bool calls_ok = gm__tune_calls_ratio(&e[i], def) <= GM_TUNE_CALLS_FACTOR ||
                        gm__tune_device_calls(&e[i].r) <= GM_TUNE_CALLS_ONCE;
        if (out->rec < 0 && calls_ok &&
            e[i].r.steady_device_calls <= steady_cap)
            out->rec = i;
    }
}
