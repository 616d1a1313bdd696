/* fuzz_trace.c — libFuzzer target: the trace readers (PyTorch snapshot via
 * the pickle reader, and the gmt decoder, chosen by magic) on arbitrary
 * bytes; a trace that loads is re-encoded, decoded again and compiled for
 * replay, so the writer and the replay compiler see fuzzed traces too. */
#include "gpumem/gpumem.h"
#include "trace/trace.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gm_trace *t;
    if (gm_trace_load_mem(data, size, &t) != GM_OK) return 0;
    uint8_t *buf;
    size_t len;
    if (gm_trace_encode_gmt(t, &buf, &len) == GM_OK) {
        gm_trace *t2;
        if (gm_trace_decode_gmt(buf, len, &t2) == GM_OK) {
            if (t2->nevents != t->nevents) abort(); /* the round trip must be lossless */
            gm_trace_free(t2);
        }
        free(buf);
    }
    for (int d = 0; d < t->ndevices && d < 4; d++) {
        gm_replay_prog *p;
        if (gm_replay_compile(t, d, &p) == GM_OK) gm_replay_prog_free(p);
    }
    gm_trace_free(t);
    return 0;
}
