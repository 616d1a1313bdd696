/* fuzz_trace.c — libFuzzer target: the trace readers (PyTorch snapshot via
 * the pickle reader, and the gmt decoder, chosen by magic) on arbitrary
 * bytes; a trace that loads is re-encoded (gmt and torch snapshot), decoded
 * again (the round trips must keep every event), compiled for replay, and
 * given to the report's attribution, scope series and text/JSON/Perfetto writers, so
 * the writers, the replay compiler and `gpumem report` see fuzzed traces too. */
#include "gpumem/gpumem.h"
#include "report/report.h"
#include "util/idmap.h"
#include "trace/trace.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void report(const gm_trace *t) {
    static FILE *null;
    if (!null && !(null = fopen("/dev/null", "w"))) return;
    gm_attribution *a;
    if (gm__attribute(t, 0, &a) != GM_OK) return;
    gm_frame_row *rows = NULL;
    size_t nrows = 0;
    gm_timeline *tl = NULL;
    gm_scope_series *ss = NULL;
    if (gm__frame_table(a, &rows, &nrows) == GM_OK &&
        gm__timeline_build(a, NULL, 64, &tl) == GM_OK) {
        (void)gm__scope_series_build(a, tl, 4, &ss); /* the timeline stacked by scope, in --json */
        gm_report_opts o = {.title = "fuzz", .max_rows = 20, .scopes = ss};
        gm__report_write_text(null, a, tl, rows, nrows, &o);
        gm__report_write_json(null, a, tl, &o);
        gm__report_write_perfetto(null, a, tl);
    }
    gm__scope_series_free(ss);
    gm__timeline_free(tl);
    free(rows);
    gm__attribution_free(a);
}

/* Work per input byte (issue 26): the readers' steps (util/idmap.h) stay
 * within a constant per byte they read; compressed input may inflate up to
 * zlib's ~1032x, and each inflated byte is read once. */
static void check_work(const uint8_t *data, size_t size, uint64_t steps) {
    bool compressed = size >= 2 && ((data[0] == 0x1f && data[1] == 0x8b) || data[0] == 'G');
    uint64_t bound = ((uint64_t)1 << 21) + (uint64_t)size * 80 * (compressed ? 1100 : 1);
    if (steps > bound) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gm_trace *t;
    uint64_t s0 = gm__work_steps;
    int rc = gm__trace_load_mem(data, size, &t);
    check_work(data, size, gm__work_steps - s0);
    if (rc != GM_OK) return 0;
    /* a few KB of .gmt can hold a million regular events (~1000x zlib);
     * their re-encoding, replay and report are linear but exceed the
     * per-input timeout, and say nothing small inputs do not */
    if (t->nevents > 100000) {
        gm__trace_free(t);
        return 0;
    }
    uint8_t *buf;
    size_t len;
    if (gm__trace_encode_gmt(t, &buf, &len) == GM_OK) {
        gm_trace *t2;
        if (gm__trace_decode_gmt(buf, len, &t2) != GM_OK) abort(); /* whatever gpumem writes, it reads */
        if (t2->nevents != t->nevents) abort(); /* the round trip must be lossless */
        gm__trace_free(t2);
        free(buf);
    }
    if (t->nevents && gm__trace_encode_snapshot(t, &buf, &len) == GM_OK) {
        gm_trace *t2;
        if (gm__trace_load_mem(buf, len, &t2) != GM_OK) abort(); /* our own snapshot refused */
        if (t2->nevents != t->nevents) abort();
        gm__trace_free(t2);
        free(buf);
    }
    for (int d = 0; d < t->ndevices && d < 4; d++) {
        gm_replay_prog *p;
        if (gm__replay_compile(t, d, &p) == GM_OK) gm__replay_prog_free(p);
    }
    if (t->nevents <= 4096) report(t); /* the timeline replays: keep inputs small */
    gm__trace_free(t);
    return 0;
}
