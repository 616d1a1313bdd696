/* gpumem_torch.c — the one allocator a PyTorch process uses through
 * CUDAPluggableAllocator, created on first use with the settings given by
 * python/gpumem (gpumem.torch.install) or the environment, and the small C
 * functions the Python side calls with ctypes for stats, summary,
 * record_stream, empty_cache and errors, and (GPUMEM_PROFILE=1) counters of
 * the time spent inside the entry points. See gpumem_torch.h. */
#include "gpumem_torch.h"

#include "gpumem/backend.h"
#include "gpumem/gpumem.h"
#include "internal.h"
#include "monitor/monitor.h" /* gm__format_bytes */
#include "report/report.h"  /* gm__history_snapshot_bytes */

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static gm_allocator *g_alloc; /* published with release, read with acquire */
static gm_backend *g_backend;
static gm_config g_cfg;
static bool g_configured;
static char g_backend_name[16] = "cuda";
static uint64_t g_failed_frees;

/* Errors are the core's per-thread detail (gm__set_error), worded for torch
 * users ("gpumem: ..."); gpumem_torch_last_error() reads it back. */
static int fail(int st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int st, const char *fmt, ...) {
    char msg[GM__ERROR_DETAIL_MAX]; /* an argument may be the current detail */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gm__set_error(st, "%s", msg);
}

static int fail_lib(int st, const char *what) {
    const char *d = gm_last_error_detail();
    return fail(st, "gpumem: %s failed: %s (%s)%s%s", what, gm_strerror(st), gm_status_name(st), *d ? ": " : "",
                d);
}

const char *gpumem_torch_last_error(void) { return gm_last_error_detail(); }

static int parse_conf(const char *conf, gm_config *cfg) {
    char err[512] = "";
    gm_config_init(cfg);
    if (!conf) conf = getenv("GPUMEM_CONF");
    int st = gm_config_parse(cfg, conf ? conf : "", err, sizeof err);
    if (st != GM_OK) return fail(st, "gpumem: bad allocator configuration \"%s\": %s", conf, err);
    return GM_OK;
}

int gpumem_torch_configure(const char *conf, const char *backend) {
    gm__clear_error();
    if (backend && strcmp(backend, "cuda") != 0 && strcmp(backend, "sim") != 0)
        return fail(GM_EINVAL, "gpumem: unknown backend \"%s\" (expected cuda or sim)", backend);
    gm_config cfg;
    int st = parse_conf(conf, &cfg);
    if (st != GM_OK) return st;
    pthread_mutex_lock(&g_lock);
    if (g_alloc) {
        pthread_mutex_unlock(&g_lock);
        return fail(GM_ESTATE, "gpumem: the allocator already exists (it was used or configured before); "
                               "configure it before the first CUDA allocation");
    }
    g_cfg = cfg;
    g_configured = true;
    snprintf(g_backend_name, sizeof g_backend_name, "%s", backend ? backend : "cuda");
    pthread_mutex_unlock(&g_lock);
    gm__clear_error(); /* "" after success, whatever the parser left */
    return GM_OK;
}

