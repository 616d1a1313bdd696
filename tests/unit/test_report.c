/* test_report.c — category attribution, the frame table and the timeline on
 * hand-built traces whose answers are known (built with the trace builder,
 * so no file is needed): a training step with frames (forward, backward on
 * autograd's frameless thread, optimizer step), a trace with no frames at
 * all (the lifetime rule), gpumem's category tags, an old trace with only
 * free_requested, and an alloc of a live address (kept live, as replay
 * keeps it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "util/gm_limits.h"
#include "gpumem/gpumem.h"
#include "report/report.h"
#include "trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tb {
    gm__trace_builder *b;
    uint64_t t;
} tb;

static uint32_t str(tb *x, const char *s) {
    uint32_t id;
    assert_int_equal(gm__tb_string(x->b, s, strlen(s), &id), GM_OK);
    return id;
}

/* A stack from "name@file" strings, innermost first, NULL-terminated. */
static uint32_t stack(tb *x, const char *const *frames) {
    uint32_t ids[16], n = 0;
    for (; frames[n]; n++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", frames[n]);
        char *at = strchr(buf, '@');
        assert_non_null(at);
        *at = '\0';
        assert_int_equal(gm__tb_frame(x->b, str(x, buf), str(x, at + 1), (int32_t)(10 + n), &ids[n]), GM_OK);
    }
    uint32_t id1;
    assert_int_equal(gm__tb_stack(x->b, ids, n, &id1), GM_OK);
    return id1;
}

static void ev(tb *x, int action, uint64_t addr, uint64_t size, uint32_t stk) {
    gm_trace_event e = {.addr = addr, .size = size, .stream = 0, .time_us = (int64_t)(x->t += 10),
                        .stack = stk, .action = (uint8_t)action};
    assert_int_equal(gm__tb_event(x->b, &e), GM_OK);
}
#define ALLOC(a, n, s) ev(&x, GM_TA_ALLOC, (a), (n), (s))
#define FREE(a, s) ev(&x, GM_TA_FREE_COMPLETED, (a), 0, (s))

static gm_trace *finish(tb *x) {
    gm_trace *t;
    assert_int_equal(gm__tb_finish(x->b, "pytorch-snapshot", &t), GM_OK);
    return t;
}

static const char *const S_PARAM[] = {"_apply@/py/torch/nn/modules/module.py", "cuda@/py/torch/nn/modules/module.py",
                                      "main@train.py", NULL};
static const char *const S_USER[] = {"main@train.py", NULL};
static const char *const S_FWD[] = {"linear@/py/torch/nn/functional.py", "forward@/py/torch/nn/modules/linear.py",
                                    "_call_impl@/py/torch/nn/modules/module.py", "main@train.py", NULL};
static const char *const S_BWD[] = {"backward@/py/torch/autograd/__init__.py", "backward@/py/torch/_tensor.py",
                                    "main@train.py", NULL};
static const char *const S_INIT[] = {"_init_group@/py/torch/optim/adam.py", "step@/py/torch/optim/adam.py",
                                     "main@train.py", NULL};
static const char *const S_STEP[] = {"step@/py/torch/optim/adam.py", "main@train.py", NULL};
static const char *const S_ZERO[] = {"zero_grad@/py/torch/optim/optimizer.py", "main@train.py", NULL};
static const char *const S_TAG[] = {"parameters@" GM_TAG_CATEGORY_FILE, "model.fc@" GM_TAG_SCOPE_FILE,
                                    "forward@/py/torch/nn/modules/linear.py", NULL};

/* One training step; live bytes in the comments. The peak (8827) is at the
 * optimizer's temporary: parameters 3000, gradients 1000 (decided by phase:
 * no frames), optimizer state 4000, temporaries 40, other 10 + 777. */
