/* test_plan.c — gpumem_plan:on on the sim backend: a repeating step is
 * learned and served from the plan (no device call once it settled), and
 * whatever the program does after the plan was made — a planned block freed
 * late, kept across the step boundary, an extra or a missing allocation, a
 * block used on another stream (record_stream, events completed by hand) —
 * no two live blocks overlap, no block is handed out while a stream may
 * still use it, and gm_check holds after every call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpumem/backend.h"
#include "gm_test.h"
#include "gpumem/gpumem.h"
#include "policy/gpumem/plan/plan.h"
#include "workload.h"

#define MIB ((uint64_t)1 << 20)
#define NSTEP 48 /* allocations per step */

typedef struct tstep {
    uint64_t size[NSTEP];
    int death[NSTEP]; /* position (after which alloc) it is freed; NSTEP + k: k into the next step */
} tstep;

typedef struct ctx {
    gm_backend *be;
    gm_allocator *al;
    wl_model m;
    gm_devptr ptr[2][NSTEP]; /* this step's and the last step's blocks */
    gm_devptr seen[NSTEP];   /* where the last step's allocations were placed */
    gm_devptr pend;          /* freed but used on stream 2: no new block may overlap it */
    uint64_t pend_size;
    bool tolerant;           /* a fault is armed: an allocation may fail cleanly */
    int errors;
} ctx;

static void check(ctx *c) {
    char err[512] = "";
    if (gm_check(c->al, 0, err, sizeof err) != GM_OK) fail_msg("gm_check: %s", err);
    if (wl_check(c->al, &c->m, 0, err, sizeof err)) fail_msg("model: %s", err);
}

static gm_devptr alloc(ctx *c, uint64_t size, gm_stream s) {
    gm_devptr p = 0;
    int rc = gm_malloc(c->al, 0, size, s, &p);
    if (rc != GM_OK && c->tolerant) { /* a clean error: nothing handed out, nothing broken */
        if (rc != GM_EBACKEND && rc != GM_ENOMEM) fail_msg("gm_malloc under a fault = %s", gm_status_name(rc));
        c->errors++;
        check(c);
        return 0;
    }
    assert_int_equal(rc, GM_OK);
    char err[256];
    if (wl_model_add(&c->m, p, size, s, err, sizeof err)) fail_msg("overlap: %s", err);
    if (c->pend && p < c->pend + c->pend_size && c->pend < p + size)
        fail_msg("0x%llx handed out while stream 2 may still use 0x%llx", (unsigned long long)p,
                 (unsigned long long)c->pend);
    check(c);
    return p;
}

static void release(ctx *c, gm_devptr p) {
    if (!p) return;
    long i = wl_model_find(&c->m, p);
    assert_true(i >= 0);
    wl_model_remove_at(&c->m, (size_t)i, NULL);
    assert_int_equal(gm_free(c->al, p), GM_OK);
    check(c);
}

static uint64_t served(ctx *c) { return gm__gp_plan_served(c->al->devices[0]->pstate); }

static uint64_t device_calls(ctx *c) {
    static const int kinds[] = {GM_BCALL_MALLOC, GM_BCALL_FREE, GM_BCALL_PHYS_CREATE,
                                GM_BCALL_PHYS_RELEASE, GM_BCALL_MAP, GM_BCALL_UNMAP};
    uint64_t n = 0, count[GM_SIM_SIZE_BUCKETS], bytes[GM_SIM_SIZE_BUCKETS];
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        assert_int_equal(gm_sim_call_sizes(c->be, 0, kinds[k], count, bytes), GM_OK);
        for (int i = 0; i < GM_SIM_SIZE_BUCKETS; i++) n += count[i];
    }
    return n;
}

/* One step; `dev` picks a deviation: 0 none, 1 block 5 freed one step
 * late, 2 an extra allocation, 3 a missing one, 4 block 7 used on stream 2
 * and freed before its event completed. */
