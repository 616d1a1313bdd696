/* format.c — one sample written as JSON, CSV, a text table (gpumem smi) and
 * the Prometheus text format 0.0.4 (gpumem exporter). Bytes are integers;
 * a value that is not available is JSON null, an empty CSV field, a "-" in
 * the table and an absent Prometheus series. */
#include "internal.h"
#include "monitor/monitor.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Grow b to hold n more bytes than it could (doubling, at least 4 KiB);
 * false, with b->oom set, when out of memory. */
static bool sbuf_grow(gm__sbuf *b, size_t n) {
    size_t ncap = (b->cap ? b->cap * 2 : 4096) + n;
    char *np = realloc(b->p, ncap);
    if (!np) {
        b->oom = true;
        return false;
    }
    b->p = np;
    b->cap = ncap;
    return true;
}

void gm__sbuf_printf(gm__sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        if (!sbuf_grow(b, (size_t)n)) return;
    }
}

/* Append n bytes: the escapes' fast path, no format parsing. */
static void sbuf_put(gm__sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->cap - b->len <= n && !sbuf_grow(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void gm__sbuf_free(gm__sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- text values: the one writer -------------------------------------------
 * Every string the monitor prints (labels, run ids, names: from other
 * processes' headers, the environment, /proc) goes through put_text: valid
 * UTF-8 passes, each invalid byte becomes U+FFFD (JSON and Prometheus's
 * text format require UTF-8: one bad byte made promtool reject a whole
 * scrape), then the format's own escapes. */
enum { TEXT_JSON, TEXT_PROM, TEXT_CSV };

static void put_text(gm__sbuf *b, const char *s, int how) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const unsigned char *run = p; /* plain bytes go out in one piece */
        int n;
        while ((n = gm__utf8_len(p)) > 1 || (n == 1 && *p >= 0x20 && *p != 0x7F && *p != '"' && *p != '\\'))
            p += n;
        sbuf_put(b, (const char *)run, (size_t)(p - run));
        if (!*p) return;
        unsigned c = *p++;
        if (!n) sbuf_put(b, GM__UTF8_REPLACEMENT, sizeof GM__UTF8_REPLACEMENT - 1);
        else if (how == TEXT_CSV) sbuf_put(b, c == '"' ? "\"\"" : (const char *)p - 1, c == '"' ? 2 : 1);
        else if (c == '"' || c == '\\') gm__sbuf_printf(b, "\\%c", c);
        else if (c == '\n') sbuf_put(b, "\\n", 2);
        else if (how == TEXT_JSON) gm__sbuf_printf(b, "\\u%04x", c); /* the other controls */
        else sbuf_put(b, (const char *)p - 1, 1);                     /* Prometheus: as they are */
    }
}

static void json_str(gm__sbuf *b, const char *s) {
    sbuf_put(b, "\"", 1);
    put_text(b, s, TEXT_JSON);
    sbuf_put(b, "\"", 1);
}

static void json_opt_str(gm__sbuf *b, const char *key, bool have, const char *s) {
    gm__sbuf_printf(b, "\"%s\":", key);
    if (have && s[0]) json_str(b, s);
    else gm__sbuf_printf(b, "null");
}

static void json_opt_int(gm__sbuf *b, const char *key, bool have, long long v) {
    if (have) gm__sbuf_printf(b, "\"%s\":%lld", key, v);
    else gm__sbuf_printf(b, "\"%s\":null", key);
}

static const char *source_name(uint32_t s) {
    return s == GM__SRC_GPUMEM ? "gpumem" : s == GM__SRC_TORCH ? "torch" : NULL;
}

static void json_device(gm__sbuf *b, const gm__mon_dev *d, const char *sep) {
    gm__sbuf_printf(b, "{\"gpu\":%d,", d->index);
    json_opt_str(b, "name", d->have_info, d->name);
    gm__sbuf_printf(b, ",");
    json_opt_str(b, "uuid", true, d->uuid);
    gm__sbuf_printf(b, ",");
    json_opt_str(b, "pci_bus_id", true, d->pci_bus_id);
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "total", d->have_mem || d->have_alloc_total, (long long)d->total);
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "driver_reserved", d->have_reserved, (long long)d->reserved);
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "used", d->have_mem, (long long)d->used);
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "free", d->have_mem, (long long)d->free);
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "util_gpu", d->have_util, d->util_gpu);
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "util_memory", d->have_util, d->util_mem);
    gm__sbuf_printf(b, "}%s", sep);
}

