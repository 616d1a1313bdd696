/* test_property.c — randomized property tests of both policies on the sim
 * backend: a seeded random workload (malloc of realistic size mixtures, free,
 * record_stream with manually completed events, empty_cache, reset of peaks,
 * OOM at small capacities, bad frees) with every invariant of workload.h
 * checked after every step.
 *
 * Replay a failure: the message names config, seed and step; run
 *   GM_SEED=<seed> GM_STEPS=<step+1> GM_CONFIG=<name> GM_TRACE=1 ./test_property
 * to rerun just that case and print every operation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workload.h"

typedef struct prop_cfg {
    const char *name;
    const char *conf;   /* GPUMEM_CONF-style string */
    uint64_t capacity;  /* sim capacity */
    double fraction;    /* gm_set_memory_fraction; 0 = not set */
    uint64_t large_max; /* largest request */
    int target_live;    /* live blocks the workload hovers around */
} prop_cfg;

/* 16 GiB rather than the sim's 141 GiB default: the policies' own recounts
 * (gm_check, run after every step) walk every page of address ranges sized
 * by the device, and the workloads peak at a few GiB. */
static const prop_cfg CONFIGS[] = {
    {"torch_default", "policy:torch", 16 * WL_GIB, 0, 400 * WL_MIB, 80},
    {"torch_max_split_128", "policy:torch,max_split_size_mb:128", 16 * WL_GIB, 0, 600 * WL_MIB, 80},
    {"torch_expandable", "policy:torch,expandable_segments:True", 16 * WL_GIB, 0, 400 * WL_MIB, 80},
    {"torch_roundup_pow2_4", "policy:torch,roundup_power2_divisions:4", 16 * WL_GIB, 0, 400 * WL_MIB, 80},
    {"torch_gc_0.6_fraction", "policy:torch,garbage_collection_threshold:0.6", 2 * WL_GIB, 0.6,
     200 * WL_MIB, 40},
    {"torch_oom_1g", "policy:torch", 1 * WL_GIB, 0, 300 * WL_MIB, 40},
    {"torch_expandable_oom_1g", "policy:torch,expandable_segments:True", 1 * WL_GIB, 0,
     300 * WL_MIB, 40},
    {"torch_max_split_oom", "policy:torch,max_split_size_mb:64,roundup_power2_divisions:8",
     1 * WL_GIB, 0, 300 * WL_MIB, 40},
    {"gpumem_default", "policy:gpumem", 16 * WL_GIB, 0, 400 * WL_MIB, 80},
    {"gpumem_oom_1g", "policy:gpumem", 1 * WL_GIB, 0, 300 * WL_MIB, 40},
    {"gpumem_fraction", "policy:gpumem", 2 * WL_GIB, 0.5, 200 * WL_MIB, 40},
    {"gpumem_plan", "policy:gpumem,gpumem_plan:on", 16 * WL_GIB, 0, 400 * WL_MIB, 80},
    {"gpumem_plan_oom_1g", "policy:gpumem,gpumem_plan:on", 1 * WL_GIB, 0, 300 * WL_MIB, 40},
};
#define NCONFIGS (sizeof CONFIGS / sizeof CONFIGS[0])

enum { NSTREAMS = 4 }; /* streams 0..3; record_stream targets 1..4 */

/* A freed block the GPU may still be using: until the streams in `mask`
 * (recorded with record_stream) have completed work queued after the free,
 * its range must not be handed out again; and until its allocation stream
 * has, not to another stream either. Completion = gm_sim_complete_events
 * after the free, or the allocator waiting itself (an EVENT_SYNC call, or a
 * device FREE, which synchronizes like cudaFree). */
typedef struct pend {
    gm_devptr ptr;
    uint64_t size;
    gm_stream stream;
    uint32_t mask;
    bool own;
} pend;

typedef struct run {
    const prop_cfg *cfg;
    uint64_t seed;
    int step;
    const char *op;
    bool trace;
    gm_backend *be;
    gm_allocator *a;
    wl_model m;
    wl_rng r;
    wl_mix mix;
    uint64_t limit; /* bytes the allocator may reserve */
    pend *pending;  /* freed blocks the streams may still be using */
    size_t npending, cap_pending;
    char err[1024];
} run;

#define RUN_FAIL(R, ...)                                                                 \
    do {                                                                                 \
        char msg_[2048];                                                                  \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                        \
        fail_msg("config %s seed %" PRIu64 " step %d op %s: %s\n  replay: GM_CONFIG=%s " \
                 "GM_SEED=%" PRIu64 " GM_STEPS=%d GM_TRACE=1",                          \
                 (R)->cfg->name, (R)->seed, (R)->step, (R)->op, msg_, (R)->cfg->name,     \
                 (R)->seed, (R)->step + 1);                                              \
    } while (0)

