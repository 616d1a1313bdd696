/* trace_categories.c — what a recorded snapshot's memory is, by category,
 * at its peak: the rules are in estimate.h (gm_est_trace_categories). */
#include "estimate.h"

#include "internal.h"
#include "trace/idmap.h"
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>

#define OTHER GM_EST_NCAT /* a fifth bucket beside the categories */

enum { F_OPT_INIT = 1, F_OPT = 2, F_APPLY = 4, F_FORWARD = 8, F_ZERO_GRAD = 16, F_FREED = 32 };

static int frame_flags(const gm_trace *t, uint32_t stack) {
    if (!stack || stack > t->nstacks) return 0;
    int fl = 0;
    for (uint32_t k = t->stack_off[stack - 1]; k < t->stack_off[stack]; k++) {
        const gm_trace_frame *f = &t->frames[t->stack_frames[k]];
        const char *name = f->name < t->nstrings ? t->strings[f->name] : "";
        const char *file = f->filename < t->nstrings ? t->strings[f->filename] : "";
        if (strstr(file, "/torch/optim/")) fl |= strcmp(name, "_init_group") ? F_OPT : F_OPT_INIT;
        if (!strcmp(name, "_apply") || !strcmp(name, "_load_from_state_dict")) fl |= F_APPLY;
        if (!strcmp(name, "zero_grad")) fl |= F_ZERO_GRAD;
        if (!strcmp(name, "forward") || strstr(file, "/torch/nn/") || strstr(file, "/transformers/") ||
            strstr(file, "/torchvision/"))
            fl |= F_FORWARD;
    }
    return fl;
}

static int category(int alloc_flags, bool has_frames, int free_flags) {
    if (alloc_flags & F_OPT_INIT) return GM_EST_CAT_OPTSTATE;
    /* torch/optim's other allocations: step temporaries if the optimizer
     * frees them, else state (SGD's momentum buffers are cloned in
     * _multi_tensor_sgd and live until the optimizer goes) */
    if (alloc_flags & F_OPT) return free_flags & F_OPT ? GM_EST_CAT_TEMPS : GM_EST_CAT_OPTSTATE;
    if (alloc_flags & F_APPLY) return GM_EST_CAT_PARAMS;
    if (!has_frames) return free_flags & F_ZERO_GRAD ? GM_EST_CAT_GRADS : GM_EST_CAT_TEMPS;
    if (alloc_flags & F_FORWARD) return GM_EST_CAT_ACTS;
    return OTHER;
}