/* ,"step":{GM_MON_STEP_STATS..., "walk_step", "categories":{name: bytes}} or null */
static void json_step(gm__sbuf *b, const gm__mon_row *r) {
    if (!r->have_step) {
        gm__sbuf_printf(b, ",\"step\":null");
        return;
    }
    const gm__shm_step_values *t = &r->step;
    const char *sep = "";
    gm__sbuf_printf(b, ",\"step\":{");
#define J(name, val, prom, help)                                   \
    gm__sbuf_printf(b, "%s", sep);                                \
    json_opt_int(b, #name, (val) >= 0, (long long)(val));         \
    sep = ",";
    GM_MON_STEP_STATS(J)
#undef J
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "walk_step", t->walk_step >= 0, (long long)t->walk_step);
    if (t->walk_step < 0) gm__sbuf_printf(b, ",\"categories\":null}");
    else {
        gm__sbuf_printf(b, ",\"categories\":{");
        for (int c = 0; c < GM_CAT_COUNT; c++) gm__sbuf_printf(b, "\"%s\":%lld,", gm_category_name(c), (long long)t->category[c]);
        gm__sbuf_printf(b, "\"untagged\":%lld}}", (long long)t->untagged);
    }
}

static void json_row(gm__sbuf *b, const gm__mon_row *r, const char *sep) {
    bool a = r->have_alloc, outside = a && r->have_nvml_used;
    const char *src = source_name(r->source);
    gm__sbuf_printf(b, "{\"pid\":%d,\"gpu\":%d,", r->pid, r->device);
    json_opt_int(b, "ns_pid", r->ns_pid > 0, r->ns_pid);
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "host_pid", r->host_pid > 0, r->host_pid);
    gm__sbuf_printf(b, ",");
    json_opt_str(b, "pid_map", gm__pidmap_name(r->pid_map) != NULL, gm__pidmap_name(r->pid_map) ? gm__pidmap_name(r->pid_map) : "");
    gm__sbuf_printf(b, ",");
#define GM__JSON_STR(n) json_opt_str(b, #n, true, r->id.n);
#define GM__JSON_INT(n) json_opt_int(b, #n, r->id.n >= 0, r->id.n);
#define GM__JSON_ID(name, kind, help) GM__JSON_##kind(name) gm__sbuf_printf(b, ",");
    GM_MON_IDENTITY(GM__JSON_ID)
#undef GM__JSON_ID
#undef GM__JSON_STR
#undef GM__JSON_INT
    json_opt_str(b, "comm", true, r->comm);
    gm__sbuf_printf(b, ",");
    json_opt_str(b, "label", true, r->label);
    gm__sbuf_printf(b, ",");
    json_opt_str(b, "source", src != NULL, src ? src : "");
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "nvml_used", r->have_nvml_used, (long long)r->nvml_used);
    const gm__shm_values *v = &r->v;
#define F(name, val, torch, prom, type, help, col) \
    gm__sbuf_printf(b, ",");                       \
    json_opt_int(b, #name, a, (long long)(val));
    GM_MON_STATS(F)
#undef F
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "last_update_ns", a, (long long)v->update_ns);
    gm__sbuf_printf(b, ",\"held\":%s", r->held ? "true" : "false");
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "outside_allocator", outside, (long long)r->nvml_used - r->v.reserved);
    gm__sbuf_printf(b, ",");
    json_opt_int(b, "uid", r->have_uid, r->uid);
    json_step(b, r);
    gm__sbuf_printf(b, "}%s", sep);
}

