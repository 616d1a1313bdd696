/* fuzz_pickle.c — libFuzzer target: the safe pickle reader on arbitrary
 * bytes (plain or gzip) must return a value or GM_EFORMAT/GM_ENOHOSTMEM,
 * never crash, leak or read out of bounds. Walks the result a little so the
 * accessors are exercised too. */
#include "gpumem/gpumem.h"
#include "trace/pickle.h"

#include <stddef.h>
#include <stdint.h>

static void walk(gm__pval v, int depth) {
    if (depth > 8) return;
    size_t n = gm__pv_len(v);
    int64_t i;
    double f;
    gm__pv_int(v, &i);
    gm__pv_float(v, &f);
    gm__pv_str(v, NULL);
    for (size_t k = 0; k < n && k < 16; k++) {
        walk(gm__pv_item(v, k), depth + 1);
        walk(gm__pv_dict_key(v, k), depth + 1);
        walk(gm__pv_dict_val(v, k), depth + 1);
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
        walk(gm__pickle_root(p), 0);
        gm__pickle_free(p);
    }
    return 0;
}