static int create_locked(void) {
    if (!g_configured) {
        int st = parse_conf(NULL, &g_cfg);
        if (st != GM_OK) return st;
        g_configured = true;
    }
    int st;
    if (strcmp(g_backend_name, "sim") == 0) {
        gm_sim_options o;
        gm_sim_options_init(&o);
        st = gm_sim_create(&g_backend, &o);
    } else {
        st = gm_cuda_create(&g_backend);
    }
    if (st != GM_OK) return fail_lib(st, "creating the device backend");
    gm_allocator *a = NULL;
    st = gm_allocator_create(&a, g_backend, &g_cfg);
    if (st != GM_OK) {
        fail_lib(st, "creating the allocator");
        gm_backend_destroy(g_backend);
        g_backend = NULL;
        return st;
    }
    /* gpumem run --oom-report DIR: make DIR, record history for the snapshot */
    if (gm__oom_report_setup() != GM_OK) /* evidence is best effort: say why, train anyway */
        fprintf(stderr, "gpumem: no out-of-memory reports: %s\n", gm_last_error_detail());
    /* Visible to gpumem smi/top/log/exporter by default (GPUMEM_PUBLISH=0
     * turns it off; its cost per operation: bench/RESULTS.md, "Publishing
     * cost"). The label is
     * GPUMEM_PUBLISH_LABEL (install(label=...), gpumem run --label, the
     * script's name), else the executable's name. A monitor must never stop
     * the training: a failure to publish is not an error here, but it is
     * said (it used to be silent). */
    const char *pub = getenv("GPUMEM_PUBLISH");
    if ((!pub || strcmp(pub, "0") != 0) && gm_allocator_publish(a, getenv("GPUMEM_PUBLISH_LABEL")) != GM_OK)
        fprintf(stderr, "gpumem: not visible to gpumem smi/top (training goes on): %s\n", gm_last_error_detail());
    __atomic_store_n(&g_alloc, a, __ATOMIC_RELEASE);
    return GM_OK;
}

static int get(gm_allocator **out) {
    gm_allocator *a = __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE);
    if (!a) {
        pthread_mutex_lock(&g_lock);
        int st = g_alloc ? GM_OK : create_locked();
        a = g_alloc;
        pthread_mutex_unlock(&g_lock);
        if (st != GM_OK) return st;
    }
    *out = a;
    return GM_OK;
}

int gpumem_torch_init(void) {
    gm_allocator *a;
    gm__clear_error();
    int st = get(&a);
    if (st == GM_OK) gm__clear_error(); /* "" after success, even if publishing failed */
    return st;
}

int gpumem_torch_is_initialized(void) { return __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE) != NULL; }

void gpumem_torch_shutdown(void) {
    pthread_mutex_lock(&g_lock);
    if (g_alloc) gm_allocator_destroy(g_alloc);
    if (g_backend) gm_backend_destroy(g_backend);
    __atomic_store_n(&g_alloc, NULL, __ATOMIC_RELEASE);
    g_backend = NULL;
    g_configured = false;
    snprintf(g_backend_name, sizeof g_backend_name, "cuda");
    pthread_mutex_unlock(&g_lock);
}

/* ---- GPUMEM_PROFILE=1: the allocator's own cost, seen from torch ---------
 * Calls of the alloc/free entry points and the time spent inside them
 * (CLOCK_MONOTONIC through the vDSO, read twice a call), to tell the
 * allocator's CPU time apart from everything else in a training step. Off by
 * default: then the only cost is one predictable branch per call. */
enum { P_CALLS, P_NS, P_MAX_NS, P_SLOW, P_PER_KIND };
enum { PROF_ALLOC, PROF_FREE, PROF_KINDS };
#define PROF_SLOW_NS 10000 /* a call this long probably talked to the device */
static int g_profile;
static uint64_t g_prof[PROF_KINDS][P_PER_KIND];