void gm__format_json(const gm__mon_sample *s, gm__sbuf *b, bool one_line) {
    const char *nl = one_line ? "" : "\n", *ind = one_line ? "" : "  ";
    gm__sbuf_printf(b, "{%s%s\"time_ns\":%llu,%s%s\"nvml\":{\"available\":%s,\"memory_info\":%s,",
                    nl, ind, (unsigned long long)s->time_ns, nl, ind, s->nvml ? "true" : "false",
                    !s->nvml ? "null" : s->nvml_mem_v1 ? "\"v1\"" : "\"v2\"");
    json_opt_str(b, "note", true, s->nvml_note);
    gm__sbuf_printf(b, "},%s%s\"host_view\":%s,\"all_users\":%s,", nl, ind, s->host_view ? "true" : "false",
                    s->all_users ? "true" : "false");
    gm__sbuf_printf(b, "%s%s\"devices\":[", nl, ind);
    for (int i = 0; i < s->ndevices; i++) {
        gm__sbuf_printf(b, "%s%s%s", nl, ind, ind);
        json_device(b, &s->devs[i], i + 1 < s->ndevices ? "," : "");
    }
    gm__sbuf_printf(b, "%s%s],%s%s\"processes\":[", s->ndevices ? nl : "", s->ndevices ? ind : "", nl, ind);
    for (int i = 0; i < s->nrows; i++) {
        gm__sbuf_printf(b, "%s%s%s", nl, ind, ind);
        json_row(b, &s->rows[i], i + 1 < s->nrows ? "," : "");
    }
    gm__sbuf_printf(b, "%s%s]%s}\n", s->nrows ? nl : "", s->nrows ? ind : "", nl);
}

/* ---- CSV: one line per (process, GPU); a GPU without processes gets one
 * line with the process fields empty ----------------------------------- */

static void csv_str(gm__sbuf *b, const char *s) {
    bool quote = strpbrk(s, ",\"\n\r") != NULL;
    if (quote) sbuf_put(b, "\"", 1);
    put_text(b, s, TEXT_CSV);
    if (quote) sbuf_put(b, "\"", 1);
}

static void csv_int(gm__sbuf *b, bool have, long long v) {
    if (have) gm__sbuf_printf(b, ",%lld", v);
    else gm__sbuf_printf(b, ",");
}

/* Device columns (NVML), then the process's: pid, label, its identity
 * (GM_MON_IDENTITY), NVML used, the published statistics (GM_MON_STATS),
 * outside_allocator, held, and the pid in the publisher's namespace and the
 * host's with how the latter is known (last, so older readers' columns keep
 * their places). */
#define GM__CSV_DEVICE_COLS "time_ns,gpu,uuid,total,driver_reserved,used,free"
#define GM__CSV_COUNT(...) +1
enum { CSV_PROC_COLS = 3 GM_MON_IDENTITY(GM__CSV_COUNT) GM_MON_STATS(GM__CSV_COUNT) + 5 };

void gm__format_csv_header(gm__sbuf *b) {
    gm__sbuf_printf(b, GM__CSV_DEVICE_COLS ",pid,label");
#define H(name, ...) gm__sbuf_printf(b, "," #name);
    GM_MON_IDENTITY(H)
#undef H
    gm__sbuf_printf(b, ",nvml_used");
#define H(name, ...) gm__sbuf_printf(b, "," #name);
    GM_MON_STATS(H)
#undef H
    gm__sbuf_printf(b, ",outside_allocator,held,ns_pid,host_pid,pid_map\n");
}