static void run_step(ctx *c, const tstep *t, int dev) {
    gm_devptr *cur = c->ptr[0], *last = c->ptr[1];
    for (int i = 0; i < NSTEP; i++) /* kept late (deviation 1): freed now, in the next step */
        if (last[i]) release(c, last[i]);
    memcpy(last, cur, sizeof c->ptr[0]);
    memset(cur, 0, sizeof c->ptr[0]);
    for (int j = 0; j < NSTEP; j++) {
        if (!(dev == 3 && j == 20)) cur[j] = alloc(c, t->size[j], 0);
        c->seen[j] = cur[j];
        if (dev == 2 && j == 10) release(c, alloc(c, 3 * MIB + 4096, 0));
        if (dev == 4 && j == 7) {
            assert_int_equal(gm_record_stream(c->al, cur[7], 2), GM_OK);
            c->pend = cur[7];
            c->pend_size = t->size[7];
        }
        for (int i = 0; i < NSTEP; i++) { /* the last step's blocks that die now */
            if (last[i] && t->death[i] == NSTEP + j) release(c, last[i]), last[i] = 0;
            if (cur[i] && t->death[i] == j && !(dev == 1 && i == 5)) release(c, cur[i]), cur[i] = 0;
        }
        if (dev == 4 && j == 30) {
            gm_sim_complete_events(c->be, 0, UINT64_MAX);
            c->pend = 0;
        }
    }
}

/* A sim of capacity bytes with manually completed events, and an allocator
 * configured by conf, with the no-overlap model. */
static void ctx_open(ctx *c, uint64_t capacity, const char *conf) {
    if (gm_test_make(GM_POLICY_GPUMEM, conf, capacity, true, &c->be, &c->al) != GM_OK)
        fail_msg("config '%s': %s", conf, gm_last_error_detail());
    wl_model_init(&c->m);
}

/* Free both steps' blocks and weights (0: none), give everything back and
 * check; the bytes still reserved (0 unless something leaked). */
static int64_t release_all(ctx *c, gm_devptr weights) {
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NSTEP; i++)
            if (c->ptr[k][i]) release(c, c->ptr[k][i]);
    if (weights) release(c, weights);
    assert_int_equal(gm_empty_cache(c->al, 0), GM_OK);
    check(c);
    gm_stats st = {.size = sizeof st};
    assert_int_equal(gm_get_stats(c->al, 0, &st), GM_OK);
    return st.reserved_bytes[GM_POOL_ALL].current;
}

/* A random step of NSTEP blocks drawn from r: a share small of them up to
 * 1 MiB, the rest 1 MiB to max_large; each dies later in the step. */
static void step_random(tstep *t, wl_rng *r, double small, uint64_t max_large) {
    for (int j = 0; j < NSTEP; j++) {
        t->size[j] = wl_chance(r, small) ? wl_range(r, 512, 1 * MIB) : wl_range(r, 1 * MIB, max_large);
        t->death[j] = j + 1 + (int)wl_below(r, NSTEP - j - 1 > 0 ? (uint64_t)(NSTEP - j - 1) : 1);
    }
}

/* Random deviations, each allocation's own: skipped, an extra allocation
 * after it, its block freed a step late, or used on stream 2 (events
 * completed a few allocations later). */
static void run_step_random(ctx *c, const tstep *t, wl_rng *r, double p) {
    gm_devptr *cur = c->ptr[0], *last = c->ptr[1];
    for (int i = 0; i < NSTEP; i++)
        if (last[i]) release(c, last[i]);
    memcpy(last, cur, sizeof c->ptr[0]);
    memset(cur, 0, sizeof c->ptr[0]);
    int late[NSTEP] = {0}, done_at = -1;
    for (int j = 0; j < NSTEP; j++) {
        if (!wl_chance(r, p)) cur[j] = alloc(c, t->size[j], 0);
        if (wl_chance(r, p)) release(c, alloc(c, wl_range(r, 512, 64 * MIB), 0));
        late[j] = wl_chance(r, p);
        if (cur[j] && !c->pend && wl_chance(r, p)) {
            assert_int_equal(gm_record_stream(c->al, cur[j], 2), GM_OK);
            c->pend = cur[j];
            c->pend_size = t->size[j];
            done_at = j + 1 + (int)wl_below(r, 8);
        }
        for (int i = 0; i < NSTEP; i++) {
            if (last[i] && t->death[i] == NSTEP + j) release(c, last[i]), last[i] = 0;
            if (cur[i] && t->death[i] == j && !late[i]) release(c, cur[i]), cur[i] = 0;
        }
        if (j == done_at) {
            gm_sim_complete_events(c->be, 0, UINT64_MAX);
            c->pend = 0;
        }
    }
    gm_sim_complete_events(c->be, 0, UINT64_MAX);
    c->pend = 0;
}