int gm_est_trace_categories(const gm_trace *t, int device, gm_est_trace_cats *out) {
    memset(out, 0, sizeof *out);
    if (device < 0 || device >= t->ndevices)
        return gm__set_error(GM_EDEVICE, "the trace has no device %d (it has %d)", device, t->ndevices);
    const gm_trace_event *ev = t->events ? t->events + t->dev_off[device] : NULL;
    size_t n = t->dev_off[device + 1] - t->dev_off[device];
    /* pass 1: each allocation's slot, its alloc stack's flags and its free's */
    uint32_t *slot_of = malloc((n ? n : 1) * sizeof *slot_of); /* event -> slot (allocs and frees) */
    uint8_t *cat = NULL;
    int *fl = NULL;
    uint32_t nslots = 0;
    gm__idmap m = {0};
    int rc = slot_of ? GM_OK : GM_ENOHOSTMEM;
    if (!rc) {
        fl = calloc(n ? n : 1, sizeof *fl);
        cat = calloc(n ? n : 1, 1);
        if (!fl || !cat) rc = GM_ENOHOSTMEM;
    }
    uint8_t *has = rc ? NULL : calloc(n ? n : 1, 1);
    int *ffl = rc ? NULL : calloc(n ? n : 1, sizeof *ffl);
    if (!rc && (!has || !ffl)) rc = GM_ENOHOSTMEM;
    for (size_t i = 0; i < n && !rc; i++) {
        const gm_trace_event *e = &ev[i];
        slot_of[i] = UINT32_MAX;
        if (e->action == GM_TA_ALLOC) {
            if ((rc = gm__idmap_reserve(&m, 1024))) break;
            size_t j = gm__idmap_find(&m, e->addr);
            if (m.id[j] != GM__IDMAP_EMPTY) m.id[j] = nslots;
            else gm__idmap_set(&m, j, e->addr, nslots);
            slot_of[i] = nslots;
            fl[nslots] = frame_flags(t, e->stack);
            has[nslots] = e->stack != 0;
            out->have_frames |= e->stack != 0;
            nslots++;
        } else if ((e->action == GM_TA_FREE_REQUESTED || e->action == GM_TA_FREE_COMPLETED) && m.cap) {
            size_t j = gm__idmap_find(&m, e->addr);
            if (m.id[j] == GM__IDMAP_EMPTY) continue;
            uint32_t s = m.id[j];
            ffl[s] |= frame_flags(t, e->stack) | F_FREED;
            if (e->action == GM_TA_FREE_COMPLETED) {
                slot_of[i] = s;
                gm__idmap_del(&m, j);
            }
        }
    }
    gm__idmap_free(&m);
    /* pass 2: live bytes per category, the peak */
    if (!rc) {
        bool any_completed = false;
        for (size_t i = 0; i < n; i++) any_completed |= ev[i].action == GM_TA_FREE_COMPLETED;
        for (uint32_t s = 0; s < nslots; s++) cat[s] = (uint8_t)category(fl[s], has[s], ffl[s]);
        int64_t live[GM_EST_NCAT + 1] = {0}, total = 0;
        uint64_t *sz = calloc(nslots ? nslots : 1, sizeof *sz);
        if (!sz) rc = GM_ENOHOSTMEM;
        /* old snapshots have no free_completed: free_requested frees */
        gm__idmap m2 = {0};
        for (size_t i = 0; i < n && !rc; i++) {
            const gm_trace_event *e = &ev[i];
            if (e->action == GM_TA_ALLOC) {
                uint32_t s = slot_of[i];
                sz[s] = (e->size + 511) / 512 * 512;
                live[cat[s]] += (int64_t)sz[s];
                total += (int64_t)sz[s];
                if (!any_completed) {
                    if ((rc = gm__idmap_reserve(&m2, 1024))) break;
                    size_t j = gm__idmap_find(&m2, e->addr);
                    if (m2.id[j] != GM__IDMAP_EMPTY) m2.id[j] = s;
                    else gm__idmap_set(&m2, j, e->addr, s);
                }
                if (total > out->peak) {
                    out->peak = total;
                    out->peak_event = i;
                    memcpy(out->at_peak, live, sizeof out->at_peak);
                    out->other_at_peak = live[OTHER];
                }
            } else if (any_completed && e->action == GM_TA_FREE_COMPLETED && slot_of[i] != UINT32_MAX) {
                uint32_t s = slot_of[i];
                live[cat[s]] -= (int64_t)sz[s];
                total -= (int64_t)sz[s];
                sz[s] = 0;
            } else if (!any_completed && e->action == GM_TA_FREE_REQUESTED && m2.cap) {
                size_t j = gm__idmap_find(&m2, e->addr);
                if (m2.id[j] != GM__IDMAP_EMPTY) {
                    uint32_t s = m2.id[j];
                    gm__idmap_del(&m2, j);
                    live[cat[s]] -= (int64_t)sz[s];
                    total -= (int64_t)sz[s];
                    sz[s] = 0;
                }
            }
        }
        gm__idmap_free(&m2);
        free(sz);
    }
    free(slot_of);
    free(fl);
    free(cat);
    free(has);
    free(ffl);
    if (rc) return gm__set_error(rc, "out of host memory classifying the trace");
    return GM_OK;
}