static void csv_line(gm__sbuf *b, const gm__mon_sample *s, const gm__mon_dev *d, const gm__mon_row *r) {
    gm__sbuf_printf(b, "%llu,%d,", (unsigned long long)s->time_ns, d ? d->index : r->device);
    csv_str(b, d ? d->uuid : "");
    csv_int(b, d && (d->have_mem || d->have_alloc_total), d ? (long long)d->total : 0);
    csv_int(b, d && d->have_reserved, d ? (long long)d->reserved : 0);
    csv_int(b, d && d->have_mem, d ? (long long)d->used : 0);
    csv_int(b, d && d->have_mem, d ? (long long)d->free : 0);
    if (!r) {
        for (int i = 0; i < CSV_PROC_COLS; i++) gm__sbuf_printf(b, ",");
        gm__sbuf_printf(b, "\n");
        return;
    }
    gm__sbuf_printf(b, ",%d,", r->pid);
    csv_str(b, r->label);
#define GM__CSV_STR(n) gm__sbuf_printf(b, ","); csv_str(b, r->id.n);
#define GM__CSV_INT(n) csv_int(b, r->id.n >= 0, r->id.n);
#define GM__CSV_ID(name, kind, help) GM__CSV_##kind(name)
    GM_MON_IDENTITY(GM__CSV_ID)
#undef GM__CSV_ID
#undef GM__CSV_STR
#undef GM__CSV_INT
    bool a = r->have_alloc;
    const gm__shm_values *v = &r->v;
    csv_int(b, r->have_nvml_used, (long long)r->nvml_used);
#define C(name, val, ...) csv_int(b, a, (long long)(val));
    GM_MON_STATS(C)
#undef C
    csv_int(b, a && r->have_nvml_used, (long long)r->nvml_used - r->v.reserved);
    gm__sbuf_printf(b, ",%d", r->held ? 1 : 0);
    csv_int(b, r->ns_pid > 0, r->ns_pid);
    csv_int(b, r->host_pid > 0, r->host_pid);
    const char *map = gm__pidmap_name(r->pid_map);
    gm__sbuf_printf(b, ",%s\n", map ? map : "");
}

void gm__format_csv(const gm__mon_sample *s, gm__sbuf *b) {
    for (int d = 0; d < s->ndevices; d++) {
        int n = 0;
        for (int i = 0; i < s->nrows; i++)
            if (s->rows[i].device == d) {
                csv_line(b, s, &s->devs[d], &s->rows[i]);
                n++;
            }
        if (!n) csv_line(b, s, &s->devs[d], NULL);
    }
}

/* ---- text table -------------------------------------------------------- */

static const char *human(bool have, long long v, char *buf, size_t len) {
    return have ? gm__format_bytes(v, buf, len) : "-";
}

/* A statistic's table cell: bytes for a gauge, a count for a counter. */
enum { GM__MON_gauge, GM__MON_counter };
static const char *cell(bool have, long long v, int type, char *buf, size_t len) {
    if (type == GM__MON_gauge || !have) return human(have, v, buf, len);
    snprintf(buf, len, "%lld", v);
    return buf;
}

void gm__format_printable(char *dst, const char *src, size_t len) {
    gm__utf8_copy(dst, len, src); /* valid UTF-8, cut on a character boundary (put_text's rule) */
    for (char *p = dst; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7F) *p = '?';
}

const char *gm__format_pid(const gm__mon_row *r, char *buf, size_t len) {
    snprintf(buf, len, "%d%s", r->pid, r->pid_map == GM_PIDMAP_INFERRED ? "?" : r->pid_map == GM_PIDMAP_UNMAPPED ? "^" : "");
    return buf;
}

/* The jobs among the rows (rows come sorted by run id): one line each with
 * the ranks seen against the world size, and the sums over its ranks. */