static void plan_steps_as(int force, const char *conf) {
    gm__gp_plan_force = force;
    ctx c = {0};
    ctx_open(&c, 16 * 1024 * MIB, getenv("PLAN_CONF") ? getenv("PLAN_CONF") : conf);

    tstep t;
    wl_rng r;
    wl_seed(&r, 16);
    step_random(&t, &r, 0.4, 96 * MIB);
    t.death[3] = NSTEP + 2; /* alive across the step boundary */
    t.death[NSTEP - 1] = NSTEP + 1;
    gm_devptr weights = alloc(&c, 200 * MIB, 0);

    for (int s = 0; s < 6; s++) run_step(&c, &t, 0);
    uint64_t before = served(&c);
    assert_true(before > 0); /* the step was learned and served */
    uint64_t calls = device_calls(&c);
    gp_state *st = c.al->devices[0]->pstate;
    uint64_t claimed = gm__gp_plan_claimed(st);
    for (int s = 0; s < 2; s++) run_step(&c, &t, 0);
    /* parked blocks taken by the next planned block at their address: some
     * in every layout of this step (gm_check after every call counts them) */
    if (gm__gp_plan_claimed(st) == claimed) fail_msg("no planned block was served from a parked one");
    int nlarge = 0; /* small blocks stay in the small pool; some cross the plan's boundary */
    for (int j = 0; j < NSTEP; j++) nlarge += t.size[j] > 1 * MIB;
    /* every large block of both steps, those alive across the boundary too
     * (the plan covers two steps, so lifetimes up to two steps are planned) */
    if (served(&c) != before + 2 * (uint64_t)nlarge)
        fail_msg("served %llu of %d large blocks in two steps", (unsigned long long)(served(&c) - before), 2 * nlarge);
    assert_int_equal(device_calls(&c), calls);            /* settled: no device call */

    if (force) assert_int_equal(gm__gp_plan_layout(c.al->devices[0]->pstate), force);

    /* deviations, each twice in a row, then the plain step again */
    for (int dev = 1; dev <= 4; dev++)
        for (int s = 0; s < 2; s++) run_step(&c, &t, dev);
    for (int s = 0; s < 2; s++) run_step(&c, &t, 0);
    gm_sim_complete_events(c.be, 0, UINT64_MAX);
    /* random deviations, rare then frequent (the plan may be dropped and
     * made again): gm_check and the no-overlap model after every call */
    for (int s = 0; s < 24; s++) run_step_random(&c, &t, &r, s < 12 ? 0.01 : 0.1);
    for (int s = 0; s < 4; s++) run_step(&c, &t, 0);
    /* parked memory is cached memory: empty_cache gives it back too */
    assert_int_equal(gm_empty_cache(c.al, 0), GM_OK);
    for (uint32_t k = 0; k < st->narenas; k++) assert_int_equal(st->arenas[k]->nparked, 0);

    int64_t left = release_all(&c, weights);
    if (left) fail_msg("reserved %lld after freeing all", (long long)left);
    wl_model_free(&c.m);
    gm_allocator_destroy(c.al);
    gm_backend_destroy(c.be);
    gm__gp_plan_force = 0;
}

/* The layout the policy picks (A on this step), and each one forced. B
 * (an arena of the plan's own) may hold more than the peak so far in its
 * first step, which a tight warm-up never allows: it is tested at slack inf. */
static void plan_steps(void **state) {
    (void)state;
    plan_steps_as(0, "policy:gpumem");
}
static void plan_steps_around(void **state) {
    (void)state;
    plan_steps_as('A', "policy:gpumem");
}
static void plan_steps_own_arena(void **state) {
    (void)state;
    plan_steps_as('B', "policy:gpumem,gpumem_slack:inf");
}

/* The default, gpumem_slack:auto: the first steps are placed tight (memory
 * moves to where it is needed, so the run's peak is the live blocks'), the
 * plan then serves every later step with no device call. Against slack inf
 * with the same plan, whose first steps hold every granule ever touched: no
 * more memory at the peak, and no call once a step was served. */
