/* bench_hotpath.c — the cost of one gm_malloc / gm_free on a warm allocator,
 * the number issue 4 is about (>= 5x faster than torch's native allocator per
 * operation, p99 <= 1 us). CPU only: the sim backend, so what is measured is
 * the front end and the policy, which is all a warm pass runs on a GPU too
 * (no device calls in steady state).
 *
 * For each trace and each policy (gpumem, torch): replay the trace's
 * alloc/free stream through gm_malloc / gm_free on stream 0 (as
 * bench/gpu_replay_bench.cpp does on the H200), one untimed cold pass, then
 * warm passes: one timed per operation (median, p99, mean; the clock's own
 * cost is printed and not subtracted) and --reps untimed ones (mean only, the
 * loop time over the op count). Then a synthetic loop: 64 live 1 MiB blocks,
 * free one and allocate it again, N times.
 *
 * Wall time on a loaded machine is noisy; instruction counts are not. Run
 * under callgrind and read the cost of the untimed functions:
 *   valgrind --tool=callgrind --toggle-collect=hp_untimed_pass \
 *            --toggle-collect=hp_synth_loop bench_hotpath --reps 1 --cg
 * (--cg: one untimed warm pass and a short synthetic loop, and the op count
 * of each, so Ir / ops is instructions per operation).
 *
 * --evict MiB: before each untimed pass, write a buffer of that size, so the
 * pass starts with the allocator's state out of the CPU's private caches, as
 * after a training step's other work (kernel launches, Python) between
 * allocator calls. Under callgrind --cache-sim=yes with --LL=2097152,16,64
 * (one core's L2), LL misses / ops in hp_untimed_pass count the cache lines
 * an operation brings in from further out.
 *
 * --loop: the warm passes replay the trace's steady loop (bench/steady_loop.h:
 * a training loop's warm steps on the blocks the previous pass left live)
 * after one cold pass up to the loop's end, instead of the whole run, whose
 * model build in every pass makes a plan drop and lay out again.
 *
 * Usage: bench_hotpath [--reps N] [--synth N] [--synth-only] [--policy gpumem|torch] [--conf S] [--cg]
 *                      [--stats] [--evict MiB] [--loop]
 *                      [TRACE...]   (default: $GPUMEM_SHARED/traces/\*.pickle.gz,
 *                      GPUMEM_SHARED defaulting to ../shared from the current directory)
 * Reports only; never fails on timing. */
#include "gpumem/gpumem.h"
#include "util/idmap.h"
#include "trace/trace.h"
#include "steady_loop.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GM__MIB_BYTES ((size_t)1 << 20)

static bool g_stats_json; /* --stats: print the stats after the passes (to diff runs) */
/* --conf: settings added to the gpumem policy's. gpumem_slack:inf measures
 * the default's steady state: its warm-up (gpumem_slack:auto) moves memory in
 * every pass of a trace too short to end it (bench/gpumem_policy_tradeoff.md). */
static const char *g_conf = "";

typedef struct hp_op {
    uint64_t size; /* 0 = free */
    uint32_t slot;
} hp_op;

typedef struct hp_prog {
    hp_op *ops;
    size_t nops;
    uint32_t nslots;
    /* --loop (steady_loop.h): the cold pass runs ops [0, loop_end), the warm
     * passes body[1], body[0], body[1], ... over slots 0 .. 2 * nslots - 1 */
    size_t loop_end;
    struct hp_prog *body[2];
} hp_prog;

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Device 0's alloc / free_completed (free_requested if the trace has no
 * completions) as slot numbers, like replay.c and trace_to_events.py. */
static int compile(const gm_trace *t, hp_prog *p) {
    size_t n = t->ndevices ? t->dev_off[1] - t->dev_off[0] : 0;
    const gm_trace_event *ev = t->events + (t->ndevices ? t->dev_off[0] : 0);
    int free_action = GM_TA_FREE_REQUESTED;
    for (size_t i = 0; i < n; i++)
        if (ev[i].action == GM_TA_FREE_COMPLETED) free_action = GM_TA_FREE_COMPLETED;
    p->ops = malloc((n ? n : 1) * sizeof *p->ops);
    p->nops = 0;
    p->nslots = 0;
    gm__idmap m = {0};
    if (!p->ops || gm__idmap_reserve(&m, 1024)) return -1;
    for (size_t i = 0; i < n; i++) {
        const gm_trace_event *e = &ev[i];
        if (e->action == GM_TA_ALLOC && e->size) {
            if (gm__idmap_reserve(&m, 1024)) return -1;
            size_t j = gm__idmap_find(&m, e->addr);
            if (m.id[j] != GM__IDMAP_EMPTY) m.id[j] = p->nslots; /* old one never freed */
            else gm__idmap_set(&m, j, e->addr, p->nslots);
            p->ops[p->nops++] = (hp_op){e->size, p->nslots++};
        } else if (e->action == free_action) {
            size_t j = gm__idmap_find(&m, e->addr);
            if (m.id[j] == GM__IDMAP_EMPTY) continue;
            p->ops[p->nops++] = (hp_op){0, m.id[j]};
            gm__idmap_del(&m, j);
        }
    }
    gm__idmap_free(&m);
    return 0;
}