static gm_trace *training_trace(void) {
    tb x = {gm__tb_new(), 0};
    assert_non_null(x.b);
    uint32_t param = stack(&x, S_PARAM), user = stack(&x, S_USER), fwd = stack(&x, S_FWD),
             bwd = stack(&x, S_BWD), init = stack(&x, S_INIT), step = stack(&x, S_STEP),
             zero = stack(&x, S_ZERO), tag = stack(&x, S_TAG);
    ALLOC(0x1000, 1000, param);  /* 0  P1        1000 */
    ALLOC(0x2000, 2000, param);  /* 1  P2        3000 */
    ALLOC(0x3000, 10, user);     /* 2  input     3010 */
    ALLOC(0x4000, 100, fwd);     /* 3  A1        3110  alive when backward starts */
    ALLOC(0x5000, 50, fwd);      /* 4  T1        3160 */
    FREE(0x5000, fwd);           /* 5            3110 */
    ALLOC(0x6000, 8, bwd);       /* 6  L (grad of the loss) 3118 */
    ALLOC(0x7000, 1000, 0);      /* 7  G1 (autograd thread) 4118 */
    ALLOC(0x8000, 300, 0);       /* 8  BT        4418 */
    ALLOC(0xd000, 777, 0);       /* 9  W: outlives backward, no parameter's size: other  5195 */
    FREE(0x8000, 0);             /* 10           4895 */
    FREE(0x6000, 0);             /* 11           4887 */
    FREE(0x4000, 0);             /* 12           4787 */
    ALLOC(0x9000, 2000, init);   /* 13 S1        6787 */
    ALLOC(0xa000, 2000, init);   /* 14 S2        8787 */
    ALLOC(0xb000, 40, step);     /* 15 OT        8827  peak */
    FREE(0xb000, step);          /* 16           8787 */
    FREE(0x7000, zero);          /* 17           7787 */
    ALLOC(0xc000, 5, tag);       /* 18 tagged    7792 */
    return finish(&x);
}

static void test_training_step(void **s) {
    (void)s;
    gm_trace *t = training_trace();
    gm_attribution *a;
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    assert_true(a->has_frames);
    assert_int_equal(a->nallocs, 13);
    assert_int_equal(a->peak_bytes, 8827);
    assert_int_equal(a->peak_ev, 15);
    assert_int_equal(gm__attr_peak_cat(a, GM_CAT_PARAMETERS), 3000);
    assert_int_equal(gm__attr_peak_cat(a, GM_CAT_GRADIENTS), 1000);
    assert_int_equal(gm__attr_peak_cat(a, GM_CAT_OPTIMIZER), 4000);
    assert_int_equal(gm__attr_peak_cat(a, GM_CAT_ACTIVATIONS), 0);
    assert_int_equal(gm__attr_peak_cat(a, GM_CAT_TEMPORARIES), 40);
    assert_int_equal(gm__attr_peak_cat(a, GM_CAT_OTHER), 10 + 777);
    assert_int_equal(a->peak_by[GM_CAT_GRADIENTS][GM_AM_PHASE], 1000);
    assert_int_equal(a->peak_by[GM_CAT_OTHER][GM_AM_PHASE], 777);
    assert_int_equal(gm__attr_peak_method(a, GM_AM_FRAMES), 7050);
    assert_int_equal(gm__attr_peak_method(a, GM_AM_UNKNOWN), 0);
    /* every allocation, live at the peak or not */
    assert_int_equal(a->bytes_by[GM_CAT_ACTIVATIONS][GM_AM_FRAMES], 100);
    assert_int_equal(a->bytes_by[GM_CAT_TEMPORARIES][GM_AM_FRAMES], 50 + 8 + 40);
    assert_int_equal(a->bytes_by[GM_CAT_TEMPORARIES][GM_AM_PHASE], 300);
    assert_int_equal(a->bytes_by[GM_CAT_PARAMETERS][GM_AM_TAGGED], 5);
    assert_int_equal(a->allocs[3].phase, GM_PH_FORWARD);
    assert_int_equal(a->allocs[5].phase, GM_PH_BACKWARD);
    assert_int_equal(a->allocs[6].phase, GM_PH_BACKWARD);
    assert_int_equal(a->allocs[6].method, GM_AM_PHASE);

    /* the peak is the one replay computes */
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(t, 0, &p), GM_OK);
    assert_int_equal(gm__replay_prog_peak_requested(p), a->peak_bytes);
    gm__replay_prog_free(p);
    gm__attribution_free(a);
    gm__trace_free(t);
}

static const gm_frame_row *row(const gm_attribution *a, const gm_frame_row *rows, size_t n, const char *label) {
    char buf[256];
    for (size_t i = 0; i < n; i++)
        if (!strcmp(gm__frame_row_label(a, &rows[i], buf, sizeof buf), label)) return &rows[i];
    fail_msg("no row '%s'", label);
    return NULL;
}