static void trace(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(run *r, const char *fmt, ...) {
    if (!r->trace) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%d] ", r->step);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void check(run *r) {
    if (wl_check(r->a, &r->m, WL_CHECK_ALL, r->err, sizeof r->err)) RUN_FAIL(r, "%s", r->err);
    /* the device's capacity, or the memory fraction, is a hard limit */
    int64_t resv = r->m.prev.reserved_bytes[GM_POOL_ALL].current;
    if (resv > (int64_t)r->limit)
        RUN_FAIL(r, "reserved %" PRId64 " > limit %" PRIu64, resv, r->limit);
}

static void setup(run *r, const prop_cfg *c, uint64_t seed) {
    r->cfg = c;
    r->seed = seed;
    r->op = "setup";
    r->trace = wl_env_u64("GM_TRACE", 0) != 0;
    wl_seed(&r->r, seed);
    wl_mix_init(&r->mix, &r->r, 0.6, 0.3, 0.1, c->large_max);
    wl_model_init(&r->m);
    r->m.torch_pools = strstr(c->conf, "policy:torch") != NULL;

    gm_sim_options o;
    gm_sim_options_init(&o);
    o.capacity = c->capacity;
    o.events_manual = true;
    assert_int_equal(gm_sim_create(&r->be, &o), GM_OK);
    r->limit = o.capacity;

    gm_config cfg;
    gm_config_init(&cfg);
    char perr[256] = "";
    int rc = gm_config_parse(&cfg, c->conf, perr, sizeof perr);
    if (rc != GM_OK) RUN_FAIL(r, "gm_config_parse(%s) = %s: %s", c->conf, gm_status_name(rc), perr);
    rc = gm_allocator_create(&r->a, r->be, &cfg);
    if (rc != GM_OK) RUN_FAIL(r, "gm_allocator_create = %s", gm_status_name(rc));
    if (c->fraction > 0) {
        rc = gm_set_memory_fraction(r->a, 0, c->fraction);
        if (rc != GM_OK) RUN_FAIL(r, "gm_set_memory_fraction = %s", gm_status_name(rc));
        r->limit = (uint64_t)((double)r->limit * c->fraction);
    }
    check(r);
}

static uint64_t sync_calls(run *r) {
    return gm_backend_call_count(r->be, 0, GM_BCALL_EVENT_SYNC) +
           gm_backend_call_count(r->be, 0, GM_BCALL_FREE);
}

static void pend_add(run *r, const wl_block *b) {
    if (r->npending == r->cap_pending) {
        size_t nc = r->cap_pending ? r->cap_pending * 2 : 64;
        pend *np = realloc(r->pending, nc * sizeof *np);
        assert_non_null(np);
        r->pending = np;
        r->cap_pending = nc;
    }
    r->pending[r->npending++] = (pend){b->ptr, b->size, b->stream, b->recorded, true};
}

/* Work queued on `s` (UINT64_MAX: every stream) so far has completed. */
static void pend_complete(run *r, gm_stream s) {
    size_t j = 0;
    for (size_t i = 0; i < r->npending; i++) {
        pend *e = &r->pending[i];
        if (s == UINT64_MAX) continue;
        if (s < 32) e->mask &= ~(1u << s);
        if (s == e->stream) e->own = false;
        if (e->mask || e->own) r->pending[j++] = *e;
    }
    r->npending = j;
}

/* A block just handed out on `stream` must not overlap memory in use. */
static void pend_check(run *r, gm_devptr p, uint64_t size, gm_stream stream, uint64_t syncs0) {
    if (sync_calls(r) != syncs0) pend_complete(r, UINT64_MAX); /* the allocator waited */
    for (size_t i = 0; i < r->npending; i++) {
        const pend *e = &r->pending[i];
        if (p >= e->ptr + e->size || e->ptr >= p + size) continue;
        if (e->mask)
            RUN_FAIL(r, "0x%" PRIx64 "+%" PRIu64 " on stream %" PRIu64 " reuses 0x%" PRIx64
                     " freed with work pending on recorded streams (mask 0x%x)",
                     p, size, stream, e->ptr, e->mask);
        if (e->own && stream != e->stream)
            RUN_FAIL(r, "0x%" PRIx64 "+%" PRIu64 " on stream %" PRIu64 " reuses 0x%" PRIx64
                     " freed on stream %" PRIu64 " before that stream's work completed",
                     p, size, stream, e->ptr, e->stream);
    }
}