static void plan_warm_tight(void **state) {
    (void)state;
    int64_t peak[2];
    for (int k = 0; k < 2; k++) {
        ctx c = {0};
        ctx_open(&c, 16 * 1024 * MIB, k ? "policy:gpumem,gpumem_slack:inf" : "policy:gpumem");
        tstep t;
        wl_rng r;
        wl_seed(&r, 23);
        step_random(&t, &r, 0.3, 96 * MIB);
        gm_devptr weights = alloc(&c, 300 * MIB, 0);
        gp_state *st = c.al->devices[0]->pstate;
        assert_true(gm__gp_warming(st) == (k == 0));
        for (int s = 0; s < 6; s++) run_step(&c, &t, 0);
        assert_true(served(&c) > 0);
        assert_false(gm__gp_warming(st)); /* loosened once a step was served */
        uint64_t calls = device_calls(&c);
        for (int s = 0; s < 3; s++) run_step(&c, &t, 0);
        assert_int_equal(device_calls(&c), calls);
        gm_stats s1 = {.size = sizeof s1};
        assert_int_equal(gm_get_stats(c.al, 0, &s1), GM_OK);
        peak[k] = s1.reserved_bytes[GM_POOL_ALL].peak;
        /* tight: within a granule per live large block of the peak allocated */
        if (k == 0 && peak[k] > s1.allocated_bytes[GM_POOL_ALL].peak + (int64_t)(NSTEP + 2) * 2 * (int64_t)MIB)
            fail_msg("auto's peak reserved %lld, allocated %lld", (long long)peak[k],
                     (long long)s1.allocated_bytes[GM_POOL_ALL].peak);
        int64_t left = release_all(&c, weights);
        if (left) fail_msg("reserved %lld after freeing all", (long long)left);
        wl_model_free(&c.m);
        gm_allocator_destroy(c.al);
        gm_backend_destroy(c.be);
    }
    if (peak[0] > peak[1]) fail_msg("auto's peak %lld above inf's %lld", (long long)peak[0], (long long)peak[1]);
}

/* Every layout the solver tries (its orders, first and best fit, the
 * improvement rounds; around the live blocks and in an arena of its own) is
 * sound: intervals that meet in time never share an address, none meets a
 * live block it overlaps. Random steps, some blocks alive across the
 * boundary, a block kept for good under them. */
static void plan_layouts_sound(void **state) {
    (void)state;
    gm__gp_plan_verify = 1;
    gm__gp_plan_verified = gm__gp_plan_wrong = 0;
    uint64_t plans = 0;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        ctx c = {0};
        ctx_open(&c, 16 * 1024 * MIB, "policy:gpumem,gpumem_plan:on");
        tstep t;
        wl_rng r;
        wl_seed(&r, 100 + seed);
        step_random(&t, &r, 0.2, (seed % 4 + 1) * 32 * MIB);
        for (int k = 0; k < (int)seed % 4; k++) t.death[wl_below(&r, NSTEP)] = NSTEP + (int)wl_below(&r, NSTEP / 2);
        gm_devptr weights = alloc(&c, (seed * 40) * MIB, 0);
        for (int s = 0; s < 6; s++) run_step(&c, &t, 0);
        plans += served(&c) > 0;
        if (release_all(&c, weights)) fail_msg("seed %llu: memory still reserved after freeing all", (unsigned long long)seed);
        wl_model_free(&c.m);
        gm_allocator_destroy(c.al);
        gm_backend_destroy(c.be);
    }
    gm__gp_plan_verify = 0;
    print_message("%llu of 8 steps served from a plan; %llu layouts checked\n", (unsigned long long)plans, (unsigned long long)gm__gp_plan_verified);
    if (plans < 4) fail_msg("only %llu of 8 random steps got a plan", (unsigned long long)plans);
    if (gm__gp_plan_verified < 8 * plans) fail_msg("%llu layouts checked", (unsigned long long)gm__gp_plan_verified);
    assert_int_equal(gm__gp_plan_wrong, 0);
}

/* The plan covers two steps and serves each position of an even step and
 * of an odd step at its own address (a period-2 layout): a block living
 * longer than a step (its two copies overlap) has two slots, and the big
 * short blocks of the peak may be laid out apart in even and odd steps to
 * use the slot standing empty (the solver's shakes). gpt2_small_adamw's
 * shape: a block living a step and a bit, three big short ones at the
 * peak, smaller ones around. Every planned address repeats every two
 * steps, the long block's alternates, and every layout tried is sound. */
