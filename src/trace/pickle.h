/* pickle.h — a safe reader for the subset of Python's pickle format that
 * PyTorch memory snapshots use (protocols 2 to 5), plain or gzip-compressed.
 *
 * Nothing is ever executed: GLOBAL / STACK_GLOBAL / REDUCE / BUILD / NEWOBJ
 * produce an opaque value that remembers the global's name. Every length is
 * checked against the input and against limits, so malformed or truncated
 * input gives GM_EFORMAT with the byte offset (of the uncompressed stream) in
 * gm_last_error_detail(), never a crash or an out-of-bounds read.
 *
 * Values are 8-byte tagged words (gm__pval): small ints, None/True/False are
 * immediate; everything else points into the loader's arena, so a whole
 * snapshot is freed at once. Short strings are interned: equal short strings
 * are the same object, which lets readers compare keys by pointer. */
#ifndef GPUMEM_TRACE_PICKLE_H
#define GPUMEM_TRACE_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t gm__pval;

typedef enum gm__ptype {
    GM__PT_ABSENT = 0, /* the value 0: "no such key / index" */
    GM__PT_NONE,
    GM__PT_BOOL,
    GM__PT_INT,    /* fits in int64 (or in uint64: [2^63, 2^64) as its bit pattern) */
    GM__PT_BIGINT, /* does not fit in int64: no numeric value offered */
    GM__PT_FLOAT,
    GM__PT_STR,
    GM__PT_BYTES,
    GM__PT_LIST,
    GM__PT_TUPLE,
    GM__PT_DICT,
    GM__PT_SET,
    GM__PT_OPAQUE, /* result of GLOBAL/REDUCE/NEWOBJ/BUILD: never executed */
    GM__PT_CONVERTED, /* a container its client converted and the reader released: only its tag is left */
} gm__ptype;

typedef struct gm__pickle gm__pickle;

typedef struct gm__pickle_limits {
    uint64_t max_memory;     /* arena + tables; default 4 GiB */
    uint64_t max_string;     /* one str/bytes; default 256 MiB */
    uint64_t max_input;      /* uncompressed bytes; default 16 GiB */
} gm__pickle_limits;

void gm__pickle_limits_init(gm__pickle_limits *l);

/* Load one pickle from memory; gzip is detected by its magic bytes.
 * limits == NULL: defaults. On error returns GM_EFORMAT (malformed),
 * GM_ENOHOSTMEM (a limit or malloc) and sets gm_last_error_detail(). */
int gm__pickle_load(const void *data, size_t len, const gm__pickle_limits *limits,
                    gm__pickle **out);
/* Load from a file as it is read: `head` holds its first len bytes (at
 * least 2 when the file has them: the gzip check), `in` the rest, read in
 * windows, never whole. GM_EIO when it cannot be read. */
int gm__pickle_load_stream(FILE *in, const void *head, size_t len, const gm__pickle_limits *limits,
                           gm__pickle **out);
/* Streaming (a snapshot's events, as they are read, never as one tree):
 * at the first APPEND(S) into a list, claim() is asked whether it takes the
 * list's items, given where the list stands as the pickler builds it (the
 * list `outer` it will go into at `index`, and the value before `outer` on
 * the stack: its dict key). From then on items() sees every item appended
 * instead of the list storing it; the list's length stays 0. The client tags
 * what it converted (gm__pv_set_tag); after items() returns, the reader
 * releases every container of that batch that nothing else holds and the
 * client tagged: a memo reference to it gives a GM__PT_CONVERTED value with
 * the same tag. A tagged container is frozen: SETITEM, APPEND... into it is
 * an error. Either callback returns GM_OK or an error (with the detail set),
 * which ends the load. */
typedef struct gm__pickle_sink {
    void *ctx;
    int (*claim)(void *ctx, gm__pickle *p, gm__pval list, gm__pval outer, gm__pval key, size_t index,
                 bool *take);
    int (*items)(void *ctx, gm__pickle *p, gm__pval list, const gm__pval *items, size_t n);
} gm__pickle_sink;
/* gm__pickle_load_stream with a sink (NULL: none). */
int gm__pickle_load_sink(FILE *in, const void *head, size_t len, const gm__pickle_limits *limits,
                         const gm__pickle_sink *sink, gm__pickle **out);
/* A container's or converted value's tag (0: none); tags are < 2^60. */
uint64_t gm__pv_tag(gm__pval v);
/* Tag a container (false: not a container, or the tag is 0 or too large). */
bool gm__pv_set_tag(gm__pval v, uint64_t tag);
void gm__pickle_free(gm__pickle *p);
gm__pval gm__pickle_root(const gm__pickle *p);
/* Bytes of the arena the values live in (tests: streaming keeps it flat). */
uint64_t gm__pickle_arena_bytes(const gm__pickle *p);
/* Uncompressed bytes consumed (for reports/bench); while loading (in a
 * sink's callback), those read so far. */
uint64_t gm__pickle_input_bytes(const gm__pickle *p);

/* ---- accessors: all accept any value (wrong type -> false/NULL/0) ------ */
gm__ptype gm__pv_type(gm__pval v);
const char *gm__pv_type_name(gm__pval v);
bool gm__pv_int(gm__pval v, int64_t *out);    /* INT and BOOL */
bool gm__pv_float(gm__pval v, double *out);   /* FLOAT, INT, BOOL */
bool gm__pv_bool(gm__pval v, bool *out);      /* BOOL only */
/* STR/BYTES: pointer to the bytes (NUL-terminated) and length. */
const char *gm__pv_str(gm__pval v, size_t *len);
const char *gm__pv_bytes(gm__pval v, size_t *len);
/* OPAQUE: "module.name" of the global involved (or "?"). */
const char *gm__pv_opaque_name(gm__pval v);
/* LIST/TUPLE/SET: items; DICT: pairs; STR/BYTES: bytes. */
size_t gm__pv_len(gm__pval v);
gm__pval gm__pv_item(gm__pval v, size_t i);      /* LIST/TUPLE/SET */
/* DICT: its n pairs as 2n values (key, value, ...), NULL if not a dict. */
const gm__pval *gm__pv_dict_items(gm__pval v, size_t *n);
/* gm__pv_int, the small ints (below 2^60 in magnitude) inline: the low 3
 * bits of a value are 1 for them (pickle_value.h). */
static inline bool gm__pv_int_fast(gm__pval v, int64_t *out) {
    if ((v & 7u) != 1u) return gm__pv_int(v, out);
    *out = (int64_t)v >> 3;
    return true;
}
gm__pval gm__pv_dict_key(gm__pval v, size_t i);  /* DICT pair i */
gm__pval gm__pv_dict_val(gm__pval v, size_t i);
/* DICT lookup by str key (last one wins, like Python); 0 if absent. */
gm__pval gm__pv_dict_get(gm__pval v, const char *key);

#endif /* GPUMEM_TRACE_PICKLE_H */
