/* gmt.c — gpumem's own trace format (.gmt), specified in docs/trace-format.md:
 * a 24-byte header (magic, version, flags, body length) and a zlib-compressed
 * body of LEB128 varints: string table, frames, stacks, final segments, and
 * the events with delta-encoded addresses and times. About 4 bytes per event
 * before compression instead of a pickle's ~70; loads without any unpickling.
 *
 * The decoder trusts nothing: every count is checked against the bytes left,
 * every index goes through the trace builder's checks. */
#include "trace.h"

#include "util/idmap.h"
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define HEADER_SIZE 24

/* ---- encoding ---------------------------------------------------------- */

typedef struct wbuf {
    uint8_t *b;
    size_t n, cap;
    bool fail;
} wbuf;

static void w_reserve(wbuf *w, size_t more) {
    if (w->fail || w->n + more <= w->cap) return;
    size_t ncap = w->cap ? w->cap * 2 : 4096;
    while (ncap < w->n + more) ncap *= 2;
    uint8_t *nb = realloc(w->b, ncap);
    if (!nb) {
        w->fail = true;
        return;
    }
    w->b = nb;
    w->cap = ncap;
}

static void w_var(wbuf *w, uint64_t v) {
    w_reserve(w, 10);
    if (w->fail) return;
    while (v >= 0x80) {
        w->b[w->n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    w->b[w->n++] = (uint8_t)v;
}

static uint64_t zz(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }
static int64_t unzz(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

static void w_bytes(wbuf *w, const void *p, size_t n) {
    w_var(w, n);
    w_reserve(w, n);
    if (w->fail) return;
    memcpy(w->b + w->n, p, n);
    w->n += n;
}

enum { EV_STREAM = 0x10, EV_DEVICE = 0x20, EV_STACK = 0x40 };

static void encode_body(const gm_trace *t, wbuf *w) {
    w_var(w, t->nstrings);
    w_var(w, t->nframes);
    w_var(w, t->nstacks);
    w_var(w, t->nsegments);
    w_var(w, t->nevents);
    w_var(w, t->has_settings ? 1 : 0);
    for (uint32_t i = 0; i < t->nstrings; i++) w_bytes(w, t->strings[i], strlen(t->strings[i]));
    for (uint32_t i = 0; i < t->nframes; i++) {
        w_var(w, t->frames[i].name);
        w_var(w, t->frames[i].filename);
        w_var(w, zz(t->frames[i].line));
    }
    for (uint32_t s = 0; s < t->nstacks; s++) {
        uint32_t a = t->stack_off[s], b = t->stack_off[s + 1];
        w_var(w, b - a);
        for (uint32_t i = a; i < b; i++) w_var(w, t->stack_frames[i]);
    }
    if (t->has_settings) {
        const char *c = t->alloc_conf ? t->alloc_conf : "";
        w_bytes(w, c, strlen(c));
    }
    for (size_t i = 0; i < t->nsegments; i++) {
        const gm_trace_segment *g = &t->segments[i];
        w_var(w, g->device);
        w_var(w, g->address);
        w_var(w, g->total_size);
        w_var(w, g->allocated_size);
        w_var(w, g->requested_size);
        w_var(w, g->stream);
        w_var(w, g->nblocks);
        bool pooled = g->pool_id[0] || g->pool_id[1];
        w_var(w, (g->large ? 1u : 0u) | (g->expandable ? 2u : 0u) | (pooled ? 4u : 0u));
        if (pooled) {
            w_var(w, g->pool_id[0]);
            w_var(w, g->pool_id[1]);
        }
    }
    uint64_t addr = 0, stream = 0;
    int64_t time = 0;
    unsigned device = 0;
    for (size_t i = 0; i < t->nevents; i++) {
        const gm_trace_event *e = &t->events[i];
        unsigned head = e->action | (e->stream != stream ? EV_STREAM : 0) |
                        (e->device != device ? EV_DEVICE : 0) | (e->stack ? EV_STACK : 0);
        w_var(w, head);
        if (head & EV_DEVICE) w_var(w, e->device);
        w_var(w, zz((int64_t)(e->addr - addr)));
        w_var(w, e->size);
        if (head & EV_STREAM) w_var(w, e->stream);
        /* modular difference: defined for any two times, and the decoder's
         * modular sum gives the time back exactly */
        w_var(w, zz((int64_t)((uint64_t)e->time_us - (uint64_t)time)));
        if (head & EV_STACK) w_var(w, e->stack);
        addr = e->addr;
        stream = e->stream;
        time = e->time_us;
        device = e->device;
    }
    w_var(w, t->nevents); /* trailer: a cheap end-of-body check */
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int gm__trace_encode_gmt(const gm_trace *t, uint8_t **out, size_t *outlen) {
    *out = NULL;
    *outlen = 0;
    wbuf w = {0};
    encode_body(t, &w);
    if (w.fail) {
        free(w.b);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory encoding a trace");
    }
    if (w.n > GM_LIMIT_GMT_BODY) { /* the reader would refuse it: never write it */
        free(w.b);
        return gm__set_error(GM_EFORMAT, "the trace's .gmt body would be %zu bytes, more than "
                             "GM_LIMIT_GMT_BODY (%llu)", w.n, (unsigned long long)GM_LIMIT_GMT_BODY);
    }
    uLong bound = compressBound((uLong)w.n);
    uint8_t *o = malloc(HEADER_SIZE + bound);
    if (!o) {
        free(w.b);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory encoding a trace");
    }
    memcpy(o, GM_TRACE_MAGIC, 8);
    put_le(o + 8, GM_TRACE_VERSION, 4);
    put_le(o + 12, 0, 4); /* flags: none defined */
    put_le(o + 16, w.n, 8);
    uLongf clen = bound;
    int zr = compress2(o + HEADER_SIZE, &clen, w.b ? w.b : (const Bytef *)"", (uLong)w.n, 6);
    free(w.b);
    if (zr != Z_OK) {
        free(o);
        return gm__set_error(GM_ENOHOSTMEM, "zlib compression failed (%d)", zr);
    }
    *out = o;
    *outlen = HEADER_SIZE + clen;
    return GM_OK;
}

int gm__trace_write_gmt(const gm_trace *t, const char *path) {
    uint8_t *buf;
    size_t len;
    int rc = gm__trace_encode_gmt(t, &buf, &len);
    if (rc) return rc;
    rc = gm__write_file(path, buf, len, false);
    free(buf);
    return rc;
}

/* ---- decoding ----------------------------------------------------------
 * The body is inflated into a window as the decoder reads it, never whole:
 * memory is the window (the longest string, at most
 * GM_LIMIT_DECLARED_LENGTH) plus the trace being built, and a header that
 * lies about the body, a bomb of zeros or padding after the zlib stream is
 * refused at the first byte that disagrees, before anything large is
 * allocated. Counts are checked against the body bytes the header declares
 * and the inflated body must be exactly that long. */

#define WINDOW ((size_t)256 << 10)

typedef struct rbuf {
    const uint8_t *p, *end; /* the window: buf[0 .. end) */
    uint8_t *buf;
    size_t bufcap;
    uint64_t pos0, body, produced; /* body offset of buf[0]; declared; inflated so far */
    bool bad, zend;
    int zr; /* zlib's last status when it failed */
    z_stream z;
    FILE *in;
    uint8_t *ibuf;
    bool ieof, ierr;
    uint64_t iread;
} rbuf;

static void in_fill(rbuf *r) {
    if (r->z.avail_in || !r->in || r->ieof) return;
    if (!r->ibuf && !(r->ibuf = malloc(WINDOW))) {
        r->ieof = r->ierr = true;
        return;
    }
    size_t k = fread(r->ibuf, 1, WINDOW, r->in);
    r->iread += k;
    if (!k) {
        r->ieof = true;
        r->ierr = ferror(r->in) != 0;
    }
    r->z.next_in = r->ibuf;
    r->z.avail_in = (uInt)k;
}

/* Inflate into out[0..room) (room never passes the declared body). */
static size_t r_inflate(rbuf *r, uint8_t *out, size_t room) {
    size_t got = 0;
    while (got < room && !r->zend) {
        in_fill(r);
        r->z.next_out = out + got;
        r->z.avail_out = (uInt)(room - got > UINT32_MAX ? UINT32_MAX : room - got);
        uInt before = r->z.avail_out;
        int zr = inflate(&r->z, Z_NO_FLUSH);
        got += before - r->z.avail_out;
        bool no_input = !r->z.avail_in && (!r->in || r->ieof);
        if (zr == Z_STREAM_END) r->zend = true;
        else if ((zr != Z_OK && zr != Z_BUF_ERROR) || (zr == Z_BUF_ERROR && no_input)) {
            r->zend = true;
            r->zr = zr == Z_OK ? Z_BUF_ERROR : zr;
        }
    }
    r->produced += got;
    gm__work_steps += got; /* inflating is work per byte too (idmap.h) */
    return got;
}

/* Make n bytes readable at p. */
static bool r_need(rbuf *r, size_t n) {
    size_t have = (size_t)(r->end - r->p);
    if (have >= n) return true;
    if (n > r->body - (r->pos0 + (uint64_t)(r->p - r->buf))) return false; /* past the declared body */
    size_t off = (size_t)(r->p - r->buf);
    size_t want = n > WINDOW ? n : WINDOW;
    if (want > r->bufcap) {
        uint8_t *nb = realloc(r->buf, want);
        if (!nb) return false;
        r->buf = nb;
        r->bufcap = want;
    }
    memmove(r->buf, r->buf + off, have);
    r->pos0 += off;
    uint64_t rest = r->body - r->produced;
    size_t room = r->bufcap - have;
    if (room > rest) room = (size_t)rest;
    have += r_inflate(r, r->buf + have, room);
    r->p = r->buf;
    r->end = r->buf + have;
    return have >= n;
}

static uint64_t r_var(rbuf *r) {
    uint64_t v = 0;
    for (int sh = 0; sh < 64; sh += 7) {
        if (r->p >= r->end && !r_need(r, 1)) {
            r->bad = true;
            return 0;
        }
        uint8_t c = *r->p++;
        v |= (uint64_t)(c & 0x7F) << sh;
        if (!(c & 0x80)) return v;
    }
    r->bad = true;
    return 0;
}

static uint64_t r_off(const rbuf *r) { return r->pos0 + (uint64_t)(r->p - r->buf); }

static int bad(const rbuf *r, const char *what) {
    if (r->ierr) return gm__set_error(GM_EIO, "error reading the gmt trace after %llu bytes",
                                      (unsigned long long)r->iread);
    if (r->zr)
        return gm__set_error(GM_EFORMAT, "gmt trace body is corrupt or truncated (zlib %d, %llu of %llu "
                             "bytes)", r->zr, (unsigned long long)r->produced, (unsigned long long)r->body);
    return gm__set_error(GM_EFORMAT, "malformed gmt trace at body byte %llu: %s",
                         (unsigned long long)r_off(r), what);
}

/* A count must fit in the declared body bytes left, at `min` bytes per item. */
static bool count_ok(const rbuf *r, uint64_t n, size_t min) {
    return !r->bad && n <= (r->body - r_off(r)) / min;
}

static int decode_tables(rbuf *r, gm__trace_builder *b, uint64_t *nsegs, uint64_t *nevents) {
    uint64_t nstr = r_var(r), nfr = r_var(r), nst = r_var(r);
    *nsegs = r_var(r);
    *nevents = r_var(r);
    uint64_t has_settings = r_var(r);
    if (!count_ok(r, nstr, 1) || !count_ok(r, nfr, 3) || !count_ok(r, nst, 1) ||
        !count_ok(r, *nsegs, 8) || !count_ok(r, *nevents, 4) || has_settings > 1)
        return bad(r, "counts exceed the body");
    for (uint64_t i = 0; i < nstr; i++) {
        uint64_t n = r_var(r);
        if (!count_ok(r, n, 1)) return bad(r, "string length exceeds the body");
        if (n > GM_LIMIT_DECLARED_LENGTH) return bad(r, "string longer than GM_LIMIT_DECLARED_LENGTH");
        if (!r_need(r, (size_t)n)) return bad(r, "truncated string");
        uint32_t id;
        int rc = gm__tb_string(b, (const char *)r->p, (size_t)n, &id);
        if (rc) return rc;
        if (id != i) return bad(r, "duplicate string in the table");
        r->p += n;
    }
    for (uint64_t i = 0; i < nfr; i++) {
        uint64_t name = r_var(r), file = r_var(r);
        int64_t line = unzz(r_var(r));
        uint32_t id;
        if (r->bad || name > UINT32_MAX || file > UINT32_MAX) return bad(r, "bad frame");
        int rc = gm__tb_frame(b, (uint32_t)name, (uint32_t)file, (int32_t)line, &id);
        if (rc) return rc;
    }
    uint32_t fr[GM_LIMIT_STACK_DEPTH];
    for (uint64_t s = 0; s < nst; s++) {
        uint64_t depth = r_var(r);
        if (!count_ok(r, depth, 1) || depth > GM_LIMIT_STACK_DEPTH) return bad(r, "bad stack depth");
        for (uint64_t i = 0; i < depth; i++) {
            uint64_t f = r_var(r);
            fr[i] = f > UINT32_MAX ? UINT32_MAX : (uint32_t)f;
        }
        uint32_t id1;
        int rc = r->bad ? bad(r, "truncated stack") : gm__tb_stack(b, fr, (uint32_t)depth, &id1);
        if (rc) return rc;
    }
    if (has_settings) {
        /* as long as any string: the writer copies what the snapshot held */
        uint64_t n = r_var(r);
        if (!count_ok(r, n, 1) || n > GM_LIMIT_DECLARED_LENGTH)
            return bad(r, "allocator conf string longer than the body or GM_LIMIT_DECLARED_LENGTH");
        if (!r_need(r, (size_t)n)) return bad(r, "truncated allocator conf string");
        char *conf = malloc((size_t)n + 1);
        if (!conf) return gm__set_error(GM_ENOHOSTMEM, "out of host memory reading a gmt trace");
        memcpy(conf, r->p, (size_t)n);
        conf[n] = '\0';
        r->p += n;
        int rc = gm__tb_conf(b, conf);
        free(conf);
        if (rc) return rc;
    }
    return GM_OK;
}

static int decode_events(rbuf *r, gm__trace_builder *b, uint64_t nsegs, uint64_t nevents) {
    for (uint64_t i = 0; i < nsegs; i++) {
        gm_trace_segment g = {0};
        uint64_t dev = r_var(r);
        g.address = r_var(r);
        g.total_size = r_var(r);
        g.allocated_size = r_var(r);
        g.requested_size = r_var(r);
        g.stream = r_var(r);
        uint64_t nb = r_var(r), fl = r_var(r);
        if (r->bad || dev > 255 || nb > UINT32_MAX) return bad(r, "bad segment");
        g.device = (uint8_t)dev;
        g.nblocks = (uint32_t)nb;
        g.large = fl & 1;
        g.expandable = (fl & 2) != 0;
        if (fl & 4) { /* a private pool's segment: its id follows */
            g.pool_id[0] = r_var(r);
            g.pool_id[1] = r_var(r);
            if (r->bad) return bad(r, "bad segment pool id");
        }
        int rc = gm__tb_segment(b, &g);
        if (rc) return rc;
    }
    gm_trace_event e = {0};
    for (uint64_t i = 0; i < nevents; i++) {
        uint64_t head = r_var(r);
        if (r->bad || head > 0x7F || (head & 0x0F) >= GM_TA_COUNT) return bad(r, "bad event head");
        e.action = (uint8_t)(head & 0x0F);
        if (head & EV_DEVICE) {
            uint64_t d = r_var(r);
            if (d > 255) return bad(r, "bad device");
            e.device = (uint8_t)d;
        }
        e.addr += (uint64_t)unzz(r_var(r));
        e.size = r_var(r);
        if (head & EV_STREAM) e.stream = r_var(r);
        e.time_us = (int64_t)((uint64_t)e.time_us + (uint64_t)unzz(r_var(r))); /* modular, as encoded */
        uint64_t st = head & EV_STACK ? r_var(r) : 0;
        if (r->bad || st > UINT32_MAX) return bad(r, "truncated event");
        e.stack = (uint32_t)st;
        int rc = gm__tb_event(b, &e);
        if (rc) return rc;
    }
    if (r_var(r) != nevents || r->bad) return bad(r, "bad trailer");
    if (r_off(r) != r->body) return bad(r, "data after the trailer (the body is longer than its trace)");
    /* the zlib stream must end with the body, and the file with the stream */
    uint8_t sink[16];
    if (r_inflate(r, sink, sizeof sink) || !r->zend || r->zr)
        return r->zr ? bad(r, "") : gm__set_error(GM_EFORMAT, "gmt trace body is longer than its header "
                                                  "declares (%llu bytes)", (unsigned long long)r->body);
    in_fill(r);
    if (r->z.avail_in)
        return gm__set_error(GM_EFORMAT, "gmt trace has %s%u bytes after its compressed body",
                             r->in && !r->ieof ? "at least " : "", r->z.avail_in);
    return r->ierr ? bad(r, "") : GM_OK;
}

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

int gm__trace_decode_gmt_stream(FILE *in, const void *head, size_t len, gm_trace **out) {
    *out = NULL;
    const uint8_t *d = head;
    if (len < HEADER_SIZE || memcmp(d, GM_TRACE_MAGIC, 8) != 0)
        return gm__set_error(GM_EFORMAT, "not a gmt trace (bad magic or shorter than its header)");
    uint64_t version = get_le(d + 8, 4), body = get_le(d + 16, 8);
    if (version != GM_TRACE_VERSION)
        return gm__set_error(GM_EFORMAT, "gmt trace version %llu is not supported (this gpumem "
                                         "reads version %d)", (unsigned long long)version,
                             GM_TRACE_VERSION);
    if (body > GM_LIMIT_GMT_BODY)
        return gm__set_error(GM_EFORMAT, "gmt trace header declares a body of %llu bytes, more than "
                             "GM_LIMIT_GMT_BODY (%llu); the file is corrupt or hostile",
                             (unsigned long long)body, (unsigned long long)GM_LIMIT_GMT_BODY);
    rbuf r = {.body = body, .in = in};
    if (inflateInit(&r.z) != Z_OK) return gm__set_error(GM_ENOHOSTMEM, "zlib initialisation failed");
    r.z.next_in = (Bytef *)(uintptr_t)(d + HEADER_SIZE);
    r.z.avail_in = (uInt)(len - HEADER_SIZE > UINT32_MAX ? UINT32_MAX : len - HEADER_SIZE);
    int rc = len - HEADER_SIZE > UINT32_MAX ? gm__set_error(GM_EINVAL, "gmt trace in memory over 4 GiB") : GM_OK;
    gm__trace_builder *b = rc ? NULL : gm__tb_new();
    if (!rc && !b) rc = gm__set_error(GM_ENOHOSTMEM, "out of host memory reading a gmt trace");
    uint64_t nsegs, nevents;
    if (!rc) rc = decode_tables(&r, b, &nsegs, &nevents);
    if (!rc) rc = decode_events(&r, b, nsegs, nevents);
    inflateEnd(&r.z);
    free(r.buf);
    free(r.ibuf);
    if (rc) {
        gm__tb_discard(b);
        return rc;
    }
    return gm__tb_finish(b, "gmt", out);
}

int gm__trace_decode_gmt(const void *data, size_t len, gm_trace **out) {
    return gm__trace_decode_gmt_stream(NULL, data, len, out);
}

/* ---- any format -------------------------------------------------------- */

int gm__trace_load_mem(const void *data, size_t len, gm_trace **out) {
    if (len >= 8 && memcmp(data, GM_TRACE_MAGIC, 8) == 0) return gm__trace_decode_gmt(data, len, out);
    return gm__trace_from_snapshot(data, len, out);
}

int gm__trace_load_file(const char *path, gm_trace **out) {
    *out = NULL;
    /* "-" is standard input, as for every command-line tool. */
    bool is_stdin = !strcmp(path, "-");
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) return gm__set_error(GM_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    int rc = GM_OK;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > GM_LIMIT_TRACE_FILE_BYTES)
        rc = gm__set_error(GM_EFORMAT, "%s is %llu bytes, more than the %llu-byte limit on trace "
                           "files (GM_LIMIT_TRACE_FILE_BYTES); compress it (gzip) or convert it "
                           "to .gmt on a machine with the memory", path,
                           (unsigned long long)st.st_size, (unsigned long long)GM_LIMIT_TRACE_FILE_BYTES);
    /* the first bytes say the format; the readers take the rest as they go,
     * so a pipe of garbage is refused at its first bytes, never buffered */
    uint8_t head[HEADER_SIZE];
    size_t len = 0;
    while (!rc && len < sizeof head) {
        size_t k = fread(head + len, 1, sizeof head - len, f);
        if (!k) break;
        len += k;
    }
    if (!rc && ferror(f)) rc = gm__set_error(GM_EIO, "error reading %s: %s", path, strerror(errno));
    if (!rc && len == 0)
        rc = gm__set_error(GM_EFORMAT, "%s is empty (0 bytes): not a torch.cuda.memory snapshot or a gpumem trace",
                           path);
    if (!rc) {
        rc = len >= 8 && memcmp(head, GM_TRACE_MAGIC, 8) == 0 ? gm__trace_decode_gmt_stream(f, head, len, out)
                                                              : gm__trace_from_snapshot_stream(f, head, len, out);
        if (rc == GM_EFORMAT || rc == GM_EIO)
            gm__set_error(rc, "%s: %s", path, gm_last_error_detail()); /* it may quote its own detail */
    }
    if (!is_stdin) fclose(f);
    return rc;
}