static void plan_parity(void **state) {
    (void)state;
    gm__gp_plan_verify = 1;
    gm__gp_plan_verified = gm__gp_plan_wrong = 0;
    ctx c = {0};
    ctx_open(&c, 64 * 1024 * MIB, "policy:gpumem,gpumem_plan:on");
    tstep t;
    wl_rng r;
    wl_seed(&r, 77);
    step_random(&t, &r, 0.0, 48 * MIB);
    t.size[2] = 400 * MIB, t.death[2] = NSTEP + 3; /* lives a step and a bit */
    t.size[3] = 800 * MIB, t.death[3] = 8;         /* the peak */
    t.size[4] = 800 * MIB, t.death[4] = 5;
    t.size[6] = 800 * MIB, t.death[6] = 7;
    t.size[9] = 400 * MIB, t.death[9] = 10;
    gm_devptr weights = alloc(&c, 300 * MIB, 0);
    gm_devptr at[12][NSTEP];
    for (int s = 0; s < 12; s++) {
        run_step(&c, &t, 0);
        memcpy(at[s], c.seen, sizeof at[s]);
    }
    uint64_t before = served(&c);
    assert_true(before > 0);
    assert_int_equal(gm__gp_plan_layout(c.al->devices[0]->pstate), 'A');
    /* the last four steps come from the plan (no deviation): period 2 */
    for (int s = 8; s < 10; s++)
        for (int j = 0; j < NSTEP; j++)
            if (t.size[j] > 1 * MIB && at[s][j] != at[s + 2][j])
                fail_msg("position %d: step %d at 0x%llx, two steps later at 0x%llx", j, s, (unsigned long long)at[s][j], (unsigned long long)at[s + 2][j]);
    assert_true(at[10][2] != at[11][2]); /* the long block's two copies */
    int apart = 0;
    for (int j = 0; j < NSTEP; j++) apart += t.size[j] > 1 * MIB && at[10][j] != at[11][j];
    print_message("%d of %d positions at other addresses in odd steps; %llu layouts checked\n", apart, NSTEP, (unsigned long long)gm__gp_plan_verified);
    assert_int_equal(gm__gp_plan_wrong, 0);
    gm__gp_plan_verify = 0;
    if (release_all(&c, weights)) fail_msg("parity: memory still reserved after freeing all");
    wl_model_free(&c.m);
    gm_allocator_destroy(c.al);
    gm_backend_destroy(c.be);
}

/* Each step also keeps a block for good (live bytes grow every step, so
 * the detector, which needs them to repeat, never makes a plan): with
 * gm_step_mark after each step a plan is made from the marks and serves
 * the step's blocks, with no more device calls than the kept blocks need. */
static void marks_as(bool marks, uint64_t *served_out, uint64_t *calls_after) {
    ctx c = {0};
    ctx_open(&c, 16 * 1024 * MIB, "policy:gpumem,gpumem_plan:on");
    tstep t;
    wl_rng r;
    wl_seed(&r, 61);
    step_random(&t, &r, 0.3, 64 * MIB);
    t.death[NSTEP - 1] = NSTEP + 3; /* alive across the boundary */
    gm_devptr kept[12] = {0};
    uint64_t calls = 0;
    for (int s = 0; s < 12; s++) {
        kept[s] = alloc(&c, 4 * MIB, 0);
        run_step(&c, &t, 0);
        if (marks) assert_int_equal(gm_step_mark(c.al, 0), GM_OK);
        if (s == 9) calls = device_calls(&c);
    }
    *served_out = served(&c);
    *calls_after = device_calls(&c) - calls;
    for (int s = 0; s < 11; s++) release(&c, kept[s]);
    if (release_all(&c, kept[11])) fail_msg("marks: memory still reserved after freeing all");
    wl_model_free(&c.m);
    gm_allocator_destroy(c.al);
    gm_backend_destroy(c.be);
}

static void plan_step_marks(void **state) {
    (void)state;
    uint64_t served_no, served_yes, calls_no, calls_yes;
    marks_as(false, &served_no, &calls_no);
    marks_as(true, &served_yes, &calls_yes);
    assert_int_equal(served_no, 0); /* no marks: no plan */
    if (served_yes < 4 * 20) fail_msg("marks: %llu allocations served from the plan", (unsigned long long)served_yes);
    /* the last two steps: only the kept blocks' new memory, as without a plan */
    if (calls_yes > calls_no) fail_msg("marks: %llu device calls in the last two steps, %llu without", (unsigned long long)calls_yes, (unsigned long long)calls_no);
    /* the allocator without a plan (gpumem, plan off) ignores marks too */
    gm_backend *be;
    gm_sim_options o;
    gm_sim_options_init(&o);
    assert_int_equal(gm_sim_create(&be, &o), GM_OK);
    gm_allocator *al;
    assert_int_equal(gm_allocator_create(&al, be, NULL), GM_OK);
    assert_int_equal(gm_step_mark(al, -1), GM_OK);
    assert_int_equal(gm_step_mark(al, 0), GM_OK);
    assert_int_equal(gm_step_mark(al, 7), GM_EDEVICE);
    assert_int_equal(gm_step_mark(NULL, 0), GM_EINVAL);
    gm_allocator_destroy(al);
    gm_backend_destroy(be);
}

