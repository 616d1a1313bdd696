/* attrib.c — category attribution of a trace's allocations (report.h).
 *
 * 1. Pair every alloc with the event that frees it, as replay does
 *    (free_completed; free_requested in traces that have no free_completed;
 *    an alloc of a still-live address leaves the old one live forever), and
 *    find the peak of live requested bytes.
 * 2. Give every event a phase: from its own stack when it has one (innermost
 *    matching frame wins: optimizer code, autograd's backward entry, module
 *    _apply/.cuda()/.to() or parameter init, a module forward), else the
 *    phase of the last framed event before it (torch records no Python
 *    frames on autograd's C++ thread, so backward allocations have none).
 * 3. Decide categories from phase and lifetime: what forward allocates and
 *    is still alive when the next backward starts (and dead before the one
 *    after) is activations; what
 *    backward / the optimizer step / parameter setup allocates and survives
 *    its phase is gradients (if it has a parameter's size, else other) /
 *    optimizer state / parameters; the rest of those phases are temporaries. In a trace with no frames, allocations
 *    alive to the end are parameters (allocated before the first free) or
 *    optimizer state (later, with a parameter's size); the rest is inferred
 *    from the steps live memory shows (find_steps(), by_steps()), or unknown. */
#include "report.h"

#include "internal.h"
#include "util/idmap.h"

#include <stdlib.h>
#include <string.h>

static const char *const method_names[] = {
#define GM__AM_NAME(n, s, d) s,
    GM_ATTR_METHODS(GM__AM_NAME)
#undef GM__AM_NAME
};
static const char *const method_help[] = {
#define GM__AM_HELP(n, s, d) d,
    GM_ATTR_METHODS(GM__AM_HELP)
#undef GM__AM_HELP
};
static const char *const phase_names[] = {
#define GM__PH_NAME(n, s) s,
    GM_PHASES(GM__PH_NAME)
#undef GM__PH_NAME
};

const char *gm__attr_method_name(int m) { return m >= 0 && m < GM_AM_COUNT ? method_names[m] : "?"; }
const char *gm__attr_method_help(int m) { return m >= 0 && m < GM_AM_COUNT ? method_help[m] : "?"; }
const char *gm__phase_name(int p) { return p >= 0 && p < GM_PH_COUNT ? phase_names[p] : "?"; }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !memcmp(s + n - m, suffix, m);
}

static bool one_of(const char *s, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(s, *list)) return true;
    return false;
}

/* The phase one frame says, or GM_PH_NONE if it says nothing. */
static int frame_phase(const char *name, const char *file) {
    static const char *const apply[] = {"_apply", "cuda", "to", "to_empty", "half", "float", "double",
                                        "bfloat16", "type", NULL};
    static const char *const scaler[] = {"step", "unscale_", "_unscale_grads_", "update", NULL};
    static const char *const init[] = {"reset_parameters", "_init_weights", "init_weights",
                                       "post_init", NULL};
    static const char *const bwd[] = {"_engine_run_backward", "run_backward", NULL};
    if (strstr(file, "torch/optim/") || (ends_with(file, "grad_scaler.py") && one_of(name, scaler)))
        return GM_PH_OPTIMIZER;
    if ((!strcmp(name, "backward") && (ends_with(file, "_tensor.py") || strstr(file, "autograd/"))) ||
        (strstr(file, "autograd/") && one_of(name, bwd)))
        return GM_PH_BACKWARD;
    bool module_py = ends_with(file, "nn/modules/module.py");
    if ((module_py && one_of(name, apply)) || one_of(name, init) || ends_with(file, "nn/init.py") ||
        (!strcmp(name, "__init__") && strstr(file, "nn/modules/")) ||
        (ends_with(file, "nn/parameter.py") && !strcmp(name, "__new__")))
        return GM_PH_PARAM;
    if (!strcmp(name, "forward") || (module_py && (!strcmp(name, "_call_impl") ||
                                                   !strcmp(name, "_wrapped_call_impl"))))
        return GM_PH_FORWARD;
    return GM_PH_NONE;
}

