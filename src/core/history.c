/* history.c — named scopes per thread, memory categories, and the allocation
 * history ring (gpumem.h, history.h).
 *
 * Scopes form one process-wide tree of (parent, name) nodes, interned under
 * a mutex when pushed; a thread keeps only its stack of node ids, so an
 * entry of the history names its whole scope path with one 32-bit id. Nodes
 * live in fixed chunks and are never moved or freed, so names read without
 * a lock.
 *
 * The ring holds the last N events of every allocator in the process. Off,
 * the allocator pays one relaxed load and a predictable branch per
 * operation (gm__history_note); on, a spin lock, a timestamp (the TSC on
 * x86-64, calibrated once against CLOCK_MONOTONIC) and a 48-byte store.
 * bench/bench_history.c measures both (bench/RESULTS.md, "Allocation history:
 * cost per allocator operation"). */
#include "history.h"

#include "devlock.h"
#include "internal.h"
#include "action.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- categories ------------------------------------------------------------ */

static const char *const cat_names[] = {
#define GM__CAT_NAME(n, s) s,
    GM_CATEGORY_LIST(GM__CAT_NAME)
#undef GM__CAT_NAME
};

const char *gm_category_name(int c) { return c >= 0 && c < GM_CAT_COUNT ? cat_names[c] : "?"; }

int gm_category_from_name(const char *name) {
    for (int c = 0; name && c < GM_CAT_COUNT; c++)
        if (!strcmp(name, cat_names[c])) return c;
    return -1;
}

/* ---- scope tree -------------------------------------------------------------- */

#define CHUNK_BITS 10
#define CHUNK (1u << CHUNK_BITS)
#define MAX_CHUNKS 1024 /* a million scope nodes */

typedef struct snode {
    char *name;
    uint32_t parent;
} snode;

