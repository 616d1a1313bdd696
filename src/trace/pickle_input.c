/* pickle_input.c — the pickle reader's input (pickle_input.h): a window
 * over memory, a file, or gzip inflated as the parse goes, by a thread of
 * its own for a regular file (inflating is a fifth of reading a big
 * snapshot: bench/RESULTS.md, 2026-12-07). */
#include "pickle_input.h"

#include "util/idmap.h"
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define IBUF_SIZE ((size_t)256 << 10)

/* Read up to room bytes of `in` (counted against the file limit). */
static size_t read_in(gm__zsrc *r, uint8_t *out, size_t room) {
    size_t k = fread(out, 1, room, r->in);
    r->iread += k;
    if (r->iread > GM_LIMIT_TRACE_FILE_BYTES) {
        r->zerr = GM__ZERR_FILE_LIMIT;
        r->ieof = r->zend = true;
        return 0;
    }
    if (k == 0) {
        r->ieof = true;
        if (ferror(r->in)) r->zerr = GM__ZERR_IO;
    }
    return k;
}

/* gzip from a file: more compressed input once zlib has used it all. */
static void gz_fill(gm__zsrc *r) {
    if (r->z.avail_in || !r->in || r->ieof) return;
    if (!r->ibuf && !(r->ibuf = malloc(IBUF_SIZE))) {
        r->zerr = GM__ZERR_IO;
        r->ieof = r->zend = true;
        return;
    }
    r->z.next_in = r->ibuf;
    r->z.avail_in = (uInt)read_in(r, r->ibuf, IBUF_SIZE);
}

/* One inflate call into out[0..room): returns the bytes it produced. At the
 * end of the stream, on corruption or on a cut file it sets zend (and zerr);
 * concatenated gzip members continue the stream. */
static size_t inflate_into(gm__zsrc *r, uint8_t *out, size_t room) {
    gz_fill(r);
    if (r->zend) return 0;
    r->z.next_out = out;
    r->z.avail_out = (uInt)room;
    int zr = inflate(&r->z, Z_NO_FLUSH);
    size_t produced = room - r->z.avail_out;
    if (zr == Z_STREAM_END) {
        gz_fill(r);
        if (!(r->z.avail_in > 0 && inflateReset(&r->z) == Z_OK)) r->zend = true;
    } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
        r->zend = true;
        r->zerr = GM__ZERR_CORRUPT;
    } else if (zr == Z_BUF_ERROR && r->z.avail_in == 0) {
        r->zend = true;
        if (!r->zerr) r->zerr = GM__ZERR_TRUNCATED;
    }
    return produced;
}

/* ---- the inflating thread ---------------------------------------------- */

#define ZP_BLOCKS 4
#define ZP_BLOCK ((size_t)1 << 20)

typedef struct gm__zpipe {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *blk[ZP_BLOCKS];
    size_t len[ZP_BLOCKS];
    unsigned head, count; /* filled blocks: head, head + 1, ... (mod ZP_BLOCKS) */
    size_t off; /* bytes of blk[head] taken */
    bool done, stop; /* done: the source ended (gm__zsrc's zend); stop: the reader left */
    gm__zsrc *src;
} zpipe;

static void *zp_main(void *arg) {
    zpipe *zp = arg;
    pthread_mutex_lock(&zp->mu);
    while (!zp->stop && !zp->done) {
        if (zp->count == ZP_BLOCKS) {
            pthread_cond_wait(&zp->cv, &zp->mu);
            continue;
        }
        unsigned slot = (zp->head + zp->count) % ZP_BLOCKS;
        pthread_mutex_unlock(&zp->mu);
        size_t k = 0;
        while (k < ZP_BLOCK && !zp->src->zend) k += inflate_into(zp->src, zp->blk[slot] + k, ZP_BLOCK - k);
        pthread_mutex_lock(&zp->mu);
        zp->len[slot] = k;
        zp->count++;
        zp->done = zp->src->zend;
        pthread_cond_broadcast(&zp->cv);
    }
    pthread_mutex_unlock(&zp->mu);
    return NULL;
}