/* Fault sweep with a plan: one backend call (of any kind) fails, counting
 * from just before a marked plan starts (its switch: moving chunks,
 * mapping its arena, giving memory back) through its first steps; every
 * error is clean, gm_check and the no-overlap model hold after every call,
 * and once the fault is spent everything can be freed and given back. */
static int fault_point(uint64_t nth, int force, uint64_t *window_calls) {
    gm__gp_plan_force = force;
    ctx c = {0};
    ctx_open(&c, 2048 * MIB, "policy:gpumem,gpumem_plan:on");
    tstep t;
    wl_rng r;
    wl_seed(&r, 16);
    step_random(&t, &r, 0.4, 48 * MIB);
    t.death[3] = NSTEP + 2;
    gm_devptr weights = alloc(&c, 100 * MIB, 0);
    for (int s = 0; s < 3; s++) {
        run_step(&c, &t, 0);
        assert_int_equal(gm_step_mark(c.al, 0), GM_OK);
    }
    c.tolerant = true;
    uint64_t calls0 = device_calls(&c);
    if (nth) assert_int_equal(gm_backend_inject_fault(c.be, GM_BCALL_ANY, nth, GM_EBACKEND), GM_OK);
    for (int s = 0; s < 4; s++) {
        run_step(&c, &t, 0);
        assert_int_equal(gm_step_mark(c.al, 0), GM_OK);
    }
    gm_backend_inject_fault(c.be, GM_BCALL_ANY, 0, 0);
    if (window_calls) *window_calls = device_calls(&c) - calls0;
    run_step(&c, &t, 0);
    gm_sim_complete_events(c.be, 0, UINT64_MAX);
    int64_t left = release_all(&c, weights);
    if (left) fail_msg("fault %llu: reserved %lld after freeing all", (unsigned long long)nth, (long long)left);
    wl_model_free(&c.m);
    gm_allocator_destroy(c.al);
    gm_sim_live lv = {.size = sizeof lv};
    assert_int_equal(gm_sim_live_objects(c.be, 0, &lv), GM_OK);
    if (lv.phys != gm_backend_dropped_count(c.be, 0, GM_BCALL_PHYS_RELEASE) || lv.reservations != gm_backend_dropped_count(c.be, 0, GM_BCALL_VA_RELEASE))
        fail_msg("fault %llu: the sim still holds %llu handles, %llu reservations", (unsigned long long)nth, (unsigned long long)lv.phys, (unsigned long long)lv.reservations);
    gm_backend_destroy(c.be);
    gm__gp_plan_force = 0;
    return c.errors;
}

static void plan_fault_sweep(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        int force = f ? 'B' : 'A';
        uint64_t window = 0;
        assert_int_equal(fault_point(0, force, &window), 0);
        /* the plan's switch and settling make device calls in the window
         * (their errors are kept inside the policy: the plan goes on or is
         * dropped, an allocation may fail cleanly) */
        if (window == 0) fail_msg("layout %c: no device call while the fault is armed", force);
        print_message("layout %c: %llu device calls while armed\n", force, (unsigned long long)window);
        uint64_t stride = window / 24 + 1;
        for (uint64_t n = 1; n <= window + stride; n += n < 8 ? 1 : stride) (void)fault_point(n, force, NULL);
    }
}

/* A hostile shape for the planner: NOBS large blocks live throughout
 * (obstacles), then steps of HP large blocks freed in reverse at the
 * step's end, alike but for every HCYCLE-th, whose blocks are larger: the
 * plan made from the steps alike drops there, and the detector makes it
 * again after it, each layout going around every obstacle, until it has
 * tried PL_TRIES times. The planner's work (its loops' steps,
 * gm__gp_plan_work) per operation seen; base: the budget's base. */
