/* bench_bigsnap.c — writes a synthetic torch.cuda.memory snapshot of any size,
 * to measure how gpumem reads big traces (bench/bigsnap.sh; issue 42 item 9).
 *
 * The bytes are laid out as CPython's pickler writes torch 2.11's snapshot
 * (protocol 4, FRAME, MEMOIZE; keys and action names shared objects, so BINGET;
 * 'compile_context' a new 'N/A' string per event; dicts and lists filled in
 * batches of 1000), gzip-compressed. The events are a training loop: weights
 * allocated once, then steps that allocate activations and free them in
 * reverse order, with temporaries in between (alloc, free_requested,
 * free_completed), inside one segment. With --frames D every event carries
 * its own list of D frames drawn from a few hundred shared frame dicts, as
 * torch's py_symbolize shares them. Python's pickle.load reads the output.
 *
 * usage: bench_bigsnap OUT.pickle.gz EVENTS [--frames D] [--level L] [--batch B]
 * (--batch: items per APPENDS, for small fuzz seeds with several batches)
 * Files go wherever OUT says (never into the source tree: they are large). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define FRAME_TARGET 65536
static int batch = 1000; /* CPython's pickler appends 1000 items at a time */

typedef struct pk {
    gzFile gz;
    uint8_t *buf; /* the current frame */
    size_t n, cap;
    uint32_t memo; /* next memo index */
} pk;

static void put(pk *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2;
        w->buf = realloc(w->buf, w->cap);
        if (!w->buf) abort();
    }
    memcpy(w->buf + w->n, p, n);
    w->n += n;
}
static void op(pk *w, uint8_t o) { put(w, &o, 1); }

/* CPython commits a frame at an object boundary once it holds 64 KiB. */
static void frame_commit(pk *w, int force) {
    if (!w->n || (!force && w->n < FRAME_TARGET)) return;
    uint8_t h[9] = {0x95};
    for (int i = 0; i < 8; i++) h[1 + i] = (uint8_t)((uint64_t)w->n >> (8 * i));
    if (gzwrite(w->gz, h, 9) != 9 || gzwrite(w->gz, w->buf, (unsigned)w->n) != (int)w->n) {
        fprintf(stderr, "bench_bigsnap: write failed\n");
        exit(1);
    }
    w->n = 0;
}

static uint32_t memoize(pk *w) {
    op(w, 0x94);
    return w->memo++;
}
static void get(pk *w, uint32_t idx) {
    if (idx < 256) {
        uint8_t b[2] = {'h', (uint8_t)idx};
        put(w, b, 2);
    } else {
        uint8_t b[5] = {'j', (uint8_t)idx, (uint8_t)(idx >> 8), (uint8_t)(idx >> 16), (uint8_t)(idx >> 24)};
        put(w, b, 5);
    }
}

/* A str object written once, then named by its memo index. */
typedef struct sobj {
    const char *s;
    int64_t memo; /* -1: not written yet */
} sobj;
static void str_new(pk *w, const char *s) {
    size_t n = strlen(s);
    op(w, 0x8c);
    op(w, (uint8_t)n);
    put(w, s, n);
}
static void str_memo(pk *w, const char *s) { /* a str object used once (memoized all the same) */
    str_new(w, s);
    memoize(w);
}
static void str(pk *w, sobj *o) {
    if (o->memo >= 0) {
        get(w, (uint32_t)o->memo);
        return;
    }
    str_new(w, o->s);
    o->memo = memoize(w);
}

static void int_(pk *w, int64_t v) {
    if (v >= 0 && v < 256) {
        op(w, 'K');
        op(w, (uint8_t)v);
    } else if (v >= 0 && v < 65536) {
        uint8_t b[3] = {'M', (uint8_t)v, (uint8_t)(v >> 8)};
        put(w, b, 3);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        op(w, 'J');
        for (int i = 0; i < 4; i++) op(w, (uint8_t)((uint64_t)v >> (8 * i)));
    } else { /* LONG1: minimal two's complement, little-endian */
        uint8_t b[9];
        int n = 0;
        uint64_t u = (uint64_t)v;
        do {
            b[n++] = (uint8_t)u;
            u >>= 8;
        } while (n < 8 && !(u == 0 && !(b[n - 1] & 0x80)));
        op(w, 0x8a);
        op(w, (uint8_t)n);
        put(w, b, (size_t)n);
    }
}

enum { K_ACTION, K_ADDR, K_SIZE, K_STREAM, K_TIME, K_FRAMES, K_CC, K_UM, K_NAME, K_FILE, K_LINE, K_N };
static sobj keys[K_N] = {{"action", -1}, {"addr", -1}, {"size", -1}, {"stream", -1}, {"time_us", -1},
                         {"frames", -1}, {"compile_context", -1}, {"user_metadata", -1},
                         {"name", -1}, {"filename", -1}, {"line", -1}};
