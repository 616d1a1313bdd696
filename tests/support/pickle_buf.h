/* pickle_buf.h — pickles written by hand in tests: a growing byte buffer,
 * its opcodes and a short str. Header-only (cmocka's asserts): test_work.c
 * and test_snapshot_stream.c. */
#ifndef GM_TEST_PICKLE_BUF_H
#define GM_TEST_PICKLE_BUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct buf {
    uint8_t *b;
    size_t n, cap;
    uint32_t memo; /* the next memo index, for writers that number them */
} buf;

static inline void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->b = realloc(b->b, b->cap);
        assert_non_null(b->b);
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static inline void put_op(buf *b, uint8_t op) { put(b, &op, 1); }
static inline void put_str(buf *b, const char *s) { /* SHORT_BINUNICODE */
    size_t n = strlen(s);
    assert_true(n < 256);
    put_op(b, 0x8c);
    put_op(b, (uint8_t)n);
    put(b, s, n);
}

#endif /* GM_TEST_PICKLE_BUF_H */
