/* fnv_flood.h — hostile inputs for the hash-flood tests and probes (issue 26,
 * defect 1): distinct strings whose FNV-1a hashes agree in their low `bits`
 * bits, the hash the pickle reader's intern table (32-bit FNV-1a) and
 * report's scope table (64-bit FNV-1a) used before they were keyed. A table
 * indexed by the low bits puts every such string in one probe chain.
 *
 * FNV-1a's low k bits depend only on the low k bits of its state, so the
 * string is a counter prefix and three chosen bytes: two searched (2^16
 * tries give ~2^(24-bits) matches in bits 8..bits-1) and the last fixing
 * the low byte. Header-only: tests/stress/test_work.c and bench/bench_flood.c. */
#ifndef GM_TEST_FNV_FLOOD_H
#define GM_TEST_FNV_FLOOD_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Writes string `i` (NUL-terminated, no NUL or '.' inside) to out[16];
 * returns its length, or 0 if none was found for this i (rare: try i+1).
 * fnv64: the 64-bit FNV-1a parameters, else the 32-bit ones. */
static inline size_t flood_string(uint64_t i, int bits, bool fnv64, char out[16]) {
    const uint64_t mask = bits >= 64 ? ~0ull : (1ull << bits) - 1;
    const uint64_t prime = fnv64 ? 1099511628211ull : 16777619ull;
    uint64_t h = fnv64 ? 1469598103934665603ull : 2166136261ull;
    int n = snprintf(out, 16, "f%010llx", (unsigned long long)i);
    for (int k = 0; k < n; k++) h = (h ^ (uint8_t)out[k]) * prime;
    for (unsigned c1 = 1; c1 < 256; c1++) {
        if (c1 == '.') continue;
        uint64_t h1 = (h ^ c1) * prime;
        for (unsigned c2 = 1; c2 < 256; c2++) {
            if (c2 == '.') continue;
            /* the hash is 0 in its low bits iff the state before the last
             * byte is that byte there: bits 8.. must be 0 already */
            uint64_t d = ((h1 ^ c2) * prime) & mask;
            if (d >> 8) continue;
            if (d == 0 || d == '.') continue; /* c3 = d must be a plain byte */
            out[n] = (char)c1;
            out[n + 1] = (char)c2;
            out[n + 2] = (char)d;
            out[n + 3] = '\0';
            return (size_t)n + 3;
        }
    }
    return 0;
}

/* The plain hashes themselves, to check the strings collide under them. */
static inline uint64_t flood_fnv(const char *s, bool fnv64) {
    uint64_t h = fnv64 ? 1469598103934665603ull : 2166136261ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * (fnv64 ? 1099511628211ull : 16777619ull);
    return fnv64 ? h : (uint32_t)h;
}

#endif /* GM_TEST_FNV_FLOOD_H */
