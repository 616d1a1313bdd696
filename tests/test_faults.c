/* test_faults.c — the fault-injection sweep. For every backend call kind
 * (and GM_BCALL_ANY), for each policy (torch plain, with expandable
 * segments, with garbage collection + max_split + power-2 rounding; gpumem),
 * the failure point n = 1, 2, 3, ... is walked through a
 * fixed workload until a run completes with no fault triggered. After every
 * injected failure the API call must return a clean error (the injected one,
 * or GM_ENOMEM / GM_EBACKEND), the allocator must pass every invariant of
 * workload.h, retrying the call must succeed, and at the end freeing
 * everything + empty_cache must leave reserved 0 and the sim 0 bytes used.
 * Leaks are ASan's job (tests run under ASan in CI).
 *
 * A broken invariant is reported with its call kind, failure point and
 * script step, and the sweep goes on with the next kind.
 * GM_TRACE=1 prints each failure point and the error it produced;
 * GM_TEST_FILTER='*gpumem*' runs one policy. */
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

/* ---- the fixed workload -------------------------------------------------- */

enum { OP_MALLOC, OP_FREE, OP_RECORD, OP_COMPLETE, OP_EMPTY };
typedef struct op {
    int kind;
    int slot;         /* OP_MALLOC/FREE/RECORD */
    uint64_t size;    /* OP_MALLOC */
    gm_stream stream; /* OP_MALLOC/RECORD/COMPLETE */
} op;

#define M(slot, size, s) {OP_MALLOC, slot, size, s}
#define F(slot) {OP_FREE, slot, 0, 0}
#define R(slot, s) {OP_RECORD, slot, 0, s}
#define C(s) {OP_COMPLETE, 0, 0, s}
#define E {OP_EMPTY, 0, 0, 0}
#define KIB WL_KIB
#define MIB WL_MIB
enum { NSLOTS = 16 };

/* On a 384 MiB device: small and large pools, splits, reuse on the same
 * stream, blocks held back by events on other streams, empty_cache with live
 * blocks, and a 250 MiB request that only fits once the cache (including
 * blocks whose events must be waited for) is released. Sizes are kept small
 * because the sweep's cost grows with the square of the backend calls made
 * (gpumem maps 2 MiB chunks: ~1 call per 2 MiB). */
enum { CAPACITY_MIB = 384 };
static const op SCRIPT[] = {
    M(0, 1000, 0), M(1, 600 * KIB, 0), M(2, 3 * MIB, 0), M(3, 8 * MIB, 0), M(4, 50 * MIB, 0),
    M(5, 5 * MIB, 1), R(2, 1), R(4, 2), F(2), F(4), M(6, 3 * MIB, 0), M(7, 50 * MIB, 0),
    C(1), F(1), M(8, 500 * KIB, 0), M(1, 700, 1), E, F(3), F(0), M(9, 250 * MIB, 0), F(7), F(9),
    M(10, 100 * MIB, 2), R(10, 3), F(10), E, M(11, 25 * MIB, 3), M(12, 2 * MIB, 3), F(12),
    M(12, 2 * MIB, 3), F(5), F(6), F(8), F(11), F(12), F(1), C(UINT64_MAX), E,
};
#define NSCRIPT (sizeof SCRIPT / sizeof SCRIPT[0])

/* ---- one run ------------------------------------------------------------- */

typedef struct frun {
    const char *conf;
    int kind, status;
    uint64_t nth;
    gm_backend *be;
    gm_allocator *a;
    wl_model m;
    gm_devptr slot[NSLOTS];
    uint64_t slot_size[NSLOTS];
    unsigned check_flags;
    int errors; /* API calls that returned an error */
    bool trace;
    char err[1024];
} frun;

/* A broken invariant ends the run (longjmp back to fault_run) and is
 * recorded; the sweep then goes on with the next call kind, so one run shows
 * every kind that fails, not just the first. */
static jmp_buf g_fail_jmp;
static char g_fail_msg[2048];