enum { A_SEG, A_ALLOC, A_FREE_REQ, A_FREE_DONE, A_N };
static sobj actions[A_N] = {{"segment_alloc", -1}, {"alloc", -1}, {"free_requested", -1},
                            {"free_completed", -1}};
static sobj empty_str = {"", -1};

/* frames: NF shared frame dicts, written at first use */
#define NF 320
static int64_t frame_memo[NF];
static char frame_names[NF][32];
static sobj frame_files[8];
static char file_names[8][64];

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static void frame_dict(pk *w, int f) {
    if (frame_memo[f] >= 0) {
        get(w, (uint32_t)frame_memo[f]);
        return;
    }
    op(w, '}');
    frame_memo[f] = memoize(w);
    op(w, '(');
    str(w, &keys[K_NAME]);
    str_memo(w, frame_names[f]);
    str(w, &keys[K_FILE]);
    str(w, &frame_files[f % 8]);
    str(w, &keys[K_LINE]);
    int_(w, 10 + f * 7);
    op(w, 'u');
}

static void event(pk *w, int action, uint64_t addr, uint64_t size, int64_t t, int depth) {
    frame_commit(w, 0);
    op(w, '}');
    memoize(w);
    op(w, '(');
    str(w, &keys[K_ACTION]);
    str(w, &actions[action]);
    str(w, &keys[K_ADDR]);
    int_(w, (int64_t)addr);
    str(w, &keys[K_SIZE]);
    int_(w, (int64_t)size);
    str(w, &keys[K_STREAM]);
    int_(w, 0);
    str(w, &keys[K_TIME]);
    int_(w, t);
    if (depth) {
        str(w, &keys[K_FRAMES]);
        op(w, ']');
        memoize(w);
        op(w, '(');
        uint32_t base = (uint32_t)(size >> 9) % (NF - (uint32_t)depth); /* a stack per call site */
        for (int i = 0; i < depth; i++) frame_dict(w, (int)(base + (uint32_t)i));
        op(w, 'e');
    }
    str(w, &keys[K_CC]);
    str_memo(w, "N/A"); /* a new str object per event, as torch makes it */
    str(w, &keys[K_UM]);
    str(w, &empty_str);
    op(w, 'u');
}

/* the event stream: calls emit() per event; returns the count */
typedef struct gen {
    pk *w;
    uint64_t want, n;
    int64_t t;
    int depth;
} gen;

static void emit(gen *g, int action, uint64_t addr, uint64_t size) {
    if (g->n && g->n % (uint64_t)batch == 0) { /* the device list's APPENDS, a new MARK */
        op(g->w, 'e');
        op(g->w, '(');
    }
    event(g->w, action, addr, size, g->t, g->depth);
    g->t += 1 + rnd() % 40;
    g->n++;
}

#define SEG_BASE 0x7f2000000000ull
#define SEG_SIZE ((uint64_t)120 << 30)

static void events(gen *g) {
    op(g->w, ']');
    memoize(g->w); /* device_traces */
    op(g->w, ']');
    memoize(g->w); /* device 0 */
    op(g->w, '(');
    emit(g, A_SEG, SEG_BASE, SEG_SIZE);
    uint64_t top = SEG_BASE;
    for (int i = 0; i < 200 && g->n < g->want; i++) { /* weights, never freed */
        uint64_t sz = (uint64_t)(1 + rnd() % 64) << 20;
        emit(g, A_ALLOC, top, sz);
        top += sz;
    }
    uint64_t st_addr[512], st_size[512];
    for (uint64_t before = UINT64_MAX; g->n != before;) { /* steps, while there is room for one */
        before = g->n;
        int k = 0;
        int acts = 200 + (int)(rnd() % 200);
        for (int i = 0; i < acts && g->n + 3 * (uint64_t)(k + 2) <= g->want; i++) {
            uint64_t sz = ((uint64_t)(1 + rnd() % 4096) << 9) * (1 + (rnd() % 4 == 0) * 63);
            st_addr[k] = top;
            st_size[k++] = sz;
            emit(g, A_ALLOC, top, sz);
            top += (sz + 511) & ~511ull;
            if (rnd() % 3 == 0) { /* a temporary */
                uint64_t ts = (uint64_t)(1 + rnd() % 256) << 9;
                emit(g, A_ALLOC, top, ts);
                emit(g, A_FREE_REQ, top, ts);
                emit(g, A_FREE_DONE, top, ts);
            }
        }
        while (k-- > 0) {
            top = st_addr[k];
            emit(g, A_FREE_REQ, st_addr[k], st_size[k]);
            emit(g, A_FREE_DONE, st_addr[k], st_size[k]);
        }
    }
    op(g->w, 'e'); /* device 0's last batch... */
    op(g->w, 'a');                   /* ...and device 0 into device_traces */
}