static void format_jobs(const gm__mon_sample *s, gm__sbuf *b) {
    char b1[24], b2[24], b3[24], b4[24], job[41];
    bool header = false;
    for (int i = 0; i < s->nrows;) {
        const gm__mon_ident *id = &s->rows[i].id;
        int j = i, ranks = 0, last_rank = -2, world = -1;
        int64_t alloc = 0, res = 0, ooms = 0, lo = INT64_MAX, hi = 0;
        for (; j < s->nrows && !strcmp(s->rows[j].id.run_id, id->run_id); j++) {
            const gm__mon_row *r = &s->rows[j];
            if (r->id.rank != last_rank || r->id.rank < 0) ranks++;
            last_rank = r->id.rank;
            if (r->id.world_size > world) world = r->id.world_size;
            if (!r->have_alloc) continue;
            alloc += r->v.allocated;
            res += r->v.reserved;
            ooms += r->v.num_ooms;
            lo = r->v.reserved < lo ? r->v.reserved : lo;
            hi = r->v.reserved > hi ? r->v.reserved : hi;
        }
        if (id->run_id[0]) {
            if (!header)
                gm__sbuf_printf(b, "\n%-40s %11s %11s %11s %11s %11s %5s\n", "Job", "Ranks", "Allocated", "Reserved",
                                "Min res", "Max res", "OOMs");
            header = true;
            char rk[24];
            if (world > 0) snprintf(rk, sizeof rk, "%d/%d", ranks, world);
            else snprintf(rk, sizeof rk, "%d", ranks);
            gm__format_printable(job, id->run_id, sizeof job);
            gm__sbuf_printf(b, "%-40s %11s %11s %11s %11s %11s %5lld\n", job, rk, human(true, alloc, b1, 24),
                            human(true, res, b2, 24), human(lo != INT64_MAX, lo, b3, 24),
                            human(lo != INT64_MAX, hi, b4, 24), (long long)ooms);
        }
        i = j;
    }
}

void gm__format_pid_note(const gm__mon_sample *s, gm__sbuf *b) {
    bool inferred = false, unmapped = false;
    for (int i = 0; i < s->nrows; i++) {
        inferred |= s->rows[i].pid_map == GM_PIDMAP_INFERRED;
        unmapped |= s->rows[i].pid_map == GM_PIDMAP_UNMAPPED;
    }
    if (inferred)
        gm__sbuf_printf(b, "pid?: inside a PID namespace NVML's pids are the host's: joined to NVML by the only "
                           "plausible match, not by the kernel's numbers\n");
    if (unmapped)
        gm__sbuf_printf(b, "pid^: NVML's pid (the host's on most drivers), matching no process that publishes here\n");
}