__attribute__((constructor)) static void profile_from_env(void) {
    const char *e = getenv("GPUMEM_PROFILE");
    g_profile = e && *e && strcmp(e, "0") != 0;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void prof_add(int kind, uint64_t ns) {
    uint64_t *p = g_prof[kind];
    __atomic_add_fetch(&p[P_CALLS], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p[P_NS], ns, __ATOMIC_RELAXED);
    if (ns >= PROF_SLOW_NS) __atomic_add_fetch(&p[P_SLOW], 1, __ATOMIC_RELAXED);
    uint64_t m = __atomic_load_n(&p[P_MAX_NS], __ATOMIC_RELAXED);
    while (ns > m && !__atomic_compare_exchange_n(&p[P_MAX_NS], &m, ns, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

int gpumem_torch_profile_enable(int on) {
    return __atomic_exchange_n(&g_profile, on != 0, __ATOMIC_RELAXED);
}

void gpumem_torch_profile_reset(void) {
    for (int k = 0; k < PROF_KINDS; k++)
        for (int i = 0; i < P_PER_KIND; i++) __atomic_store_n(&g_prof[k][i], 0, __ATOMIC_RELAXED);
}

int gpumem_torch_profile(uint64_t *out, int n) {
    if (!out || n < 0) return fail(GM_EINVAL, "gpumem: profile: NULL buffer or negative length");
    for (int i = 0; i < n && i < GPUMEM_TORCH_PROFILE_FIELDS; i++)
        out[i] = __atomic_load_n(&g_prof[i / P_PER_KIND][i % P_PER_KIND], __ATOMIC_RELAXED);
    return GPUMEM_TORCH_PROFILE_FIELDS;
}

/* One counter per gm_bcall kind for device into out (calls or ns): backend_calls
 * and backend_ns. */
static int backend_counters(const char *what, uint64_t (*read)(const gm_backend *, int, int), int device,
                            uint64_t *out, int n) {
    if (!out || n < 0) return fail(GM_EINVAL, "gpumem: %s: NULL buffer or negative length", what);
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    int count = 0;
    st = gm_backend_device_count(g_backend, &count);
    if (st != GM_OK) return fail_lib(st, "device_count");
    if (device < 0 || device >= count)
        return fail(GM_EDEVICE, "gpumem: %s: device %d out of range (%d devices)", what, device, count);
    for (int k = 0; k < n && k < GM_BCALL_COUNT; k++) out[k] = read(g_backend, device, k);
    return GM_BCALL_COUNT;
}

int gpumem_torch_backend_calls(int device, uint64_t *out, int n) {
    return backend_counters("backend_calls", gm_backend_call_count, device, out, n);
}

int gpumem_torch_backend_ns(int device, uint64_t *out, int n) {
    return backend_counters("backend_ns", gm_backend_call_ns, device, out, n);
}

int gpumem_torch_capture_calls(int device, int who, uint64_t *out, int n) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_pool_capture_calls(a, device, who, out, n);
    return st < 0 ? fail_lib(st, "capture_calls") : st;
}

static int alloc_raw(int64_t size, int device, uint64_t stream, uint64_t id0, uint64_t id1, uint64_t *out) {
    gm_allocator *a;
    *out = 0;
    int st = get(&a);
    if (st != GM_OK) return st;
    if (size < 0) return fail(GM_EINVAL, "gpumem: negative allocation size %" PRId64, size);
    gm_devptr p = 0;
    if (__builtin_expect(id0 == 0 && id1 == 0, 1)) st = gm_malloc(a, device, (size_t)size, (gm_stream)stream, &p);
    else st = gm_malloc_pool(a, device, (size_t)size, (gm_stream)stream, id0, id1, &p);
    if (st == GM_ENOMEM) {
        /* the core's detail already says what was asked for and what is held;
         * under gpumem run --oom-report DIR the evidence goes to DIR first
         * (src/monitor/oom_report.c), and the detail is kept across it */
        char detail[2048];
        snprintf(detail, sizeof detail, "%s", gm_last_error_detail());
        gm__oom_report_from_env(a, device, (uint64_t)size, detail, gm__history_snapshot_bytes);
        const char *d = detail;
        const char *lead = "Out of memory. ";
        if (!strncmp(d, lead, strlen(lead))) d += strlen(lead);
        if (*d) return fail(st, "gpumem: CUDA out of memory. %s", d);
        char want[32];
        gm__format_bytes(size, want, sizeof want);
        return fail(st, "gpumem: CUDA out of memory. Tried to allocate %s on device %d.", want, device);
    }
    if (st != GM_OK) return fail_lib(st, "allocation");
    gm__clear_error();
    *out = p;
    return GM_OK;
}

int gpumem_torch_alloc_raw(int64_t size, int device, uint64_t stream, uint64_t *out) {
    if (__builtin_expect(!__atomic_load_n(&g_profile, __ATOMIC_RELAXED), 1))
        return alloc_raw(size, device, stream, 0, 0, out);
    uint64_t t0 = now_ns();
    int st = alloc_raw(size, device, stream, 0, 0, out);
    prof_add(PROF_ALLOC, now_ns() - t0);
    return st;
}

int gpumem_torch_alloc_pool(int64_t size, int device, uint64_t stream, uint64_t id0, uint64_t id1, uint64_t *out) {
    if (!out) return fail(GM_EINVAL, "gpumem: alloc_pool: NULL out");
    return alloc_raw(size, device, stream, id0, id1, out);
}

/* The pool entry points: the allocator is made on first use, as for an
 * allocation (a MemPool may come before any tensor). */
#define GM__TORCH_POOL_CALL(name, what)                                                        \
    int gpumem_torch_pool_##name(int device, uint64_t id0, uint64_t id1) {                     \
        gm_allocator *a;                                                                       \
        int st = get(&a);                                                                      \
        if (st != GM_OK) return st;                                                            \
        st = gm_pool_##name(a, device, id0, id1);                                              \
        return st == GM_OK ? (gm__clear_error(), GM_OK) : fail_lib(st, what);                  \
    }
GM__TORCH_POOL_CALL(retain, "createOrIncrefPool")
GM__TORCH_POOL_CALL(begin, "beginAllocateToPool")
GM__TORCH_POOL_CALL(end, "endAllocateToPool")
GM__TORCH_POOL_CALL(release, "releasePool")
GM__TORCH_POOL_CALL(empty_cache, "emptyCache(mempool_id)")
#undef GM__TORCH_POOL_CALL

int gpumem_torch_pool_set_tag(int device, uint64_t id0, uint64_t id1, const char *tag) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_pool_set_tag(a, device, id0, id1, tag);
    return st == GM_OK ? (gm__clear_error(), GM_OK) : fail_lib(st, "pool_set_tag");
}

int gpumem_torch_pool_set_options(int device, uint64_t id0, uint64_t id1, const gm_pool_options *o) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_pool_set_options(a, device, id0, id1, o);
    return st == GM_OK ? (gm__clear_error(), GM_OK) : fail_lib(st, "MemPool options");
}