#define FR_FAIL(R, step, ...)                                                               \
    do {                                                                                    \
        char msg_[1536];                                                                    \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                           \
        snprintf(g_fail_msg, sizeof g_fail_msg, "%s, fault %s#%" PRIu64 " -> %s, script step %d: %s", \
                 (R)->conf, (R)->kind == GM_BCALL_ANY ? "ANY" : gm_bcall_name((R)->kind),    \
                 (R)->nth, gm_status_name((R)->status), step, msg_);                         \
        longjmp(g_fail_jmp, 1);                                                             \
    } while (0)

static uint64_t calls(gm_backend *be, int kind) {
    if (kind != GM_BCALL_ANY) return gm_backend_call_count(be, 0, kind);
    uint64_t n = 0;
    for (int k = 0; k < GM_BCALL_COUNT; k++) n += gm_backend_call_count(be, 0, k);
    return n;
}

static bool clean_error(const frun *r, int rc) {
    return rc == r->status || rc == GM_ENOMEM || rc == GM_EBACKEND;
}

static int attempt(frun *r, const op *o) {
    switch (o->kind) {
    case OP_MALLOC: {
        gm_devptr p = 0;
        int rc = gm_malloc(r->a, 0, o->size, o->stream, &p);
        if (rc == GM_OK) {
            r->slot[o->slot] = p;
            r->slot_size[o->slot] = o->size;
        }
        return rc;
    }
    case OP_FREE: return gm_free(r->a, r->slot[o->slot]);
    case OP_RECORD: return gm_record_stream(r->a, r->slot[o->slot], o->stream);
    case OP_COMPLETE: return gm_sim_complete_events(r->be, 0, o->stream);
    default: return gm_empty_cache(r->a, 0);
    }
}

/* Bring the model in line with a successful op. */
static void commit(frun *r, int step, const op *o) {
    if (o->kind == OP_MALLOC) {
        if (wl_model_add(&r->m, r->slot[o->slot], o->size, o->stream, r->err, sizeof r->err))
            FR_FAIL(r, step, "%s", r->err);
    } else if (o->kind == OP_FREE) {
        long i = wl_model_find(&r->m, r->slot[o->slot]);
        if (i < 0) FR_FAIL(r, step, "slot %d not live in the model", o->slot);
        wl_model_remove_at(&r->m, (size_t)i, NULL);
        r->slot[o->slot] = 0;
    }
}

static void check(frun *r, int step, const char *when) {
    if (wl_check(r->a, &r->m, r->check_flags, r->err, sizeof r->err))
        FR_FAIL(r, step, "%s: %s", when, r->err);
}

static void run_step(frun *r, int step) {
    const op *o = &SCRIPT[step];
    int rc = attempt(r, o);
    for (int tries = 0; rc != GM_OK; tries++) {
        if (!clean_error(r, rc))
            FR_FAIL(r, step, "call failed with %s (%s), not a clean backend error",
                    gm_status_name(rc), gm_last_error_detail());
        if (r->trace)
            fprintf(stderr, "  %s %s#%" PRIu64 ": step %d -> %s: %s\n", r->conf,
                    r->kind == GM_BCALL_ANY ? "ANY" : gm_bcall_name(r->kind), r->nth, step,
                    gm_status_name(rc), gm_last_error_detail());
        r->errors++;
        if (rc == GM_ENOMEM) {
            /* an OOM from the policy counts in num_ooms; an injected
             * GM_ENOMEM from a call outside placement (mem_info at device
             * creation) need not */
            gm_stats s = {.size = sizeof s};
            memset(&s, 0, sizeof s);
            s.size = sizeof s;
            if (gm_get_stats(r->a, 0, &s) == GM_OK && s.num_ooms == r->m.ooms + 1) r->m.ooms++;
        }
        /* the failed call changed nothing: same model, every invariant holds */
        check(r, step, "after the injected failure");
        if (tries == 2) FR_FAIL(r, step, "still failing after %d retries: %s", tries + 1,
                                gm_status_name(rc));
        rc = attempt(r, o);
    }
    commit(r, step, o);
    check(r, step, "after the step");
}