enum { NOBS = 1500, HP = 64, HCYCLE = 6, HSTEPS = 48 };
static void gm_check_ok(ctx *c) {
    char err[512] = "";
    if (gm_check(c->al, 0, err, sizeof err) != GM_OK) fail_msg("gm_check: %s", err);
}
static void hostile_run(uint64_t base, uint64_t *work, uint64_t *ops, uint64_t *starved, uint64_t *served_out) {
    gm__gp_plan_work_base = base;
    ctx c = {0};
    ctx_open(&c, 16 * 1024 * MIB, "policy:gpumem");
    wl_rng r;
    wl_seed(&r, 43);
    static gm_devptr obs[NOBS], blk[HP];
    uint64_t bsz[HP];
    for (int i = 0; i < NOBS; i++) assert_int_equal(gm_malloc(c.al, 0, MIB + 512 * wl_range(&r, 1, 256), 0, &obs[i]), GM_OK);
    gp_state *st = c.al->devices[0]->pstate; /* made at the first allocation */
    for (int k = 0; k < HP; k++) bsz[k] = MIB + 512 * wl_range(&r, 1, 64);
    uint64_t longest = 0;
    for (int s = 0; s < HSTEPS; s++) {
        uint64_t len = s % HCYCLE == HCYCLE - 1 ? ++longest : 0;
        for (int k = 0; k < HP; k++) assert_int_equal(gm_malloc(c.al, 0, bsz[k] + 512 * len * (1 + k % 3), 0, &blk[k]), GM_OK);
        for (int k = HP - 1; k >= 0; k--) assert_int_equal(gm_free(c.al, blk[k]), GM_OK);
        if (s % 32 == 31) gm_check_ok(&c); /* the blocks are not in the model: gm_check alone */
    }
    *work = gm__gp_plan_work(st), *ops = gm__gp_plan_ops(st), *starved = gm__gp_plan_starved(st);
    *served_out = served(&c);
    for (int i = 0; i < NOBS; i++) assert_int_equal(gm_free(c.al, obs[i]), GM_OK);
    gm_check_ok(&c);
    wl_model_free(&c.m);
    gm_allocator_destroy(c.al);
    gm_backend_destroy(c.be);
    gm__gp_plan_work_base = PL_WORK_BASE;
}

/* The planner's work is bounded: at most PL_WORK_PER_OP per operation plus
 * the base (and one placement's scan and one history catch-up past it),
 * whatever the trace. Here the base is lowered so that a short run reaches
 * it: unbounded, this run's layouts took over 8x the budget (checked
 * below, so the shape stays hostile); bounded, the plan degrades (layouts
 * refused until the operations since paid for one) and still serves. */
static void plan_work_bounded(void **state) {
    (void)state;
    uint64_t base = (uint64_t)1 << 20, work, ops, starved, srv;
    hostile_run(UINT64_MAX / 2, &work, &ops, &starved, &srv); /* no bound */
    uint64_t budget = base + PL_WORK_PER_OP * ops;
    print_message("unbounded: %llu steps of work for %llu operations (%.0f each), %llu served\n", (unsigned long long)work,
                  (unsigned long long)ops, (double)work / (double)ops, (unsigned long long)srv);
    assert_int_equal(starved, 0);
    if (work < 8 * budget) fail_msg("the hostile run took only %llu steps of work, the budget is %llu", (unsigned long long)work, (unsigned long long)budget);
    hostile_run(base, &work, &ops, &starved, &srv);
    budget = base + PL_WORK_PER_OP * ops;
    print_message("bounded: %llu steps of work for %llu operations (%.0f each), %llu layouts refused or cut short, %llu served\n", (unsigned long long)work,
                  (unsigned long long)ops, (double)work / (double)ops, (unsigned long long)starved, (unsigned long long)srv);
    if (work > budget + budget / 16) fail_msg("%llu steps of work, the budget %llu", (unsigned long long)work, (unsigned long long)budget);
    assert_true(starved > 0); /* it degraded */
    assert_true(srv > 0);     /* and served between */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plan_steps),
        cmocka_unit_test(plan_steps_around),
        cmocka_unit_test(plan_steps_own_arena),
        cmocka_unit_test(plan_warm_tight),
        cmocka_unit_test(plan_layouts_sound),
        cmocka_unit_test(plan_parity),
        cmocka_unit_test(plan_step_marks),
        cmocka_unit_test(plan_fault_sweep),
        cmocka_unit_test(plan_work_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
