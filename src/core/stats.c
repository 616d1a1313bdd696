/* stats.c — statistics output: gm_stats_to_json (torch.cuda.memory_stats()
 * keys, generated from the X-macro lists in gpumem.h) and the text of
 * torch.cuda.memory_summary() (torch/cuda/memory.py), column for column, so
 * people who know torch's table can read ours. Both write into a caller's
 * buffer and return GM_ENOSPACE, truncated and NUL-terminated, when it is too
 * small. */
#include "frontend.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* ---- JSON ------------------------------------------------------------------ */

int gm_stats_to_json(const gm_stats *s, char *buf, size_t len) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!s || (!buf && len)) return gm__set_error(GM_EINVAL, "gm_stats_to_json: NULL argument");
    static const char *const pools[] = GM_POOL_NAMES;
    gm__putbuf o = {buf, len, 0, false};
    if (len) buf[0] = '\0';
    const char *comma = "";
    gm__put(&o, "{");
#define GM__J_STAT(name, st)                                                   \
    gm__put(&o, "%s\"%s.current\":%lld,\"%s.peak\":%lld,\"%s.allocated\":%lld,\"%s.freed\":%lld", comma, name, \
        (long long)(st).current, name, (long long)(st).peak, name, (long long)(st).allocated, name,          \
        (long long)(st).freed);                                                \
    comma = ",";
#define GM__J_ARRAY(n)                                                         \
    for (int p = 0; p < GM_POOL_COUNT; p++) {                                  \
        char key[64];                                                          \
        snprintf(key, sizeof key, "%s.%s", #n, pools[p]);                      \
        GM__J_STAT(key, s->n[p])                                               \
    }
#define GM__J_SINGLE(n) GM__J_STAT(#n, s->n)
#define GM__J_COUNTER(n)                                                       \
    gm__put(&o, "%s\"%s\":%lld", comma, #n, (long long)s->n);                      \
    comma = ",";
    GM_STAT_ARRAYS(GM__J_ARRAY)
    GM_STAT_SINGLES(GM__J_SINGLE)
    GM_STAT_COUNTERS(GM__J_COUNTER)
#undef GM__J_STAT
#undef GM__J_ARRAY
#undef GM__J_SINGLE
#undef GM__J_COUNTER
    gm__put(&o, "}");
    return gm__put_finish(&o, "gm_stats_to_json");
}

/* ---- memory_summary ------------------------------------------------------- */

/* torch's _format_size: scale by the row's "all" value (pref) */
static void fmt_size(gm__putbuf *o, int64_t sz, double pref) {
    static const char *const prefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int k = 0;
    for (int i = 1; i < 6; i++) {
        if (pref < 768 * 1024) break;
        k = i;
        sz = sz >= 0 ? sz / 1024 : -((-sz + 1023) / 1024); /* Python's // */
        pref /= 1024;
    }
    gm__put(o, "%6lld %s", (long long)sz, prefixes[k]);
}

/* torch's _format_count */
static void fmt_count(gm__putbuf *o, int64_t cnt, double pref) {
    static const char *const prefixes[] = {" ", "K", "M"};
    int k = 0;
    for (int i = 1; i < 3; i++) {
        if (pref < 750 * 1000) break;
        k = i;
        cnt = cnt >= 0 ? cnt / 1000 : -((-cnt + 999) / 1000);
        pref /= 1000;
    }
    gm__put(o, "%7lld %s ", (long long)cnt, prefixes[k]);
}

typedef void (*fmt_fn)(gm__putbuf *, int64_t, double);

static void line_start(gm__putbuf *o) { gm__put(o, "|"); }
static void line_end(gm__putbuf *o) { gm__put(o, "|\n"); }

static void rule(gm__putbuf *o, char c) {
    char r[76];
    memset(r, c, 75);
    r[75] = '\0';
    gm__put(o, "|%s|\n", r);
}

static void row(gm__putbuf *o, const char *name, const gm_stat *st, const gm_stat *pref, fmt_fn f) {
    line_start(o);
    gm__put(o, " %-21s | ", name);
    f(o, st->current, (double)pref->current);
    gm__put(o, " | ");
    f(o, st->peak, (double)pref->peak);
    gm__put(o, " | ");
    f(o, st->allocated, (double)pref->allocated);
    gm__put(o, " | ");
    f(o, st->freed, (double)pref->freed);
    gm__put(o, " ");
    line_end(o);
}

int gm__format_summary(const gm_stats *s, int device, bool abbreviated, char *buf, size_t len) {
    if (!s || (!buf && len)) return gm__set_error(GM_EINVAL, "gm_memory_summary: NULL argument");
    gm__putbuf o = {buf, len, 0, false};
    if (len) buf[0] = '\0';
    static const struct {
        size_t off;
        const char *name;
        fmt_fn f;
    } metrics[] = {
        {offsetof(gm_stats, allocated_bytes), "Allocated memory", fmt_size},
        {offsetof(gm_stats, active_bytes), "Active memory", fmt_size},
        {offsetof(gm_stats, requested_bytes), "Requested memory", fmt_size},
        {offsetof(gm_stats, reserved_bytes), "GPU reserved memory", fmt_size},
        {offsetof(gm_stats, inactive_split_bytes), "Non-releasable memory", fmt_size},
        {offsetof(gm_stats, allocation), "Allocations", fmt_count},
        {offsetof(gm_stats, active), "Active allocs", fmt_count},
        {offsetof(gm_stats, segment), "GPU reserved segments", fmt_count},
        {offsetof(gm_stats, inactive_split), "Non-releasable allocs", fmt_count},
    };
    rule(&o, '=');
    gm__put(&o, "| %16s PyTorch CUDA memory summary, device ID %-17d |\n", "", device);
    rule(&o, '-');
    gm__put(&o, "|  %9s CUDA OOMs: %-12lld | %6s cudaMalloc retries: %-8lld  |\n", "", (long long)s->num_ooms, "",
        (long long)s->num_alloc_retries);
    rule(&o, '=');
    gm__put(&o, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n");
    for (size_t m = 0; m < sizeof metrics / sizeof *metrics; m++) {
        const gm_stat *arr = (const gm_stat *)((const char *)s + metrics[m].off);
        rule(&o, '-');
        row(&o, metrics[m].name, &arr[GM_POOL_ALL], &arr[GM_POOL_ALL], metrics[m].f);
        if (!abbreviated) {
            row(&o, "      from large pool", &arr[GM_POOL_LARGE], &arr[GM_POOL_ALL], metrics[m].f);
            row(&o, "      from small pool", &arr[GM_POOL_SMALL], &arr[GM_POOL_ALL], metrics[m].f);
        }
    }
    rule(&o, '-');
    row(&o, "Oversize allocations", &s->oversize_allocations, &s->oversize_allocations, fmt_count);
    rule(&o, '-');
    row(&o, "Oversize GPU segments", &s->oversize_segments, &s->oversize_segments, fmt_count);
    rule(&o, '=');
    return gm__put_finish(&o, "gm_memory_summary");
}