/* Start inflating r's source in a thread (no thread: r inflates itself).
 * Regular files only: a read of one always returns, so stopping the thread
 * never waits on a pipe's writer. */
static void zp_start(gm__input *r) {
    struct stat st;
    if (fstat(fileno(r->src.in), &st) != 0 || !S_ISREG(st.st_mode)) return;
    zpipe *zp = calloc(1, sizeof *zp);
    if (!zp) return;
    zp->src = &r->src;
    bool mu = pthread_mutex_init(&zp->mu, NULL) == 0;
    bool cv = mu && pthread_cond_init(&zp->cv, NULL) == 0, ok = cv;
    for (int i = 0; ok && i < ZP_BLOCKS; i++) ok = (zp->blk[i] = malloc(ZP_BLOCK)) != NULL;
    if (ok && pthread_create(&zp->th, NULL, zp_main, zp) == 0) {
        r->pipe = zp;
        return;
    }
    for (int i = 0; i < ZP_BLOCKS; i++) free(zp->blk[i]);
    if (cv) pthread_cond_destroy(&zp->cv);
    if (mu) pthread_mutex_destroy(&zp->mu);
    free(zp);
}

static void zp_end(gm__input *r) {
    zpipe *zp = r->pipe;
    if (!zp) return;
    pthread_mutex_lock(&zp->mu);
    zp->stop = true;
    pthread_cond_broadcast(&zp->cv);
    pthread_mutex_unlock(&zp->mu);
    pthread_join(zp->th, NULL);
    pthread_cond_destroy(&zp->cv);
    pthread_mutex_destroy(&zp->mu);
    for (int i = 0; i < ZP_BLOCKS; i++) free(zp->blk[i]);
    free(zp);
    r->pipe = NULL;
}

/* Bytes the thread inflated, into out[0..room); at the source's end (and
 * every block taken) the reader's zend and zerr. */
static size_t zp_take(gm__input *r, uint8_t *out, size_t room) {
    zpipe *zp = r->pipe;
    pthread_mutex_lock(&zp->mu);
    while (!zp->count && !zp->done) pthread_cond_wait(&zp->cv, &zp->mu);
    if (!zp->count) { /* ended, and all of it taken: the thread has stopped touching src */
        r->zend = true;
        r->zerr = zp->src->zerr;
        pthread_mutex_unlock(&zp->mu);
        return 0;
    }
    unsigned h = zp->head;
    size_t k = zp->len[h] - zp->off < room ? zp->len[h] - zp->off : room, off = zp->off;
    pthread_mutex_unlock(&zp->mu);
    memcpy(out, zp->blk[h] + off, k); /* blk[h] is the reader's until it is given back */
    pthread_mutex_lock(&zp->mu);
    zp->off += k;
    if (zp->off == zp->len[h]) {
        zp->head = (h + 1) % ZP_BLOCKS;
        zp->count--;
        zp->off = 0;
        pthread_cond_broadcast(&zp->cv);
    }
    pthread_mutex_unlock(&zp->mu);
    return k;
}

/* More input into out[0..room): inflated, or read from the file. */
static size_t produce(gm__input *r, uint8_t *out, size_t room) {
    size_t k;
    if (r->pipe) {
        k = zp_take(r, out, room);
    } else {
        k = r->gz ? inflate_into(&r->src, out, room) : r->src.in && !r->src.ieof ? read_in(&r->src, out, room) : 0;
        r->zerr = r->src.zerr;
        if (r->src.zend || (!k && !r->gz)) r->zend = true;
    }
    gm__work_steps += k; /* bytes read are work too (idmap.h) */
    return k;
}