/* Finish: disarm, free what is live, empty the cache: nothing may remain. */
static void finish(frun *r) {
    int step = (int)NSCRIPT;
    gm_backend_inject_fault(r->be, r->kind, 0, 0);
    if (wl_free_all(r->a, &r->m, r->err, sizeof r->err)) FR_FAIL(r, step, "%s", r->err);
    int rc = gm_empty_cache(r->a, 0);
    if (rc != GM_OK) FR_FAIL(r, step, "final empty_cache = %s", gm_status_name(rc));
    check(r, step, "at the end");
    if (wl_check(r->a, &r->m, WL_CHECK_ALL, r->err, sizeof r->err))
        FR_FAIL(r, step, "at the end: %s", r->err);
    gm_stats s = {.size = sizeof s};
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    if (gm_get_stats(r->a, 0, &s) != GM_OK) FR_FAIL(r, step, "gm_get_stats failed");
    if (s.reserved_bytes[GM_POOL_ALL].current != 0)
        FR_FAIL(r, step, "reserved %" PRId64 " after free all + empty_cache",
                s.reserved_bytes[GM_POOL_ALL].current);
    uint64_t fr = 0, tot = 0;
    if (gm_mem_get_info(r->a, 0, &fr, &tot) != GM_OK || fr != tot)
        FR_FAIL(r, step, "sim reports %" PRIu64 " bytes still in use", tot - fr);
}

enum { RUN_CLEAN, RUN_FIRED, RUN_FAILED };

static void release_run(frun *r) {
    if (r->a) gm_allocator_destroy(r->a);
    if (r->be) gm_backend_destroy(r->be);
    wl_model_free(&r->m);
    free(r);
}

/* RUN_FIRED when the fault fired (the sweep goes on to nth + 1), RUN_CLEAN
 * when the workload made fewer than nth calls of the kind, RUN_FAILED (with
 * g_fail_msg) when an invariant broke. */
/* The policy under test: a config string, and a memory fraction to set
 * after creation (0: none; torch's garbage collection needs one). */
typedef struct fconf {
    const char *conf;
    double fraction;
} fconf;

static int fault_run(const fconf *fc, int kind, int status, uint64_t nth, int *errors) {
    const char *conf = fc->conf;
    frun *const r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->conf = conf;
    r->kind = kind;
    r->status = status;
    r->nth = nth;
    r->trace = wl_env_u64("GM_TRACE", 0) != 0;
    wl_model_init(&r->m);
    r->m.torch_pools = strstr(conf, "policy:torch") != NULL;
    /* our own gm_mem_get_info calls would consume MEM_INFO faults */
    r->check_flags = WL_CHECK_PEAKS | WL_CHECK_SEGMENTS;
    if (kind != GM_BCALL_MEM_INFO && kind != GM_BCALL_ANY) r->check_flags |= WL_CHECK_SIM_USED;
    if (setjmp(g_fail_jmp)) {
        *errors = r->errors;
        /* the allocator may be broken: drop it without touching it again */
        r->a = NULL;
        if (r->be) gm_backend_inject_fault(r->be, kind, 0, 0);
        release_run(r);
        return RUN_FAILED;
    }

    gm_sim_options o;
    gm_sim_options_init(&o);
    o.capacity = CAPACITY_MIB * WL_MIB;
    o.events_manual = true;
    assert_int_equal(gm_sim_create(&r->be, &o), GM_OK);
    gm_config cfg;
    gm_config_init(&cfg);
    assert_int_equal(gm_config_parse(&cfg, conf, NULL, 0), GM_OK);

    uint64_t before = calls(r->be, kind);
    assert_int_equal(gm_backend_inject_fault(r->be, kind, nth, status), GM_OK);
    int rc = gm_allocator_create(&r->a, r->be, &cfg);
    if (rc != GM_OK) {
        if (!clean_error(r, rc)) FR_FAIL(r, -1, "gm_allocator_create = %s", gm_status_name(rc));
        r->errors++;
        rc = gm_allocator_create(&r->a, r->be, &cfg);
        if (rc != GM_OK) FR_FAIL(r, -1, "gm_allocator_create retry = %s", gm_status_name(rc));
    }
    if (fc->fraction > 0) { /* creates the device: mem_info may fail */
        rc = gm_set_memory_fraction(r->a, 0, fc->fraction);
        if (rc != GM_OK) {
            if (!clean_error(r, rc)) FR_FAIL(r, -1, "gm_set_memory_fraction = %s", gm_status_name(rc));
            r->errors++;
            rc = gm_set_memory_fraction(r->a, 0, fc->fraction);
            if (rc != GM_OK) FR_FAIL(r, -1, "gm_set_memory_fraction retry = %s", gm_status_name(rc));
        }
    }
    for (int i = 0; i < (int)NSCRIPT; i++) run_step(r, i);
    bool fired = calls(r->be, kind) - before >= nth;
    finish(r);
    *errors = r->errors;
    release_run(r);
    return fired ? RUN_FIRED : RUN_CLEAN;
}