static void test_frame_table(void **s) {
    (void)s;
    gm_trace *t = training_trace();
    gm_attribution *a;
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    gm_frame_row *rows;
    size_t n;
    assert_int_equal(gm__frame_table(a, &rows, &n), GM_OK);
    const gm_frame_row *r = row(a, rows, n, "step (adam.py:11)");
    assert_int_equal(r->self_bytes, 40);
    assert_int_equal(r->total_bytes, 4040);
    assert_int_equal(r->total_peak, 4040);
    assert_int_equal(r->self_calls, 1);
    assert_int_equal(r->total_calls, 3);
    r = row(a, rows, n, "_init_group (adam.py:10)");
    assert_int_equal(r->self_bytes, 4000);
    r = row(a, rows, n, "[no Python frames: backward]");
    assert_int_equal(r->self_bytes, 1300 + 777);
    assert_int_equal(r->self_peak, 1000 + 777);
    assert_int_equal(r->total_calls, 3);
    /* main is on every framed stack but the tag's: total counts each allocation once */
    r = row(a, rows, n, "main (train.py:12)");
    assert_int_equal(r->total_calls, 9);
    assert_int_equal(r->total_bytes, 1000 + 2000 + 10 + 100 + 50 + 8 + 2000 + 2000 + 40);
    r = row(a, rows, n, "scope model.fc");
    assert_true(r->scope);
    assert_int_equal(r->self_bytes, 5); /* the category tag is no row and no frame */
    /* sorted: live at the peak, descending */
    for (size_t i = 1; i < n; i++) assert_true(rows[i - 1].total_peak >= rows[i].total_peak);
    free(rows);
    gm__attribution_free(a);
    gm__trace_free(t);
}

static void test_timeline(void **s) {
    (void)s;
    gm_trace *t = training_trace();
    gm_attribution *a;
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    gm_timeline *tl;
    assert_int_equal(gm__timeline_build(a, NULL, 6, &tl), GM_OK); /* 2 buckets of 10 events */
    assert_int_equal(tl->peak_requested, 8827);
    assert_true(tl->peak_reserved >= tl->peak_allocated && tl->peak_allocated >= 8827);
    assert_true(tl->npts <= 6);
    assert_int_equal(tl->pts[tl->peak_pt].ev, 15);
    int64_t sum = 0;
    for (int c = 0; c < GM_CAT_COUNT; c++) sum += tl->pts[tl->peak_pt].cat[c];
    assert_int_equal(sum, 8827);
    assert_int_equal(tl->pts[tl->peak_pt].cat[GM_CAT_OPTIMIZER], 4000);
    /* the segment map at the peak holds every live allocation once */
    uint64_t placed = 0, opt = 0;
    assert_true(tl->nsegs > 0);
    for (size_t i = 0; i < tl->nsegs; i++)
        for (size_t k = 0; k < tl->segs[i].nblocks; k++) {
            placed += tl->segs[i].blocks[k].size;
            if (tl->segs[i].blocks[k].cat == GM_CAT_OPTIMIZER) opt += tl->segs[i].blocks[k].size;
            assert_true(tl->segs[i].blocks[k].offset + tl->segs[i].blocks[k].size <= tl->segs[i].total_size);
        }
    assert_int_equal(placed, 8827);
    assert_int_equal(opt, 4000);
    gm__timeline_free(tl);
    gm__attribution_free(a);
    gm__trace_free(t);
}

/* No frames anywhere: the lifetime rule. 20 events; P, Q, S, U alive to
 * the end, t* short. */
static void test_lifetime_rule(void **s) {
    (void)s;
    tb x = {gm__tb_new(), 0};
    ALLOC(0x1000, 1000, 0); /* P: parameters (before the first free) */
    ALLOC(0x2000, 500, 0);  /* Q: parameters */
    ALLOC(0x3000, 100, 0);  /* t: unknown */
    FREE(0x3000, 0);
    ALLOC(0x4000, 1000, 0); /* S: optimizer state (a parameter's size, after the first free) */
    ALLOC(0x5000, 700, 0);  /* U: long-lived, no parameter's size: parameters */
    for (int i = 0; i < 6; i++) {
        ALLOC(0x6000, 64, 0); /* t2: unknown */
        FREE(0x6000, 0);
    }
    ALLOC(0x7000, 300, 0); /* made late, never freed: long-lived (optimizer: no; parameters) */
    ALLOC(0x8000, 1000, 0);
    FREE(0x8000, 0); /* short, a parameter's size: unknown */
    gm_trace *t = finish(&x);
    gm_attribution *a;
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    assert_false(a->has_frames);
    assert_int_equal(a->bytes_by[GM_CAT_PARAMETERS][GM_AM_LIFETIME], 1000 + 500 + 700 + 300);
    assert_int_equal(a->bytes_by[GM_CAT_OPTIMIZER][GM_AM_LIFETIME], 1000);
    assert_int_equal(a->bytes_by[GM_CAT_OTHER][GM_AM_UNKNOWN], 100 + 6 * 64 + 1000);
    assert_int_equal(a->peak_bytes, 1000 + 500 + 1000 + 700 + 300 + 1000);
    assert_int_equal(gm__attr_peak_method(a, GM_AM_UNKNOWN), 1000);
    gm__attribution_free(a);
    gm__trace_free(t);
}