static struct {
    pthread_mutex_t mu;
    snode *chunk[MAX_CHUNKS];
    uint32_t n; /* nodes, node 0 is the root */
    uint32_t *table; /* open addressing: node ids, 0 = empty */
    uint32_t cap;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

static __thread uint32_t tls_stack[GM_SCOPE_MAX_DEPTH];
static __thread int tls_depth;
static uint32_t global_scope; /* of threads with no scope open; atomic */

static snode *node_at(uint32_t id) { return &S.chunk[id >> CHUNK_BITS][id & (CHUNK - 1)]; }

static uint64_t node_hash(uint32_t parent, const char *name) {
    uint64_t h = 1469598103934665603ull ^ parent;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return h;
}

static int table_grow(void) {
    uint32_t ncap = S.cap ? S.cap * 2 : 1024;
    uint32_t *nt = calloc(ncap, sizeof *nt);
    if (!nt) return GM_ENOHOSTMEM;
    for (uint32_t i = 0; i < S.cap; i++) {
        uint32_t id = S.table[i];
        if (!id) continue;
        snode *x = node_at(id);
        uint32_t j = (uint32_t)node_hash(x->parent, x->name) & (ncap - 1);
        while (nt[j]) j = (j + 1) & (ncap - 1);
        nt[j] = id;
    }
    free(S.table);
    S.table = nt;
    S.cap = ncap;
    return GM_OK;
}

/* The node (parent, name), made if new (S.mu held). */
static int intern(uint32_t parent, const char *name, uint32_t *out) {
    if (S.n == 0) { /* the root */
        if (!(S.chunk[0] = calloc(CHUNK, sizeof(snode)))) return GM_ENOHOSTMEM;
        S.n = 1;
    }
    if ((S.n + 1) * 2 > S.cap && table_grow()) return GM_ENOHOSTMEM;
    uint32_t j = (uint32_t)node_hash(parent, name) & (S.cap - 1);
    for (; S.table[j]; j = (j + 1) & (S.cap - 1)) {
        snode *x = node_at(S.table[j]);
        if (x->parent == parent && !strcmp(x->name, name)) {
            *out = S.table[j];
            return GM_OK;
        }
    }
    uint32_t id = S.n;
    if ((id >> CHUNK_BITS) >= MAX_CHUNKS) return GM_ENOHOSTMEM;
    if (!S.chunk[id >> CHUNK_BITS] && !(S.chunk[id >> CHUNK_BITS] = calloc(CHUNK, sizeof(snode))))
        return GM_ENOHOSTMEM;
    char *copy = strdup(name);
    if (!copy) return GM_ENOHOSTMEM;
    snode *x = node_at(id);
    x->name = copy;
    x->parent = parent;
    __atomic_store_n(&S.n, id + 1, __ATOMIC_RELEASE);
    S.table[j] = id;
    *out = id;
    return GM_OK;
}

int gm_scope_push(const char *name) {
    if (!name || !*name) return gm__set_error(GM_EINVAL, "gm_scope_push: empty scope name");
    if (tls_depth >= GM_SCOPE_MAX_DEPTH)
        return gm__set_error(GM_EINVAL, "gm_scope_push(\"%s\"): scopes nested deeper than %d", name,
                             GM_SCOPE_MAX_DEPTH);
    uint32_t parent = tls_depth ? tls_stack[tls_depth - 1] : 0, id;
    pthread_mutex_lock(&S.mu);
    int rc = intern(parent, name, &id);
    pthread_mutex_unlock(&S.mu);
    if (rc) return gm__set_error(rc, "gm_scope_push(\"%s\"): out of host memory for scope names", name);
    tls_stack[tls_depth++] = id;
    return GM_OK;
}

int gm_scope_pop(void) {
    if (!tls_depth) return gm__set_error(GM_ESTATE, "gm_scope_pop: this thread has no scope open");
    tls_depth--;
    return GM_OK;
}

int gm_scope_depth(void) { return tls_depth; }

int gm_scope_set_global(const char *name) {
    uint32_t id = 0;
    if (name) {
        if (!*name) return gm__set_error(GM_EINVAL, "gm_scope_set_global: empty scope name");
        pthread_mutex_lock(&S.mu);
        int rc = intern(0, name, &id);
        pthread_mutex_unlock(&S.mu);
        if (rc) return gm__set_error(rc, "gm_scope_set_global(\"%s\"): out of host memory", name);
    }
    __atomic_store_n(&global_scope, id, __ATOMIC_RELEASE);
    return GM_OK;
}

static inline uint32_t scope_now(void) {
    return tls_depth ? tls_stack[tls_depth - 1] : __atomic_load_n(&global_scope, __ATOMIC_ACQUIRE);
}

const char *gm_scope_current(void) { return tls_depth ? node_at(tls_stack[tls_depth - 1])->name : NULL; }

const char *gm__hist_scope_name(uint32_t node) {
    return node && node < __atomic_load_n(&S.n, __ATOMIC_ACQUIRE) ? node_at(node)->name : NULL;
}

uint32_t gm__hist_scope_parent(uint32_t node) {
    return node && node < __atomic_load_n(&S.n, __ATOMIC_ACQUIRE) ? node_at(node)->parent : 0;
}

/* ---- the ring ---------------------------------------------------------------- */

int gm__history_on;

static struct {
    gm__devlock lock;
    gm__hist_entry *e;
    size_t cap, head, n; /* next slot to write, entries held */
    uint64_t recorded, dropped;
    uint64_t t0_tick;
    double t0_ns;
    pthread_mutex_t oom_mu;
    char *oom_path;
    int oom_format;
    int (*oom_dump)(const char *path, int format); /* gm_history_dump, lent by the report layer */
} H = {.oom_mu = PTHREAD_MUTEX_INITIALIZER};

static double mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline uint64_t tick(void) {
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
#endif
}

static inline void put(int device, int action, uint64_t addr, uint64_t size, uint64_t stream, uint8_t cat,
                       uint32_t scope, uint64_t t) {
    if (!H.e) return; /* switched off and freed meanwhile */
    gm__hist_entry *x = &H.e[H.head];
    *x = (gm__hist_entry){t, addr, size, stream, scope, (uint8_t)action, (uint8_t)device, cat};
    if (++H.head == H.cap) H.head = 0;
    if (H.n < H.cap) H.n++;
    else H.dropped++;
    H.recorded++;
}

void gm__history_record(int device, int action, uint64_t addr, uint64_t size, uint64_t stream) {
    uint32_t scope = scope_now();
    uint64_t t = tick();
    gm__devlock_lock(&H.lock);
    put(device, action, addr, size, stream, GM__HIST_NO_CAT, scope, t);
    gm__devlock_unlock(&H.lock);
}

void gm__history_record_free(int device, uint64_t addr, uint64_t size, uint64_t stream, int completed) {
    uint32_t scope = scope_now();
    uint64_t t = tick();
    gm__devlock_lock(&H.lock);
    put(device, GM_TA_FREE_REQUESTED, addr, size, stream, GM__HIST_NO_CAT, scope, t);
    if (completed) put(device, GM_TA_FREE_COMPLETED, addr, size, stream, GM__HIST_NO_CAT, scope, t);
    gm__devlock_unlock(&H.lock);
}

/* Nanoseconds per tick, measured once per process over 2 ms, so every dump
 * converts a tick to the same time. */
static double ns_per_tick;
static pthread_once_t calibrate_once = PTHREAD_ONCE_INIT;

static void calibrate(void) {
    uint64_t t0 = tick();
    double n0 = mono_ns(), n1;
    while ((n1 = mono_ns()) - n0 < 2e6) {
    }
    uint64_t t1 = tick();
    ns_per_tick = t1 > t0 ? (n1 - n0) / (double)(t1 - t0) : 1.0;
}

/* ---- segment observer (history.h) ---------------------------------------- */

gm__seg_observer *gm__seg_observer_now;
static gm__seg_observer *obs_chain; /* every pair ever set, newest first */
static pthread_mutex_t obs_mu = PTHREAD_MUTEX_INITIALIZER;

int gm_set_segment_observer(gm_segment_observer cb, void *arg) {
    gm__clear_error();
    gm__seg_observer *o = NULL;
    if (cb) {
        o = calloc(1, sizeof *o);
        if (!o) return gm__set_error(GM_ENOHOSTMEM, "gm_set_segment_observer: out of host memory");
        o->cb = cb;
        o->arg = arg;
    }
    pthread_mutex_lock(&obs_mu);
    if (o) {
        o->older = obs_chain;
        obs_chain = o;
    }
    __atomic_store_n(&gm__seg_observer_now, o, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&obs_mu);
    return GM_OK;
}

int gm_history_enable(size_t max_entries) {
    gm__hist_entry *fresh = NULL;
    if (max_entries) {
        if (max_entries > ((size_t)1 << 32))
            return gm__set_error(GM_EINVAL, "gm_history_enable: %zu entries is more than 2^32", max_entries);
        fresh = malloc(max_entries * sizeof *fresh);
        if (!fresh)
            return gm__set_error(GM_ENOHOSTMEM, "gm_history_enable: no host memory for %zu entries (%zu bytes)",
                                 max_entries, max_entries * sizeof *fresh);
        memset(fresh, 0, max_entries * sizeof *fresh); /* fault the pages in now, not while recording */
    }
    if (fresh) pthread_once(&calibrate_once, calibrate);
    gm__hist_entry *old = NULL;
    gm__devlock_lock(&H.lock);
    if (fresh) {
        old = H.e;
        H.e = fresh;
        H.cap = max_entries;
        H.head = H.n = 0;
        H.recorded = H.dropped = 0;
        H.t0_tick = tick();
        H.t0_ns = mono_ns();
    }
    __atomic_store_n(&gm__history_on, fresh != NULL, __ATOMIC_RELAXED);
    gm__devlock_unlock(&H.lock);
    free(old);
    return GM_OK;
}

bool gm_history_enabled(void) { return __atomic_load_n(&gm__history_on, __ATOMIC_RELAXED) != 0; }

void gm_history_counts(uint64_t *recorded, uint64_t *held, uint64_t *dropped) {
    gm__devlock_lock(&H.lock);
    if (recorded) *recorded = H.recorded;
    if (held) *held = H.n;
    if (dropped) *dropped = H.dropped;
    gm__devlock_unlock(&H.lock);
}

int gm_history_tag(gm_devptr ptr, int category) {
    if (category < 0 || category >= GM_CAT_COUNT)
        return gm__set_error(GM_EINVAL, "gm_history_tag: category %d is not one of 0..%d", category,
                             GM_CAT_COUNT - 1);
    if (!gm_history_enabled()) return GM_OK;
    uint64_t t = tick();
    gm__devlock_lock(&H.lock);
    put(0, GM__HIST_TAG, ptr, 0, 0, (uint8_t)category, 0, t);
    gm__devlock_unlock(&H.lock);
    return GM_OK;
}

int gm__history_copy(gm__hist_copy *out) {
    memset(out, 0, sizeof *out);
    gm__devlock_lock(&H.lock);
    size_t n = H.n;
    gm__hist_entry *e = malloc((n ? n : 1) * sizeof *e);
    if (!e) {
        gm__devlock_unlock(&H.lock);
        return gm__set_error(GM_ENOHOSTMEM, "no host memory to copy %zu history entries", n);
    }
    size_t start = (H.head + H.cap - n) % (H.cap ? H.cap : 1);
    for (size_t i = 0; i < n; i++) e[i] = H.e[(start + i) % H.cap];
    out->e = e;
    out->n = n;
    out->dropped = H.dropped;
    out->t0_tick = H.t0_tick;
    out->t0_ns = H.t0_ns;
    gm__devlock_unlock(&H.lock);
    out->ns_per_tick = ns_per_tick ? ns_per_tick : 1.0;
    return GM_OK;
}

int gm__history_set_oom_dump(int (*dump)(const char *path, int format), const char *path, int format) {
    char *copy = path ? strdup(path) : NULL;
    if (path && !copy) return gm__set_error(GM_ENOHOSTMEM, "gm_history_dump_on_oom: out of host memory");
    pthread_mutex_lock(&H.oom_mu);
    free(H.oom_path);
    H.oom_path = copy;
    H.oom_format = format;
    H.oom_dump = dump;
    pthread_mutex_unlock(&H.oom_mu);
    return GM_OK;
}

void gm__history_oom(int device, uint64_t size, uint64_t stream) {
    if (!gm_history_enabled()) return;
    gm__history_record(device, GM_TA_OOM, 0, size, stream);
    pthread_mutex_lock(&H.oom_mu);
    if (H.oom_path && H.oom_dump) {
        /* keep the caller's OOM explanation */
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", gm_last_error_detail());
        H.oom_dump(H.oom_path, H.oom_format);
        gm__set_error(GM_ENOMEM, "%s", saved);
    }
    pthread_mutex_unlock(&H.oom_mu);
}
