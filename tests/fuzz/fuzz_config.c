/* fuzz_config.c — libFuzzer target: gm_config_parse (PYTORCH_CUDA_ALLOC_CONF
 * syntax) on arbitrary strings must accept or refuse with a message, never
 * crash; what it accepts must format to a string that parses back to the
 * same configuration (the canonical form is a fixed point). */
#include "gpumem/gpumem.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *s = fuzz_cstr(data, size);
    if (!s) return 0;
    gm_config c;
    gm_config_init(&c);
    char err[256];
    if (gm_config_parse(&c, s, err, sizeof err) == GM_OK) {
        char f1[2048], f2[2048];
        if (gm_config_format(&c, f1, sizeof f1) == GM_OK) {
            gm_config c2;
            gm_config_init(&c2);
            if (gm_config_parse(&c2, f1, err, sizeof err) != GM_OK) abort(); /* our own output refused */
            if (gm_config_format(&c2, f2, sizeof f2) != GM_OK || strcmp(f1, f2)) abort();
        }
    } else if (!err[0]) {
        abort(); /* a refusal must say why */
    }
    free(s);
    return 0;
}