/* Make n bytes readable, moving the window into buf. */
bool gm__input_refill(gm__input *r, size_t n) {
    if (r->zend || (!r->gz && !r->src.in)) return false;
    size_t have = (size_t)(r->end - r->p);
    r->base += (uint64_t)(r->p - r->wbase);
    /* where the window is, as numbers: r->buf may move below */
    uintptr_t pb = (uintptr_t)r->buf, pp = (uintptr_t)r->p;
    bool inbuf = pb && pp >= pb && pp <= pb + r->bufcap;
    size_t off = inbuf ? (size_t)(pp - pb) : 0;
    size_t want = n > (256u << 10) ? n : (256u << 10);
    if (want > r->bufcap) {
        uint8_t *nb = realloc(r->buf, want);
        if (!nb) return false;
        r->buf = nb;
        r->bufcap = want;
    }
    if (inbuf) memmove(r->buf, r->buf + off, have);
    else if (have) memcpy(r->buf, r->p, have); /* the caller's first bytes */
    r->wbase = r->p = r->buf;
    while (have < n && !r->zend) have += produce(r, r->buf + have, r->bufcap - have);
    r->end = r->buf + have;
    if (r->base + have > r->max_input) return false;
    return have >= n;
}

int gm__input_error(const gm__input *r) {
    if (r->zerr == GM__ZERR_IO)
        return gm__set_error(GM_EIO, "error reading the input after %llu bytes", (unsigned long long)r->src.iread);
    if (r->zerr == GM__ZERR_FILE_LIMIT)
        return gm__set_error(GM_EFORMAT,
                             "input longer than %llu bytes (GM_LIMIT_TRACE_FILE_BYTES); "
                             "convert it to .gmt on a machine with the memory",
                             (unsigned long long)GM_LIMIT_TRACE_FILE_BYTES);
    if (r->zerr == GM__ZERR_TRUNCATED)
        return gm__set_error(GM_EFORMAT,
                             "gzip stream ends early (after %llu decompressed bytes): "
                             "the file is truncated",
                             (unsigned long long)gm__input_offset(r, r->end));
    return gm__set_error(GM_EFORMAT, "gzip stream is corrupt (%s) after %llu decompressed bytes",
                         r->src.z.msg ? r->src.z.msg : "bad data", (unsigned long long)gm__input_offset(r, r->end));
}

int gm__input_finish(gm__input *r) {
    size_t extra = (size_t)(r->end - r->p);
    uint8_t sink[64];
    while (!extra && !r->zend && (r->gz || r->src.in)) extra += produce(r, sink, sizeof sink);
    if (extra)
        return gm__set_error(GM_EFORMAT,
                             "data after the pickle's STOP opcode%s: not one pickle "
                             "(corrupt or concatenated file?)",
                             r->gz ? " inside the gzip stream" : "");
    return r->zerr ? gm__input_error(r) : GM_OK;
}

int gm__input_open(gm__input *r, FILE *in, const void *head, size_t len, uint64_t max_input) {
    memset(r, 0, sizeof *r);
    r->max_input = max_input;
    r->src.in = in;
    const uint8_t *d = head;
    if (!(len >= 2 && d[0] == 0x1f && d[1] == 0x8b)) {
        r->p = r->wbase = d;
        r->end = d + len;
        return GM_OK;
    }
    if (len > UINT32_MAX) return gm__set_error(GM_EINVAL, "compressed input over 4 GiB");
    if (inflateInit2(&r->src.z, 16 + MAX_WBITS) != Z_OK)
        return gm__set_error(GM_ENOHOSTMEM, "zlib initialisation failed");
    r->gz = true;
    r->src.z.next_in = (Bytef *)(uintptr_t)d;
    r->src.z.avail_in = (uInt)len;
    if (in) zp_start(r); /* a file: inflate beside the opcodes */
    return GM_OK;
}

void gm__input_close(gm__input *r) {
    zp_end(r);
    if (r->gz) inflateEnd(&r->src.z);
    free(r->buf);
    free(r->src.ibuf);
    r->buf = r->src.ibuf = NULL;
}
