/* test_faults.c — the fault-injection sweep. For every backend call kind
 * (and GM_BCALL_ANY), for each policy (torch plain, with expandable
 * segments, with garbage collection + max_split + power-2 rounding; gpumem),
 * the failure point n = 1, 2, 3, ... is walked through a
 * fixed workload until a run completes with no fault triggered. After every
 * injected failure the API call must return a clean error (the injected one,
 * or GM_ENOMEM / GM_EBACKEND), the allocator must pass every invariant of
 * workload.h, retrying the call must succeed, and at the end freeing
 * everything + empty_cache must leave reserved 0 and the sim 0 bytes used.
 * Host leaks are ASan's job (tests run under ASan in CI); device leaks are
 * the sim's: after gm_allocator_destroy every run asserts that the sim holds
 * no allocation, reservation, physical handle, mapping or event beyond what
 * the allocator reported dropping (gm_backend_dropped_count: a cleanup call
 * that failed twice), and a one-shot fault may drop nothing.
 *
 * Besides the one-shot sweep: persistent faults (from the nth call on, every
 * call of the kind fails, through the workload, empty_cache and destroy:
 * every call must return, clean, with the invariants intact), one-shot and
 * persistent faults during teardown (destroy with live blocks, pending
 * events and a cache), and two devices driven by four threads under faults.
 * Every run has a 60 s alarm: a hang fails with the run that hung.
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
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gm_test.h"
#include "workload.h"

/* ---- hang guard ------------------------------------------------------------ */

static char g_running[256]; /* the run in progress, for the alarm */

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "test_faults: a run did not finish within 60 s (hang): ";
    (void)!write(2, m, sizeof m - 1);
    (void)!write(2, g_running, strnlen(g_running, sizeof g_running));
    (void)!write(2, "\n", 1);
    _exit(1);
}

static void guard(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_running, sizeof g_running, fmt, ap);
    va_end(ap);
    signal(SIGALRM, on_alarm);
    alarm(60);
}

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

enum { MODE_ONESHOT, MODE_PERSIST, MODE_TEARDOWN, MODE_TEARDOWN_PERSIST };
static const char *const MODE_NAME[] = {"one-shot", "persistent", "teardown one-shot",
                                         "teardown persistent"};