static void teardown(run *r) {
    free(r->pending);
    if (r->a) gm_allocator_destroy(r->a);
    if (r->be) gm_backend_destroy(r->be);
    wl_model_free(&r->m);
}

/* Complete every pending event: after this nothing the test did keeps
 * memory from being reused. */
static void complete_all(run *r) {
    int rc = gm_sim_complete_events(r->be, 0, UINT64_MAX);
    if (rc != GM_OK) RUN_FAIL(r, "gm_sim_complete_events = %s", gm_status_name(rc));
    pend_complete(r, UINT64_MAX);
}

static void expect_stat(run *r, const char *what, int64_t got, int64_t want) {
    if (got != want) RUN_FAIL(r, "%s = %" PRId64 ", expected %" PRId64, what, got, want);
}

static gm_stats stats(run *r) {
    gm_stats s = {.size = sizeof s};
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    int rc = gm_get_stats(r->a, 0, &s);
    if (rc != GM_OK) RUN_FAIL(r, "gm_get_stats = %s", gm_status_name(rc));
    return s;
}

/* Free every live block, remembering what the streams may still use. */
static void free_all(run *r) {
    while (r->m.n > 0) {
        wl_block b;
        wl_model_remove_at(&r->m, r->m.n - 1, &b);
        int rc = gm_free(r->a, b.ptr);
        if (rc != GM_OK) RUN_FAIL(r, "free(0x%" PRIx64 ") = %s", b.ptr, gm_status_name(rc));
        pend_add(r, &b);
    }
}

/* Free everything: allocated must drop to 0; then empty_cache must return
 * every byte to the device. */
static void drain(run *r) {
    free_all(r);
    check(r);
    gm_stats s = stats(r);
    expect_stat(r, "allocated_bytes.all.current after freeing all",
                s.allocated_bytes[GM_POOL_ALL].current, 0);
    expect_stat(r, "allocation.all.current after freeing all", s.allocation[GM_POOL_ALL].current, 0);
    int rc = gm_empty_cache(r->a, 0);
    if (rc != GM_OK) RUN_FAIL(r, "gm_empty_cache = %s", gm_status_name(rc));
    check(r);
    s = stats(r);
    expect_stat(r, "reserved_bytes.all.current after free all + empty_cache",
                s.reserved_bytes[GM_POOL_ALL].current, 0);
    expect_stat(r, "active_bytes.all.current after free all + empty_cache",
                s.active_bytes[GM_POOL_ALL].current, 0);
    expect_stat(r, "segment.all.current after free all + empty_cache", s.segment[GM_POOL_ALL].current,
                0);
}

/* OOM: the allocator must be consistent now, and once everything is freed
 * (and the streams' work done) a request of up to half the limit succeeds. */
static void on_oom(run *r, uint64_t size, gm_stream stream) {
    r->m.ooms++;
    if (gm_last_error_detail()[0] == '\0') RUN_FAIL(r, "GM_ENOMEM without an explanation");
    check(r);
    if (size > r->limit / 2 || !wl_chance(&r->r, 0.5)) return;
    r->op = "oom-recover";
    trace(r, "oom recovery: free %zu blocks, retry %" PRIu64, r->m.n, size);
    free_all(r);
    complete_all(r);
    check(r);
    gm_devptr p = 0;
    uint64_t syncs0 = sync_calls(r);
    int rc = gm_malloc(r->a, 0, size, stream, &p);
    if (rc != GM_OK)
        RUN_FAIL(r, "malloc(%" PRIu64 ") after freeing everything = %s (limit %" PRIu64 "): %s",
                 size, gm_status_name(rc), r->limit, gm_last_error_detail());
    pend_check(r, p, size, stream, syncs0);
    if (wl_model_add(&r->m, p, size, stream, r->err, sizeof r->err)) RUN_FAIL(r, "%s", r->err);
}

static void op_malloc(run *r) {
    uint64_t size = wl_chance(&r->r, 0.01) ? 0 : wl_size(&r->r, &r->mix);
    gm_stream stream = wl_chance(&r->r, 0.6) ? 0 : wl_range(&r->r, 1, NSTREAMS - 1);
    gm_devptr p = 0xdead;
    uint64_t syncs0 = sync_calls(r);
    int rc = gm_malloc(r->a, 0, size, stream, &p);
    trace(r, "malloc(%" PRIu64 ", stream %" PRIu64 ") = %s 0x%" PRIx64, size, stream,
          gm_status_name(rc), p);
    if (rc == GM_ENOMEM) {
        on_oom(r, size, stream);
        return;
    }
    if (rc != GM_OK) RUN_FAIL(r, "malloc(%" PRIu64 ") = %s", size, gm_status_name(rc));
    if (size == 0) {
        if (p != 0) RUN_FAIL(r, "malloc(0) gave 0x%" PRIx64 ", expected 0", p);
        return;
    }
    pend_check(r, p, size, stream, syncs0);
    if (wl_model_add(&r->m, p, size, stream, r->err, sizeof r->err)) RUN_FAIL(r, "%s", r->err);
}

