/* pickle.c — the safe pickle reader behind pickle.h.
 *
 * One pass over the opcodes with a value stack, a mark stack and a memo, as
 * in CPython's _Unpickler, but every value is data: globals and constructors
 * become opaque values. The bytes come through pickle_input.h's window
 * (gzip inflated as the parse goes); gm__input_need() guarantees that n
 * bytes are readable before any opcode argument is touched, which is the
 * whole bounds story. Every table counts against limits.max_memory.
 *
 * Streaming (pickle.h's sink): a snapshot's events are converted as they are
 * appended, and the containers of a batch (the items between a MARK and its
 * APPENDS) are released and reused, so ten million events never stand as a
 * tree. A container may be released only when nothing can reach it again:
 * it was made after the batch's MARK (so it is not on the stack below it),
 * no container holds it (o.hash counts them), one memo entry at most holds
 * it (that entry becomes a GM__PT_CONVERTED value carrying the client's
 * tag), and the client tagged it. Containers and item arrays come from free
 * lists, item arrays in power-of-two classes. */
#include "pickle_value.h"

#include "pickle_input.h"
#include "util/idmap.h"
#include "internal.h"

#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define CHUNK_MAX ((size_t)32 << 20)

#define INTERN_MAX 64 /* intern str objects up to this many bytes */
#define ITEM_CLASSES 40
#define RECENT 64 /* direct-mapped, so a file can only make it miss, never search it */
#define RECENT_MAX 16

/* ---- the loader -------------------------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(8) uint8_t data[];
} chunk;

struct gm__pickle {
    gm__pickle_limits lim;
    chunk *chunks;
    uint64_t mem; /* bytes of arena chunks and tables */
    gm__pval root;
    uint64_t consumed;
    /* tables (freed after loading) */
    gm__pval *stack;
    size_t sp, stack_cap;
    struct pmark { size_t sp; uint64_t seq; } *marks; /* seq: containers made before the MARK */
    size_t nmarks, marks_cap;
    gm__pval *memo;
    size_t memo_cap, memo_count;
    pobj **intern;
    size_t intern_cap, intern_count;
    pobj *recent[RECENT]; /* interned short strs by a cheap index: a snapshot names a few thousand times a second */
    /* streaming */
    const gm__pickle_sink *sink;
    uint64_t seq;                   /* containers made so far */
    pcont *free_cont;               /* released containers (linked through o.u.items) */
    gm__pval *free_items[ITEM_CLASSES]; /* released item arrays of 2^c items (linked through [0]) */
    gm__pval *work;                 /* containers being released */
    size_t nwork, work_cap;
    const gm__input *rd;            /* while loading: where the input is */
};

static int mem_charge(gm__pickle *p, uint64_t bytes) {
    if (p->mem + bytes > p->lim.max_memory)
        return gm__set_error(GM_ENOHOSTMEM, "pickle needs more than %llu bytes of memory (limit "
                             "GM_LIMIT_TRACE_MEMORY)",
                             (unsigned long long)p->lim.max_memory);
    p->mem += bytes;
    return GM_OK;
}