static void segments(pk *w) {
    static const char *sk[] = {"device", "address", "total_size", "allocated_size", "active_size",
                               "requested_size", "stream", "segment_type", "segment_pool_id",
                               "is_expandable", "frames", "blocks"};
    op(w, ']');
    memoize(w);
    op(w, '}');
    memoize(w);
    op(w, '(');
    int64_t v[] = {0, (int64_t)SEG_BASE, (int64_t)SEG_SIZE, 0, 0, 0, 0};
    for (int i = 0; i < 7; i++) {
        str_memo(w, sk[i]);
        int_(w, v[i]);
    }
    str_memo(w, sk[7]);
    str_memo(w, "large");
    str_memo(w, sk[8]);
    int_(w, 0);
    int_(w, 0);
    op(w, 0x86);
    memoize(w);
    str_memo(w, sk[9]);
    op(w, 0x89);
    str_memo(w, sk[10]);
    op(w, ']');
    memoize(w);
    str_memo(w, sk[11]);
    op(w, ']');
    memoize(w);
    /* the weights' blocks, one memoized dict each: as in a real snapshot,
     * the event keys come after a thousand memo entries (LONG_BINGET) */
    static const char *bk[] = {"address", "size", "requested_size", "state", "frames"};
    uint32_t bkm[5] = {0};
    op(w, '(');
    for (int b = 0; b < 200; b++) {
        op(w, '}');
        memoize(w);
        op(w, '(');
        for (int k = 0; k < 5; k++) {
            if (b == 0) {
                str_new(w, bk[k]);
                bkm[k] = memoize(w);
            } else {
                get(w, bkm[k]);
            }
            if (k < 3) {
                int_(w, (int64_t)SEG_BASE + b);
            } else if (k == 3) {
                str_memo(w, "active_allocated");
            } else {
                op(w, ']');
                memoize(w);
            }
        }
        op(w, 'u');
    }
    op(w, 'e');
    op(w, 'u');
    op(w, 'a');
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_bigsnap OUT.pickle.gz EVENTS [--frames D] [--level L] [--batch B]\n");
        return 2;
    }
    int depth = 0, level = 6;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--frames")) depth = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--level")) level = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]) > 0 ? atoi(argv[i + 1]) : 1000;
    }
    if (depth < 0 || depth > 64) depth = 64;
    char mode[8];
    snprintf(mode, sizeof mode, "wb%d", level);
    pk w = {.gz = gzopen(argv[1], mode)};
    if (!w.gz) {
        perror(argv[1]);
        return 1;
    }
    gzbuffer(w.gz, 1 << 20);
    for (int f = 0; f < NF; f++) {
        frame_memo[f] = -1;
        snprintf(frame_names[f], sizeof frame_names[f], "forward_%d", f);
    }
    for (int i = 0; i < 8; i++) {
        snprintf(file_names[i], sizeof file_names[i], "/usr/lib/python3/site-packages/torch/nn/mod%d.py", i);
        frame_files[i] = (sobj){file_names[i], -1};
    }
    uint8_t proto[2] = {0x80, 4};
    if (gzwrite(w.gz, proto, 2) != 2) return 1;
    op(&w, '}');
    memoize(&w);
    op(&w, '(');
    str_memo(&w, "segments");
    segments(&w);
    str_memo(&w, "device_traces");
    gen g = {.w = &w, .want = strtoull(argv[2], NULL, 10), .depth = depth};
    if (g.want < 1) g.want = 1;
    events(&g);
    str_memo(&w, "allocator_settings");
    op(&w, '}');
    memoize(&w);
    str_memo(&w, "PYTORCH_CUDA_ALLOC_CONF");
    str(&w, &empty_str);
    op(&w, 's');
    str_memo(&w, "external_annotations");
    op(&w, ']');
    memoize(&w);
    op(&w, 'u');
    op(&w, '.');
    frame_commit(&w, 1);
    if (gzclose(w.gz) != Z_OK) {
        fprintf(stderr, "bench_bigsnap: closing %s failed\n", argv[1]);
        return 1;
    }
    printf("%s: %llu events, frames %d\n", argv[1], (unsigned long long)g.n, depth);
    free(w.buf);
    return 0;
}
