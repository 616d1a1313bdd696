/* frames.c — the frame / scope table of a report: allocated bytes, bytes
 * live at the peak and allocation counts per Python function (grouped by
 * name and file, as torch.profiler's key_averages groups by op), "self" for
 * allocations whose innermost frame it is, "total" for every allocation
 * with it anywhere on the stack (once per allocation, even if recursive).
 * gpumem scopes (GM_TAG_SCOPE_FILE frames) are rows of their own. */
#include "report.h"

#include "internal.h"
#include "util/idmap.h"

#include <stdlib.h>
#include <string.h>

typedef struct agg {
    uint64_t bytes, peak, calls;
} agg;

static int cmp_rows(const void *x, const void *y) {
    const gm_frame_row *a = x, *b = y;
    if (a->total_peak != b->total_peak) return a->total_peak > b->total_peak ? -1 : 1;
    if (a->total_bytes != b->total_bytes) return a->total_bytes > b->total_bytes ? -1 : 1;
    if (a->self_bytes != b->self_bytes) return a->self_bytes > b->self_bytes ? -1 : 1;
    return a->name != b->name ? (a->name < b->name ? -1 : 1) : (a->filename < b->filename ? -1 : a->filename > b->filename);
}

int gm__frame_table(const gm_attribution *a, gm_frame_row **rows_out, size_t *nrows_out) {
    const gm_trace *t = a->trace;
    *rows_out = NULL;
    *nrows_out = 0;
    agg *st = calloc((size_t)t->nstacks + GM_PH_COUNT, sizeof *st); /* stacks, then frameless by phase */
    uint32_t *row_of_frame = malloc((t->nframes ? t->nframes : 1) * sizeof *row_of_frame);
    gm_frame_row *rows = malloc(((size_t)t->nframes + GM_PH_COUNT) * sizeof *rows);
    uint32_t *seen = malloc(((size_t)t->nframes + GM_PH_COUNT) * sizeof *seen);
    gm__idmap m = {0};
    size_t nrows = 0;
    int rc = GM_OK;
    if (!st || !row_of_frame || !rows || !seen) goto oom;
    for (size_t k = 0; k < a->nallocs; k++) {
        const gm_attr_alloc *al = &a->allocs[k];
        agg *g = al->stack ? &st[al->stack - 1] : &st[t->nstacks + al->phase];
        g->bytes += al->size;
        g->calls++;
        if (a->peak_bytes && al->ev <= a->peak_ev && (al->end == GM_ATTR_ALIVE || al->end > a->peak_ev))
            g->peak += al->size;
    }
    /* one row per function (name, file) */
    for (uint32_t f = 0; f < t->nframes; f++) {
        const gm_trace_frame *fr = &t->frames[f];
        row_of_frame[f] = UINT32_MAX;
        if (!strcmp(t->strings[fr->filename], GM_TAG_CATEGORY_FILE)) continue;
        if (gm__idmap_reserve(&m, 256)) goto oom;
        uint64_t key = (uint64_t)fr->name << 32 | fr->filename;
        size_t j = gm__idmap_find(&m, key);
        if (m.id[j] == GM__IDMAP_EMPTY) {
            rows[nrows] = (gm_frame_row){.name = fr->name, .filename = fr->filename, .line = fr->line,
                                         .scope = !strcmp(t->strings[fr->filename], GM_TAG_SCOPE_FILE)};
            seen[nrows] = UINT32_MAX;
            gm__idmap_set(&m, j, key, (uint32_t)nrows++);
        }
        row_of_frame[f] = m.id[j];
    }
    for (uint32_t s = 0; s < t->nstacks; s++) {
        const agg *g = &st[s];
        if (!g->calls) continue;
        bool first = true;
        for (uint32_t k = t->stack_off[s]; k < t->stack_off[s + 1]; k++) {
            uint32_t r = row_of_frame[t->stack_frames[k]];
            if (r == UINT32_MAX) continue;
            gm_frame_row *row = &rows[r];
            if (first) { /* innermost frame (tags aside) */
                row->self_bytes += g->bytes;
                row->self_peak += g->peak;
                row->self_calls += g->calls;
                first = false;
            }
            if (seen[r] == s) continue;
            seen[r] = s;
            row->total_bytes += g->bytes;
            row->total_peak += g->peak;
            row->total_calls += g->calls;
        }
    }
    for (int p = 0; p < GM_PH_COUNT; p++) {
        const agg *g = &st[t->nstacks + p];
        if (!g->calls) continue;
        rows[nrows++] = (gm_frame_row){UINT32_MAX, (uint32_t)p, 0, g->bytes, g->bytes, g->peak, g->peak,
                                       g->calls, g->calls, false};
    }
    /* drop functions no allocation ran under */
    size_t w = 0;
    for (size_t r = 0; r < nrows; r++)
        if (rows[r].total_calls) rows[w++] = rows[r];
    nrows = w;
    if (nrows > 1) qsort(rows, nrows, sizeof *rows, cmp_rows);
    *rows_out = rows;
    *nrows_out = nrows;
    rows = NULL;
    goto out;
oom:
    rc = gm__set_error(GM_ENOHOSTMEM, "out of host memory building the frame table");
out:
    gm__idmap_free(&m);
    free(st);
    free(row_of_frame);
    free(rows);
    free(seen);
    return rc;
}

const char *gm__frame_row_label(const gm_attribution *a, const gm_frame_row *r, char *buf, size_t len) {
    const gm_trace *t = a->trace;
    if (r->name == UINT32_MAX) {
        snprintf(buf, len, "[no Python frames: %s]",
                 r->filename == GM_PH_NONE ? "no phase known" : gm__phase_name((int)r->filename));
    } else if (r->scope) {
        snprintf(buf, len, "scope %s", t->strings[r->name]);
    } else {
        const char *file = t->strings[r->filename], *slash = strrchr(file, '/');
        snprintf(buf, len, "%s (%s:%d)", t->strings[r->name], slash ? slash + 1 : file, r->line);
    }
    return buf;
}
