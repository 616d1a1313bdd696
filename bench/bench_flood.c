/* bench_flood.c — writes the hash-flood probes of issue 26 (defect 1) and
 * their controls, for timing `gpumem replay` and `gpumem report --json` on
 * them (bench/RESULTS.md, 2026-12-03):
 *   OUT/flood.pickle        a snapshot whose 2^N extra strings share one
 *                           FNV-1a chain (the pickle reader's old intern hash)
 *   OUT/control.pickle      the same size, ordinary strings
 *   OUT/scopes.gmt          2^N allocations, each under its own gpumem scope
 *                           whose names share one 64-bit FNV-1a chain (report's
 *                           old scope-table hash)
 *   OUT/scopes-control.gmt  the same with ordinary names
 * Usage: bench_flood OUT [N=18]. Generating 2^18 strings takes ~1 s. */
#include "gpumem/gpumem.h"
#include "report/report.h"
#include "trace/trace.h"

#include "../tests/support/fnv_flood.h"

#include <stdlib.h>
#include <string.h>

static void put_u32(FILE *f, uint32_t v) {
    for (int i = 0; i < 4; i++) fputc((int)(v >> (8 * i)) & 0xff, f);
}

static void put_str(FILE *f, const char *s) {
    size_t n = strlen(s);
    fputc(0x8c, f); /* SHORT_BINUNICODE */
    fputc((int)n, f);
    fwrite(s, 1, n, f);
}

static int write_pickle(const char *path, char (*strs)[16], size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    fputs("\x80\x04}(", f);                               /* PROTO 4, EMPTY_DICT, MARK */
    put_str(f, "device_traces");
    fputs("](]", f);                                      /* [ [ {alloc} ] ] */
    fputs("}(", f);
    put_str(f, "action");
    put_str(f, "alloc");
    put_str(f, "addr");
    fputc('J', f);
    put_u32(f, 1u << 21);
    put_str(f, "size");
    fputc('J', f);
    put_u32(f, 512);
    fputs("ua", f);                                       /* SETITEMS, APPEND */
    fputs("e", f);                                        /* APPENDS */
    put_str(f, "flood");
    fputs("](", f);
    for (size_t i = 0; i < n; i++) put_str(f, strs[i]);
    fputs("eu.", f);                                      /* APPENDS, SETITEMS, STOP */
    return fclose(f) != 0;
}

static int write_scopes(const char *path, char (*strs)[16], size_t n) {
    gm__trace_builder *b = gm__tb_new();
    uint32_t file, name, fr, st;
    if (!b || gm__tb_string(b, GM_TAG_SCOPE_FILE, strlen(GM_TAG_SCOPE_FILE), &file)) return 1;
    for (size_t i = 0; i < n; i++) {
        gm_trace_event e = {.addr = (uint64_t)(i + 1) << 9, .size = 512, .action = GM_TA_ALLOC, .time_us = (int64_t)i};
        if (gm__tb_string(b, strs[i], strlen(strs[i]), &name) || gm__tb_frame(b, name, file, 0, &fr) ||
            gm__tb_stack(b, &fr, 1, &st))
            return 1;
        e.stack = st;
        if (gm__tb_event(b, &e)) return 1;
    }
    gm_trace *t;
    if (gm__tb_finish(b, "gmt", &t)) return 1;
    int rc = gm__trace_write_gmt(t, path);
    gm__trace_free(t);
    return rc != 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_flood OUTDIR [LOG2_N=18]\n");
        return 2;
    }
    int lg = argc > 2 ? atoi(argv[2]) : 18;
    size_t n = (size_t)1 << lg;
    char (*strs)[16] = malloc(n * sizeof *strs);
    if (!strs) return 1;
    char path[4096];
    for (int fnv64 = 0; fnv64 <= 1; fnv64++) {
        for (int flood = 0; flood <= 1; flood++) {
            uint64_t k = 0;
            for (size_t i = 0; i < n; i++) {
                if (flood) {
                    while (!flood_string(k++, lg + 2, fnv64, strs[i])) {}
                } else {
                    snprintf(strs[i], 16, "c%010llx%03x", (unsigned long long)k, (unsigned)(k * 2654435761u) & 0xfff);
                    k++;
                }
            }
            snprintf(path, sizeof path, "%s/%s%s", argv[1], fnv64 ? "scopes" : (flood ? "flood" : "control"),
                     fnv64 ? (flood ? ".gmt" : "-control.gmt") : ".pickle");
            int rc = fnv64 ? write_scopes(path, strs, n) : write_pickle(path, strs, n);
            if (rc) {
                fprintf(stderr, "bench_flood: cannot write %s: %s\n", path, gm_last_error_detail());
                return 1;
            }
            printf("wrote %s (%zu strings)\n", path, n);
        }
    }
    free(strs);
    return 0;
}