/* The steady loop of p (--loop): p->body[0..1] and p->loop_end, or nothing
 * (the whole trace is replayed) when the trace has none. */
static void make_loop(hp_prog *p) {
    uint32_t *slot = malloc((p->nops ? p->nops : 1) * sizeof *slot);
    unsigned char *is_alloc = malloc(p->nops ? p->nops : 1);
    bench_loop l;
    int ok = slot && is_alloc;
    for (size_t i = 0; ok && i < p->nops; i++) slot[i] = p->ops[i].slot, is_alloc[i] = p->ops[i].size != 0;
    if (ok && bench_loop_make(p->nops, slot, is_alloc, p->nslots, &l) == 0) {
        for (int q = 0; q < 2; q++) {
            hp_prog *b = calloc(1, sizeof *b);
            if (b) b->ops = malloc((l.e - l.s) * sizeof *b->ops);
            if (!b || !b->ops) {
                free(b);
                continue;
            }
            b->nops = l.e - l.s;
            b->nslots = 2 * p->nslots;
            for (size_t i = l.s; i < l.e; i++) b->ops[i - l.s] = (hp_op){p->ops[i].size, l.slot[q][i - l.s]};
            p->body[q] = b;
        }
        if (p->body[0] && p->body[1]) p->loop_end = l.e;
        printf("steady loop: operations %zu..%zu of %zu\n", l.s, l.e, p->nops);
        bench_loop_free(&l);
    } else {
        printf("steady loop: none found, the whole trace is replayed\n");
    }
    free(slot);
    free(is_alloc);
}

static void free_prog(hp_prog *p) {
    for (int q = 0; q < 2; q++)
        if (p->body[q]) free(p->body[q]->ops), free(p->body[q]);
    free(p->ops);
}

/* One pass; blocks still live at the end are freed, so passes start alike. */
static void finish_pass(gm_allocator *a, gm_devptr *ptr, uint32_t nslots) {
    for (uint32_t s = 0; s < nslots; s++)
        if (ptr[s]) gm_free(a, ptr[s]), ptr[s] = 0;
}

static inline void pass_body(gm_allocator *a, const hp_prog *p, gm_devptr *ptr, uint64_t *nops) {
    uint64_t n = 0;
    for (size_t i = 0; i < p->nops; i++) {
        const hp_op *o = &p->ops[i];
        if (o->size) {
            gm_malloc(a, 0, o->size, 0, &ptr[o->slot]);
            n++;
        } else if (ptr[o->slot]) {
            gm_free(a, ptr[o->slot]);
            ptr[o->slot] = 0;
            n++;
        }
    }
    *nops = n;
}

/* Two names for one loop, so callgrind can count the warm pass alone. */
__attribute__((noipa)) void hp_cold_pass(gm_allocator *a, const hp_prog *p, gm_devptr *ptr,
                                             uint64_t *nops) {
    pass_body(a, p, ptr, nops);
}
__attribute__((noipa)) void hp_untimed_pass(gm_allocator *a, const hp_prog *p, gm_devptr *ptr,
                                                uint64_t *nops) {
    pass_body(a, p, ptr, nops);
}

static int cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

typedef struct hp_row {
    double median, p99, mean, max, untimed_mean;
    uint64_t ops, fails;
} hp_row;

static void timed_pass(gm_allocator *a, const hp_prog *p, gm_devptr *ptr, uint32_t *ns, hp_row *r) {
    size_t k = 0;
    double sum = 0;
    for (size_t i = 0; i < p->nops; i++) {
        const hp_op *o = &p->ops[i];
        uint64_t t0, t1;
        if (o->size) {
            t0 = now_ns();
            int rc = gm_malloc(a, 0, o->size, 0, &ptr[o->slot]);
            t1 = now_ns();
            if (rc) r->fails++;
        } else if (ptr[o->slot]) {
            t0 = now_ns();
            gm_free(a, ptr[o->slot]);
            t1 = now_ns();
            ptr[o->slot] = 0;
        } else {
            continue;
        }
        ns[k++] = (uint32_t)(t1 - t0 > UINT32_MAX ? UINT32_MAX : t1 - t0);
        sum += (double)(t1 - t0);
    }
    r->ops = k;
    if (!k) return;
    r->mean = sum / (double)k;
    qsort(ns, k, sizeof *ns, cmp_u32);
    r->median = ns[k / 2];
    size_t i99 = (size_t)((double)k * 0.99);
    r->p99 = ns[i99 < k ? i99 : k - 1];
    r->max = ns[k - 1];
}