static void op_free(run *r) {
    if (r->m.n == 0) return;
    wl_block b;
    wl_model_remove_at(&r->m, (size_t)wl_below(&r->r, r->m.n), &b);
    int rc = gm_free(r->a, b.ptr);
    trace(r, "free(0x%" PRIx64 ") = %s", b.ptr, gm_status_name(rc));
    if (rc != GM_OK) RUN_FAIL(r, "free(0x%" PRIx64 ") = %s", b.ptr, gm_status_name(rc));
    pend_add(r, &b);
    if (wl_chance(&r->r, 0.05)) {
        /* the pointer was not handed out again yet: a second free is a
         * double free, reported, changing nothing (checked after the step) */
        r->op = "double-free";
        rc = gm_free(r->a, b.ptr);
        if (rc != GM_EDOUBLEFREE && rc != GM_EFOREIGN)
            RUN_FAIL(r, "second free(0x%" PRIx64 ") = %s, expected GM_EDOUBLEFREE", b.ptr,
                     gm_status_name(rc));
    }
}

static void op_record_stream(run *r) {
    if (r->m.n == 0) return;
    wl_block *b = &r->m.live[wl_below(&r->r, r->m.n)];
    gm_stream s = wl_range(&r->r, 1, NSTREAMS);
    int rc = gm_record_stream(r->a, b->ptr, s);
    trace(r, "record_stream(0x%" PRIx64 ", %" PRIu64 ") = %s", b->ptr, s, gm_status_name(rc));
    if (rc != GM_OK) RUN_FAIL(r, "record_stream = %s", gm_status_name(rc));
    if (s != b->stream) b->recorded |= 1u << s; /* own stream: nothing to wait for */
}

/* More than the allocator may ever reserve: GM_ENOMEM whatever the policy,
 * with the allocator consistent afterwards (checked after the step). */
static void op_oversize(run *r) {
    uint64_t size = r->limit + wl_range(&r->r, 1, 64 * WL_MIB);
    gm_devptr p = 0xdead;
    int rc = gm_malloc(r->a, 0, size, 0, &p);
    trace(r, "malloc(%" PRIu64 ", oversize) = %s", size, gm_status_name(rc));
    if (rc != GM_ENOMEM)
        RUN_FAIL(r, "malloc(%" PRIu64 ") over the limit %" PRIu64 " = %s, expected GM_ENOMEM",
                 size, r->limit, gm_status_name(rc));
    r->m.ooms++;
    if (gm_last_error_detail()[0] == '\0') RUN_FAIL(r, "GM_ENOMEM without an explanation");
}

/* A device the backend does not have: reported, nothing changes. */
static void op_bad_device(run *r) {
    gm_devptr p = 0xdead;
    int dev = wl_chance(&r->r, 0.5) ? 1 : -1;
    int rc = gm_malloc(r->a, dev, 4096, 0, &p);
    trace(r, "malloc(device %d) = %s", dev, gm_status_name(rc));
    if (rc != GM_EDEVICE && rc != GM_EINVAL)
        RUN_FAIL(r, "malloc on device %d of a 1-device sim = %s, expected GM_EDEVICE", dev,
                 gm_status_name(rc));
}

static void op_bad_pointer(run *r) {
    /* never a live block start: the model's ptr + 1 or a far address */
    gm_devptr p = r->m.n ? r->m.live[wl_below(&r->r, r->m.n)].ptr + 1 : 0x10;
    int rc = gm_free(r->a, p);
    trace(r, "free(foreign 0x%" PRIx64 ") = %s", p, gm_status_name(rc));
    if (rc != GM_EFOREIGN && rc != GM_EDOUBLEFREE && rc != GM_EINVAL)
        RUN_FAIL(r, "free(0x%" PRIx64 " inside a live block) = %s, expected GM_EFOREIGN", p,
                 gm_status_name(rc));
}