int gpumem_torch_sleep(int device, const char *tag, int offload, uint64_t *released) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_allocator_sleep(a, device, tag, offload ? GM_SLEEP_OFFLOAD : 0, released);
    return st == GM_OK ? GM_OK : fail_lib(st, "sleep");
}

int gpumem_torch_wake(int device, const char *tag) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_allocator_wake(a, device, tag);
    return st == GM_OK ? GM_OK : fail_lib(st, "wake");
}

int gpumem_torch_set_settings(const char *conf) {
    gm__clear_error();
    if (!conf) return fail(GM_EINVAL, "gpumem: _set_allocator_settings: NULL settings");
    pthread_mutex_lock(&g_lock);
    gm_allocator *a = g_alloc;
    int st = GM_OK;
    if (!a) { /* nothing made yet: every key may change, for the allocator to come */
        if (!g_configured && (st = parse_conf(NULL, &g_cfg)) == GM_OK) g_configured = true;
        char err[512] = "";
        gm_config c = g_cfg;
        if (st == GM_OK && (st = gm_config_parse(&c, conf, err, sizeof err)) != GM_OK)
            fail(st, "gpumem: bad allocator settings \"%s\": %s", conf, err);
        else if (st == GM_OK)
            g_cfg = c;
    }
    pthread_mutex_unlock(&g_lock);
    if (!a) return st == GM_OK ? (gm__clear_error(), GM_OK) : st;
    st = gm_allocator_set_settings(a, conf);
    return st == GM_OK ? GM_OK : fail_lib(st, "_set_allocator_settings");
}