/* No frames, but steps: live memory rises through forward and falls
 * through backward (issue 42: 58-94% of the peak was "other"). Parameters
 * P1, P2 made first; three steps of forward (activations A1, A2 alive at the
 * step's high point; a temporary T born and freed before it), backward
 * (gradients G1, G2, the first allocations of the parameters' sizes after
 * the high point), the optimizer step (state S1, S2 in the first,
 * long-lived; temporaries, one of a parameter's size). */
static void test_step_rule(void **s) {
    (void)s;
    tb x = {gm__tb_new(), 0};
    ALLOC(0x1000, 1000, 0); /* P1 */
    ALLOC(0x2000, 500, 0);  /* P2 */
    for (int step = 0; step < 3; step++) {
        ALLOC(0x3000, 4000, 0); /* A1 */
        ALLOC(0x4000, 100, 0);  /* T */
        FREE(0x4000, 0);
        ALLOC(0x5000, 6000, 0); /* A2: the high point follows */
        FREE(0x5000, 0);
        ALLOC(0x6000, 1000, 0); /* G1 */
        ALLOC(0x7000, 500, 0);  /* G2 */
        FREE(0x3000, 0);
        if (!step) {
            ALLOC(0x8000, 1000, 0); /* S1 */
            ALLOC(0x9000, 500, 0);  /* S2 */
        }
        ALLOC(0xa000, 1000, 0); /* an optimizer temporary of a parameter's size: not a gradient */
        FREE(0xa000, 0);
        ALLOC(0xa000, 64, 0);
        FREE(0xa000, 0);
        FREE(0x6000, 0); /* zero_grad(set_to_none=True) */
        FREE(0x7000, 0);
    }
    gm_trace *t = finish(&x);
    gm_attribution *a;
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    assert_false(a->has_frames);
    assert_int_equal(a->nsteps, 3);
    assert_int_equal(a->bytes_by[GM_CAT_PARAMETERS][GM_AM_LIFETIME], 1500);
    assert_int_equal(a->bytes_by[GM_CAT_OPTIMIZER][GM_AM_LIFETIME], 1500);
    assert_int_equal(a->bytes_by[GM_CAT_ACTIVATIONS][GM_AM_STEPS], 3 * (4000 + 6000));
    assert_int_equal(a->bytes_by[GM_CAT_GRADIENTS][GM_AM_STEPS], 3 * 1500);
    assert_int_equal(a->bytes_by[GM_CAT_TEMPORARIES][GM_AM_STEPS], 3 * (100 + 1000 + 64));
    assert_int_equal(gm__attr_peak_method(a, GM_AM_UNKNOWN), 0);
    /* at the peak (the second step's high: P, S, A1, A2): nothing is "other" */
    assert_int_equal(a->peak_bytes, 1500 + 1500 + 4000 + 6000);
    assert_int_equal(gm__attr_peak_cat(a, GM_CAT_ACTIVATIONS), 10000);
    assert_int_equal(gm__attr_peak_cat(a, GM_CAT_OTHER), 0);
    gm__attribution_free(a);
    gm__trace_free(t);
}

/* Old snapshots have free_requested only; an alloc of a live address keeps
 * the old allocation live (as replay does) and is counted. */
