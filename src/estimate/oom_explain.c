/* oom_explain.c — the explained out-of-memory message (estimate.h,
 * gm__est_oom_explain): the state of the device and of the allocator, what
 * holds the memory when known, and the changes that would have made the
 * allocation fit, ranked by predicted saving.
 *
 * Savings (upper bounds, stated as such in the text):
 *  - fragmentation: reserved but unallocated memory the allocator could not
 *    use (expandable_segments:True / policy:gpumem give it back);
 *  - optimizer state: all of it without state (SGD), 3/4 with 8-bit state;
 *  - activations: half with accumulation x2, 3/4 with checkpointing (each
 *    layer keeps its input; what it saved of the whole peak when measured:
 *    bench/RESULTS.md, "training memory estimator");
 *  - a bf16 model: half of parameters + gradients + optimizer state. */
#include "estimate.h"

#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct out {
    char *buf;
    size_t len, need;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->need < o->len ? o->len - o->need : 0;
    int n = vsnprintf(room ? o->buf + o->need : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->need += (size_t)n;
}

static const char *fmt(uint64_t b, char *buf, size_t len) { return gm__format_bytes((int64_t)b, buf, len); }

typedef struct change {
    char what[200];
    uint64_t saving;
} change;

static int cmp_change(const void *a, const void *b) {
    const change *x = a, *y = b;
    return x->saving < y->saving ? 1 : x->saving > y->saving ? -1 : 0;
}

size_t gm__est_oom_explain(const gm_est_oom_info *in, char *buf, size_t len) {
    out o = {buf, len, 0};
    if (buf && len) buf[0] = 0;
    char a[32], b[32], c[32], d[32];
    uint64_t unalloc = in->reserved > in->allocated ? in->reserved - in->allocated : 0;
    if (!in->tail_only) {
        put(&o, "CUDA out of memory on device %d: tried to allocate %s.", in->device, fmt(in->requested, a, sizeof a));
        if (in->device_total)
            put(&o, " The GPU has %s, of which %s is free.", fmt(in->device_total, a, sizeof a),
                fmt(in->device_free, b, sizeof b));
        if (in->limit) put(&o, " This process is limited to %s.", fmt(in->limit, a, sizeof a));
        put(&o, " This process has %s allocated and %s reserved (%s reserved but unallocated", fmt(in->allocated, a, sizeof a),
            fmt(in->reserved, b, sizeof b), fmt(unalloc, c, sizeof c));
        if (in->largest_free_block) put(&o, "; the largest free block is %s", fmt(in->largest_free_block, d, sizeof d));
        put(&o, ").");
    }
    if (in->have_categories) {
        put(&o, "\nHeld by category:");
        const char *sep = " ";
        for (int k = 0; k < GM_EST_NCAT; k++)
            if (in->by_category[k] > 0) {
                put(&o, "%s%s %s", sep, gm_category_name(k), fmt((uint64_t)in->by_category[k], a, sizeof a));
                sep = "; ";
            }
    }
    if (in->nscopes > 0 && in->scopes && in->scope_bytes) {
        put(&o, "\nTop scopes:");
        for (int i = 0; i < in->nscopes && i < 5; i++)
            put(&o, "%s %s %s", i ? "," : "", in->scopes[i] ? in->scopes[i] : "?", fmt(in->scope_bytes[i], a, sizeof a));
    }
    /* what must be found: the request beyond what the device and the cache
     * could give without fragmentation (the allocator already released its
     * free cached segments before failing) */
    uint64_t avail = in->limit ? (in->limit > in->reserved ? in->limit - in->reserved : 0) : in->device_free;
    uint64_t shortfall = in->requested > avail ? in->requested - avail : 0;
    change ch[8];
    int n = 0;
    if (unalloc >= in->requested / 2 && unalloc > 0 && !in->gpumem_policy) {
        snprintf(ch[n].what, sizeof ch[n].what, "%s (the reserved but unallocated memory is fragmentation)",
                 in->expandable_segments ? "GPUMEM_CONF=policy:gpumem" : "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
        ch[n++].saving = unalloc;
    }
    if (in->have_categories) {
        uint64_t S = in->by_category[GM_EST_CAT_OPTSTATE] > 0 ? (uint64_t)in->by_category[GM_EST_CAT_OPTSTATE] : 0;
        uint64_t A = in->by_category[GM_EST_CAT_ACTS] > 0 ? (uint64_t)in->by_category[GM_EST_CAT_ACTS] : 0;
        uint64_t P = in->by_category[GM_EST_CAT_PARAMS] > 0 ? (uint64_t)in->by_category[GM_EST_CAT_PARAMS] : 0;
        uint64_t G = in->by_category[GM_EST_CAT_GRADS] > 0 ? (uint64_t)in->by_category[GM_EST_CAT_GRADS] : 0;
        if (A) {
            snprintf(ch[n].what, sizeof ch[n].what, "activation checkpointing (model.gradient_checkpointing_enable())");
            ch[n++].saving = A / 4 * 3;
            snprintf(ch[n].what, sizeof ch[n].what, "half the batch with gradient accumulation x2");
            ch[n++].saving = A / 2;
        }
        if (S) {
            snprintf(ch[n].what, sizeof ch[n].what, "an 8-bit optimizer (bitsandbytes AdamW8bit)");
            ch[n++].saving = S / 4 * 3;
        }
        if (P + G + S) {
            snprintf(ch[n].what, sizeof ch[n].what, "the model in bf16 (model.to(torch.bfloat16))");
            ch[n++].saving = (P + G + S) / 2;
        }
    }
    qsort(ch, (size_t)n, sizeof ch[0], cmp_change);
    /* the two or three largest; say which alone would have covered the shortfall */
    int shown = 0;
    for (int i = 0; i < n && shown < 3; i++) {
        if (!ch[i].saving) continue;
        if (!shown) put(&o, "\nChanges that would have made it fit (predicted saving, upper bound):");
        put(&o, "\n  - %s: %s%s", ch[i].what, fmt(ch[i].saving, a, sizeof a),
            ch[i].saving >= shortfall ? "" : " (not enough alone)");
        shown++;
    }
    if (!shown)
        put(&o, "\nNo allocator setting would have made it fit; a smaller batch or model would "
                "('gpumem estimate --fit batch' predicts the largest batch that fits).");
    else
        put(&o, "\n('gpumem estimate' predicts each change for a model and run; 'gpumem advise' ranks "
                "allocator settings for a recorded snapshot.)");
    return o.need;
}