typedef struct frun {
    const char *conf;
    int kind, status, mode;
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
        snprintf(g_fail_msg, sizeof g_fail_msg, "%s, %s fault %s#%" PRIu64 " -> %s, script step %d: %s", \
                 (R)->conf, MODE_NAME[(R)->mode],                                            \
                 (R)->kind == GM_BCALL_ANY ? "ANY" : gm_bcall_name((R)->kind),               \
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
    unsigned flags = r->check_flags;
    /* memory the allocator dropped (a release refused twice, counted) is
     * still in use on the sim but no longer reserved */
    if (gm_backend_dropped_count(r->be, 0, GM_BCALL_ANY)) flags &= ~(unsigned)WL_CHECK_SIM_USED;
    if (wl_check(r->a, &r->m, flags, r->err, sizeof r->err))
        FR_FAIL(r, step, "%s: %s", when, r->err);
}

static bool slot_live(const frun *r, int slot) {
    return r->slot[slot] && wl_model_find(&r->m, r->slot[slot]) >= 0;
}

static void count_oom(frun *r, int rc) {
    if (rc != GM_ENOMEM) return;
    /* an OOM from the policy counts in num_ooms; an injected GM_ENOMEM from
     * a call outside placement (mem_info at device creation) need not */
    gm_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    if (gm_get_stats(r->a, 0, &s) == GM_OK && s.num_ooms == r->m.ooms + 1) r->m.ooms++;
}

/* Under a persistent fault a step is tried once: it succeeds or fails
 * cleanly, with every invariant intact either way; a free or record of a
 * block that was never allocated (its malloc failed) is skipped. */
static void run_step_persistent(frun *r, int step) {
    const op *o = &SCRIPT[step];
    if ((o->kind == OP_FREE || o->kind == OP_RECORD) && !slot_live(r, o->slot)) return;
    int rc = attempt(r, o);
    if (rc != GM_OK) {
        if (!clean_error(r, rc))
            FR_FAIL(r, step, "call failed with %s (%s), not a clean backend error",
                    gm_status_name(rc), gm_last_error_detail());
        r->errors++;
        count_oom(r, rc);
        check(r, step, "after a failed call");
        return;
    }
    commit(r, step, o);
    check(r, step, "after the step");
}

static void run_step(frun *r, int step) {
    if (r->mode == MODE_PERSIST) {
        run_step_persistent(r, step);
        return;
    }
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
        count_oom(r, rc);
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

/* Persistent fault, still armed: free what can be freed, empty the cache;
 * every call returns, clean, and the invariants hold. */
static void finish_persistent(frun *r) {
    int step = (int)NSCRIPT;
    for (size_t i = r->m.n; i-- > 0;) {
        int rc = gm_free(r->a, r->m.live[i].ptr);
        if (rc == GM_OK) wl_model_remove_at(&r->m, i, NULL);
        else if (!clean_error(r, rc))
            FR_FAIL(r, step, "final gm_free = %s (%s)", gm_status_name(rc), gm_last_error_detail());
    }
    check(r, step, "after freeing everything");
    int rc = gm_empty_cache(r->a, 0);
    if (rc != GM_OK && !clean_error(r, rc))
        FR_FAIL(r, step, "empty_cache = %s (%s)", gm_status_name(rc), gm_last_error_detail());
    check(r, step, "after empty_cache");
}

/* After gm_allocator_destroy: the sim holds nothing but what the allocator
 * reported dropping; a one-shot fault is retried, so nothing is dropped. */
static void check_destroyed(frun *r, int ndev) {
    int step = (int)NSCRIPT + 1;
    for (int dev = 0; dev < ndev; dev++) {
        gm_sim_live l;
        memset(&l, 0, sizeof l);
        l.size = sizeof l;
        if (gm_sim_live_objects(r->be, dev, &l) != GM_OK) FR_FAIL(r, step, "gm_sim_live_objects failed");
        uint64_t dfree = gm_backend_dropped_count(r->be, dev, GM_BCALL_FREE);
        uint64_t dva = gm_backend_dropped_count(r->be, dev, GM_BCALL_VA_RELEASE);
        uint64_t dphys = gm_backend_dropped_count(r->be, dev, GM_BCALL_PHYS_RELEASE);
        uint64_t dunmap = gm_backend_dropped_count(r->be, dev, GM_BCALL_UNMAP);
        uint64_t dev_ = gm_backend_dropped_count(r->be, dev, GM_BCALL_EVENT_DESTROY);
        bool persistent = r->mode == MODE_PERSIST || r->mode == MODE_TEARDOWN_PERSIST;
        if (l.allocations != dfree || l.reservations != dva || l.phys != dphys ||
            l.events != dev_ || (l.mapped_pages && !dunmap) ||
            (!persistent && dfree + dva + dphys + dunmap + dev_))
            FR_FAIL(r, step,
                    "after gm_allocator_destroy device %d holds %" PRIu64 " allocations, %" PRIu64
                    " reservations, %" PRIu64 " physical handles, %" PRIu64 " mapped pages, %" PRIu64
                    " events; the allocator reported dropping %" PRIu64 " frees, %" PRIu64
                    " VA releases, %" PRIu64 " physical releases, %" PRIu64 " unmaps, %" PRIu64
                    " event destroys",
                    dev, l.allocations, l.reservations, l.phys, l.mapped_pages, l.events, dfree, dva,
                    dphys, dunmap, dev_);
    }
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

/* The prefix of the script run before a teardown fault: live blocks, blocks
 * waiting on events of other streams, and a cache. */
enum { TEARDOWN_STEPS = 16 };

static int fault_run(const fconf *fc, int mode, int kind, int status, uint64_t nth, int *errors) {
    const char *conf = fc->conf;
    frun *const r = calloc(1, sizeof *r);
    assert_non_null(r);
    guard("%s, %s fault %s#%" PRIu64 " -> %s", conf, MODE_NAME[mode],
          kind == GM_BCALL_ANY ? "ANY" : gm_bcall_name(kind), nth, gm_status_name(status));
    r->conf = conf;
    r->mode = mode;
    r->kind = kind;
    r->status = status;
    r->nth = nth;
    r->trace = wl_env_u64("GM_TRACE", 0) != 0;
    wl_model_init(&r->m);
    r->m.torch_pools = strstr(conf, "policy:torch") != NULL;
    /* our own gm_mem_get_info calls would consume MEM_INFO faults */
    r->check_flags = WL_CHECK_PEAKS | WL_CHECK_SEGMENTS;
    if (kind != GM_BCALL_MEM_INFO && kind != GM_BCALL_ANY) r->check_flags |= WL_CHECK_SIM_USED;
    bool teardown = mode == MODE_TEARDOWN || mode == MODE_TEARDOWN_PERSIST;
    if (mode == MODE_PERSIST) r->check_flags |= WL_CHECK_LOOSE;
    unsigned fflags = mode == MODE_PERSIST || mode == MODE_TEARDOWN_PERSIST ? GM_FAULT_PERSISTENT : 0;
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
    if (!teardown) assert_int_equal(gm_backend_inject_fault_ex(r->be, kind, nth, status, fflags), GM_OK);
    int rc = gm_allocator_create(&r->a, r->be, &cfg);
    if (rc != GM_OK && mode == MODE_PERSIST) { /* a device that never works: a clean error */
        if (!clean_error(r, rc)) FR_FAIL(r, -1, "gm_allocator_create = %s", gm_status_name(rc));
        r->a = NULL;
        gm_backend_inject_fault(r->be, kind, 0, 0);
        bool fired0 = calls(r->be, kind) - before >= nth;
        check_destroyed(r, 1);
        release_run(r);
        alarm(0);
        return fired0 ? RUN_FIRED : RUN_CLEAN;
    }
    if (rc != GM_OK) {
        if (!clean_error(r, rc)) FR_FAIL(r, -1, "gm_allocator_create = %s", gm_status_name(rc));
        r->errors++;
        rc = gm_allocator_create(&r->a, r->be, &cfg);
        if (rc != GM_OK) FR_FAIL(r, -1, "gm_allocator_create retry = %s", gm_status_name(rc));
    }
    if (fc->fraction > 0) { /* creates the device: mem_info may fail */
        rc = gm_set_memory_fraction(r->a, 0, fc->fraction);
        if (rc != GM_OK && mode == MODE_PERSIST) {
            if (!clean_error(r, rc)) FR_FAIL(r, -1, "gm_set_memory_fraction = %s", gm_status_name(rc));
            r->errors++; /* go on without a fraction: every step fails cleanly */
        } else if (rc != GM_OK) {
            if (!clean_error(r, rc)) FR_FAIL(r, -1, "gm_set_memory_fraction = %s", gm_status_name(rc));
            r->errors++;
            rc = gm_set_memory_fraction(r->a, 0, fc->fraction);
            if (rc != GM_OK) FR_FAIL(r, -1, "gm_set_memory_fraction retry = %s", gm_status_name(rc));
        }
    }
    bool fired;
    if (teardown) { /* destroy with live blocks, pending events and a cache */
        for (int i = 0; i < TEARDOWN_STEPS; i++) run_step(r, i);
        before = calls(r->be, kind);
        assert_int_equal(gm_backend_inject_fault_ex(r->be, kind, nth, status, fflags), GM_OK);
    } else {
        for (int i = 0; i < (int)NSCRIPT; i++) run_step(r, i);
        if (mode == MODE_PERSIST) finish_persistent(r);
        else finish(r);
    }
    gm_allocator_destroy(r->a); /* a persistent fault is still armed */
    r->a = NULL;
    fired = calls(r->be, kind) - before >= nth;
    gm_backend_inject_fault(r->be, kind, 0, 0);
    check_destroyed(r, 1);
    *errors = r->errors;
    release_run(r);
    alarm(0);
    return fired ? RUN_FIRED : RUN_CLEAN;
}

/* ---- the sweep ------------------------------------------------------------ */

typedef struct sweep_result {
    uint64_t points; /* failure points that fired */
    int errors;      /* of which an API call saw the error */
    bool failed;     /* an invariant broke (message printed) */
} sweep_result;

/* Persistent runs cost as much as one-shot ones, and from one failure point
 * to the next little changes: every point up to 16, then every ~12% further. */
static uint64_t next_point(int mode, uint64_t n) {
    if (mode == MODE_ONESHOT || mode == MODE_TEARDOWN || n < 16) return n + 1;
    return n + n / 8;
}

static sweep_result sweep(const fconf *fc, int mode, int kind, int status) {
    sweep_result res = {0, 0, false};
    for (uint64_t n = 1; n <= 5000; n = next_point(mode, n)) {
        int errors = 0;
        int out = fault_run(fc, mode, kind, status, n, &errors);
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

static void sweep_all_mode(const char *conf, double fraction, int mode) {
    const fconf fc = {conf, fraction};
    sweep_result any = {0, 0, false};
    uint64_t total = 0;
    int nfailed = 0;
    char line[1024];
    int len = snprintf(line, sizeof line, "%s [%s]:", conf, MODE_NAME[mode]);
    for (int k = 0; k <= GM_BCALL_COUNT; k++) {
        int kind = k == GM_BCALL_COUNT ? GM_BCALL_ANY : k;
        const char *name = kind == GM_BCALL_ANY ? "ANY" : gm_bcall_name(kind);
        sweep_result r = sweep(&fc, mode, kind, GM_EBACKEND);
        /* a full device looks different from a broken one: the allocator
         * is expected to free its cache and retry on GM_ENOMEM */
        if (kind == GM_BCALL_MALLOC || kind == GM_BCALL_PHYS_CREATE || kind == GM_BCALL_ANY) {
            sweep_result o = sweep(&fc, mode, kind, GM_ENOMEM);
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
    if (nfailed) fail_msg("%s [%s]: %d call kinds broke an invariant (FAILED lines above)", conf,
                          MODE_NAME[mode], nfailed);
    /* the sweep is only worth something if the workload reaches the device */
    if (mode == MODE_ONESHOT) {
        assert_true(any.points >= 10);
        assert_true(total >= any.points / 2);
    } else {
        assert_true(any.points >= 3);
    }
}

static void sweep_all(const char *conf, double fraction) {
    for (int mode = MODE_ONESHOT; mode <= MODE_TEARDOWN_PERSIST; mode++)
        sweep_all_mode(conf, fraction, mode);
}

/* ---- two devices, four threads ------------------------------------------- *
 * Threads on two devices malloc, free (their own and other threads' blocks
 * through a shared table), record streams, empty the cache and complete
 * events while a fault is armed (one-shot or persistent, on every call kind
 * in turn). Which thread meets the fault depends on the schedule; what must
 * hold does not: every error is clean, gm_check passes on both devices, and
 * once disarmed, freeing everything and empty_cache leave nothing reserved,
 * and destroy leaves the sim holding only what was reported dropped. */
enum { TH_THREADS = 4, TH_DEVICES = 2, TH_SLOTS = 64, TH_OPS = 150 };

typedef struct th_shared {
    gm_allocator *a;
    gm_backend *be;
    pthread_mutex_t lock; /* guards slot[] (ownership of pointers), not the allocator */
    gm_devptr slot[TH_SLOTS];
    int bad; /* unclean errors seen */
    char why[256];
} th_shared;

typedef struct th_arg {
    th_shared *sh;
    int tid;
} th_arg;

static _Atomic int g_th_errors; /* clean errors the threads saw, over all runs */

static void th_bad(th_shared *sh, const char *what, int rc) {
    if (rc == GM_EBACKEND || rc == GM_ENOMEM) {
        g_th_errors++;
        return;
    }
    pthread_mutex_lock(&sh->lock);
    if (!sh->bad++)
        snprintf(sh->why, sizeof sh->why, "%s = %s (%s)", what, gm_status_name(rc), gm_last_error_detail());
    pthread_mutex_unlock(&sh->lock);
}

static void *th_body(void *p) {
    th_arg *ta = p;
    th_shared *sh = ta->sh;
    wl_rng rng;
    wl_seed(&rng, 0x5eed0000u + (uint64_t)ta->tid);
    int dev = ta->tid % TH_DEVICES;
    for (int i = 0; i < TH_OPS; i++) {
        unsigned what = (unsigned)wl_below(&rng, 100);
        int k = (int)wl_below(&rng, TH_SLOTS);
        gm_stream stream = (gm_stream)(ta->tid * 4 + (int)wl_below(&rng, 4));
        if (what < 50) { /* malloc into an empty slot */
            uint64_t size = wl_chance(&rng, 0.7) ? wl_range(&rng, 1, 1 << 20) : wl_range(&rng, 1 << 20, 48 << 20);
            gm_devptr ptr = 0;
            int rc = gm_malloc(sh->a, dev, size, stream, &ptr);
            if (rc == GM_OK) {
                pthread_mutex_lock(&sh->lock);
                gm_devptr old = sh->slot[k];
                if (!old) sh->slot[k] = ptr;
                pthread_mutex_unlock(&sh->lock);
                if (old && (rc = gm_free(sh->a, ptr)) != GM_OK) th_bad(sh, "gm_free", rc);
            } else {
                th_bad(sh, "gm_malloc", rc);
            }
        } else if (what < 85) { /* free any thread's block (maybe another device's) */
            pthread_mutex_lock(&sh->lock);
            gm_devptr ptr = sh->slot[k];
            sh->slot[k] = 0;
            pthread_mutex_unlock(&sh->lock);
            if (!ptr) continue;
            if (wl_chance(&rng, 0.5)) {
                int rc = gm_record_stream(sh->a, ptr, stream + 100);
                if (rc != GM_OK && rc != GM_ENOHOSTMEM) th_bad(sh, "gm_record_stream", rc);
            }
            int rc = gm_free(sh->a, ptr);
            if (rc != GM_OK) {
                th_bad(sh, "gm_free", rc);
                pthread_mutex_lock(&sh->lock); /* still live: keep it for the end */
                for (int j = 0; j < TH_SLOTS && ptr; j++)
                    if (!sh->slot[j]) sh->slot[j] = ptr, ptr = 0;
                pthread_mutex_unlock(&sh->lock);
                if (ptr) th_bad(sh, "no slot left for a block whose free failed", GM_ESTATE);
            }
        } else if (what < 93) {
            int rc = gm_empty_cache(sh->a, dev);
            if (rc != GM_OK) th_bad(sh, "gm_empty_cache", rc);
        } else {
            int rc = gm_sim_complete_events(sh->be, dev, UINT64_MAX);
            if (rc != GM_OK) th_bad(sh, "gm_sim_complete_events", rc);
        }
    }
    return NULL;
}

static void threads_run(const char *conf, int kind, uint64_t nth, unsigned flags) {
    guard("threads %s, %s fault %s#%" PRIu64, conf, flags ? "persistent" : "one-shot",
          kind == GM_BCALL_ANY ? "ANY" : gm_bcall_name(kind), nth);
    th_shared sh;
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.lock, NULL);
    gm_sim_options o;
    gm_sim_options_init(&o);
    o.device_count = TH_DEVICES;
    o.capacity = 512 * WL_MIB;
    o.events_manual = true;
    assert_int_equal(gm_test_make_opts(GM_POLICY_TORCH, conf, &o, &sh.be, &sh.a), GM_OK); /* conf names the policy */
    assert_int_equal(gm_backend_inject_fault_ex(sh.be, kind, nth, GM_EBACKEND, flags), GM_OK);
    pthread_t t[TH_THREADS];
    th_arg args[TH_THREADS];
    for (int i = 0; i < TH_THREADS; i++) {
        args[i] = (th_arg){&sh, i};
        assert_int_equal(pthread_create(&t[i], NULL, th_body, &args[i]), 0);
    }
    for (int i = 0; i < TH_THREADS; i++) pthread_join(t[i], NULL);
    char err[512] = "";
    if (sh.bad) fail_msg("threads %s fault %s#%" PRIu64 ": %d unclean errors, first: %s", conf,
                         gm_bcall_name(kind), nth, sh.bad, sh.why);
    if (gm_check(sh.a, -1, err, sizeof err) != GM_OK)
        fail_msg("threads %s fault %s#%" PRIu64 ": gm_check: %s", conf, gm_bcall_name(kind), nth, err);
    gm_backend_inject_fault(sh.be, kind, 0, 0);
    for (int k = 0; k < TH_SLOTS; k++)
        if (sh.slot[k]) assert_int_equal(gm_free(sh.a, sh.slot[k]), GM_OK);
    assert_int_equal(gm_sim_complete_events(sh.be, 0, UINT64_MAX), GM_OK);
    assert_int_equal(gm_sim_complete_events(sh.be, 1, UINT64_MAX), GM_OK);
    assert_int_equal(gm_empty_cache(sh.a, -1), GM_OK);
    for (int dev = 0; dev < TH_DEVICES; dev++) {
        gm_stats st;
        memset(&st, 0, sizeof st);
        st.size = sizeof st;
        assert_int_equal(gm_get_stats(sh.a, dev, &st), GM_OK);
        assert_int_equal(st.allocation[GM_POOL_ALL].current, 0);
        /* dropped memory was given up by the allocator: not reserved any more */
        assert_int_equal(st.reserved_bytes[GM_POOL_ALL].current, 0);
    }
    gm_allocator_destroy(sh.a);
    frun r;
    memset(&r, 0, sizeof r);
    r.conf = conf;
    r.kind = kind;
    r.nth = nth;
    r.mode = flags ? MODE_PERSIST : MODE_ONESHOT;
    r.status = GM_EBACKEND;
    r.be = sh.be;
    if (setjmp(g_fail_jmp)) fail_msg("threads: %s", g_fail_msg);
    check_destroyed(&r, TH_DEVICES);
    gm_backend_destroy(sh.be);
    pthread_mutex_destroy(&sh.lock);
    alarm(0);
}

static void faults_threads(void **state) {
    (void)state;
    static const char *const confs[] = {"policy:torch", "policy:torch,expandable_segments:True",
                                        "policy:gpumem"};
    for (size_t c = 0; c < sizeof confs / sizeof *confs; c++)
        for (int k = 0; k <= GM_BCALL_COUNT; k++) {
            int kind = k == GM_BCALL_COUNT ? GM_BCALL_ANY : k;
            if (kind == GM_BCALL_MEM_INFO) continue; /* devices are made on first use: see the sweep */
            threads_run(confs[c], kind, 3, 0);
            threads_run(confs[c], kind, 40, 0);
            threads_run(confs[c], kind, 10, GM_FAULT_PERSISTENT);
        }
    assert_true(g_th_errors > 100); /* the faults reached the callers */
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
        cmocka_unit_test(faults_threads),
        cmocka_unit_test(faults_gpumem_plan),
    };
    /* GM_TEST_FILTER (e.g. "*gpumem*"): tests/support/test_filter.c */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
