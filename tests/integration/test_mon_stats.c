/* test_mon_stats.c — every published statistic (GM_MON_STATS, the one list
 * in monitor.h) appears with the same value in torch's memory_stats keys
 * (gm_stats_to_json), the shm record, smi/log JSON, CSV and the Prometheus
 * families. Driven by the list itself: a statistic added there is checked
 * here without editing this test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gm_test.h"
#include "monitor/monitor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The integer after `"key":` in a flat JSON object (torch keys hold dots). */
static bool json_value(const char *json, const char *key, long long *out) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p) return false;
    *out = strtoll(p + strlen(pat), NULL, 10);
    return true;
}

/* The CSV value of column `col` on the line of our pid. */
static bool csv_value(const char *csv, const char *col, int pid, long long *out) {
    const char *nl = strchr(csv, '\n');
    int idx = -1, pid_idx = -1, i = 0;
    for (const char *p = csv; p < nl; i++) {
        const char *e = memchr(p, ',', (size_t)(nl - p));
        if (!e) e = nl;
        if ((size_t)(e - p) == strlen(col) && !strncmp(p, col, (size_t)(e - p))) idx = i;
        if (e - p == 3 && !strncmp(p, "pid", 3)) pid_idx = i;
        p = e + 1;
    }
    if (idx < 0 || pid_idx < 0) return false;
    for (const char *line = nl + 1; *line; line = strchr(line, '\n') + 1) {
        char fields[64][32] = {{0}};
        int n = 0;
        for (const char *p = line; *p && *p != '\n' && n < 64; n++) {
            size_t len = strcspn(p, ",\n");
            snprintf(fields[n], sizeof fields[n], "%.*s", (int)len, p);
            p += len;
            if (*p == ',') p++;
        }
        if (pid_idx < n && atoi(fields[pid_idx]) == pid && idx < n) {
            *out = strtoll(fields[idx], NULL, 10);
            return true;
        }
        if (!strchr(line, '\n')) break;
    }
    return false;
}

/* The value of family `fam`'s series for our pid. */
static bool prom_value(const char *text, const char *fam, int pid, long long *out) {
    char want[64];
    snprintf(want, sizeof want, "pid=\"%d\"", pid);
    size_t flen = strlen(fam);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, fam, flen) || line[flen] != '{') continue;
        const char *close = strstr(line, "} ");
        const char *p = strstr(line, want);
        if (close && p && p < close) {
            *out = strtoll(close + 2, NULL, 10);
            return true;
        }
    }
    return false;
}

static void test_every_stat_everywhere(void **state) {
    char tag[64];
    snprintf(tag, sizeof tag, "monstats%d", (int)getpid());
    setenv("GPUMEM_SHM_TAG", tag, 1);
    gm_backend *b;
    gm_allocator *a;
    assert_int_equal(gm_test_make(GM_POLICY_TORCH, NULL, 1ull << 30, false, &b, &a), GM_OK);
    assert_int_equal(gm_allocator_publish(a, "stats-test"), GM_OK);
    /* something non-zero in every statistic: live and freed blocks, an OOM */
    gm_devptr p[6];
    for (int i = 0; i < 6; i++) assert_int_equal(gm_malloc(a, 0, (uint64_t)(i + 1) * 700000 + 123, 0, &p[i]), GM_OK);
    for (int i = 0; i < 6; i += 2) assert_int_equal(gm_free(a, p[i]), GM_OK);
    gm_devptr big;
    assert_int_equal(gm_malloc(a, 0, 4ull << 30, 0, &big), GM_ENOMEM);

    gm_stats st = gm_test_stats(a);
    static char torch[16384];
    assert_int_equal(gm_stats_to_json(&st, torch, sizeof torch), GM_OK);

    gm__collector *c;
    assert_int_equal(gm__collector_create(&c, NULL, false), GM_OK);
    gm__mon_sample s;
    assert_int_equal(gm__collector_sample(c, &s), GM_OK);
    const gm__mon_row *row = NULL;
    for (int i = 0; i < s.nrows; i++)
        if (s.rows[i].pid == getpid() && s.rows[i].device == 0) row = &s.rows[i];
    assert_non_null(row);
    assert_true(row->have_alloc);
    gm__sbuf js = {0}, csv = {0}, prom = {0};
    gm__format_json(&s, &js, true);
    gm__format_csv_header(&csv);
    gm__format_csv(&s, &csv);
    gm__format_prometheus(&s, &prom);
    assert_false(js.oom || csv.oom || prom.oom);

    const gm__shm_values *v = &row->v;
    int pid = (int)getpid(), checked = 0;
#define CHECK(name, val, torch_key, prom_suffix, type, help, col)                                          \
    do {                                                                                                  \
        long long want = (long long)(val);                                                                \
        long long got = 0; /* printed as 0 where a format lacks the value */                              \
        const char *tk = torch_key;                                                                       \
        if (tk) {                                                                                         \
            if (!json_value(torch, tk, &got)) fail_msg("%s: torch key %s missing", #name, tk);           \
            if (got != want) fail_msg("%s: shm %lld, memory_stats %s %lld", #name, want, tk, got);        \
        }                                                                                                 \
        if (!json_value(js.p, #name, &got) || got != want)                                               \
            fail_msg("%s: JSON %lld, want %lld", #name, got, want);                                      \
        if (!csv_value(csv.p, #name, pid, &got) || got != want)                                          \
            fail_msg("%s: CSV %lld, want %lld", #name, got, want);                                       \
        if (!prom_value(prom.p, "gpumem_process_allocator_" prom_suffix, pid, &got) || got != want)      \
            fail_msg("%s: /metrics %lld, want %lld", #name, got, want);                                  \
        if (!strstr(prom.p, "# TYPE gpumem_process_allocator_" prom_suffix " " #type "\n"))              \
            fail_msg("%s: no TYPE line", #name);                                                          \
        checked++;                                                                                        \
    } while (0);
    GM_MON_STATS(CHECK)
#undef CHECK
    assert_true(checked >= 10);
    /* without NVML the device row still has its size: the sim's 1 GiB, from the record */
    assert_true(s.ndevices >= 1 && s.devs[0].have_alloc_total && !s.devs[0].have_mem);
    assert_int_equal(s.devs[0].total, 1ull << 30);
    assert_non_null(strstr(js.p, "\"total\":1073741824"));
    assert_true(v->num_ooms == 1 && v->allocated > 0 && v->reserved > v->allocated);

    gm__sbuf_free(&js);
    gm__sbuf_free(&csv);
    gm__sbuf_free(&prom);
    gm__sample_free(&s);
    gm__collector_destroy(c);
    for (int i = 1; i < 6; i += 2) assert_int_equal(gm_free(a, p[i]), GM_OK);
    gm_test_destroy(b, a);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_stat_everywhere)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
