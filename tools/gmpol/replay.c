/* replay.c — dev harness for the gpumem policy (not part of the build):
 * replays a text trace from tools/gmpol/dump_trace.py through the public API
 * (gm_malloc / gm_free, sim backend) several times in a row and prints, per
 * pass, peak requested / peak reserved / ratio, device calls by kind and
 * ns per operation (pass 1 = cold, later passes = warm), until the real
 * `gpumem replay` exists.
 *
 * Build (from the repository root), optimised, without the sanitizers:
 *   tools/gmpol/build.sh            -> /tmp/gmpol/replay
 * Run: replay TRACE.txt [--policy gpumem|torch] [--passes N] [--check]
 *                       [--conf STR] [--capacity GiB]
 */
#define _GNU_SOURCE
#include "gpumem/backend.h"
#include "gpumem/gpumem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct ev {
    uint32_t id;   /* alloc number */
    uint8_t free;  /* 0 alloc, 1 free */
    uint64_t size;
} ev;

static ev *g_ev;
static size_t g_nev, g_nalloc;

/* addr -> alloc id of the live allocation, open addressing */
static uint64_t *hk;
static uint32_t *hv;
static size_t hcap = 1 << 22;

static size_t hslot(uint64_t k) {
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 40) & (hcap - 1);
    while (hk[i] && hk[i] != k) i = (i + 1) & (hcap - 1);
    return i;
}

static void hdel(size_t i) { /* backward-shift delete */
    size_t j = i;
    hk[i] = 0;
    for (;;) {
        j = (j + 1) & (hcap - 1);
        if (!hk[j]) return;
        size_t h = (size_t)((hk[j] * 0x9E3779B97F4A7C15ull) >> 40) & (hcap - 1);
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            hk[i] = hk[j];
            hv[i] = hv[j];
            hk[j] = 0;
            i = j;
        }
    }
}

static int load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    hk = calloc(hcap, sizeof *hk);
    hv = calloc(hcap, sizeof *hv);
    size_t cap = 1 << 20;
    g_ev = malloc(cap * sizeof *g_ev);
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned long long addr = 0, size = 0;
        if (g_nev == cap) g_ev = realloc(g_ev, (cap *= 2) * sizeof *g_ev);
        if (line[0] == 'a' && sscanf(line + 2, "%llu %llu", &addr, &size) == 2) {
            size_t i = hslot(addr);
            hk[i] = addr;
            hv[i] = (uint32_t)g_nalloc;
            g_ev[g_nev++] = (ev){(uint32_t)g_nalloc++, 0, size};
        } else if (line[0] == 'f' && sscanf(line + 2, "%llu", &addr) == 1) {
            size_t i = hslot(addr);
            if (!hk[i]) continue; /* freed before the trace began */
            g_ev[g_nev++] = (ev){hv[i], 1, 0};
            hdel(i);
        }
    }
    fclose(f);
    return 0;
}

/* granules touched by live blocks (2 MiB), for comparing with reserved */
static uint32_t *tg_cnt; /* indexed by (addr - tg_base) >> 21 */
static uint64_t tg_base, tg_n, tg_cur, tg_peak;
static uint64_t *g_size;