int gpumem_torch_pool_checkpoint(int device, uint64_t id0, uint64_t id1, gm_pool_checkpoint **out) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_pool_checkpoint_take(a, device, id0, id1, out);
    return st == GM_OK ? GM_OK : fail_lib(st, "getCheckpointState");
}

int gpumem_torch_pool_restore(gm_pool_checkpoint *c, gm_pool_restore_cb cb, void *arg) {
    gm_allocator *a = __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE);
    int st = gm_pool_checkpoint_restore(a, c, cb, arg);
    return st == GM_OK ? GM_OK : fail_lib(st, "setCheckpointPoolState");
}

void gpumem_torch_pool_checkpoint_free(gm_pool_checkpoint *c) {
    gm_pool_checkpoint_free(__atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE), c);
}

int gpumem_torch_pool_use_count(int device, uint64_t id0, uint64_t id1, int *out) {
    if (!out) return fail(GM_EINVAL, "gpumem: pool_use_count: NULL out");
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_pool_use_count(a, device, id0, id1, out);
    return st == GM_OK ? GM_OK : fail_lib(st, "getPoolUseCount");
}

static int free_raw(uint64_t ptr) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_free(a, ptr);
    return st == GM_OK ? GM_OK : fail_lib(st, "free");
}

int gpumem_torch_free_raw(uint64_t ptr) {
    if (__builtin_expect(!__atomic_load_n(&g_profile, __ATOMIC_RELAXED), 1)) return free_raw(ptr);
    uint64_t t0 = now_ns();
    int st = free_raw(ptr);
    prof_add(PROF_FREE, now_ns() - t0);
    return st;
}

int gpumem_torch_record_stream(uint64_t ptr, uint64_t stream) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_record_stream(a, ptr, stream);
    return st == GM_OK ? GM_OK : fail_lib(st, "record_stream");
}

int gpumem_torch_tag(uint64_t ptr, int category) {
    gm_allocator *a = __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE);
    /* the block (for the OOM explanation) and the history (for the report) */
    if (a && gm_block_set_category(a, ptr, category) == GM_EINVAL) return fail_lib(GM_EINVAL, "tag");
    int st = gm_history_tag(ptr, category);
    return st == GM_OK ? GM_OK : fail_lib(st, "tag");
}

int gpumem_torch_empty_cache(int device) {
    gm_allocator *a = __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE);
    if (!a) return GM_OK; /* nothing cached yet */
    int st = gm_empty_cache(a, device);
    return st == GM_OK ? GM_OK : fail_lib(st, "empty_cache");
}

int gpumem_torch_step_mark(int device) {
    gm_allocator *a = __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE);
    if (!a) return GM_OK; /* nothing allocated yet: no step to learn */
    int st = gm_step_mark(a, device);
    return st == GM_OK ? GM_OK : fail_lib(st, "step_mark");
}

int gpumem_torch_set_memory_fraction(double fraction, int device) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_set_memory_fraction(a, device, fraction);
    return st == GM_OK ? GM_OK : fail_lib(st, "set_memory_fraction");
}

int gpumem_torch_mem_get_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_mem_get_info(a, device, free_bytes, total_bytes);
    return st == GM_OK ? GM_OK : fail_lib(st, "mem_get_info");
}

int gpumem_torch_device_count(int *count) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_backend_device_count(g_backend, count);
    return st == GM_OK ? GM_OK : fail_lib(st, "device_count");
}

int gpumem_torch_stats_json(int device, char *buf, size_t len) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    gm_stats s = {.size = sizeof s};
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    st = gm_get_stats(a, device, &s);
    if (st != GM_OK) return fail_lib(st, "get_stats");
    st = gm_stats_to_json(&s, buf, len);
    return st == GM_OK ? GM_OK : fail_lib(st, "stats_to_json");
}