void gm__format_table(const gm__mon_sample *s, gm__sbuf *b) {
    char t[64], b1[24], b2[24], b3[24], b4[24], b6[24];
    time_t sec = (time_t)(s->time_ns / 1000000000ull);
    struct tm tm;
    localtime_r(&sec, &tm);
    strftime(t, sizeof t, "%Y-%m-%d %H:%M:%S", &tm);
    gm__sbuf_printf(b, "gpumem %s  %s\n", GM_VERSION_STRING, t);
    if (s->nvml_note[0]) gm__sbuf_printf(b, "note: %s\n", s->nvml_note);
    gm__sbuf_printf(b, "%-4s %-24s %-13s %12s %12s %12s %12s %5s\n", "GPU", "Name", "Bus-Id", "Total",
                    "Drv-reserved", "Used", "Free", "Util");
    for (int i = 0; i < s->ndevices; i++) {
        const gm__mon_dev *d = &s->devs[i];
        char util[8] = "-";
        if (d->have_util) snprintf(util, sizeof util, "%u%%", d->util_gpu);
        gm__sbuf_printf(b, "%-4d %-24.24s %-13.13s %12s %12s %12s %12s %5s\n", d->index,
                        d->have_info ? d->name : "-", d->pci_bus_id[0] ? d->pci_bus_id : "-",
                        human(d->have_mem || d->have_alloc_total, (long long)d->total, b1, 24),
                        human(d->have_reserved, (long long)d->reserved, b2, 24),
                        human(d->have_mem, (long long)d->used, b3, 24),
                        human(d->have_mem, (long long)d->free, b4, 24), util);
    }
    /* the process table: NVML's use, the statistics with a column, then
     * what NVML sees beyond the allocator (context, libraries, other allocators) */
    gm__sbuf_printf(b, "\n%-4s %-8s %-16s %-12s %5s %11s", "GPU", "PID", "Process", "Job", "Rank", "NVML used");
#define HEAD(name, val, torch, prom, type, help, col) \
    if (col) gm__sbuf_printf(b, " %11s", col ? col : "");
    GM_MON_STATS(HEAD)
#undef HEAD
    gm__sbuf_printf(b, " %11s\n", "Outside");
    if (!s->nrows)
        gm__sbuf_printf(b, "(no processes: a process shows here once it uses gpumem's allocator, or runs "
                           "under 'gpumem run'; try 'gpumem demo' in another terminal)\n");
    for (int i = 0; i < s->nrows; i++) {
        const gm__mon_row *r = &s->rows[i];
        const gm__shm_values *v = &r->v;
        char name[17], job[13], rank[12] = "-", pid[16];
        gm__format_printable(name, r->label, sizeof name);
        gm__format_printable(job, r->id.run_id[0] ? r->id.run_id : "-", sizeof job);
        if (r->id.rank >= 0) snprintf(rank, sizeof rank, "%d", r->id.rank);
        bool a = r->have_alloc;
        gm__sbuf_printf(b, "%-4d %-8s %-16s %-12s %5s %11s", r->device, gm__format_pid(r, pid, sizeof pid), name, job, rank,
                        human(r->have_nvml_used, (long long)r->nvml_used, b1, 24));
#define CELL(name, val, torch, prom, type, help, col) \
    if (col) gm__sbuf_printf(b, " %11s", cell(a, (long long)(val), GM__MON_##type, b1, 24));
        GM_MON_STATS(CELL)
#undef CELL
        gm__sbuf_printf(b, " %11s%s\n", human(a && r->have_nvml_used, (long long)r->nvml_used - r->v.reserved, b6, 24),
                        r->held ? " (held)" : "");
    }
    format_jobs(s, b);
    gm__format_pid_note(s, b);
}

/* ---- Prometheus text format 0.0.4 ---------------------------------------- */

void gm__prom_escape(gm__sbuf *b, const char *s) { put_text(b, s, TEXT_PROM); }

static void prom_family(gm__sbuf *b, const char *name, const char *type, const char *help) {
    gm__sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* gpu="N" and UUID="..." when NVML gave one (no empty label): the labels
 * dcgm-exporter gives its series, so `* on (UUID)` joins them */
static void prom_gpu_labels(gm__sbuf *b, int gpu, const char *uuid) {
    gm__sbuf_printf(b, "gpu=\"%d\"", gpu);
    if (uuid && uuid[0]) {
        gm__sbuf_printf(b, ",UUID=\"");
        gm__prom_escape(b, uuid);
        gm__sbuf_printf(b, "\"");
    }
}

static void prom_label(gm__sbuf *b, const char *name, const char *value) {
    if (!value[0]) return;
    gm__sbuf_printf(b, ",%s=\"", name);
    gm__prom_escape(b, value);
    gm__sbuf_printf(b, "\"");
}

static const gm__mon_dev *dev_of(const gm__mon_sample *s, int index) {
    static const gm__mon_dev none;
    return index >= 0 && index < s->ndevices ? &s->devs[index] : &none;
}

enum { DEV_TOTAL, DEV_RESERVED, DEV_USED, DEV_FREE };

/* A device series: gpu, UUID, modelName and Hostname as dcgm-exporter
 * names them. */
static void prom_devices(const gm__mon_sample *s, gm__sbuf *b, int which, const char *name, const char *help) {
    prom_family(b, name, "gauge", help);
    for (int i = 0; i < s->ndevices; i++) {
        const gm__mon_dev *d = &s->devs[i];
        uint64_t v[] = {d->total, d->reserved, d->used, d->free};
        bool total_only = which == DEV_TOTAL && d->have_alloc_total; /* no NVML: the backend's size */
        if ((!d->have_mem && !total_only) || (which == DEV_RESERVED && !d->have_reserved)) continue;
        gm__sbuf_printf(b, "%s{", name);
        prom_gpu_labels(b, d->index, d->uuid);
        if (d->have_info) prom_label(b, "modelName", d->name);
        prom_label(b, "Hostname", s->hostname);
        gm__sbuf_printf(b, "} %llu\n", (unsigned long long)v[which]);
    }
}

/* The key of a process's series: {gpu, UUID, pid (as this exporter sees
 * it)}. Three labels, whatever the job: who the process is lives once, in
 * gpumem_process_info, so 1,000 ranks make 1,000 series per family, not
 * one per value of every identity label. */
static void prom_key(const gm__mon_sample *s, gm__sbuf *b, const gm__mon_row *r) {
    prom_gpu_labels(b, r->device, dev_of(s, r->device)->uuid);
    gm__sbuf_printf(b, ",pid=\"%d\"", r->pid);
}

static void prom_row(const gm__mon_sample *s, gm__sbuf *b, const char *name, const gm__mon_row *r, long long v) {
    gm__sbuf_printf(b, "%s{", name);
    prom_key(s, b, r);
    gm__sbuf_printf(b, "} %lld\n", v);
}

/* gpumem_process_info{key, ns_pid and host_pid where they differ from pid,
 * pid_map where the host pid is inferred or the pid is NVML's unmapped, uid,
 * source, comm (the executable), label (what the process calls itself),
 * Hostname (this node), then its identity (GM_MON_IDENTITY: run_id, rank,
 * ...; never Prometheus's own job and instance), each only when known} 1 */
static void prom_info(const gm__mon_sample *s, gm__sbuf *b, const gm__mon_row *r) {
    gm__sbuf_printf(b, "gpumem_process_info{");
    prom_key(s, b, r);
    if (r->ns_pid > 0 && r->ns_pid != r->pid) gm__sbuf_printf(b, ",ns_pid=\"%d\"", r->ns_pid);
    if (r->host_pid > 0 && r->host_pid != r->pid) gm__sbuf_printf(b, ",host_pid=\"%d\"", r->host_pid);
    if (r->pid_map == GM_PIDMAP_INFERRED || r->pid_map == GM_PIDMAP_UNMAPPED)
        gm__sbuf_printf(b, ",pid_map=\"%s\"", gm__pidmap_name(r->pid_map));
    if (r->have_uid) gm__sbuf_printf(b, ",uid=\"%u\"", r->uid);
    const char *src = source_name(r->source);
    if (src) gm__sbuf_printf(b, ",source=\"%s\"", src);
    prom_label(b, "comm", r->comm);
    prom_label(b, "label", r->label);
    prom_label(b, "Hostname", s->hostname);
#define GM__PROM_STR(n) prom_label(b, #n, r->id.n);
#define GM__PROM_INT(n) \
    if (r->id.n >= 0) gm__sbuf_printf(b, "," #n "=\"%d\"", r->id.n);
#define GM__PROM_ID(name, kind, help) GM__PROM_##kind(name)
    GM_MON_IDENTITY(GM__PROM_ID)
#undef GM__PROM_ID
#undef GM__PROM_STR
#undef GM__PROM_INT
    gm__sbuf_printf(b, "} 1\n");
}

/* The step records (gm_step_mark): one family per GM_MON_STEP_STATS entry,
 * then live bytes by category at the last block walk. */
static void prom_steps(const gm__mon_sample *s, gm__sbuf *b) {
#define STEP_FAMILY(name, val, prom, help)                                                  \
    prom_family(b, "gpumem_process_" prom, "gauge", help);                                 \
    for (int i = 0; i < s->nrows; i++) {                                                   \
        const gm__shm_step_values *t = &s->rows[i].step;                                   \
        if (s->rows[i].have_step && (val) >= 0)                                            \
            prom_row(s, b, "gpumem_process_" prom, &s->rows[i], (long long)(val));         \
    }
    GM_MON_STEP_STATS(STEP_FAMILY)
#undef STEP_FAMILY
    prom_family(b, "gpumem_process_category_bytes", "gauge",
                "Live bytes by category (gpumem.torch.track) at a recent step start.");
    for (int i = 0; i < s->nrows; i++) {
        const gm__mon_row *r = &s->rows[i];
        if (!r->have_step || r->step.walk_step < 0) continue;
        for (int c = 0; c <= GM_CAT_COUNT; c++) {
            gm__sbuf_printf(b, "gpumem_process_category_bytes{");
            prom_key(s, b, r);
            gm__sbuf_printf(b, ",category=\"%s\"} %lld\n", c < GM_CAT_COUNT ? gm_category_name(c) : "untagged",
                            (long long)(c < GM_CAT_COUNT ? r->step.category[c] : r->step.untagged));
        }
    }
}

void gm__format_prometheus(const gm__mon_sample *s, gm__sbuf *b) {
    prom_devices(s, b, DEV_TOTAL, "gpumem_device_memory_total_bytes",
                 "Device memory in total (NVML; without it, as the allocators' backend reports it).");
    prom_devices(s, b, DEV_RESERVED, "gpumem_device_memory_driver_reserved_bytes",
                 "Device memory reserved by the driver (NVML memory info v2).");
    prom_devices(s, b, DEV_USED, "gpumem_device_memory_used_bytes", "Device memory used by processes (NVML).");
    prom_devices(s, b, DEV_FREE, "gpumem_device_memory_free_bytes", "Device memory free (NVML).");
#define FAMILY(name, val, torch, prom, type, help, col)                                 \
    prom_family(b, "gpumem_process_allocator_" prom, #type, help);                      \
    for (int i = 0; i < s->nrows; i++) {                                               \
        const gm__shm_values *v = &s->rows[i].v;                                       \
        if (s->rows[i].have_alloc)                                                     \
            prom_row(s, b, "gpumem_process_allocator_" prom, &s->rows[i], (long long)(val)); \
    }
    GM_MON_STATS(FAMILY)
#undef FAMILY
    prom_family(b, "gpumem_process_device_memory_bytes", "gauge",
                "Device memory used by the process as NVML reports it (context and libraries included).");
    for (int i = 0; i < s->nrows; i++)
        if (s->rows[i].have_nvml_used) prom_row(s, b, "gpumem_process_device_memory_bytes", &s->rows[i],
                                                (long long)s->rows[i].nvml_used);
    prom_steps(s, b);
    prom_family(b, "gpumem_process_info", "gauge",
                "1 per process and GPU: who it is (identity labels), joined to the other gpumem_process_ "
                "series on (gpu, UUID, pid).");
    for (int i = 0; i < s->nrows; i++) prom_info(s, b, &s->rows[i]);
    prom_family(b, "gpumem_nvml_available", "gauge", "1 if NVML was loaded, 0 if not.");
    gm__sbuf_printf(b, "gpumem_nvml_available %d\n", s->nvml ? 1 : 0);
    prom_family(b, "gpumem_producers", "gauge", "Processes publishing allocator stats.");
    gm__sbuf_printf(b, "gpumem_producers %d\n", s->nproducers);
    prom_family(b, "gpumem_segments_skipped", "gauge",
                "Publication segments the last scan skipped as not verifiable, by reason (hostile or broken).");
    static const char *const reasons[] = {
#define GM__SKIP_NAME(n, str) str,
        GM__SKIP_REASONS(GM__SKIP_NAME)
#undef GM__SKIP_NAME
    };
    for (int r = 0; r < GM__SKIP_COUNT; r++)
        gm__sbuf_printf(b, "gpumem_segments_skipped{reason=\"%s\"} %d\n", reasons[r], s->skipped_by[r]);
    prom_family(b, "gpumem_node_mode", "gauge", "1 if every user's processes are read (--node / --all-users).");
    gm__sbuf_printf(b, "gpumem_node_mode %d\n", s->all_users ? 1 : 0);
}