static gm_allocator *make(const char *conf, gm_backend **be) {
    gm_sim_options so;
    gm_sim_options_init(&so);
    gm_config cfg;
    gm_config_init(&cfg);
    char err[128];
    gm_allocator *a = NULL;
    if (gm_config_parse(&cfg, conf, err, sizeof err) || gm_sim_create(be, &so)) return NULL;
    if (gm_allocator_create(&a, *be, &cfg)) {
        gm_backend_destroy(*be);
        return NULL;
    }
    return a;
}

static size_t g_evict_bytes;
static unsigned char *g_evict_buf;

/* Push the allocator's state out of the private caches (--evict). */
__attribute__((noipa)) void hp_evict(void) {
    for (size_t i = 0; i < g_evict_bytes; i += 64) g_evict_buf[i] = (unsigned char)(g_evict_buf[i] + 1);
}

/* A warm pass's program: the whole trace, or the loop's renaming of this parity. */
static const hp_prog *warm_prog(const hp_prog *p, int parity) { return p->loop_end ? p->body[parity] : p; }

/* After a warm pass: the whole trace frees what is left; a loop keeps it for
 * the next pass, which takes the other parity. */
static int warm_done(gm_allocator *a, const hp_prog *p, gm_devptr *ptr, int parity) {
    if (p->loop_end) return parity ^ 1;
    finish_pass(a, ptr, p->nslots);
    return parity;
}

static void bench_trace(const char *base, const hp_prog *p, const char *policy, int reps, bool cg) {
    char conf[256];
    snprintf(conf, sizeof conf, "policy:%s%s%s", policy, *g_conf && !strcmp(policy, "gpumem") ? "," : "",
             !strcmp(policy, "gpumem") ? g_conf : "");
    gm_backend *be;
    gm_allocator *a = make(conf, &be);
    const hp_prog *cold = p;
    hp_prog head = *p;
    bool loop = p->loop_end != 0;
    if (loop) { /* warm passes run the loop, each on the live blocks the one before left */
        head.nops = p->loop_end;
        cold = &head;
    }
    uint32_t nslots = loop ? 2 * p->nslots : p->nslots;
    gm_devptr *ptr = calloc(nslots ? nslots : 1, sizeof *ptr);
    uint32_t *ns = malloc((p->nops ? p->nops : 1) * sizeof *ns);
    if (!a || !ptr || !ns) {
        printf("%s %s: setup failed: %s\n", base, policy, gm_last_error_detail());
        goto out;
    }
    uint64_t n;
    int parity = 1;
    hp_cold_pass(a, cold, ptr, &n);
    if (!loop) finish_pass(a, ptr, nslots);
    hp_row r = {0};
    if (!cg) {
        timed_pass(a, warm_prog(p, parity), ptr, ns, &r);
        parity = warm_done(a, p, ptr, parity);
    }
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        if (g_evict_bytes) hp_evict();
        uint64_t t0 = now_ns();
        hp_untimed_pass(a, warm_prog(p, parity), ptr, &n);
        double dt = (double)(now_ns() - t0);
        parity = warm_done(a, p, ptr, parity);
        if (dt / (double)n < best) best = dt / (double)n;
    }
    if (loop) finish_pass(a, ptr, nslots);
    gm_stats s = {.size = sizeof s};
    gm_get_stats(a, 0, &s);
    char err[256];
    int ck = gm_check(a, 0, err, sizeof err);
    if (cg)
        printf("%-26s %-6s ops/pass %llu (untimed passes: %d)\n", base, policy, (unsigned long long)n, reps);
    else
        printf("%-26s %-6s ops %7llu  median %4.0f  p99 %5.0f  mean %6.1f  max %7.0f  untimed mean %6.1f ns%s%s\n",
               base, policy, (unsigned long long)r.ops, r.median, r.p99, r.mean, r.max, best,
               r.fails ? "  FAILS" : "", ck ? "  CHECK FAILED" : "");
    if (ck) printf("  %s\n", err);
    if (g_stats_json) {
        static char js[16384];
        gm_stats_to_json(&s, js, sizeof js);
        printf("  stats %s\n", js);
    }
out:
    free(ns);
    free(ptr);
    if (a) {
        gm_allocator_destroy(a);
        gm_backend_destroy(be);
    }
}