static void test_old_trace_and_anomalies(void **s) {
    (void)s;
    tb x = {gm__tb_new(), 0};
    ev(&x, GM_TA_ALLOC, 0x1000, 100, 0);
    ev(&x, GM_TA_ALLOC, 0x1000, 200, 0); /* double alloc */
    ev(&x, GM_TA_FREE_REQUESTED, 0x1000, 0, 0);
    ev(&x, GM_TA_FREE_REQUESTED, 0x9999, 0, 0); /* unknown */
    ev(&x, GM_TA_ALLOC, 0x2000, 50, 0);
    ev(&x, GM_TA_ALLOC, 0x40000000, GM_LIMIT_ALLOC_BYTES + 1, 0); /* replay skips it */
    ev(&x, GM_TA_FREE_REQUESTED, 0x40000000, 0, 0);
    gm_trace *t = finish(&x);
    gm_attribution *a;
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    assert_int_equal(a->oversized_allocs, 1);
    assert_int_equal(a->free_action, GM_TA_FREE_REQUESTED);
    assert_int_equal(a->double_allocs, 1);
    assert_int_equal(a->unknown_frees, 1);
    assert_int_equal(a->allocs[0].end, GM_ATTR_ALIVE);
    assert_int_equal(a->allocs[1].end, 2);
    assert_int_equal(a->peak_bytes, 300);
    gm_replay_prog *p;
    assert_int_equal(gm__replay_compile(t, 0, &p), GM_OK);
    assert_int_equal(gm__replay_prog_peak_requested(p), a->peak_bytes);
    gm__replay_prog_free(p);
    gm__attribution_free(a);
    assert_int_equal(gm__attribute(t, 3, &a), GM_EDEVICE);
    gm__trace_free(t);

    /* only an oversized alloc: replay makes no segment, and the timeline
     * (its segment map at the peak) still builds (fuzz_trace found it) */
    x = (tb){gm__tb_new(), 0};
    ev(&x, GM_TA_ALLOC, 0x40000000, GM_LIMIT_ALLOC_BYTES + 1, 0);
    t = finish(&x);
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    assert_int_equal(a->peak_bytes, 0);
    gm_timeline *tl;
    assert_int_equal(gm__timeline_build(a, NULL, 64, &tl), GM_OK);
    gm__timeline_free(tl);
    gm__attribution_free(a);
    gm__trace_free(t);
}

/* gpumem.torch.track's phase scopes decide phases without Python frames. */
static void test_phase_scopes(void **s) {
    (void)s;
    static const char *const P[] = {"parameters@" GM_TAG_CATEGORY_FILE, NULL};
    static const char *const F[] = {"model.fc@" GM_TAG_SCOPE_FILE, GM_SCOPE_FORWARD "@" GM_TAG_SCOPE_FILE, NULL};
    static const char *const B[] = {GM_SCOPE_BACKWARD "@" GM_TAG_SCOPE_FILE, NULL};
    static const char *const O[] = {GM_SCOPE_OPTIMIZER "@" GM_TAG_SCOPE_FILE, NULL};
    tb x = {gm__tb_new(), 0};
    uint32_t p = stack(&x, P), f = stack(&x, F), b = stack(&x, B), o = stack(&x, O);
    ALLOC(0x1000, 4096, p); /* parameters (tagged) */
    ALLOC(0x2000, 100, f);  /* activation */
    ALLOC(0x3000, 10, f);   /* temporary */
    FREE(0x3000, f);
    ALLOC(0x4000, 4096, b); /* gradient */
    ALLOC(0x5000, 7, b);    /* temporary */
    FREE(0x5000, b);
    FREE(0x2000, b);
    ALLOC(0x6000, 8192, o); /* optimizer state */
    ALLOC(0x7000, 1, 0);    /* no frames after the optimizer: its phase */
    gm_trace *t = finish(&x);
    gm_attribution *a;
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    assert_int_equal(a->bytes_by[GM_CAT_PARAMETERS][GM_AM_TAGGED], 4096);
    assert_int_equal(a->bytes_by[GM_CAT_ACTIVATIONS][GM_AM_FRAMES], 100);
    assert_int_equal(a->bytes_by[GM_CAT_TEMPORARIES][GM_AM_FRAMES], 17);
    assert_int_equal(a->bytes_by[GM_CAT_GRADIENTS][GM_AM_FRAMES], 4096);
    assert_int_equal(a->bytes_by[GM_CAT_OPTIMIZER][GM_AM_FRAMES], 8192);
    assert_int_equal(a->bytes_by[GM_CAT_OPTIMIZER][GM_AM_PHASE], 1);
    gm__attribution_free(a);
    gm__trace_free(t);
}


/* Every point's scope series sum to its categories; the views sum to the
 * peak at the peak; names of a view are distinct. */
/* The scope series' JSON (values, or deltas), as a malloc'd string. */
static char *series_json(const gm_scope_series *ss, bool deltas) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    gm__scope_series_json(f, ss, deltas);
    fclose(f);
    return buf;
}