/* Phase (low 4 bits) and 1 + tagged category (high 4 bits) of a stack. */
static uint8_t stack_class(const gm_trace *t, uint32_t s) {
    int phase = GM_PH_NONE, tag = -1;
    for (uint32_t k = t->stack_off[s]; k < t->stack_off[s + 1]; k++) {
        const gm_trace_frame *f = &t->frames[t->stack_frames[k]];
        const char *name = t->strings[f->name], *file = t->strings[f->filename];
        if (!strcmp(file, GM_TAG_CATEGORY_FILE)) {
            if (tag < 0) tag = gm_category_from_name(name);
            continue;
        }
        if (!strcmp(file, GM_TAG_SCOPE_FILE)) {
            if (phase == GM_PH_NONE)
                phase = !strcmp(name, GM_SCOPE_FORWARD)     ? GM_PH_FORWARD
                        : !strcmp(name, GM_SCOPE_BACKWARD)  ? GM_PH_BACKWARD
                        : !strcmp(name, GM_SCOPE_OPTIMIZER) ? GM_PH_OPTIMIZER
                                                            : GM_PH_NONE;
            continue;
        }
        if (phase == GM_PH_NONE) phase = frame_phase(name, file);
    }
    if (phase == GM_PH_NONE) phase = GM_PH_OTHER; /* frames, none of a known phase */
    return (uint8_t)(phase | (tag + 1) << 4);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Pair allocs with frees; the peak of live requested bytes. */
static int pair(gm_attribution *a, int64_t *live) {
    gm__idmap m = {0};
    int rc = gm__idmap_reserve(&m, 1024);
    int64_t cur = 0;
    for (size_t i = 0; i < a->nevents && !rc; i++) {
        const gm_trace_event *e = &a->ev[i];
        if (e->action == GM_TA_ALLOC) {
            if ((rc = gm__idmap_reserve(&m, 1024))) break;
            if (a->nallocs >= UINT32_MAX - 1) {
                rc = gm__set_error(GM_EINVAL, "trace too long to attribute");
                break;
            }
            size_t j = gm__idmap_find(&m, e->addr);
            if (m.id[j] != GM__IDMAP_EMPTY) {
                a->double_allocs++; /* the old one is never freed, as in replay */
                m.id[j] = (uint32_t)a->nallocs;
            } else {
                gm__idmap_set(&m, j, e->addr, (uint32_t)a->nallocs);
            }
            /* replay skips an alloc over the limit (and its free): here it
             * stays in the list with 0 bytes, so both peaks agree */
            uint64_t size = e->size;
            if (size > GM_LIMIT_ALLOC_BYTES) {
                a->oversized_allocs++;
                size = 0;
            }
            a->allocs[a->nallocs++] = (gm_attr_alloc){e->addr, size, e->stream, (uint32_t)i,
                                                      GM_ATTR_ALIVE, e->stack, GM_CAT_OTHER,
                                                      GM_AM_UNKNOWN, GM_PH_NONE};
            cur += (int64_t)size;
            if (cur > a->peak_bytes) {
                a->peak_bytes = cur;
                a->peak_ev = i;
            }
        } else if (e->action == a->free_action) {
            size_t j = gm__idmap_find(&m, e->addr);
            if (m.id[j] == GM__IDMAP_EMPTY) {
                a->unknown_frees++;
                continue;
            }
            gm_attr_alloc *al = &a->allocs[m.id[j]];
            gm__idmap_del(&m, j);
            al->end = (uint32_t)i;
            cur -= (int64_t)al->size;
        }
        if (live) live[i] = cur;
    }
    gm__idmap_free(&m);
    return rc;
}

/* Alive across (nearly) the whole trace: never freed, or for at least half
 * of the device's events. */
static bool long_lived(const gm_attr_alloc *al, size_t nevents) {
    return al->end == GM_ATTR_ALIVE || (uint64_t)(al->end - al->ev) * 2 >= nevents;
}

/* Lifetime rule for an allocation with no phase (no frames before it):
 * long-lived allocations are parameters, or optimizer state when made after
 * the first free with the size of an earlier long-lived one (Adam's
 * exp_avg / exp_avg_sq are made in the first step, each the size of its
 * parameter). Long-lived buffers made later (a static KV cache) are
 * counted as parameters too: the trace cannot tell them apart. */
static void by_lifetime(gm_attr_alloc *al, size_t nevents, size_t first_free, const uint64_t *psizes,
                        size_t np) {
    if (!long_lived(al, nevents)) return; /* stays OTHER / UNKNOWN */
    al->method = GM_AM_LIFETIME;
    al->cat = al->ev > first_free && np && bsearch(&al->size, psizes, np, sizeof *psizes, cmp_u64)
                  ? GM_CAT_OPTIMIZER
                  : GM_CAT_PARAMETERS;
}

/* The steps of a training run without frames, from live memory alone: it
 * rises through forward to a high point and falls through backward and the
 * optimizer step. With hysteresis between the 10th and 90th percentiles of
 * live memory after setup (lo, hi: a first step's spike or the teardown at
 * the end do not set them): above 60% of the way is high, below 30% low;
 * each high stretch gives its maximum, in event order. Fewer than two: no
 * step structure. The parameters' sizes (psizes, sorted) become unique
 * sizes with their counts, for the gradients of each step. */
typedef struct steps_found {
    uint32_t *high;
    size_t nhigh;
    uint64_t *size;      /* the parameters' distinct sizes */
    uint32_t *count;     /* parameters of each */
    uint32_t *left;      /* gradients of each still to come in this step */
    size_t nsize, step;  /* the step whose gradients `left` counts */
} steps_found;

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int find_steps(const int64_t *live, size_t n, size_t first_free, const uint64_t *psizes, size_t np,
                      steps_found *st) {
    memset(st, 0, sizeof *st);
    if (first_free + 16 >= n) return GM_OK;
    size_t stride = (n - first_free) / 65536 + 1, ns = 0;
    int64_t *smp = malloc(((n - first_free) / stride + 1) * sizeof *smp);
    if (!smp) return gm__set_error(GM_ENOHOSTMEM, "out of host memory attributing a trace");
    for (size_t i = first_free; i < n; i += stride) smp[ns++] = live[i];
    qsort(smp, ns, sizeof *smp, cmp_i64);
    int64_t lo = smp[ns / 10], hi = smp[ns - 1 - ns / 10];
    free(smp);
    /* unsigned and in parts: a hostile trace's live bytes can be near either end of int64 */
    uint64_t span = (uint64_t)hi - (uint64_t)lo;
    if (hi / 20 > 0 && span < (uint64_t)(hi / 20)) return GM_OK; /* flat: no steps to see */
    int64_t up = (int64_t)((uint64_t)lo + span / 5 * 3 + span % 5 * 3 / 5);     /* lo + 3/5 of the span */
    int64_t down = (int64_t)((uint64_t)lo + span / 10 * 3 + span % 10 * 3 / 10); /* lo + 3/10 */
    st->high = malloc((n / 2 + 1) * sizeof *st->high);
    st->size = malloc((np + 1) * sizeof *st->size);
    st->count = calloc(np + 1, sizeof *st->count);
    st->left = calloc(np + 1, sizeof *st->left);
    if (!st->high || !st->size || !st->count || !st->left)
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory attributing a trace");
    bool high = false;
    size_t arg = first_free;
    for (size_t i = first_free; i < n; i++) {
        if (!high && live[i] > up) {
            high = true;
            arg = i;
        } else if (high && live[i] < down) {
            st->high[st->nhigh++] = (uint32_t)arg;
            high = false;
        } else if (high && live[i] > live[arg]) {
            arg = i;
        }
    }
    if (high) st->high[st->nhigh++] = (uint32_t)arg;
    if (st->nhigh < 2) st->nhigh = 0;
    for (size_t k = 0; k < np; k++) {
        if (!st->nsize || st->size[st->nsize - 1] != psizes[k]) st->size[st->nsize++] = psizes[k];
        st->count[st->nsize - 1]++;
    }
    return GM_OK;
}

/* Points of pts (sorted) in [from, to). */
static size_t spans(const uint32_t *pts, size_t n, uint32_t from, uint32_t to) {
    size_t l = 0, r = n;
    while (l < r) {
        size_t m = (l + r) / 2;
        if (pts[m] < from) l = m + 1;
        else r = m;
    }
    size_t k = l;
    while (k < n && pts[k] < to && k - l < 2) k++;
    return k - l; /* 0, 1, or 2 (two or more) */
}

/* The step rule for an allocation of a frameless trace that no lifetime
 * rule decided (docs/report.md, "inferred"); called in event order. Made in
 * the setup (before the first free) and freed after it but before the first
 * high point: a parameter replaced, as an fp32 model cast to 16 bits one
 * tensor at a time. After a step's high point, the first allocations with a
 * parameter's size, as many as there are parameters of that size, are the
 * step's gradients (backward makes them before the optimizer's temporaries
 * of the same sizes). Alive at one high point: activations; at two or more
 * (across steps): other; at none: temporaries. */
static void by_steps(gm_attr_alloc *al, size_t first_free, steps_found *st) {
    if (al->end == GM_ATTR_ALIVE) return;
    if (al->ev < first_free && al->end > first_free && (!st->nhigh || al->end <= st->high[0])) {
        al->method = GM_AM_STEPS;
        al->cat = GM_CAT_PARAMETERS;
        return;
    }
    if (!st->nhigh) return;
    size_t step = 0; /* high points before the allocation */
    for (size_t l = 0, r = st->nhigh; l < r;) {
        size_t m = (l + r) / 2;
        if (st->high[m] < al->ev) l = m + 1, step = l;
        else r = m;
    }
    if (step != st->step) { /* a new step: all its gradients to come */
        st->step = step;
        memcpy(st->left, st->count, st->nsize * sizeof *st->left);
    }
    al->method = GM_AM_STEPS;
    const uint64_t *ps = step ? bsearch(&al->size, st->size, st->nsize, sizeof *st->size, cmp_u64) : NULL;
    if (ps && st->left[ps - st->size]) {
        st->left[ps - st->size]--;
        al->cat = GM_CAT_GRADIENTS;
        return;
    }
    size_t highs = spans(st->high, st->nhigh, al->ev, al->end);
    al->cat = highs == 1 ? GM_CAT_ACTIVATIONS : highs ? GM_CAT_OTHER : GM_CAT_TEMPORARIES;
}

static int classify(gm_attribution *a, const int64_t *live) {
    const gm_trace *t = a->trace;
    size_t n = a->nevents;
    uint8_t *cls = t->nstacks ? malloc(t->nstacks) : NULL; /* stack -> class, 0xff unknown */
    uint8_t *ph = malloc(n ? n : 1);
    uint32_t *run_end = malloc((n ? n : 1) * sizeof *run_end);
    uint32_t *next_bwd = malloc((n ? n : 1) * sizeof *next_bwd);
    uint64_t *psizes = NULL;
    steps_found st = {0};
    int rc = GM_OK;
    if ((t->nstacks && !cls) || !ph || !run_end || !next_bwd) {
        rc = gm__set_error(GM_ENOHOSTMEM, "out of host memory attributing a trace");
        goto out;
    }
    if (cls) memset(cls, 0xff, t->nstacks);
    int cur = GM_PH_NONE;
    size_t first_free = n;
    for (size_t i = 0; i < n; i++) {
        const gm_trace_event *e = &a->ev[i];
        if (e->stack) {
            uint32_t s = e->stack - 1;
            if (cls[s] == 0xff) cls[s] = stack_class(t, s);
            cur = cls[s] & 15;
            a->has_frames = true;
        }
        ph[i] = (uint8_t)cur;
        if (e->action == a->free_action && first_free == n) first_free = i;
    }
    for (size_t i = n; i-- > 0;) {
        run_end[i] = i + 1 < n && ph[i + 1] == ph[i] ? run_end[i + 1] : (uint32_t)i;
        bool bwd_start = ph[i] == GM_PH_BACKWARD && (i == 0 || ph[i - 1] != GM_PH_BACKWARD);
        next_bwd[i] = bwd_start ? (uint32_t)i : i + 1 < n ? next_bwd[i + 1] : GM_ATTR_ALIVE;
    }
    /* sizes of the allocations the lifetime rule calls parameters */
    size_t np = 0;
    psizes = malloc((a->nallocs ? a->nallocs : 1) * sizeof *psizes);
    if (!psizes) {
        rc = gm__set_error(GM_ENOHOSTMEM, "out of host memory attributing a trace");
        goto out;
    }
    for (size_t k = 0; k < a->nallocs; k++) {
        const gm_attr_alloc *al = &a->allocs[k];
        if (ph[al->ev] == GM_PH_NONE && long_lived(al, n) && al->ev < first_free)
            psizes[np++] = al->size;
    }
    if (np > 1) qsort(psizes, np, sizeof *psizes, cmp_u64);
    if (live && !a->has_frames && (rc = find_steps(live, n, first_free, psizes, np, &st))) goto out;
    a->nsteps = st.nhigh;
    for (size_t k = 0; k < a->nallocs; k++) {
        gm_attr_alloc *al = &a->allocs[k];
        uint32_t i = al->ev;
        int p = ph[i];
        al->phase = (uint8_t)p;
        int tag = al->stack ? (cls[al->stack - 1] >> 4) - 1 : -1;
        if (tag >= 0) {
            al->cat = (uint8_t)tag;
            al->method = GM_AM_TAGGED;
        } else if (p == GM_PH_NONE) {
            by_lifetime(al, n, first_free, psizes, np);
            if (al->method == GM_AM_UNKNOWN && !a->has_frames) by_steps(al, first_free, &st);
        } else {
            al->method = al->stack ? GM_AM_FRAMES : GM_AM_PHASE;
            bool outlives = al->end > run_end[i];
            switch (p) {
            case GM_PH_PARAM: al->cat = outlives ? GM_CAT_PARAMETERS : GM_CAT_TEMPORARIES; break;
            case GM_PH_BACKWARD: al->cat = outlives ? GM_CAT_GRADIENTS : GM_CAT_TEMPORARIES; break;
            case GM_PH_OPTIMIZER: al->cat = outlives ? GM_CAT_OPTIMIZER : GM_CAT_TEMPORARIES; break;
            case GM_PH_FORWARD: {
                /* saved for the next backward, and dead before the one after
                 * (what outlives a whole step is a buffer such as cuBLAS's
                 * workspace, not an activation) */
                uint32_t nb = next_bwd[i], nb2 = GM_ATTR_ALIVE;
                if (nb != GM_ATTR_ALIVE && run_end[nb] + 1 < n) nb2 = next_bwd[run_end[nb] + 1];
                al->cat = nb == GM_ATTR_ALIVE || al->end <= nb ? GM_CAT_TEMPORARIES
                          : nb2 == GM_ATTR_ALIVE || al->end <= nb2 ? GM_CAT_ACTIVATIONS
                                                                   : GM_CAT_OTHER;
                break;
            }
            default: al->cat = GM_CAT_OTHER; break;
            }
        }
    }
    /* a gradient has its parameter's size: what else outlives backward
     * (cuBLAS's workspace for autograd's thread) is other */
    size_t nparam = 0;
    for (size_t k = 0; k < a->nallocs; k++)
        if (a->allocs[k].cat == GM_CAT_PARAMETERS) psizes[nparam++] = a->allocs[k].size;
    if (nparam > 1) qsort(psizes, nparam, sizeof *psizes, cmp_u64);
    for (size_t k = 0; k < a->nallocs; k++) {
        gm_attr_alloc *al = &a->allocs[k];
        if (nparam && al->cat == GM_CAT_GRADIENTS && al->method != GM_AM_TAGGED &&
            !bsearch(&al->size, psizes, nparam, sizeof *psizes, cmp_u64))
            al->cat = GM_CAT_OTHER;
        a->bytes_by[al->cat][al->method] += al->size;
        a->count_by[al->cat]++;
        if (al->ev <= a->peak_ev && (al->end == GM_ATTR_ALIVE || al->end > a->peak_ev) && a->peak_bytes)
            a->peak_by[al->cat][al->method] += al->size;
    }
out:
    free(st.high);
    free(st.size);
    free(st.count);
    free(st.left);
    free(cls);
    free(ph);
    free(run_end);
    free(next_bwd);
    free(psizes);
    return rc;
}

int gm__attribute(const gm_trace *t, int device, gm_attribution **out) {
    *out = NULL;
    if (device < 0 || device >= t->ndevices)
        return gm__set_error(GM_EDEVICE, "the trace has no device %d (it has %d)", device, t->ndevices);
    gm_attribution *a = calloc(1, sizeof *a);
    if (!a) return gm__set_error(GM_ENOHOSTMEM, "out of host memory attributing a trace");
    a->device = device;
    a->trace = t;
    a->ev = t->events ? t->events + t->dev_off[device] : NULL;
    a->nevents = t->dev_off[device + 1] - t->dev_off[device];
    if (a->nevents >= GM_ATTR_ALIVE) {
        size_t n = a->nevents;
        free(a);
        return gm__set_error(GM_EINVAL, "trace too long to attribute (%zu events)", n);
    }
    size_t nalloc = 0;
    bool any_completed = false, any_requested = false, any_stack = false;
    for (size_t i = 0; i < a->nevents; i++) {
        any_stack |= a->ev[i].stack != 0;
        nalloc += a->ev[i].action == GM_TA_ALLOC;
        any_completed |= a->ev[i].action == GM_TA_FREE_COMPLETED;
        any_requested |= a->ev[i].action == GM_TA_FREE_REQUESTED;
    }
    a->free_action = !any_completed && any_requested ? GM_TA_FREE_REQUESTED : GM_TA_FREE_COMPLETED;
    a->allocs = malloc((nalloc ? nalloc : 1) * sizeof *a->allocs);
    /* without frames, live bytes per event: the steps are read from them */
    int64_t *live = any_stack ? NULL : malloc((a->nevents ? a->nevents : 1) * sizeof *live);
    int rc = a->allocs && (any_stack || live) ? pair(a, live)
                                              : gm__set_error(GM_ENOHOSTMEM, "out of host memory attributing a trace");
    if (!rc) rc = classify(a, live);
    free(live);
    if (rc) {
        gm__attribution_free(a);
        return rc;
    }
    *out = a;
    return GM_OK;
}

const char *gm__attr_frames_note(const gm_attribution *a, char *buf, size_t len) {
    if (a->has_frames) snprintf(buf, len, "%s", "");
    else
        snprintf(buf, len,
                 "This trace has no Python frames: parameters and optimizer state come from lifetimes, the "
                 "other categories are inferred from sizes and the %zu steps live memory shows (rule "
                 "\"inferred\"): approximate. For exact categories, record frames: call %s before the run, "
                 "then torch.cuda.memory._dump_snapshot(\"snapshot.pickle\").",
                 a->nsteps, GM_RECORD_FRAMES_CALL);
    return buf;
}

void gm__attribution_free(gm_attribution *a) {
    if (!a) return;
    free(a->allocs);
    free(a);
}

uint64_t gm__attr_peak_cat(const gm_attribution *a, int cat) {
    uint64_t s = 0;
    for (int m = 0; m < GM_AM_COUNT; m++) s += a->peak_by[cat][m];
    return s;
}

uint64_t gm__attr_peak_method(const gm_attribution *a, int method) {
    uint64_t s = 0;
    for (int c = 0; c < GM_CAT_COUNT; c++) s += a->peak_by[c][method];
    return s;
}