static void touch(gm_devptr p, uint64_t size, int d) {
    if (!size) return;
    if (!tg_cnt) {
        tg_base = (p >> 21 << 21) - ((uint64_t)1 << 40);
        tg_n = (uint64_t)1 << 22; /* 8 TiB window */
        tg_cnt = calloc(tg_n, sizeof *tg_cnt);
    }
    uint64_t g0 = (p - tg_base) >> 21, g1 = (p + size - 1 - tg_base) >> 21;
    for (uint64_t g = g0; g <= g1 && g < tg_n; g++) {
        if (d > 0 && tg_cnt[g]++ == 0) tg_cur++;
        if (d < 0 && --tg_cnt[g] == 0) tg_cur--;
    }
    if (tg_cur > tg_peak) tg_peak = tg_cur;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: replay TRACE.txt [--policy P] [--passes N] [--check] [--conf S] [--capacity GiB]\n");
        return 2;
    }
    const char *policy = "gpumem", *conf = "";
    int passes = 3, check = 0;
    double cap_gib = 141;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--policy") && i + 1 < argc) policy = argv[++i];
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--conf") && i + 1 < argc) conf = argv[++i];
        else if (!strcmp(argv[i], "--capacity") && i + 1 < argc) cap_gib = atof(argv[++i]);
    }
    if (load(argv[1])) {
        perror(argv[1]);
        return 1;
    }
    gm_sim_options so;
    gm_sim_options_init(&so);
    so.capacity = (uint64_t)(cap_gib * (1 << 30));
    gm_backend *be;
    if (gm_sim_create(&be, &so)) return 1;
    gm_config cfg;
    gm_config_init(&cfg);
    char cs[512], err[256];
    snprintf(cs, sizeof cs, "policy:%s%s%s", policy, *conf ? "," : "", conf);
    if (gm_config_parse(&cfg, cs, err, sizeof err)) {
        fprintf(stderr, "conf: %s\n", err);
        return 2;
    }
    gm_allocator *al;
    if (gm_allocator_create(&al, be, &cfg)) return 1;
    gm_devptr *ptr = calloc(g_nalloc, sizeof *ptr);
    g_size = calloc(g_nalloc, sizeof *g_size);
    int touched = getenv("GMPOL_TOUCHED") != NULL;
    double *lat = malloc(g_nev * sizeof *lat);
    printf("%s policy=%s events=%zu\n", argv[1], policy, g_nev);
    printf("pass  peak_req        peak_res        ratio    ns/op   p50    p99    p999  create map unmap release malloc free\n");
    for (int p = 1; p <= passes; p++) {
        gm_stats s0 = {.size = sizeof s0}, s1 = {.size = sizeof s1};
        gm_reset_peak_stats(al, 0);
        gm_get_stats(al, 0, &s0);
        int timed_each = p == passes && passes >= 3;
        double t0 = now_ns();
        for (size_t i = 0; i < g_nev; i++) {
            const ev *e = &g_ev[i];
            double a = timed_each ? now_ns() : 0;
            int rc;
            if (!e->free) {
                rc = gm_malloc(al, 0, e->size, 0, &ptr[e->id]);
                if (touched) touch(ptr[e->id], g_size[e->id] = (e->size + 511) / 512 * 512, 1);
            } else {
                if (touched) touch(ptr[e->id], g_size[e->id], -1);
                rc = gm_free(al, ptr[e->id]);
                ptr[e->id] = 0;
            }
            if (timed_each) lat[i] = now_ns() - a;
            if (rc) {
                fprintf(stderr, "event %zu: %s (%s)\n", i, gm_status_name(rc), gm_last_error_detail());
                return 1;
            }
            if (check && gm_check(al, 0, err, sizeof err)) {
                fprintf(stderr, "event %zu: check: %s\n", i, err);
                return 1;
            }
        }
        double t = now_ns() - t0;
        gm_get_stats(al, 0, &s1);
        double p50 = 0, p99 = 0, p999 = 0;
        if (timed_each) {
            qsort(lat, g_nev, sizeof *lat, cmp_d);
            p50 = lat[g_nev / 2], p99 = lat[g_nev * 99 / 100], p999 = lat[g_nev * 999 / 1000];
        }
        int64_t req = s1.requested_bytes[0].peak, res = s1.reserved_bytes[0].peak;
        printf("%-5d %-15lld %-15lld %-8.5f %-7.1f %-6.0f %-6.0f %-6.0f %-6lld %-3lld %-5lld %-7lld %-6lld %lld\n", p,
               (long long)req, (long long)res, (double)res / (double)req, t / g_nev, p50, p99, p999,
               (long long)(s1.num_phys_create - s0.num_phys_create), (long long)(s1.num_map - s0.num_map),
               (long long)(s1.num_unmap - s0.num_unmap), (long long)(s1.num_phys_release - s0.num_phys_release),
               (long long)(s1.num_device_alloc - s0.num_device_alloc),
               (long long)(s1.num_device_free - s0.num_device_free));
        if (getenv("GMPOL_POOLS"))
            for (int q = 1; q <= 2; q++)
                printf("      pool %d: peak requested %lld reserved %lld (%.4f of all requested)\n", q,
                       (long long)s1.requested_bytes[q].peak, (long long)s1.reserved_bytes[q].peak,
                       (double)s1.reserved_bytes[q].peak / (double)req);
        if (touched) printf("      peak touched granules %llu = %.5f of peak requested\n", (unsigned long long)tg_peak,
                            (double)(tg_peak << 21) / (double)req);
        tg_peak = tg_cur;
        for (size_t k = 0; k < g_nalloc; k++) /* leftovers, so the next pass starts alike */
            if (ptr[k]) {
                if (touched) touch(ptr[k], g_size[k], -1);
                gm_free(al, ptr[k]), ptr[k] = 0;
            }
    }
    if (gm_check(al, 0, err, sizeof err)) printf("final check: %s\n", err);
    gm_allocator_destroy(al);
    gm_backend_destroy(be);
    free(ptr), free(lat), free(g_ev), free(hk), free(hv);
    return 0;
}