int gpumem_torch_reset_peak(int device) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_reset_peak_stats(a, device);
    return st == GM_OK ? GM_OK : fail_lib(st, "reset_peak_stats");
}

int gpumem_torch_reset_accumulated(int device) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_reset_accumulated_stats(a, device);
    return st == GM_OK ? GM_OK : fail_lib(st, "reset_accumulated_stats");
}

int gpumem_torch_summary(int device, int abbreviated, char *buf, size_t len) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    st = gm_memory_summary(a, device, abbreviated != 0, buf, len);
    return st == GM_OK ? GM_OK : fail_lib(st, "memory_summary");
}

int gpumem_torch_check(int device, char *buf, size_t len) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    return gm_check(a, device, buf, len);
}

void gpumem__torch_note_failed_free(void) { __atomic_add_fetch(&g_failed_frees, 1, __ATOMIC_RELAXED); }
uint64_t gpumem_torch_failed_frees(void) { return __atomic_load_n(&g_failed_frees, __ATOMIC_RELAXED); }

/* ---- for the C++ shim ------------------------------------------------------ */

int gpumem_torch_get_stats(int device, gm_stats *out) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    st = gm_get_stats(a, device, out);
    return st == GM_OK ? GM_OK : fail_lib(st, "get_stats");
}

int gpumem_torch_block(uint64_t ptr, int *device, gm_block_info *out) {
    gm_allocator *a = __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE);
    if (!a) return fail(GM_ESTATE, "gpumem: no allocator yet");
    return gm_block_lookup(a, ptr, device, out); /* GM_EFOREIGN is an answer, not an error */
}

int gpumem_torch_walk_segments(int device, gm_segment_cb cb, void *arg) {
    gm_allocator *a = __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE);
    if (!a) return GM_OK; /* nothing allocated yet */
    int st = gm_walk_segments(a, device, cb, arg);
    return st == GM_OK ? GM_OK : fail_lib(st, "walk_segments");
}

int gpumem_torch_walk_blocks(int device, gm_block_cb cb, void *arg) {
    gm_allocator *a = __atomic_load_n(&g_alloc, __ATOMIC_ACQUIRE);
    if (!a) return GM_OK;
    int st = gm_walk_blocks(a, device, cb, arg);
    return st == GM_OK ? GM_OK : fail_lib(st, "walk_blocks");
}

int gpumem_torch_set_segment_observer(gm_segment_observer cb, void *arg) {
    int st = gm_set_segment_observer(cb, arg);
    return st == GM_OK ? GM_OK : fail_lib(st, "set_segment_observer");
}

int gpumem_torch_config(gm_config *out, char *conf_str, size_t len) {
    gm_allocator *a;
    int st = get(&a);
    if (st != GM_OK) return st;
    *out = *gm_allocator_config(a);
    if (conf_str && len) {
        st = gm_config_format(out, conf_str, len);
        if (st != GM_OK) return fail_lib(st, "config_format");
    }
    return GM_OK;
}

void gpumem_torch_note_failed_free(void) { gpumem__torch_note_failed_free(); }

int gpumem_torch_max_devices(void) { return GM_MAX_DEVICES; }

/* The ctypes side's signatures, from the one list in gpumem_torch.h. */
const char *gpumem_torch_signatures(void) {
#define GPUMEM_TORCH__SIG(ret, name, params, sig) #name "=" sig "\n"
#define GPUMEM_TORCH__GM_SIG(name, sig) #name "=" sig "\n"
    return GPUMEM_TORCH_CTYPES_ENTRY_POINTS(GPUMEM_TORCH__SIG) GPUMEM_TORCH_CTYPES_GM_FUNCTIONS(GPUMEM_TORCH__GM_SIG);
#undef GPUMEM_TORCH__GM_SIG
#undef GPUMEM_TORCH__SIG
}
