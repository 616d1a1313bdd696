/* fuzz_pickle.c — libFuzzer target: the safe pickle reader on arbitrary
 * bytes (plain or gzip) must return a value or GM_EFORMAT/GM_ENOHOSTMEM,
 * never crash, leak or read out of bounds. Walks the result a little so the
 * accessors are exercised too. */
#include "gpumem/gpumem.h"
#include "trace/pickle.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The walk visits each container once (a memo lets one list appear
 * everywhere: walking every path was exponential, 16.8 s for a 97-byte
 * input) and at most WALK_BUDGET values in all, so it is linear in the
 * input and never starves the fuzzer. */
#define WALK_BUDGET 100000
#define SEEN_CAP 4096 /* power of two; a full table just stops memoising */
typedef struct walker {
    gm__pval seen[SEEN_CAP];
    size_t nseen;
    size_t budget;
} walker;

static bool first_visit(walker *w, gm__pval v) {
    size_t h = (size_t)((v >> 3) * 0x9E3779B97F4A7C15ull >> 40) & (SEEN_CAP - 1);
    for (size_t k = 0; k < SEEN_CAP; k++, h = (h + 1) & (SEEN_CAP - 1)) {
        if (w->seen[h] == v) return false;
        if (!w->seen[h]) {
            if (w->nseen * 2 >= SEEN_CAP) return w->budget > 0; /* table full: budget only */
            w->seen[h] = v;
            w->nseen++;
            return true;
        }
    }
    return w->budget > 0;
}

static void walk(walker *w, gm__pval v, int depth) {
    if (depth > 8 || w->budget == 0) return;
    w->budget--;
    size_t n = gm__pv_len(v);
    int64_t i;
    double f;
    gm__pv_int(v, &i);
    gm__pv_float(v, &f);
    gm__pv_str(v, NULL);
    if (!n || !first_visit(w, v)) return;
    for (size_t k = 0; k < n && k < 16; k++) {
        walk(w, gm__pv_item(v, k), depth + 1);
        walk(w, gm__pv_dict_key(v, k), depth + 1);
        walk(w, gm__pv_dict_val(v, k), depth + 1);
    }
    gm__pv_dict_get(v, "device_traces");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gm__pickle_limits l;
    gm__pickle_limits_init(&l);
    l.max_memory = 256u << 20; /* keep the fuzzer inside its RSS limit */
    l.max_string = 16u << 20;
    l.max_input = 256u << 20;
    gm__pickle *p;
    if (gm__pickle_load(data, size, &l, &p) == GM_OK) {
        static walker w; /* 32 KiB: not on the stack */
        memset(&w, 0, sizeof w);
        w.budget = WALK_BUDGET;
        walk(&w, gm__pickle_root(p), 0);
        gm__pickle_free(p);
    }
    return 0;
}