static void check_view_sums(const gm_attribution *a, const gm_timeline *tl, const gm_scope_series *ss) {
    assert_int_equal(ss->npts, tl->npts);
    assert_true(ss->nviews >= 1);
    for (int i = 0; i < ss->nviews; i++) {
        const gm_scope_view *v = &ss->views[i];
        assert_int_equal(v->depth, i + 1);
        int64_t at_peak = 0;
        for (size_t j = 0; j < v->nseries; j++) {
            at_peak += v->at_peak[j];
            for (size_t k = 0; k < j; k++) assert_string_not_equal(v->names[j], v->names[k]);
        }
        assert_int_equal(at_peak, a->peak_bytes);
        for (size_t p = 0; p < tl->npts; p++) {
            int64_t want = 0, got = 0;
            for (int c = 0; c < GM_CAT_COUNT; c++) want += tl->pts[p].cat[c];
            for (size_t j = 0; j < v->nseries; j++) {
                got += v->values[j * tl->npts + p];
                assert_true(v->values[j * tl->npts + p] <= v->max[j]);
            }
            assert_int_equal(got, want);
        }
        assert_int_equal(v->values[0 * tl->npts + tl->peak_pt], v->at_peak[0]);
    }
}

/* Attribute t, build its timeline (at most points points) and its scope
 * series (top n per depth), and check that each view sums to the
 * categories; scoped_free releases all four. */
static void scoped_build(gm_trace *t, size_t points, size_t top, gm_attribution **a, gm_timeline **tl,
                         gm_scope_series **ss) {
    assert_int_equal(gm__attribute(t, 0, a), GM_OK);
    assert_int_equal(gm__timeline_build(*a, NULL, points, tl), GM_OK);
    assert_int_equal(gm__scope_series_build(*a, *tl, top, ss), GM_OK);
    check_view_sums(*a, *tl, *ss);
}

static void scoped_free(gm_trace *t, gm_attribution *a, gm_timeline *tl, gm_scope_series *ss) {
    gm__scope_series_free(ss);
    gm__timeline_free(tl);
    gm__attribution_free(a);
    gm__trace_free(t);
}

static const gm_scope_view *view(const gm_scope_series *ss, int depth) {
    assert_true(depth >= 1 && depth <= ss->nviews);
    return &ss->views[depth - 1];
}

/* The bytes at the peak of the series named name in v (fails if absent). */
static int64_t series_peak(const gm_scope_view *v, const char *name) {
    for (size_t j = 0; j < v->nseries; j++)
        if (!strcmp(v->names[j], name)) return v->at_peak[j];
    fail_msg("depth %d has no series '%s'", v->depth, name);
    return -1;
}

/* gpumem scopes: module paths cut at each depth, phases in brackets, the
 * top N and "other scopes". */