/* ---- the sweep ------------------------------------------------------------ */

typedef struct sweep_result {
    uint64_t points; /* failure points that fired */
    int errors;      /* of which an API call saw the error */
    bool failed;     /* an invariant broke (message printed) */
} sweep_result;

static sweep_result sweep(const fconf *fc, int kind, int status) {
    sweep_result res = {0, 0, false};
    for (uint64_t n = 1; n <= 5000; n++) {
        int errors = 0;
        int out = fault_run(fc, kind, status, n, &errors);
        if (out == RUN_FAILED) {
            print_error("FAILED: %s\n", g_fail_msg);
            res.failed = true;
            return res;
        }
        if (out == RUN_CLEAN) return res;
        res.points++;
        res.errors += errors > 0;
    }
    print_error("FAILED: %s: sweep of %d did not end after 5000 failure points\n", fc->conf, kind);
    res.failed = true;
    return res;
}

static void sweep_all(const char *conf, double fraction) {
    const fconf fc = {conf, fraction};
    sweep_result any = {0, 0, false};
    uint64_t total = 0;
    int nfailed = 0;
    char line[1024];
    int len = snprintf(line, sizeof line, "%s:", conf);
    for (int k = 0; k <= GM_BCALL_COUNT; k++) {
        int kind = k == GM_BCALL_COUNT ? GM_BCALL_ANY : k;
        const char *name = kind == GM_BCALL_ANY ? "ANY" : gm_bcall_name(kind);
        sweep_result r = sweep(&fc, kind, GM_EBACKEND);
        /* a full device looks different from a broken one: the allocator
         * is expected to free its cache and retry on GM_ENOMEM */
        if (kind == GM_BCALL_MALLOC || kind == GM_BCALL_PHYS_CREATE || kind == GM_BCALL_ANY) {
            sweep_result o = sweep(&fc, kind, GM_ENOMEM);
            r.points += o.points;
            r.errors += o.errors;
            r.failed |= o.failed;
        }
        nfailed += r.failed;
        if (kind == GM_BCALL_ANY) any = r;
        else total += r.points;
        if ((r.points || r.failed) && len < (int)sizeof line)
            len += snprintf(line + len, sizeof line - (size_t)len, " %s=%" PRIu64 "/%d%s", name,
                            r.points, r.errors, r.failed ? "(FAILED)" : "");
    }
    print_message("%s (failure points fired/seen by the caller)\n", line);
    if (nfailed) fail_msg("%s: %d call kinds broke an invariant (FAILED lines above)", conf, nfailed);
    /* the sweep is only worth something if the workload reaches the device */
    assert_true(any.points >= 10);
    assert_true(total >= any.points / 2);
}

static void faults_torch(void **state) { sweep_all("policy:torch", 0); }
static void faults_torch_expandable(void **state) {
    sweep_all("policy:torch,expandable_segments:True", 0);
}
/* the other torch paths: garbage collection, oversize blocks, rounding */
static void faults_torch_gc_split(void **state) {
    sweep_all("policy:torch,garbage_collection_threshold:0.5,max_split_size_mb:24,"
              "roundup_power2_divisions:4",
              0.99);
}
static void faults_gpumem(void **state) { sweep_all("policy:gpumem", 0); }
static void faults_gpumem_plan(void **state) { sweep_all("policy:gpumem,gpumem_plan:on", 0); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(faults_torch),
        cmocka_unit_test(faults_torch_expandable),
        cmocka_unit_test(faults_torch_gc_split),
        cmocka_unit_test(faults_gpumem),
        cmocka_unit_test(faults_gpumem_plan),
    };
    const char *only = getenv("GM_TEST_FILTER"); /* e.g. "*gpumem*" */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
