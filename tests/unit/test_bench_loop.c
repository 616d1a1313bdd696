/* The replay benches' steady loop (bench/steady_loop.h): replayed again and
 * again after its head, it never allocates into a live slot, never frees a
 * dead one and leaves as many blocks live after each pass as the head did. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../bench/steady_loop.h"

enum { MAXEV = 8192, MAXSLOT = 256 };

typedef struct tr {
    uint32_t slot[MAXEV];
    unsigned char is_alloc[MAXEV];
    size_t n;
    uint32_t nslots, free_list[MAXSLOT], nfree;
} tr;

/* slots are reused after free, as bench/trace_to_events.py numbers them */
static uint32_t tr_alloc(tr *t) {
    uint32_t s = t->nfree ? t->free_list[--t->nfree] : t->nslots++;
    t->slot[t->n] = s;
    t->is_alloc[t->n++] = 1;
    return s;
}

static void tr_free(tr *t, uint32_t s) {
    t->slot[t->n] = s;
    t->is_alloc[t->n++] = 0;
    t->free_list[t->nfree++] = s;
}

/* A model (8 blocks never freed), then steps: activations, a loss kept
 * until the next step's loss exists, gradients freed at the next step's
 * start (carried across the boundary), a temporary. */
static void training(tr *t, int steps) {
    for (int i = 0; i < 8; i++) tr_alloc(t);
    uint32_t loss = UINT32_MAX, grad[3] = {UINT32_MAX, UINT32_MAX, UINT32_MAX};
    for (int k = 0; k < steps; k++) {
        for (int g = 0; g < 3; g++)
            if (grad[g] != UINT32_MAX) tr_free(t, grad[g]);
        uint32_t act[12];
        for (int a = 0; a < 12; a++) act[a] = tr_alloc(t);
        uint32_t l = tr_alloc(t);
        if (loss != UINT32_MAX) tr_free(t, loss);
        loss = l;
        for (int a = 11; a >= 0; a--) {
            if (a < 3) grad[a] = tr_alloc(t);
            tr_free(t, act[a]);
        }
        tr_free(t, tr_alloc(t));
    }
}

/* Replay: each event must find its slot in the state it expects. */
static void apply(unsigned char *live, const uint32_t *slot, const unsigned char *is_alloc, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (is_alloc[i]) assert_false(live[slot[i]]);
        else assert_true(live[slot[i]]);
        live[slot[i]] = is_alloc[i];
    }
}

static size_t count(const unsigned char *live, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += live[i];
    return c;
}

static void test_loop_replays_for_ever(void **state) {
    (void)state;
    static tr t;
    training(&t, 40);
    bench_loop l;
    assert_int_equal(bench_loop_make(t.n, t.slot, t.is_alloc, t.nslots, &l), 0);
    assert_true(l.s >= t.n * 3 / 10 && l.e > l.s && l.e - l.s >= t.n / 10);
    static unsigned char live[2 * MAXSLOT];
    apply(live, t.slot, t.is_alloc, l.e); /* the head: the trace's own slots */
    size_t after_head = count(live, 2 * t.nslots);
    for (int pass = 0; pass < 6; pass++) {
        int parity = (pass + 1) & 1; /* the first pass after the head has parity 1 */
        apply(live, l.slot[parity], t.is_alloc + l.s, l.e - l.s);
        assert_int_equal(count(live, 2 * t.nslots), after_head);
        for (size_t i = 0; i < l.e - l.s; i++) assert_true(l.slot[parity][i] < 2 * t.nslots);
    }
    bench_loop_free(&l);
}

static void test_no_loop_in_a_trace_that_never_frees(void **state) {
    (void)state;
    static tr t;
    for (int i = 0; i < 200; i++) tr_alloc(&t);
    bench_loop l;
    assert_int_equal(bench_loop_make(t.n, t.slot, t.is_alloc, t.nslots, &l), -1);
    assert_null(l.slot[0]);
    assert_null(l.slot[1]);
}

static void test_bad_slot_is_refused(void **state) {
    (void)state;
    static tr t;
    training(&t, 20);
    bench_loop l;
    assert_int_equal(bench_loop_make(t.n, t.slot, t.is_alloc, t.nslots - 1, &l), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loop_replays_for_ever),
        cmocka_unit_test(test_no_loop_in_a_trace_that_never_frees),
        cmocka_unit_test(test_bad_slot_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