static void test_scope_series_paths(void **s) {
    (void)s;
#define SC "@" GM_TAG_SCOPE_FILE
    static const char *const P[] = {"parameters@" GM_TAG_CATEGORY_FILE, GM_SCOPE_UNTRACKED SC, NULL};
    static const char *const A0[] = {"model.enc.0.attn" SC, "model.enc.0" SC, "model.enc" SC, "model" SC,
                                     GM_SCOPE_FORWARD SC, NULL};
    static const char *const M1[] = {"model.enc.1.mlp" SC, "model.enc.1" SC, "model.enc" SC, "model" SC,
                                     GM_SCOPE_FORWARD SC, NULL};
    static const char *const H[] = {"model.head" SC, "model" SC, GM_SCOPE_FORWARD SC, NULL};
    static const char *const B0[] = {"model.enc.0.attn" SC, GM_SCOPE_BACKWARD SC, NULL};
    static const char *const O[] = {GM_SCOPE_OPTIMIZER SC, NULL};
#undef SC
    tb x = {gm__tb_new(), 0};
    uint32_t p = stack(&x, P), a0 = stack(&x, A0), m1 = stack(&x, M1), h = stack(&x, H), b0 = stack(&x, B0),
             o = stack(&x, O);
    ALLOC(0x1000, 1000, p);  /* parameters, [untracked]   1000 */
    ALLOC(0x2000, 100, a0);  /* activation of enc.0.attn   1100 */
    ALLOC(0x3000, 200, m1);  /* activation of enc.1.mlp    1300 */
    ALLOC(0x4000, 30, h);    /* head                       1330 */
    ALLOC(0x5000, 1000, b0); /* gradient, in enc.0.attn's backward 2330 */
    ALLOC(0x6000, 7, 0);     /* autograd thread, no scope: [backward] 2337 */
    FREE(0x6000, 0);
    FREE(0x2000, b0);
    FREE(0x3000, b0);
    ALLOC(0x7000, 2000, o);  /* optimizer state: [optimizer step] 4030 peak */
    gm_trace *t = finish(&x);
    gm_attribution *a;
    gm_timeline *tl;
    gm_scope_series *ss;
    scoped_build(t, 6000, 10, &a, &tl, &ss);
    assert_int_equal(a->peak_bytes, 1000 + 30 + 1000 + 2000);
    assert_true(ss->by_scope);
    assert_false(ss->by_frames);
    assert_int_equal(ss->nviews, 4);
    const gm_scope_view *v = view(ss, 1);
    assert_int_equal(series_peak(v, "model"), 30 + 1000);
    assert_int_equal(series_peak(v, "[untracked]"), 1000);
    assert_int_equal(series_peak(v, "[optimizer step]"), 2000);
    assert_int_equal(series_peak(v, "[backward]"), 0);
    assert_int_equal(v->nscopes, 4);
    assert_string_equal(v->names[0], "[optimizer step]"); /* ranked by bytes at the peak */
    v = view(ss, 2);
    assert_int_equal(series_peak(v, "model.enc"), 1000);
    assert_int_equal(series_peak(v, "model.head"), 30);
    v = view(ss, 3);
    assert_int_equal(series_peak(v, "model.enc.0"), 1000);
    assert_int_equal(series_peak(v, "model.enc.1"), 0);
    v = view(ss, 4);
    assert_int_equal(series_peak(v, "model.enc.0.attn"), 1000);
    assert_int_equal(series_peak(v, "model.head"), 30);
    assert_int_equal(v->nscopes, 6);
    /* enc.1.mlp's own maximum: 200, before the peak */
    for (size_t j = 0; j < v->nseries; j++)
        if (!strcmp(v->names[j], "model.enc.1.mlp")) assert_int_equal(v->max[j], 200);
    gm__scope_series_free(ss);

    /* top 2: the rest summed in "other scopes" */
    assert_int_equal(gm__scope_series_build(a, tl, 2, &ss), GM_OK);
    check_view_sums(a, tl, ss);
    v = view(ss, 4);
    assert_int_equal(v->nseries, 3);
    assert_string_equal(v->names[0], "[optimizer step]");
    assert_string_equal(v->names[1], "model.enc.0.attn"); /* 1000 as [untracked], but its maximum is 1100 */
    assert_int_equal(series_peak(v, GM_SCOPE_OTHERS), 1000 + 30);
    /* the JSON both outputs write: values, or deltas that sum to them */
    char *buf = series_json(ss, false);
    assert_non_null(strstr(buf, "\"name\":\"model.enc.0.attn\",\"at_peak\":1000"));
    assert_non_null(strstr(buf, "\"encoding\":\"values\""));
    free(buf);
    buf = series_json(ss, true);
    assert_non_null(strstr(buf, "\"deltas\":["));
    free(buf);
    scoped_free(t, a, tl, ss);
}

/* A torch snapshot: scopes from the module forward frames (call sites),
 * "(self)" for a forward's own code, phases for the rest. */
static void test_scope_series_frames(void **s) {
    (void)s;
    /* lines are 10 + the frame's index in the stack */
    static const char *const LIN[] = {"linear@/py/torch/nn/functional.py", "forward@/py/torch/nn/modules/linear.py",
                                      "_call_impl@/py/torch/nn/modules/module.py", "forward@/m/model.py",
                                      "main@train.py", NULL};
    static const char *const OWN[] = {"gelu@/py/torch/nn/functional.py", "forward@/m/model.py", "main@train.py", NULL};
    tb x = {gm__tb_new(), 0};
    uint32_t lin = stack(&x, LIN), own = stack(&x, OWN), bwd = stack(&x, S_BWD), step = stack(&x, S_STEP);
    ALLOC(0x1000, 100, lin); /* model.py:13 > linear.py (self) */
    ALLOC(0x2000, 50, own);  /* model.py (self) */
    ALLOC(0x3000, 8, bwd);   /* [backward] (frames) */
    ALLOC(0x4000, 1000, 0);  /* [backward] (phase) */
    FREE(0x1000, 0);
    FREE(0x2000, 0);
    ALLOC(0x5000, 40, step); /* [optimizer step] */
    gm_trace *t = finish(&x);
    gm_attribution *a;
    gm_timeline *tl;
    gm_scope_series *ss;
    scoped_build(t, 6000, 10, &a, &tl, &ss);
    assert_false(ss->by_scope);
    assert_true(ss->by_frames);
    assert_int_equal(ss->nviews, 2);
    assert_int_equal(a->peak_bytes, 100 + 50 + 8 + 1000);
    const gm_scope_view *v = view(ss, 1);
    assert_int_equal(series_peak(v, "model.py:13"), 100);
    assert_int_equal(series_peak(v, "model.py (self)"), 50);
    assert_int_equal(series_peak(v, "[backward]"), 1008);
    v = view(ss, 2);
    assert_int_equal(series_peak(v, "model.py:13 > linear.py (self)"), 100);
    assert_int_equal(series_peak(v, "model.py (self)"), 50);
    for (size_t j = 0; j < v->nseries; j++)
        if (!strcmp(v->names[j], "[optimizer step]")) assert_int_equal(v->max[j], 40);
    scoped_free(t, a, tl, ss);
}