static void *arena_alloc(gm__pickle *p, size_t n) {
    n = (n + 7) & ~(size_t)7;
    chunk *c = p->chunks;
    if (!c || c->cap - c->used < n) {
        /* chunks double up to 32 MiB: small pickles stay small, and big
         * ones take few page faults (huge pages where the kernel allows) */
        size_t cap = c ? (c->cap + sizeof *c) * 2 : ((size_t)64 << 10);
        if (cap > CHUNK_MAX) cap = CHUNK_MAX;
        if (cap < n + sizeof *c) cap = n + sizeof *c;
        bool huge = cap >= 2 * HUGE_PAGE;
        if (huge) cap = (cap + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
        if (mem_charge(p, cap) != GM_OK) return NULL;
        c = huge ? aligned_alloc(HUGE_PAGE, cap) : malloc(cap);
        if (c && huge) madvise(c, cap, MADV_HUGEPAGE);
        cap -= sizeof *c;
        if (!c) {
            gm__set_error(GM_ENOHOSTMEM, "out of host memory reading pickle");
            return NULL;
        }
        c->next = p->chunks;
        c->used = 0;
        c->cap = cap;
        p->chunks = c;
    }
    void *r = c->data + c->used;
    c->used += n;
    return r;
}

/* Grow a malloc'd table to hold `need` elements, charging the memory. */
static int table_grow(gm__pickle *p, void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return GM_OK;
    size_t ncap = *cap ? *cap * 2 : 64;
    while (ncap < need) ncap *= 2;
    if (mem_charge(p, (uint64_t)(ncap - *cap) * elem) != GM_OK) return GM_ENOHOSTMEM;
    void *n = realloc(*arr, ncap * elem);
    if (!n) return gm__set_error(GM_ENOHOSTMEM, "out of host memory reading pickle");
    *arr = n;
    *cap = ncap;
    return GM_OK;
}

void gm__pickle_limits_init(gm__pickle_limits *l) {
    l->max_memory = GM_LIMIT_TRACE_MEMORY;
    l->max_string = GM_LIMIT_DECLARED_LENGTH;
    l->max_input = GM_LIMIT_TRACE_INPUT_BYTES;
}

/* n little-endian bytes at s: the widths opcodes use as one load each (a
 * byte loop was a sixth of reading a snapshot's opcodes) */
static inline uint64_t rd_le(const uint8_t *s, int n) {
    uint16_t h;
    uint32_t w;
    uint64_t v = 0;
    switch (n) {
    case 1: return s[0];
    case 2: memcpy(&h, s, 2); return le16toh(h);
    case 4: memcpy(&w, s, 4); return le32toh(w);
    case 8: memcpy(&v, s, 8); return le64toh(v);
    }
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | s[i];
    return v;
}

/* ---- value constructors ------------------------------------------------ */

static gm__pval mk_int(gm__pickle *p, int64_t i) {
    if (i >= SMALL_MIN && i <= SMALL_MAX) return ((uint64_t)i << 3) | TAG_INT;
    pobj *o = arena_alloc(p, sizeof *o);
    if (!o) return 0;
    o->type = GM__PT_INT;
    o->u.i = i;
    return PV(o);
}

static gm__pval mk_obj(gm__pickle *p, gm__ptype t) {
    if (pv_is_cont(t)) {
        pcont *c = p->free_cont;
        if (c) p->free_cont = (pcont *)(void *)c->o.u.items;
        else if (!(c = arena_alloc(p, sizeof *c))) return 0;
        memset(c, 0, sizeof *c);
        c->o.type = t;
        c->seq = ++p->seq;
        return PV(&c->o);
    }
    pobj *o = arena_alloc(p, sizeof *o);
    if (!o) return 0;
    memset(o, 0, sizeof *o);
    o->type = t;
    return PV(o);
}

/* Item arrays: 2^c items, from class c's free list or the arena. */
static gm__pval *items_alloc(gm__pickle *p, size_t need, uint64_t *cap) {
    int c = need <= 2 ? 1 : 64 - __builtin_clzll((unsigned long long)need - 1); /* 2^c >= need */
    if (c >= ITEM_CLASSES) {
        gm__set_error(GM_ENOHOSTMEM, "pickle container too large");
        return NULL;
    }
    *cap = (uint64_t)1 << c;
    gm__pval *a = p->free_items[c];
    if (a) {
        p->free_items[c] = (gm__pval *)(uintptr_t)a[0];
        return a;
    }
    return arena_alloc(p, ((size_t)1 << c) * sizeof *a);
}

static void items_release(gm__pickle *p, gm__pval *a, uint64_t cap) {
    if (!a || !cap || (cap & (cap - 1))) return;
    int c = __builtin_ctzll(cap); /* a power of two */
    a[0] = (gm__pval)(uintptr_t)p->free_items[c];
    p->free_items[c] = a;
}

/* keyed (idmap.h): a file cannot pick strings that share a probe chain
 * (under the plain FNV-1a this was, crafted strings made the work
 * quadratic: bench/RESULTS.md, "crafted inputs") */
static uint32_t hash_bytes(const uint8_t *s, size_t n) { return (uint32_t)gm__hash_bytes(s, n); }

static int intern_grow(gm__pickle *p) {
    size_t ncap = p->intern_cap ? p->intern_cap * 2 : 1024;
    if (mem_charge(p, ncap * sizeof(pobj *)) != GM_OK) return GM_ENOHOSTMEM;
    pobj **t = calloc(ncap, sizeof *t);
    if (!t) return GM_ENOHOSTMEM;
    for (size_t i = 0; i < p->intern_cap; i++) {
        pobj *o = p->intern[i];
        if (!o) continue;
        size_t j = o->hash & (ncap - 1);
        while (t[j]) j = (j + 1) & (ncap - 1);
        t[j] = o;
    }
    free(p->intern);
    p->intern = t;
    p->intern_cap = ncap;
    return GM_OK;
}

static gm__pval mk_bytes(gm__pickle *p, gm__ptype t, const uint8_t *s, size_t n) {
    uint32_t h = 0;
    size_t slot = 0;
    size_t ri = n ? (n * 31 + s[0] * 7 + s[n - 1]) % RECENT : 0;
    if (t == GM__PT_STR && n <= RECENT_MAX) { /* before the keyed hash: 'N/A' for every event */
        pobj *o = p->recent[ri];
        if (o && o->len == n && memcmp(o->u.s, s, n) == 0) return PV(o);
    }
    if (t == GM__PT_STR && n <= INTERN_MAX) {
        if (p->intern_count * 2 >= p->intern_cap && intern_grow(p) != GM_OK) return 0;
        h = hash_bytes(s, n);
        slot = h & (p->intern_cap - 1);
        for (pobj *o; (o = p->intern[slot]) != NULL; slot = (slot + 1) & (p->intern_cap - 1), gm__work_steps++)
            if (o->hash == h && o->len == n && memcmp(o->u.s, s, n) == 0) {
                if (n <= RECENT_MAX) p->recent[ri] = o;
                return PV(o);
            }
    }
    pobj *o = arena_alloc(p, sizeof *o + n + 1);
    if (!o) return 0;
    o->type = t;
    o->hash = h;
    o->len = n;
    o->cap = 0;
    o->u.s = (char *)(o + 1);
    if (n) memcpy(o->u.s, s, n);
    o->u.s[n] = '\0';
    if (t == GM__PT_STR && n <= INTERN_MAX) {
        p->intern[slot] = o;
        p->intern_count++;
        if (n <= RECENT_MAX) p->recent[ri] = o;
    }
    return PV(o);
}

/* Append n values to a container's item array (doubling), counting the
 * references to containers among them (and marking o as holding one). */
static int cont_append(gm__pickle *p, pobj *o, const gm__pval *v, size_t n) {
    size_t per = o->type == GM__PT_DICT ? 2 : 1;
    size_t need_items = (size_t)(o->len * per) + n;
    if (need_items > o->cap) {
        uint64_t ncap;
        gm__pval *ni = items_alloc(p, need_items, &ncap);
        if (!ni) return GM_ENOHOSTMEM;
        if (o->len) memcpy(ni, o->u.items, (size_t)(o->len * per) * sizeof *ni);
        items_release(p, o->u.items, o->cap);
        o->u.items = ni;
        o->cap = ncap;
    }
    memcpy(o->u.items + o->len * per, v, n * sizeof *v);
    o->len += n / per;
    for (size_t i = 0; i < n; i++)
        if (pv_cont(v[i])) {
            PC(PV(o))->flags |= PC_HOLDS;
            if (PO(v[i])->hash != UINT32_MAX) PO(v[i])->hash++;
        }
    return GM_OK;
}

static gm__pval mk_cont(gm__pickle *p, gm__ptype t, const gm__pval *v, size_t n) {
    gm__pval c = mk_obj(p, t);
    if (c && n && cont_append(p, PO(c), v, n) != GM_OK) return 0;
    return c;
}

static gm__pval mk_opaque(gm__pickle *p, const char *name) {
    gm__pval o = mk_obj(p, GM__PT_OPAQUE);
    if (o) PO(o)->u.name = name ? name : "?";
    return o;
}

/* ---- the opcode loop --------------------------------------------------- */

static const char *op_name(uint8_t op) {
    switch (op) {
    case 0x80: return "PROTO"; case 0x95: return "FRAME"; case '.': return "STOP";
    case '(': return "MARK"; case '0': return "POP"; case '1': return "POP_MARK";
    case '2': return "DUP"; case '}': return "EMPTY_DICT"; case ']': return "EMPTY_LIST";
    case ')': return "EMPTY_TUPLE"; case 0x8f: return "EMPTY_SET"; case 'N': return "NONE";
    case 0x88: return "NEWTRUE"; case 0x89: return "NEWFALSE"; case 'K': return "BININT1";
    case 'M': return "BININT2"; case 'J': return "BININT"; case 0x8a: return "LONG1";
    case 0x8b: return "LONG4"; case 'G': return "BINFLOAT"; case 0x8c: return "SHORT_BINUNICODE";
    case 'X': return "BINUNICODE"; case 0x8d: return "BINUNICODE8"; case 'C': return "SHORT_BINBYTES";
    case 'B': return "BINBYTES"; case 0x8e: return "BINBYTES8"; case 0x96: return "BYTEARRAY8";
    case 'U': return "SHORT_BINSTRING"; case 'T': return "BINSTRING"; case 0x94: return "MEMOIZE";
    case 'q': return "BINPUT"; case 'r': return "LONG_BINPUT"; case 'h': return "BINGET";
    case 'j': return "LONG_BINGET"; case 'u': return "SETITEMS"; case 's': return "SETITEM";
    case 'a': return "APPEND"; case 'e': return "APPENDS"; case 0x90: return "ADDITEMS";
    case 'l': return "LIST"; case 't': return "TUPLE"; case 'd': return "DICT";
    case 0x91: return "FROZENSET"; case 0x85: return "TUPLE1"; case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3"; case 'c': return "GLOBAL"; case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE"; case 0x81: return "NEWOBJ"; case 0x92: return "NEWOBJ_EX";
    case 'b': return "BUILD"; case 'P': return "PERSID"; case 'Q': return "BINPERSID";
    case 0x82: return "EXT1"; case 0x83: return "EXT2"; case 0x84: return "EXT4";
    case 0x97: return "NEXT_BUFFER"; case 0x98: return "READONLY_BUFFER";
    case 'I': return "INT"; case 'L': return "LONG"; case 'F': return "FLOAT";
    case 'S': return "STRING"; case 'V': return "UNICODE"; case 'p': return "PUT";
    case 'g': return "GET"; case 'i': return "INST"; case 'o': return "OBJ";
    }
    return NULL;
}

static int op_err(const gm__input *r, uint64_t at, uint8_t op, const char *what) {
    const char *n = op_name(op);
    /* a pickle cut short by a broken gzip stream: say what broke */
    if (r->zerr) return gm__input_error(r);
    return gm__set_error(GM_EFORMAT, "malformed pickle at byte %llu (%s): %s",
                         (unsigned long long)at, n ? n : "?", what);
}

static inline int push(gm__pickle *p, gm__pval v) {
    if (!v) return GM_ENOHOSTMEM; /* the constructor set the detail */
    if (p->sp == p->stack_cap &&
        table_grow(p, (void **)&p->stack, &p->stack_cap, p->sp + 1, sizeof *p->stack) != GM_OK)
        return GM_ENOHOSTMEM;
    p->stack[p->sp++] = v;
    return GM_OK;
}

static inline size_t stack_floor(const gm__pickle *p) {
    return p->nmarks ? p->marks[p->nmarks - 1].sp : 0;
}

static gm__pval mk_long(gm__pickle *p, const uint8_t *b, size_t n) {
    if (n == 0) return mk_int(p, 0);
    if (n == 9 && b[8] == 0 && (b[7] & 0x80)) {
        /* [2^63, 2^64): a uint64 (addresses, sizes, streams; gpumem's own
         * snapshot writer writes them so), kept as its bit pattern */
        return mk_int(p, (int64_t)rd_le(b, 8));
    }
    if (n > 8) {
        /* fits only if the extra bytes are pure sign extension */
        uint8_t ext = (b[7] & 0x80) ? 0xFF : 0x00;
        for (size_t i = 8; i < n; i++)
            if (b[i] != ext) return mk_obj(p, GM__PT_BIGINT);
        n = 8;
    }
    uint64_t v = rd_le(b, (int)n);
    if (n < 8 && (b[n - 1] & 0x80)) v |= ~(uint64_t)0 << (8 * n);
    return mk_int(p, (int64_t)v);
}

static gm__pval mk_float_be(gm__pickle *p, const uint8_t *b) {
    uint64_t bits = 0;
    for (int i = 0; i < 8; i++) bits = (bits << 8) | b[i];
    gm__pval v = mk_obj(p, GM__PT_FLOAT);
    if (v) memcpy(&PO(v)->u.f, &bits, sizeof bits);
    return v;
}

static int memo_put(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op, uint64_t idx) {
    /* a real pickler numbers memo entries in order, so an index never
     * exceeds the bytes read so far: this bounds the memo by the input */
    if (idx > at) return op_err(r, at, op, "memo index larger than the input so far");
    if (idx >= p->memo_cap) {
        size_t old = p->memo_cap;
        if (table_grow(p, (void **)&p->memo, &p->memo_cap, (size_t)idx + 1, sizeof *p->memo))
            return GM_ENOHOSTMEM;
        memset(p->memo + old, 0, (p->memo_cap - old) * sizeof *p->memo);
    }
    gm__pval old = p->memo[idx], v = p->stack[p->sp - 1];
    if (!old) p->memo_count++;
    else if (pv_cont(old) && PC(old)->memo == idx + 1) PC(old)->memo = 0;
    if (pv_cont(v)) PC(v)->memo = PC(v)->memo ? UINT64_MAX : idx + 1;
    p->memo[idx] = v;
    return GM_OK;
}

/* BININT1/2 (n bytes, unsigned), BININT (4, signed) */
static inline int op_int(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op, int n) {
    if (!gm__input_need(r, (size_t)n)) return op_err(r, at, op, "truncated");
    uint64_t v = rd_le(r->p, n);
    r->p += n;
    return push(p, mk_int(p, op == 'J' ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v));
}

/* BINPUT, LONG_BINPUT, BINGET, LONG_BINGET: an n-byte memo index */
static inline int op_memo(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op, int n) {
    if (!gm__input_need(r, (size_t)n)) return op_err(r, at, op, "truncated");
    uint64_t idx = rd_le(r->p, n);
    r->p += n;
    if (op == 'q' || op == 'r') return memo_put(p, r, at, op, idx);
    if (idx >= p->memo_cap || !p->memo[idx]) return op_err(r, at, op, "memo key not found");
    return push(p, p->memo[idx]);
}

/* str/bytes opcodes: `lb` length bytes, then the data. */
static int op_blob(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op, int lb, gm__ptype t) {
    if (!gm__input_need(r, (size_t)lb)) return op_err(r, at, op, "truncated length");
    uint64_t n = rd_le(r->p, lb);
    if (op == 'T' && (n & 0x80000000u)) return op_err(r, at, op, "negative length");
    if (n > p->lim.max_string) return op_err(r, at, op, "declared length exceeds the limit (GM_LIMIT_DECLARED_LENGTH)");
    r->p += lb;
    if (!gm__input_need(r, (size_t)n)) return op_err(r, at, op, "truncated data");
    int rc = push(p, mk_bytes(p, t, r->p, (size_t)n));
    r->p += n;
    return rc;
}

static int read_line(gm__input *r, size_t *len) {
    for (size_t n = 0; n < 1024; n++) {
        if (!gm__input_need(r, n + 1)) return -1;
        if (r->p[n] == '\n') {
            *len = n;
            return 0;
        }
    }
    return -1;
}

static int op_global(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op) {
    char name[2100];
    size_t m, n;
    if (read_line(r, &m) != 0) return op_err(r, at, op, "bad module line");
    memcpy(name, r->p, m);
    r->p += m + 1;
    name[m] = '.';
    if (read_line(r, &n) != 0) return op_err(r, at, op, "bad name line");
    memcpy(name + m + 1, r->p, n);
    r->p += n + 1;
    gm__pval s = mk_bytes(p, GM__PT_STR, (const uint8_t *)name, m + 1 + n);
    return s ? push(p, mk_opaque(p, PO(s)->u.s)) : GM_ENOHOSTMEM;
}

static int op_stack_global(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op) {
    size_t ml = 0, nl = 0;
    const char *mod = gm__pv_str(p->stack[p->sp - 2], &ml);
    const char *nm = gm__pv_str(p->stack[p->sp - 1], &nl);
    if (!mod || !nm || ml + nl > 2048) return op_err(r, at, op, "module and name must be str");
    char name[2100];
    memcpy(name, mod, ml);
    name[ml] = '.';
    memcpy(name + ml + 1, nm, nl);
    gm__pval s = mk_bytes(p, GM__PT_STR, (const uint8_t *)name, ml + 1 + nl);
    p->sp -= 2;
    return s ? push(p, mk_opaque(p, PO(s)->u.s)) : GM_ENOHOSTMEM;
}

/* ---- streaming (pickle.h's sink) ------------------------------------------ */

/* Ask the sink whether it takes the list at stack position t, at the list's
 * first APPEND(S): the list it goes into is the one below it (APPEND of a
 * single item), or the one below the MARK under it (a batch of siblings). */
static int stream_claim(gm__pickle *p, size_t t) {
    pcont *c = PC(p->stack[t]);
    c->flags |= PC_CHECKED;
    size_t x = p->nmarks, o = SIZE_MAX; /* o: the outer list's position */
    for (int k = 0; x > 0 && k < 4 && p->marks[x - 1].sp > t; k++) x--;
    size_t m = x > 0 && p->marks[x - 1].sp <= t ? p->marks[x - 1].sp : 0; /* the siblings start at m */
    if (m >= 1 && pv_type(p->stack[m - 1]) == GM__PT_LIST) {
        o = m - 1;
    } else if (t >= 1 && pv_type(p->stack[t - 1]) == GM__PT_LIST) {
        o = t - 1;
        m = t;
    }
    if (o == SIZE_MAX || c->o.len) return GM_OK;
    bool take = false;
    size_t index = (size_t)PO(p->stack[o])->len + (t - m);
    int rc = p->sink->claim(p->sink->ctx, p, p->stack[t], p->stack[o], o ? p->stack[o - 1] : 0, index, &take);
    if (!rc && take) c->flags |= PC_STREAMED;
    return rc;
}

static bool releasable(const gm__pval v, uint64_t seq) {
    if (!pv_cont(v)) return false;
    const pcont *c = PC(v);
    return c->seq > seq && c->o.hash == 0 && c->memo != UINT64_MAX && c->tag &&
           !(c->flags & (PC_QUEUED | PC_STREAMED));
}

static int work_push(gm__pickle *p, gm__pval v) {
    if (table_grow(p, (void **)&p->work, &p->work_cap, p->nwork + 1, sizeof *p->work)) return GM_ENOHOSTMEM;
    PC(v)->flags |= PC_QUEUED;
    p->work[p->nwork++] = v;
    return GM_OK;
}

/* After the sink converted a batch (items made after the MARK of `seq`):
 * release what nothing else holds, and what only released ones held. */
static int stream_release(gm__pickle *p, const gm__pval *items, size_t n, uint64_t seq) {
    for (size_t i = 0; i < n; i++)
        if (releasable(items[i], seq) && work_push(p, items[i])) return GM_ENOHOSTMEM;
    while (p->nwork) {
        gm__pval v = p->work[--p->nwork];
        pcont *c = PC(v);
        size_t k = c->flags & PC_HOLDS ? (size_t)(c->o.len * (c->o.type == GM__PT_DICT ? 2 : 1)) : 0;
        for (size_t i = 0; i < k; i++) {
            gm__pval e = c->o.u.items[i];
            if (!pv_cont(e) || PO(e)->hash == UINT32_MAX) continue;
            PO(e)->hash--;
            if (releasable(e, seq) && work_push(p, e)) return GM_ENOHOSTMEM;
        }
        if (c->memo) p->memo[c->memo - 1] = (c->tag << 3) | TAG_CONV;
        items_release(p, c->o.u.items, c->o.cap);
        c->o.type = GM__PT_ABSENT;
        c->o.u.items = (gm__pval *)(void *)p->free_cont;
        p->free_cont = c;
    }
    return GM_OK;
}

/* SETITEM(S)/APPEND(S)/ADDITEMS into `target` (opaque targets swallow). */
static int op_fill(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op, gm__pval target,
                   const gm__pval *v, size_t n, gm__ptype want) {
    gm__ptype t = pv_type(target);
    if (t == GM__PT_OPAQUE) return GM_OK;
    if (t != want) {
        char msg[80];
        snprintf(msg, sizeof msg, "target is a %s, not a %s", gm__pv_type_name(target),
                 want == GM__PT_DICT ? "dict" : want == GM__PT_SET ? "set" : "list");
        return op_err(r, at, op, msg);
    }
    if (want == GM__PT_DICT && (n & 1)) return op_err(r, at, op, "odd number of items");
    if (PC(target)->tag && !(PC(target)->flags & PC_STREAMED))
        return op_err(r, at, op, "changes a container already converted (a snapshot's event or frames)");
    return n ? cont_append(p, PO(target), v, n) : GM_OK;
}

/* APPEND(S) into the list at stack position t: streamed or stored. seq:
 * the batch's MARK (UINT64_MAX: APPEND, no batch; nothing is released). */
static int op_append(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op, size_t t, const gm__pval *v,
                     size_t n, uint64_t seq) {
    gm__pval target = p->stack[t];
    if (p->sink && pv_type(target) == GM__PT_LIST) {
        if (!(PC(target)->flags & PC_CHECKED)) {
            int rc = stream_claim(p, t);
            if (rc) return rc;
        }
        if (PC(target)->flags & PC_STREAMED) {
            p->rd = r;
            int rc = p->sink->items(p->sink->ctx, p, target, v, n);
            return rc ? rc : stream_release(p, v, n, seq);
        }
    }
    return op_fill(p, r, at, op, target, v, n, GM__PT_LIST);
}

/* Pop to the last MARK; *k is where the items start, *seq what was made before it. */
static int pop_mark(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op, size_t *k, uint64_t *seq) {
    if (!p->nmarks) return op_err(r, at, op, "no MARK on the stack");
    p->nmarks--;
    *k = p->marks[p->nmarks].sp;
    if (seq) *seq = p->marks[p->nmarks].seq;
    return GM_OK;
}

static int op_marked(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op) {
    size_t k = 0;
    uint64_t seq = 0;
    int rc = pop_mark(p, r, at, op, &k, &seq);
    if (rc) return rc;
    size_t n = p->sp - k;
    gm__pval *items = p->stack ? p->stack + k : NULL; /* MARK on a never-used stack */
    gm__ptype want = op == 'u' ? GM__PT_DICT : op == 0x90 ? GM__PT_SET : GM__PT_LIST;
    if (op == 'u' || op == 'e' || op == 0x90) {
        if (k <= stack_floor(p)) return op_err(r, at, op, "no container below the MARK");
        rc = op == 'e' ? op_append(p, r, at, op, k - 1, items, n, seq)
                       : op_fill(p, r, at, op, p->stack[k - 1], items, n, want);
        p->sp = k;
        return rc;
    }
    gm__ptype t = op == 't' ? GM__PT_TUPLE : op == 'd' ? GM__PT_DICT
                : op == 0x91 ? GM__PT_SET : GM__PT_LIST;
    if (t == GM__PT_DICT && (n & 1)) return op_err(r, at, op, "odd number of items");
    gm__pval c = mk_cont(p, t, items, n);
    p->sp = k;
    return push(p, c);
}

/* Number of values an opcode pops from above the current MARK (a table:
 * a switch here was a second indirect jump per opcode). */
static const uint8_t op_arity[256] = {
    ['.'] = 1, ['2'] = 1, [0x94] = 1, ['q'] = 1, ['r'] = 1, [0x85] = 1,
    ['s'] = 3, [0x87] = 3, [0x92] = 3,
    ['a'] = 2, [0x86] = 2, [0x93] = 2, ['R'] = 2, [0x81] = 2, ['b'] = 2,
};

static int run_one(gm__pickle *p, gm__input *r, uint64_t at, uint8_t op) {
    const uint8_t *a;
    switch (op) {
    case 0x80:
        if (!gm__input_need(r, 1)) return op_err(r, at, op, "truncated");
        if (*r->p > 5) return op_err(r, at, op, "unsupported protocol (above 5)");
        r->p++;
        return GM_OK;
    case 0x95:
        if (!gm__input_need(r, 8)) return op_err(r, at, op, "truncated");
        r->p += 8;
        return GM_OK;
    case '(':
        if (table_grow(p, (void **)&p->marks, &p->marks_cap, p->nmarks + 1, sizeof *p->marks))
            return GM_ENOHOSTMEM;
        p->marks[p->nmarks++] = (struct pmark){p->sp, p->seq};
        return GM_OK;
    case '0':
        if (p->sp > stack_floor(p)) p->sp--;
        else if (p->nmarks) p->nmarks--;
        else return op_err(r, at, op, "stack underflow");
        return GM_OK;
    case '1': {
        size_t k = 0;
        int rc = pop_mark(p, r, at, op, &k, NULL);
        if (!rc) p->sp = k;
        return rc;
    }
    case '2': return push(p, p->stack[p->sp - 1]);
    case '}': return push(p, mk_obj(p, GM__PT_DICT));
    case ']': return push(p, mk_obj(p, GM__PT_LIST));
    case ')': return push(p, mk_obj(p, GM__PT_TUPLE));
    case 0x8f: return push(p, mk_obj(p, GM__PT_SET));
    case 'N': return push(p, PV_NONE);
    case 0x88: return push(p, PV_TRUE);
    case 0x89: return push(p, PV_FALSE);
    case 'K': return op_int(p, r, at, op, 1);
    case 'M': return op_int(p, r, at, op, 2);
    case 'J': return op_int(p, r, at, op, 4);
    case 0x8a: case 0x8b: {
        int lb = op == 0x8a ? 1 : 4;
        if (!gm__input_need(r, (size_t)lb)) return op_err(r, at, op, "truncated length");
        uint64_t n = rd_le(r->p, lb);
        if (op == 0x8b && (n & 0x80000000u)) return op_err(r, at, op, "negative length");
        if (n > p->lim.max_string) return op_err(r, at, op, "declared length exceeds the limit (GM_LIMIT_DECLARED_LENGTH)");
        r->p += lb;
        if (!gm__input_need(r, (size_t)n)) return op_err(r, at, op, "truncated data");
        a = r->p;
        r->p += n;
        return push(p, mk_long(p, a, (size_t)n));
    }
    case 'G':
        if (!gm__input_need(r, 8)) return op_err(r, at, op, "truncated");
        a = r->p;
        r->p += 8;
        return push(p, mk_float_be(p, a));
    case 0x8c: return op_blob(p, r, at, op, 1, GM__PT_STR);
    case 'X': return op_blob(p, r, at, op, 4, GM__PT_STR);
    case 0x8d: return op_blob(p, r, at, op, 8, GM__PT_STR);
    case 'C': case 'U': return op_blob(p, r, at, op, 1, GM__PT_BYTES);
    case 'B': case 'T': return op_blob(p, r, at, op, 4, GM__PT_BYTES);
    case 0x8e: case 0x96: return op_blob(p, r, at, op, 8, GM__PT_BYTES);
    case 0x94: return memo_put(p, r, at, op, p->memo_count);
    case 'q': case 'h': return op_memo(p, r, at, op, 1);
    case 'r': case 'j': return op_memo(p, r, at, op, 4);
    case 'u': case 'e': case 0x90: case 'l': case 't': case 'd': case 0x91:
        return op_marked(p, r, at, op);
    case 's':
        p->sp -= 2;
        return op_fill(p, r, at, op, p->stack[p->sp - 1], p->stack + p->sp, 2, GM__PT_DICT);
    case 'a':
        p->sp -= 1;
        return op_append(p, r, at, op, p->sp - 1, p->stack + p->sp, 1, UINT64_MAX);
    case 0x85: case 0x86: case 0x87: {
        size_t n = (size_t)(op - 0x84);
        gm__pval c = mk_cont(p, GM__PT_TUPLE, p->stack + p->sp - n, n);
        p->sp -= n;
        return push(p, c);
    }
    case 'c': return op_global(p, r, at, op);
    case 0x93: return op_stack_global(p, r, at, op);
    case 'R': case 0x81: case 0x92: {
        /* never call anything: the result is an opaque stand-in */
        p->sp -= op == 0x92 ? 2 : 1;
        const char *nm = gm__pv_opaque_name(p->stack[p->sp - 1]);
        gm__pval o = mk_opaque(p, nm);
        if (!o) return GM_ENOHOSTMEM;
        p->stack[p->sp - 1] = o;
        return GM_OK;
    }
    case 'b': p->sp--; return GM_OK; /* the state is ignored; the object stays opaque */
    }
    const char *n = op_name(op);
    char msg[96];
    if (n) snprintf(msg, sizeof msg, "opcode not supported by this safe reader");
    else snprintf(msg, sizeof msg, "unknown opcode 0x%02x", op);
    return op_err(r, at, op, msg);
}

static int run_ops(gm__pickle *p, gm__input *r) {
    for (;;) {
        if (!gm__input_need(r, 1)) {
            if (r->base + (uint64_t)(r->end - r->wbase) > p->lim.max_input)
                return gm__set_error(GM_EFORMAT, "pickle larger than the input limit (%llu decompressed "
                                     "bytes, GM_LIMIT_TRACE_INPUT_BYTES)", (unsigned long long)p->lim.max_input);
            if (r->zerr) return gm__input_error(r);
            return gm__set_error(GM_EFORMAT, "truncated pickle at byte %llu: no STOP opcode",
                                 (unsigned long long)gm__input_offset(r, r->p));
        }
        const uint8_t *q = r->p;
        /* (LONG_)BINGET, every second opcode of a snapshot (its keys and
         * action names are memo references): at once when its argument is
         * in the window, the entry is set and the stack has room, as
         * run_one would (test_unpickle: test_memo_get_window) */
        if ((*q == 'h' || *q == 'j') && r->end - q >= 5) {
            int n = *q == 'h' ? 1 : 4;
            uint64_t idx = n == 1 ? q[1] : rd_le(q + 1, 4);
            gm__pval v = idx < p->memo_cap ? p->memo[idx] : 0;
            if (v && p->sp < p->stack_cap) {
                p->stack[p->sp++] = v;
                r->p = q + 1 + n;
                continue;
            }
        }
        uint64_t at = gm__input_offset(r, q);
        uint8_t op = *r->p++;
        int arity = op_arity[op];
        if (arity && p->sp - stack_floor(p) < (size_t)arity)
            return op_err(r, at, op, "stack underflow");
        if (op == '.') {
            p->root = p->stack[p->sp - 1];
            p->consumed = gm__input_offset(r, r->p);
            return gm__input_finish(r);
        }
        int rc = run_one(p, r, at, op);
        if (rc) return rc;
    }
}

/* ---- public entry points ----------------------------------------------- */

static void pickle_free_tables(gm__pickle *p) {
    free(p->stack);
    free(p->marks);
    free(p->memo);
    free(p->intern);
    free(p->work);
    p->stack = NULL;
    p->marks = NULL;
    p->memo = NULL;
    p->intern = NULL;
    p->work = NULL;
}

void gm__pickle_free(gm__pickle *p) {
    if (!p) return;
    pickle_free_tables(p);
    for (chunk *c = p->chunks, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(p);
}

int gm__pickle_load_sink(FILE *in, const void *head, size_t len, const gm__pickle_limits *limits,
                         const gm__pickle_sink *sink, gm__pickle **out) {
    *out = NULL;
    if (!head && len) return gm__set_error(GM_EINVAL, "no input");
    gm__pickle *p = calloc(1, sizeof *p);
    if (!p) return GM_ENOHOSTMEM;
    if (limits) p->lim = *limits;
    else gm__pickle_limits_init(&p->lim);
    p->sink = sink && sink->claim && sink->items ? sink : NULL;
    gm__input r;
    int rc = gm__input_open(&r, in, head, len, p->lim.max_input);
    if (!rc) rc = run_ops(p, &r);
    gm__input_close(&r);
    p->rd = NULL;
    pickle_free_tables(p);
    if (rc != GM_OK) {
        gm__pickle_free(p);
        return rc;
    }
    *out = p;
    return GM_OK;
}

int gm__pickle_load_stream(FILE *in, const void *head, size_t len, const gm__pickle_limits *limits,
                           gm__pickle **out) {
    return gm__pickle_load_sink(in, head, len, limits, NULL, out);
}

int gm__pickle_load(const void *data, size_t len, const gm__pickle_limits *limits, gm__pickle **out) {
    return gm__pickle_load_sink(NULL, data, len, limits, NULL, out);
}

gm__pval gm__pickle_root(const gm__pickle *p) { return p ? p->root : 0; }
uint64_t gm__pickle_arena_bytes(const gm__pickle *p) {
    uint64_t n = 0;
    for (const chunk *c = p ? p->chunks : NULL; c; c = c->next) n += c->cap;
    return n;
}

uint64_t gm__pickle_input_bytes(const gm__pickle *p) {
    if (!p) return 0;
    return p->rd ? gm__input_offset(p->rd, p->rd->p) : p->consumed;
}
