/* history_dump.c — gm_history_dump: the allocation history ring
 * (src/core/history.c) turned into a gm_trace (scopes and category tags as
 * frames, ticks as microseconds) and written as .gmt or as a torch
 * snapshot, so `gpumem report` and PyTorch's memory_viz read it. */
#include "report.h"

#include "history.h"
#include "internal.h"
#include "util/idmap.h"

#include <stdlib.h>
#include <string.h>

#define STACK_MAX (GM_SCOPE_MAX_DEPTH + 1)

int gm__history_to_trace(gm_trace **out, uint64_t *dropped) {
    *out = NULL;
    gm__hist_copy c;
    int rc = gm__history_copy(&c);
    if (rc) return rc;
    if (dropped) *dropped = c.dropped;
    gm__trace_builder *b = gm__tb_new();
    uint8_t *cat = malloc(c.n ? c.n : 1);
    gm__idmap live = {0}; /* address -> entry of its live alloc */
    if (!b || !cat) {
        rc = gm__set_error(GM_ENOHOSTMEM, "out of host memory dumping the history");
        goto out;
    }
    memset(cat, GM__HIST_NO_CAT, c.n ? c.n : 1);
    /* tags name the allocation live at their address */
    for (size_t i = 0; i < c.n && !rc; i++) {
        const gm__hist_entry *e = &c.e[i];
        if ((rc = gm__idmap_reserve(&live, 1024))) break;
        size_t j = gm__idmap_find(&live, e->addr);
        if (e->action == GM_TA_ALLOC) {
            if (live.id[j] != GM__IDMAP_EMPTY) live.id[j] = (uint32_t)i;
            else gm__idmap_set(&live, j, e->addr, (uint32_t)i);
        } else if (e->action == GM_TA_FREE_COMPLETED && live.id[j] != GM__IDMAP_EMPTY) {
            gm__idmap_del(&live, j);
        } else if (e->action == GM__HIST_TAG && live.id[j] != GM__IDMAP_EMPTY) {
            cat[live.id[j]] = e->category;
        }
    }
    if (rc) {
        rc = gm__set_error(rc, "out of host memory dumping the history");
        goto out;
    }
    uint32_t scope_file, cat_file;
    rc = gm__tb_string(b, GM_TAG_SCOPE_FILE, strlen(GM_TAG_SCOPE_FILE), &scope_file);
    if (!rc) rc = gm__tb_string(b, GM_TAG_CATEGORY_FILE, strlen(GM_TAG_CATEGORY_FILE), &cat_file);
    uint32_t frames[STACK_MAX];
    for (size_t i = 0; i < c.n && !rc; i++) {
        const gm__hist_entry *e = &c.e[i];
        if (e->action == GM__HIST_TAG) continue;
        uint32_t n = 0, id, sid;
        if (cat[i] != GM__HIST_NO_CAT) {
            const char *name = gm_category_name(cat[i]);
            rc = gm__tb_string(b, name, strlen(name), &id);
            if (!rc) rc = gm__tb_frame(b, id, cat_file, 0, &frames[n++]);
        }
        for (uint32_t s = e->scope; s && n < STACK_MAX && !rc; s = gm__hist_scope_parent(s)) {
            const char *name = gm__hist_scope_name(s);
            rc = gm__tb_string(b, name, strlen(name), &sid);
            if (!rc) rc = gm__tb_frame(b, sid, scope_file, 0, &frames[n++]);
        }
        uint32_t stack = 0;
        if (!rc && n) rc = gm__tb_stack(b, frames, n, &stack);
        double us = (c.t0_ns + (double)(int64_t)(e->tick - c.t0_tick) * c.ns_per_tick) / 1000.0;
        gm_trace_event ev = {e->addr, e->size, e->stream, (int64_t)us, stack, e->action, e->device};
        if (!rc) rc = gm__tb_event(b, &ev);
    }
    if (!rc) {
        rc = gm__tb_finish(b, "gpumem-history", out);
        b = NULL;
    }
out:
    gm__tb_discard(b);
    gm__idmap_free(&live);
    free(cat);
    free(c.e);
    return rc;
}

int gm_history_dump(const char *path, int format) {
    if (!path || !*path) return gm__set_error(GM_EINVAL, "gm_history_dump: no path");
    if (format != GM_HISTORY_GMT && format != GM_HISTORY_TORCH)
        return gm__set_error(GM_EINVAL, "gm_history_dump: format %d is neither GM_HISTORY_GMT nor "
                                        "GM_HISTORY_TORCH", format);
    gm_trace *t;
    int rc = gm__history_to_trace(&t, NULL);
    if (rc) return rc;
    rc = format == GM_HISTORY_GMT ? gm__trace_write_gmt(t, path) : gm__trace_write_snapshot(t, path);
    gm__trace_free(t);
    return rc;
}

int gm__history_snapshot_bytes(uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    gm_trace *t;
    int rc = gm__history_to_trace(&t, NULL);
    if (rc) return rc;
    rc = gm__trace_encode_snapshot(t, out, len);
    gm__trace_free(t);
    return rc;
}

/* The core records the OOM and calls gm_history_dump through the hook it is
 * lent here (src/core/history.c: the core calls nothing above it). */
int gm_history_dump_on_oom(const char *path, int format) {
    if (path && format != GM_HISTORY_GMT && format != GM_HISTORY_TORCH)
        return gm__set_error(GM_EINVAL, "gm_history_dump_on_oom: format %d is neither GM_HISTORY_GMT nor "
                                        "GM_HISTORY_TORCH", format);
    return gm__history_set_oom_dump(path ? gm_history_dump : NULL, path, format);
}