/* 64 live 1 MiB blocks; free one and allocate it again, n times. */
static inline void synth_body(gm_allocator *a, gm_devptr *live, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        gm_devptr *p = &live[i & 63];
        gm_free(a, *p);
        gm_malloc(a, 0, GM__MIB_BYTES, 0, p);
    }
}
__attribute__((noipa)) void hp_synth_warmup(gm_allocator *a, gm_devptr *live, uint64_t n) {
    synth_body(a, live, n);
}
__attribute__((noipa)) void hp_synth_loop(gm_allocator *a, gm_devptr *live, uint64_t n) {
    synth_body(a, live, n);
}

static void bench_synth(const char *policy, uint64_t n, bool cg) {
    char conf[64];
    snprintf(conf, sizeof conf, "policy:%s", policy);
    gm_backend *be;
    gm_allocator *a = make(conf, &be);
    if (!a) return;
    gm_devptr live[64];
    for (int i = 0; i < 64; i++) gm_malloc(a, 0, GM__MIB_BYTES, 0, &live[i]);
    hp_synth_warmup(a, live, 1024);
    uint64_t t0 = now_ns();
    hp_synth_loop(a, live, n);
    double dt = (double)(now_ns() - t0);
    if (cg) printf("synthetic 1MiBx64         %-6s ops %llu (free+malloc = 2 ops each)\n", policy,
                   (unsigned long long)(2 * n));
    else printf("synthetic 1MiBx64         %-6s ops %7llu  mean %6.1f ns/op (%.1f ns per free+malloc)\n",
                policy, (unsigned long long)(2 * n), dt / (double)(2 * n), dt / (double)n);
    for (int i = 0; i < 64; i++) gm_free(a, live[i]);
    gm_allocator_destroy(a);
    gm_backend_destroy(be);
}

int main(int argc, char **argv) {
    int reps = 5;
    uint64_t synth = 2000000;
    const char *only = NULL;
    bool cg = false, synth_only = false, loop = false;
    int first = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--synth") && i + 1 < argc) synth = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--policy") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--cg")) cg = true;
        else if (!strcmp(argv[i], "--synth-only")) synth_only = true;
        else if (!strcmp(argv[i], "--stats")) g_stats_json = true;
        else if (!strcmp(argv[i], "--loop")) loop = true;
        else if (!strcmp(argv[i], "--conf") && i + 1 < argc) g_conf = argv[++i];
        else if (!strcmp(argv[i], "--evict") && i + 1 < argc) {
            g_evict_bytes = strtoull(argv[++i], NULL, 10) << 20;
            g_evict_buf = calloc(g_evict_bytes ? g_evict_bytes : 1, 1);
            if (!g_evict_buf) {
                fprintf(stderr, "--evict: cannot allocate %zu bytes\n", g_evict_bytes);
                return 2;
            }
        }
        else {
            first = i;
            break;
        }
    }
    if (cg && synth == 2000000) synth = 20000;
    glob_t g = {0};
    char **paths = argv + first;
    size_t npaths = (size_t)(argc - first);
    if (!npaths && !synth_only) {
        const char *sh = getenv("GPUMEM_SHARED");
        char pat[1024];
        snprintf(pat, sizeof pat, "%s/traces/*.pickle.gz", sh ? sh : "../shared");
        if (glob(pat, 0, NULL, &g) == 0) {
            paths = g.gl_pathv;
            npaths = g.gl_pathc;
        }
    }
    {
        uint64_t t0 = now_ns();
        for (int i = 0; i < 1000000; i++) (void)now_ns();
        printf("clock_gettime: %.1f ns per call (the timed pass includes about one)\n",
               (double)(now_ns() - t0) / 1e6);
    }
    static const char *const policies[] = {"gpumem", "torch"};
    for (size_t k = 0; k < npaths; k++) {
        gm_trace *t;
        if (gm__trace_load_file(paths[k], &t)) {
            printf("%s: %s\n", paths[k], gm_last_error_detail());
            continue;
        }
        hp_prog p = {0};
        const char *base = strrchr(paths[k], '/') ? strrchr(paths[k], '/') + 1 : paths[k];
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(base, "."), base);
        if (compile(t, &p) == 0) {
            if (loop) make_loop(&p);
            for (int q = 0; q < 2; q++)
                if (!only || !strcmp(only, policies[q])) bench_trace(name, &p, policies[q], reps, cg);
        }
        free_prog(&p);
        gm__trace_free(t);
    }
    for (int q = 0; q < 2; q++)
        if (synth && (!only || !strcmp(only, policies[q]))) bench_synth(policies[q], synth, cg);
    globfree(&g);
    free(g_evict_buf);
    return 0;
}