/* Downsampled to few points, the series still sum to the categories at
 * every kept point, and the peak point is kept. */
static void test_scope_series_downsampled(void **s) {
    (void)s;
    gm_trace *t = training_trace();
    gm_attribution *a;
    gm_timeline *tl;
    gm_scope_series *ss;
    scoped_build(t, 6, 1, &a, &tl, &ss);
    assert_int_equal(tl->pts[tl->peak_pt].ev, a->peak_ev);
    const gm_scope_view *v = view(ss, 1);
    assert_int_equal(v->nseries, 2); /* the top one and "other scopes" */
    assert_string_equal(v->names[1], GM_SCOPE_OTHERS);
    scoped_free(t, a, tl, ss);
}

/* A path deeper than GM_SCOPE_DEPTH_MAX gets that many views, the last cut
 * there; a trace with no allocation gets one empty view. */
static void test_scope_series_limits(void **s) {
    (void)s;
    static const char *const DEEP[] = {"a.b.c.d.e.f.g.h.i.j@" GM_TAG_SCOPE_FILE, NULL};
    tb x = {gm__tb_new(), 0};
    uint32_t deep = stack(&x, DEEP);
    ALLOC(0x1000, 64, deep);
    gm_trace *t = finish(&x);
    gm_attribution *a;
    gm_timeline *tl;
    gm_scope_series *ss;
    scoped_build(t, 6000, 10, &a, &tl, &ss);
    assert_int_equal(ss->nviews, GM_SCOPE_DEPTH_MAX);
    assert_int_equal(series_peak(view(ss, 1), "a"), 64);
    assert_int_equal(series_peak(view(ss, GM_SCOPE_DEPTH_MAX), "a.b.c.d.e.f.g.h"), 64);
    scoped_free(t, a, tl, ss);

    x = (tb){gm__tb_new(), 0};
    FREE(0x1000, 0); /* of an address never allocated: no allocation at all */
    t = finish(&x);
    assert_int_equal(gm__attribute(t, 0, &a), GM_OK);
    assert_int_equal(gm__timeline_build(a, NULL, 6000, &tl), GM_OK);
    assert_int_equal(gm__scope_series_build(a, tl, 10, &ss), GM_OK);
    assert_int_equal(ss->nviews, 1);
    assert_int_equal(ss->views[0].nseries, 0);
    assert_int_equal(ss->views[0].nscopes, 0);
    char *buf = series_json(ss, true);
    assert_non_null(strstr(buf, "\"series\":[]"));
    free(buf);
    scoped_free(t, a, tl, ss);
}

static void test_names(void **s) {
    (void)s;
    for (int c = 0; c < GM_CAT_COUNT; c++) assert_int_equal(gm_category_from_name(gm_category_name(c)), c);
    assert_int_equal(gm_category_from_name("weights"), -1);
    assert_string_equal(gm_category_name(GM_CAT_OPTIMIZER), "optimizer_state");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_training_step),   cmocka_unit_test(test_frame_table),
        cmocka_unit_test(test_timeline),        cmocka_unit_test(test_lifetime_rule),
        cmocka_unit_test(test_step_rule),
        cmocka_unit_test(test_old_trace_and_anomalies), cmocka_unit_test(test_names),
        cmocka_unit_test(test_phase_scopes),    cmocka_unit_test(test_scope_series_paths),
        cmocka_unit_test(test_scope_series_frames), cmocka_unit_test(test_scope_series_downsampled),
        cmocka_unit_test(test_scope_series_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
