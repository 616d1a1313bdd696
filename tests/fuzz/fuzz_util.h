/* fuzz_util.h — what every libFuzzer harness here needs: the input as a
 * NUL-terminated C string. A fresh malloc of exactly n + 1 bytes (not
 * strndup, which stops at an embedded NUL), so ASan catches a reader that
 * runs past the terminator. */
#ifndef GPUMEM_FUZZ_UTIL_H
#define GPUMEM_FUZZ_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A copy of d[0..n) plus a NUL; NULL when malloc fails. free() it. */
static inline char *fuzz_cstr(const uint8_t *d, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, d, n);
    s[n] = '\0';
    return s;
}

#endif