static void step(run *r) {
    double live = (double)r->m.n / (double)r->cfg->target_live;
    double p_malloc = live < 1.0 ? 0.55 : 0.30;
    double u = wl_unit(&r->r);
    uint64_t syncs0 = sync_calls(r);
    int rc;
    if ((u -= p_malloc) < 0) {
        r->op = "malloc";
        op_malloc(r);
    } else if ((u -= 0.30) < 0) {
        r->op = "free";
        op_free(r);
    } else if ((u -= 0.06) < 0) {
        r->op = "record_stream";
        op_record_stream(r);
    } else if ((u -= 0.05) < 0) {
        r->op = "complete_events";
        gm_stream s = wl_chance(&r->r, 0.3) ? UINT64_MAX : wl_range(&r->r, 0, NSTREAMS);
        trace(r, "complete_events(%" PRIu64 ")", s);
        rc = gm_sim_complete_events(r->be, 0, s);
        if (rc != GM_OK) RUN_FAIL(r, "gm_sim_complete_events = %s", gm_status_name(rc));
        pend_complete(r, s);
    } else if ((u -= 0.01) < 0) {
        r->op = "empty_cache";
        trace(r, "empty_cache");
        rc = gm_empty_cache(r->a, 0);
        if (rc != GM_OK) RUN_FAIL(r, "gm_empty_cache = %s", gm_status_name(rc));
    } else if ((u -= 0.01) < 0) {
        r->op = "reset_peak_stats";
        trace(r, "reset_peak_stats");
        rc = gm_reset_peak_stats(r->a, 0);
        if (rc != GM_OK) RUN_FAIL(r, "gm_reset_peak_stats = %s", gm_status_name(rc));
        if (wl_check_peaks_reset(r->a, &r->m, r->err, sizeof r->err)) RUN_FAIL(r, "%s", r->err);
    } else if ((u -= 0.01) < 0) {
        r->op = "bad_free";
        op_bad_pointer(r);
        if (wl_chance(&r->r, 0.3)) {
            r->op = "bad_device";
            op_bad_device(r);
        }
        if (r->limit <= 2 * WL_GIB && wl_chance(&r->r, 0.3)) {
            r->op = "oversize";
            op_oversize(r);
        }
    } else if ((u -= 0.003) < 0) {
        r->op = "drain";
        trace(r, "drain");
        drain(r);
    } else {
        r->op = "free";
        op_free(r);
    }
    if (sync_calls(r) != syncs0) pend_complete(r, UINT64_MAX); /* the allocator waited */
    check(r);
}

/* The run a failed assertion jumped out of: released before the next test
 * so that LeakSanitizer reports only the library's leaks. */
static run *g_failed_run;

static void release_failed_run(void) {
    if (!g_failed_run) return;
    teardown(g_failed_run);
    free(g_failed_run);
    g_failed_run = NULL;
}

static void run_config(void **state) {
    const prop_cfg *c = *state;
    release_failed_run();
    const char *only = getenv("GM_CONFIG");
    if (only && *only && strcmp(only, c->name) != 0) skip();
    int steps = (int)wl_env_u64("GM_STEPS", 1500);
    uint64_t seed0 = wl_env_u64("GM_SEED", 0);
    int nseeds = seed0 ? 1 : 3;
    int64_t ooms = 0, peak_reserved = 0;
    size_t max_live = 0;
    for (int k = 0; k < nseeds; k++) {
        run *r = calloc(1, sizeof *r);
        assert_non_null(r);
        g_failed_run = r;
        setup(r, c, seed0 ? seed0 : 1000 + (uint64_t)k * 7919);
        for (r->step = 0; r->step < steps; r->step++) {
            step(r);
            if (r->m.n > max_live) max_live = r->m.n;
        }
        ooms += r->m.ooms;
        if (r->m.prev.reserved_bytes[GM_POOL_ALL].peak > peak_reserved)
            peak_reserved = r->m.prev.reserved_bytes[GM_POOL_ALL].peak;
        r->op = "final-drain";
        drain(r);
        g_failed_run = NULL;
        teardown(r);
        free(r);
    }
    print_message("%s: %d seeds x %d steps, up to %zu live blocks, %" PRId64
                  " OOMs, peak reserved %.1f MiB\n",
                  c->name, nseeds, steps, max_live, ooms, (double)peak_reserved / (double)WL_MIB);
    /* the small devices exist to exercise OOM (op_oversize guarantees some) */
    if (!seed0 && c->capacity <= 2 * WL_GIB && steps >= 1000) assert_true(ooms > 0);
}

int main(void) {
    struct CMUnitTest tests[NCONFIGS];
    for (size_t i = 0; i < NCONFIGS; i++) {
        tests[i] = (struct CMUnitTest){CONFIGS[i].name, run_config, NULL, NULL,
                                       (void *)&CONFIGS[i]};
    }
    int failed = _cmocka_run_group_tests("property", tests, NCONFIGS, NULL, NULL);
    release_failed_run();
    return failed;
}
