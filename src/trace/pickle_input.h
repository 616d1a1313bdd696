/* pickle_input.h — where the pickle reader's bytes come from (pickle.c reads
 * them, pickle_input.c fetches them): a window over the input, which is the
 * caller's memory, a file read as the parse goes, or gzip of either,
 * inflated in windows (a trace of 80 MB never sits in memory whole). Gzip
 * from a regular file is inflated by a thread of its own while the opcodes
 * run. gm__input_need() guarantees that n bytes are readable at p before any
 * of them is touched, which is the whole bounds story of the reader. */
#ifndef GPUMEM_TRACE_PICKLE_INPUT_H
#define GPUMEM_TRACE_PICKLE_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <zlib.h>

/* zlib over the head and `in`, or `in` alone */
typedef struct gm__zsrc {
    z_stream z;
    /* a file read as the parse goes (NULL: all input is in memory), so a
     * pipe or /dev/zero is refused at its first bad byte, never buffered */
    FILE *in;
    uint8_t *ibuf; /* gzip: compressed bytes read from `in` */
    bool ieof, zend;
    int zerr; /* why it ended: 0 at its end, else GM__ZERR_* */
    uint64_t iread; /* bytes read from `in` */
} gm__zsrc;

enum { GM__ZERR_TRUNCATED = 1, GM__ZERR_CORRUPT = 2, GM__ZERR_IO = 3, GM__ZERR_FILE_LIMIT = 4 };

struct gm__zpipe; /* the inflating thread */

typedef struct gm__input {
    const uint8_t *p, *end, *wbase; /* readable: [p, end); wbase: the window's first byte */
    uint64_t base; /* absolute offset (of the uncompressed stream) of wbase[0] */
    uint64_t max_input; /* uncompressed bytes allowed */
    bool gz, zend; /* zend: the input (after gunzip) has ended */
    int zerr; /* why it ended: 0 at its end, else GM__ZERR_* */
    gm__zsrc src; /* the inflating thread's while it runs; read here once it has ended */
    struct gm__zpipe *pipe;
    uint8_t *buf;
    size_t bufcap;
} gm__input;

/* Start reading: `head` holds the input's first len bytes (at least 2 when
 * it has them: the gzip check), `in` the rest (NULL: none). GM_EINVAL for
 * compressed input over 4 GiB in memory, GM_ENOHOSTMEM if zlib cannot
 * start; gm__input_close() is due either way. */
int gm__input_open(gm__input *r, FILE *in, const void *head, size_t len, uint64_t max_input);
void gm__input_close(gm__input *r);
/* Slow path of gm__input_need(): move the window so n bytes are readable. */
bool gm__input_refill(gm__input *r, size_t n);

static inline bool gm__input_need(gm__input *r, size_t n) {
    return (size_t)(r->end - r->p) >= n || gm__input_refill(r, n);
}

/* The absolute offset of `at`, a byte of the window. */
static inline uint64_t gm__input_offset(const gm__input *r, const uint8_t *at) {
    return r->base + (uint64_t)(at - r->wbase);
}

/* Why the input ended early (r->zerr set): sets the error and returns it. */
int gm__input_error(const gm__input *r);
/* After the pickle's STOP: the input must end there. For gzip the rest is
 * inflated so that zlib checks the trailer (CRC-32 and length); any byte
 * after STOP, decompressed or not, is an error, so this never inflates more
 * than one window. */
int gm__input_finish(gm__input *r);

#endif /* GPUMEM_TRACE_PICKLE_INPUT_H */
