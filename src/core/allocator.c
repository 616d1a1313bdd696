/* allocator.c — the allocator front end: the public gm_malloc / gm_free API,
 * lazily created devices with one mutex each, the pointer map, request-level
 * stats (allocation, allocated_bytes, requested_bytes, oversize_allocations,
 * num_ooms), record_stream, and the checks and walks over a device. Placement
 * and caching are the policy's job (src/policy/torch/, src/policy/gpumem/).
 *
 * Speed: the common malloc/free path takes the device lock once (devlock.h:
 * one atomic exchange, a plain store to release), does one hash lookup and no
 * host allocation or syscall. gm_free finds the device of
 * a pointer through each device's [lo, hi) address range (lock-free reads),
 * then its pointer map under the device lock. */
#include "allocator.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- devices --------------------------------------------------------------- */

static void device_free(gm__device *d) {
    gm__fe_dev *fe = d->fe;
    if (fe) {
        gm__ptrmap_free(&fe->map);
        free(fe->pending);
        free(fe);
    }
    free(d);
}

/* Apply a memory fraction like torch's setMemoryFraction (lock held). */
static void set_fraction(gm__device *d, double fraction) {
    d->memory_fraction = fraction;
    d->fraction_set = true;
    d->allowed_memory_maximum = (uint64_t)(fraction * (double)d->total_memory);
    for (uint32_t i = 0; d->mp && i < d->mp->n; i++) /* the private pools' views */
        if (d->mp->slot[i]) {
            gm__device *v = &d->mp->slot[i]->view;
            v->memory_fraction = fraction;
            v->fraction_set = true;
            v->allowed_memory_maximum = d->allowed_memory_maximum;
        }
}

static int device_create(gm_allocator *a, int index, gm__device **out) {
    gm__device *d = calloc(1, sizeof *d);
    gm__fe_dev *fe = calloc(1, sizeof *fe);
    if (!d || !fe) {
        free(d);
        free(fe);
        return gm__set_error(GM_ENOHOSTMEM, "out of host memory creating device %d", index);
    }
    d->index = index;
    d->alloc = a;
    d->backend = a->backend;
    d->cfg = &a->cfg;
    d->pops = gm__policy_get((int)a->cfg.policy); /* checked by gm__config_check */
    d->fe = fe;
    d->memory_fraction = 1.0;
    d->stats.size = sizeof d->stats;
    d->stats.max_split_size = a->cfg.max_split_size == UINT64_MAX ? -1 : (int64_t)a->cfg.max_split_size;
    atomic_init(&fe->lo, UINT64_MAX);
    atomic_init(&fe->hi, 0);
    gm__devlock_init(&d->lock);
    int rc = gm__ptrmap_init(&fe->map);
    uint64_t free_b = 0;
    if (rc == GM_OK) rc = gm__be_mem_info(d, &free_b, &d->total_memory);
    if (rc == GM_OK) {
        if (a->cfg.per_process_memory_fraction < 1.0) set_fraction(d, a->cfg.per_process_memory_fraction);
        rc = d->pops->create(d, &d->pstate);
    }
    if (rc != GM_OK) {
        device_free(d);
        return gm__set_error(rc, "creating device %d failed: %s", index, gm_strerror(rc));
    }
    *out = d;
    return GM_OK;
}

int gm__get_device_slow(gm_allocator *a, int device, gm__device **out) {
    *out = NULL;
    if (device < 0 || device >= a->ndevices)
        return gm__set_error(GM_EDEVICE, "device %d out of range (backend has %d)", device, a->ndevices);
    gm__device *d;
    int rc = GM_OK;
    pthread_mutex_lock(&a->devices_lock);
    d = a->devices[device];
    if (!d && (rc = device_create(a, device, &d)) == GM_OK) {
        __atomic_store_n(&a->devices[device], d, __ATOMIC_RELEASE);
        gm__sink *s = gm__sink_get(a);
        if (s) s->ops->set_total(s, device, d->total_memory);
    }
    pthread_mutex_unlock(&a->devices_lock);
    *out = d;
    return rc;
}

/* Resolve `device` (-1 = every created device) into a list. */
static int device_list(gm_allocator *a, int device, gm__device **list, int *n) {
    *n = 0;
    if (device == -1) {
        for (int i = 0; i < a->ndevices; i++)
            if ((list[*n] = dev_peek(a, i))) (*n)++;
        return GM_OK;
    }
    if (device < 0 || device >= a->ndevices)
        return gm__set_error(GM_EDEVICE, "device %d out of range (backend has %d)", device, a->ndevices);
    if ((list[0] = dev_peek(a, device))) *n = 1;
    return GM_OK;
}

/* ---- create / destroy ------------------------------------------------------- */

int gm__allocator_create(gm_allocator **out, gm_backend *backend, const gm_config *cfg, const gm__hooks *hooks) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!out || !backend) return gm__set_error(GM_EINVAL, "gm_allocator_create: NULL argument");
    *out = NULL;
    gm_config c;
    gm_config_init(&c);
    if (cfg) {
        if (cfg->size == 0 || cfg->size > sizeof c)
            return gm__set_error(GM_EINVAL, "gm_allocator_create: cfg->size %u is not a gm_config size", cfg->size);
        memcpy(&c, cfg, cfg->size);
        c.size = sizeof c;
    }
    char err[256];
    if (gm__config_check(&c, err, sizeof err) != GM_OK) return gm__set_error(GM_ECONFIG, "%s", err);
    int n = 0;
    int rc = gm_backend_device_count(backend, &n);
    if (rc != GM_OK) return gm__set_error(rc, "backend %s: device count failed", gm_backend_name(backend));
    if (n <= 0) return gm__set_error(GM_EDEVICE, "backend %s has no device", gm_backend_name(backend));
    gm_allocator *a = calloc(1, sizeof *a);
    if (!a) return GM_ENOHOSTMEM;
    a->backend = backend;
    a->cfg = c;
    a->ndevices = n < GM_MAX_DEVICES ? n : GM_MAX_DEVICES;
    a->hooks = hooks;
    pthread_mutex_init(&a->devices_lock, NULL);
    gm__clear_error();
    *out = a;
    return GM_OK;
}

static void device_destroy(gm__device *d) {
    gm__fe_dev *fe = d->fe;
    gm__devlock_lock(&d->lock);
    gm__events_drain(d);
    for (uint64_t i = 0; i <= fe->map.mask; i++)
        if (fe->map.slots[i].key) gm__uses_free(fe->map.slots[i].block);
    d->pops->destroy(d->pstate);
    d->pstate = NULL;
    gm__mempool_destroy_all(d);
    gm__devlock_unlock(&d->lock);
    device_free(d);
}

void gm_allocator_destroy(gm_allocator *a) {
    if (!a) return;
    gm__sink *s = gm__sink_get(a);
    gm__sink_set(a, NULL);
    if (s) s->ops->close(s);
    for (int i = 0; i < a->ndevices; i++)
        if (a->devices[i]) device_destroy(a->devices[i]);
    pthread_mutex_destroy(&a->devices_lock);
    free(a);
}

const gm_config *gm_allocator_config(const gm_allocator *a) { return a ? &a->cfg : NULL; }

/* ---- malloc / free ---------------------------------------------------------- */

/* torch's format_size */
/* torch's _format_size (CUDACachingAllocator's OOM text: "bytes", "KiB" up
 * to 1 MiB inclusive, ...), kept apart from gm__format_bytes so that the OOM
 * message reads as torch's does. */
static const char *fmt_size(uint64_t n, char *buf, size_t len) {
    if (n <= 1024) snprintf(buf, len, "%llu bytes", (unsigned long long)n);
    else if (n <= GM__MIB) snprintf(buf, len, "%.2f KiB", n / 1024.0);
    else if (n <= GM__GIB) snprintf(buf, len, "%.2f MiB", n / (double)GM__MIB);
    else snprintf(buf, len, "%.2f GiB", n / (double)GM__GIB);
    return buf;
}

/* The OOM explanation, in torch's words where they apply (lock held): what
 * was asked, the device, the limit if one is set, what is allocated and what
 * is reserved but unallocated, and the one setting that addresses the latter
 * under the policy in use (never the one already in use). */
static int explain_oom(gm__device *d, uint64_t size) {
    uint64_t free_b = 0, total_b = d->total_memory;
    gm__be_mem_info(d, &free_b, &total_b); /* best effort: the message still helps */
    int64_t alloc = d->stats.allocated_bytes[GM_POOL_ALL].current;
    int64_t resv = d->stats.reserved_bytes[GM_POOL_ALL].current;
    char s1[32], s2[32], s3[32], s4[32], s5[32], lim[96] = "", advice[256];
    if (d->fraction_set && d->memory_fraction < 1.0)
        snprintf(lim, sizeof lim, " This process is limited to %s (memory fraction %.3g).",
                 fmt_size(d->allowed_memory_maximum, s5, sizeof s5), d->memory_fraction);
    const gm_config *c = d->cfg;
    const char *policy = gm_policy_name((int)c->policy);
    bool fragmented = resv - alloc > resv / 8 && (uint64_t)(resv - alloc) >= size / 4;
    /* What holds the memory, when the caller said (gm_block_set_category:
     * gpumem.torch.track() tags parameters, gradients, optimizer state): the
     * estimator (a hook, src/api/) then names the changes that would have
     * made it fit. */
    char tail[640] = "";
    const gm__hooks *h = d->alloc->hooks;
    uint64_t limit = d->fraction_set && d->memory_fraction < 1.0 ? d->allowed_memory_maximum : total_b;
    if (total_b && size > limit) /* no freeing, cache or setting can place it */
        snprintf(advice, sizeof advice,
                 "The request alone exceeds the %s's capacity of %s: nothing freed or cached would make it "
                 "fit; make the tensor smaller (batch, sequence length, or split the operation).",
                 limit < total_b ? "process's limit" : "device", fmt_size(limit, s3, sizeof s3));
    else if (h && h->explain_oom && h->explain_oom(d, size, free_b, total_b, tail, sizeof tail)) {
        snprintf(advice, sizeof advice, "%s", "");
    } else if (!fragmented)
        snprintf(advice, sizeof advice,
                 "Little is cached: the live tensors need this memory (a smaller batch, activation "
                 "checkpointing or lower precision would help; `gpumem estimate` puts numbers on them).");
    else if (c->policy == GM_POLICY_TORCH && !c->expandable_segments)
        snprintf(advice, sizeof advice,
                 "If reserved but unallocated memory is large try setting GPUMEM_CONF=policy:gpumem "
                 "(or expandable_segments:True) to avoid fragmentation.");
    else if (c->policy == GM_POLICY_TORCH)
        snprintf(advice, sizeof advice,
                 "Reserved but unallocated memory is large even with expandable_segments: try "
                 "GPUMEM_CONF=policy:gpumem.");
    else if (c->gpumem_slack > 0.0)
        snprintf(advice, sizeof advice,
                 "Reserved but unallocated memory is large: gpumem_slack:0 makes the gpumem policy "
                 "move idle memory instead of holding it (more device calls per step).");
    else
        snprintf(advice, sizeof advice, "Memory is split between streams or pinned by live blocks.");
    return gm__set_error(
        GM_ENOMEM,
        "Out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is "
        "free.%s Of the allocated memory %s is allocated by gpumem (policy %s), and %s is reserved "
        "but unallocated. %s%s",
        fmt_size(size, s1, sizeof s1), d->index, fmt_size(total_b, s2, sizeof s2),
        fmt_size(free_b, s3, sizeof s3), lim, fmt_size((uint64_t)alloc, s4, sizeof s4), policy ? policy : "?",
        fmt_size((uint64_t)(resv - alloc), s5, sizeof s5), advice, tail);
}

/* A failed placement (lock held; released here): the OOM explanation or
 * the error, the history. */
__attribute__((noinline)) static int alloc_failed(gm__device *d, int rc, size_t size, gm_stream stream) {
    if (rc == GM_ENOMEM) {
        d->stats.num_ooms++;
        explain_oom(d, size);
    } else {
        gm__set_error(rc, "gm_malloc of %zu bytes on device %d failed: %s", size, d->index, gm_strerror(rc));
    }
    publish(d);
    gm__devlock_unlock(&d->lock);
    if (rc == GM_ENOMEM) gm__history_oom(d->index, size, stream);
    return rc;
}

/* The same, then the lock released. */
static inline void alloc_done(gm__device *d, gm__block_hdr *b, size_t size, gm_stream stream, uint16_t mpool) {
    hand_out(d, b, size, stream, mpool);
    publish(d);
    gm__devlock_unlock(&d->lock);
}

/* The start of gm_malloc and gm_malloc_pool: the arguments checked, *out
 * zeroed, the device locked and its pending events processed. *dp is NULL
 * when there is nothing more to do (an error, or size 0: the return value
 * says which); otherwise the device is locked and the return value is the
 * events' status, which the caller hands to alloc_failed if it is not OK. */
static inline int malloc_enter(gm_allocator *a, int device, size_t size, gm_devptr *out, const char *fn,
                               gm__device **dp) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    *dp = NULL;
    if (!a || !out) return gm__set_error(GM_EINVAL, "%s: NULL argument", fn);
    *out = 0;
    if (size == 0) return GM_OK;
    gm__device *d;
    int rc = get_device(a, device, &d);
    if (rc != GM_OK) return rc;
    gm__fe_dev *fe = d->fe;
    gm__devlock_lock(&d->lock);
    if (fe->npending) rc = gm__device_process_events(d, false);
    *dp = d;
    return rc;
}

int gm_malloc(gm_allocator *a, int device, size_t size, gm_stream stream, gm_devptr *out) {
    gm__device *d;
    int rc = malloc_enter(a, device, size, out, "gm_malloc", &d);
    if (!d) return rc;
    gm__fe_dev *fe = d->fe;
    gm__block_hdr *b = NULL;
    if (rc == GM_OK) rc = gm__ptrmap_reserve(&fe->map);
    if (rc == GM_OK) rc = d->pops->malloc(d->pstate, size, stream, &b);
    uint16_t mpool = 0;
    if (__builtin_expect(rc != GM_OK, 0)) {
        /* torch's use_on_oom: a MemPool's memory serves the device's own pools before they fail */
        if (rc == GM_ENOMEM && d->mp) rc = gm__mempool_on_oom(d, size, stream, &b, &mpool);
        if (rc != GM_OK) return alloc_failed(d, rc, size, stream);
    }
    alloc_done(d, b, size, stream, mpool);
    *out = b->ptr;
    return GM_OK;
}

int gm_malloc_pool(gm_allocator *a, int device, size_t size, gm_stream stream, uint64_t id0, uint64_t id1,
                   gm_devptr *out) {
    gm__device *d;
    int rc = malloc_enter(a, device, size, out, "gm_malloc_pool", &d);
    if (!d) return rc;
    gm__fe_dev *fe = d->fe;
    gm__block_hdr *b = NULL;
    gm__mempool *p = gm__mempool_find(d, id0, id1);
    if (rc == GM_OK && (!p || p->use_count == 0)) {
        gm__devlock_unlock(&d->lock);
        return gm__set_error(GM_EINVAL, "gm_malloc_pool: device %d has no private pool (%llu, %llu) in use; "
                             "gm_pool_begin or gm_pool_retain it first", device, (unsigned long long)id0,
                             (unsigned long long)id1);
    }
    if (rc == GM_OK && p->asleep) {
        gm__devlock_unlock(&d->lock);
        return gm__set_error(GM_ESTATE, "gm_malloc_pool: private pool (%llu, %llu) tagged '%s' on device %d is "
                             "asleep (gm_allocator_sleep); wake it first", (unsigned long long)id0,
                             (unsigned long long)id1, p->tag, device);
    }
    if (rc == GM_OK) rc = gm__ptrmap_reserve(&fe->map);
    if (rc == GM_OK) {
        rc = p->view.pops->malloc(p->view.pstate, size, stream, &b);
        gm__mempool_sync(d, p);
    }
    if (rc != GM_OK) return alloc_failed(d, rc, size, stream);
    p->blocks++;
    alloc_done(d, b, size, stream, p->slot);
    *out = b->ptr;
    return GM_OK;
}

/* Find the device holding live block `ptr` and return it locked, or NULL;
 * *slot is where its pointer map holds it (valid while the lock is held). */
gm__device *gm__lock_owner(gm_allocator *a, gm_devptr ptr, gm__block_hdr **out, uint64_t *slot) {
    for (int i = 0; i < a->ndevices; i++) {
        gm__device *d = dev_peek(a, i);
        if (!d) continue;
        gm__fe_dev *fe = d->fe;
        if (ptr < atomic_load_explicit(&fe->lo, memory_order_acquire) ||
            ptr >= atomic_load_explicit(&fe->hi, memory_order_acquire))
            continue;
        gm__devlock_lock(&d->lock);
        uint64_t i = gm__ptrmap_slot(&fe->map, ptr);
        if (i != UINT64_MAX) {
            *out = fe->map.slots[i].block;
            *slot = i;
            return d;
        }
        gm__devlock_unlock(&d->lock);
    }
    return NULL;
}

typedef struct inside_arg {
    gm_devptr ptr;
    bool inside;
} inside_arg;

static int inside_cb(const gm_segment_info *seg, void *arg) {
    inside_arg *ia = arg;
    if (ia->ptr >= seg->address && ia->ptr - seg->address < seg->total_size) ia->inside = true;
    return GM_OK;
}

/* Slow path for a pointer that is not a live block: is it ours at all? */
static int classify_unknown(gm_allocator *a, gm_devptr ptr, const char *what) {
    inside_arg ia = {ptr, false};
    for (int i = 0; i < a->ndevices && !ia.inside; i++) {
        gm__device *d = dev_peek(a, i);
        if (!d) continue;
        gm__devlock_lock(&d->lock);
        if (d->pops->owns) ia.inside = d->pops->owns(d->pstate, ptr) || gm__mempool_owns(d, ptr);
        else {
            d->pops->walk_segments(d->pstate, inside_cb, &ia);
            gm__mempool_walk_segments(d, inside_cb, &ia);
        }
        gm__devlock_unlock(&d->lock);
    }
    if (ia.inside)
        return gm__set_error(GM_EDOUBLEFREE,
                             "%s: pointer 0x%llx lies in this allocator's memory but is not a live "
                             "allocation (already freed, or not the start of one)",
                             what, (unsigned long long)ptr);
    return gm__set_error(GM_EFOREIGN, "%s: pointer 0x%llx was not allocated by this allocator", what,
                         (unsigned long long)ptr);
}

int gm_free(gm_allocator *a, gm_devptr ptr) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "gm_free: NULL allocator");
    if (ptr == 0) return GM_OK; /* like free(NULL) and torch's size-0 tensors */
    gm__block_hdr *b;
    uint64_t slot;
    gm__device *d = gm__lock_owner(a, ptr, &b, &slot);
    if (!d) return classify_unknown(a, ptr, "gm_free");
    int rc = free_block(d, b, slot);
    if (rc == GM_OK) publish(d);
    gm__devlock_unlock(&d->lock);
    return rc;
}

int gm_record_stream(gm_allocator *a, gm_devptr ptr, gm_stream stream) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "gm_record_stream: NULL allocator");
    if (ptr == 0) return GM_OK;
    gm__block_hdr *b;
    uint64_t slot;
    gm__device *d = gm__lock_owner(a, ptr, &b, &slot);
    if (!d) return classify_unknown(a, ptr, "gm_record_stream");
    int rc = GM_OK;
    if (stream != b->stream) rc = gm__uses_add(b, stream); /* own stream: nothing to wait for */
    gm__devlock_unlock(&d->lock);
    return rc;
}

/* ---- cache, fraction, info ----------------------------------------------- */

int gm_empty_cache(gm_allocator *a, int device) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "gm_empty_cache: NULL allocator");
    gm__device *list[GM_MAX_DEVICES];
    int n, rc = device_list(a, device, list, &n);
    for (int i = 0; i < n && rc == GM_OK; i++) {
        gm__device *d = list[i];
        gm__devlock_lock(&d->lock);
        /* during a capture nothing is freed and no event waited for: torch's
         * emptyCache releases nothing of its own pools while captures are
         * under way, and says nothing. A capture that failed (torch never
         * calls endAllocateToPool after a failed cudaStreamEndCapture)
         * leaves the device capturing: empty_cache must not raise then. */
        if (d->capturing) {
            gm__devlock_unlock(&d->lock);
            continue;
        }
        rc = gm__device_process_events(d, true);
        if (rc == GM_OK) rc = d->pops->empty_cache(d->pstate);
        if (rc == GM_OK) rc = gm__mempool_empty_released(d);
        publish(d);
        gm__devlock_unlock(&d->lock);
    }
    return rc;
}

/* The settings of every policy instance (the device's, its private pools')
 * follow a->cfg; lock held. A pool keeps its own plan, slack and (for
 * another allocator's memory or no_split) expandable_segments. */
static void settings_apply(gm__device *d, const gm_config *was, const gm_config *c) {
    for (uint32_t i = 0; d->mp && i < d->mp->n; i++) {
        gm__mempool *p = d->mp->slot[i];
        if (!p) continue;
        gm_config pc = *c;
        pc.gpumem_plan = p->cfg.gpumem_plan;
        pc.gpumem_slack = p->cfg.gpumem_slack;
        if (p->opt.seg_alloc || p->opt.no_split) pc.expandable_segments = p->cfg.expandable_segments;
        p->cfg = pc;
    }
    /* the string set the fraction (else one set by gm_set_memory_fraction stays) */
    if (c->per_process_memory_fraction != was->per_process_memory_fraction)
        set_fraction(d, c->per_process_memory_fraction);
}

int gm_allocator_set_settings(gm_allocator *a, const char *str) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "gm_allocator_set_settings: NULL allocator");
    char err[512];
    pthread_mutex_lock(&a->devices_lock); /* no device is made meanwhile */
    gm_config c = a->cfg;
    int rc = gm_config_parse(&c, str, err, sizeof err);
    const char *fixed = rc == GM_OK ? gm__config_fixed_change(&a->cfg, &c) : NULL;
    if (rc != GM_OK) {
        rc = gm__set_error(rc, "allocator settings \"%s\": %s", str, err);
    } else if (fixed) {
        rc = gm__set_error(GM_ECONFIG, "allocator settings \"%s\": %s cannot change while the allocator runs (its "
                           "policy was built with it); set it at start: GPUMEM_CONF, `gpumem run --conf`, or "
                           "gpumem.torch.install(conf)", str, fixed);
    } else {
        gm__device *list[GM_MAX_DEVICES];
        int n = 0;
        for (int i = 0; i < a->ndevices; i++)
            if ((list[n] = dev_peek(a, i))) n++;
        for (int i = 0; i < n; i++) gm__devlock_lock(&list[i]->lock); /* in index order */
        gm_config was = a->cfg;
        a->cfg = c;
        for (int i = 0; i < n; i++) {
            settings_apply(list[i], &was, &c);
            publish(list[i]);
        }
        for (int i = n - 1; i >= 0; i--) gm__devlock_unlock(&list[i]->lock);
    }
    pthread_mutex_unlock(&a->devices_lock);
    return rc;
}

int gm_step_mark(gm_allocator *a, int device) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "gm_step_mark: NULL allocator");
    gm__device *list[GM_MAX_DEVICES];
    int n, rc = device_list(a, device, list, &n);
    gm__sink *sink = gm__sink_get(a);
    for (int i = 0; i < n; i++) {
        gm__device *d = list[i];
        if (!d->pops->step_mark && !sink) continue;
        gm__devlock_lock(&d->lock);
        /* a step inside a capture (an optimizer step being recorded) is no
         * step of the device's own pools, and a plan switch would sync */
        if (!d->capturing && d->pops->step_mark) d->pops->step_mark(d->pstate);
        if (!d->capturing && sink) sink->ops->step(sink, d->index, &d->stats);
        gm__devlock_unlock(&d->lock);
    }
    /* no lock held: the monitor may walk the blocks (at most once a second) */
    if (sink && n > 0) sink->ops->step_walk(sink, a, device);
    return rc;
}

int gm_set_memory_fraction(gm_allocator *a, int device, double fraction) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "gm_set_memory_fraction: NULL allocator");
    if (!(fraction >= 0.0 && fraction <= 1.0))
        return gm__set_error(GM_EINVAL, "memory fraction %g not in [0, 1]", fraction);
    gm__device *d;
    int rc = get_device(a, device, &d);
    if (rc != GM_OK) return rc;
    gm__devlock_lock(&d->lock);
    set_fraction(d, fraction);
    gm__devlock_unlock(&d->lock);
    return GM_OK;
}

int gm_mem_get_info(gm_allocator *a, int device, uint64_t *free_bytes, uint64_t *total_bytes) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "gm_mem_get_info: NULL allocator");
    gm__device *d;
    int rc = get_device(a, device, &d);
    if (rc != GM_OK) return rc;
    uint64_t f = 0, t = 0;
    gm__devlock_lock(&d->lock);
    rc = gm__be_mem_info(d, &f, &t);
    gm__devlock_unlock(&d->lock);
    if (rc != GM_OK) return gm__set_error(rc, "mem_info of device %d failed", device);
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return GM_OK;
}

/* ---- stats --------------------------------------------------------------- */

int gm_get_stats(gm_allocator *a, int device, gm_stats *out) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a || !out) return gm__set_error(GM_EINVAL, "gm_get_stats: NULL argument");
    /* out->size says which version of gm_stats the caller was built with: an
     * older, shorter one gets its prefix; anything else is a caller's bug. */
    uint32_t want = out->size;
    if (want < offsetof(gm_stats, allocation) + sizeof out->allocation || want > sizeof(gm_stats))
        return gm__set_error(GM_EINVAL, "gm_get_stats: out->size is %u; set it to sizeof(gm_stats) (%zu)", want,
                             sizeof(gm_stats));
    if (device < 0 || device >= a->ndevices)
        return gm__set_error(GM_EDEVICE, "device %d out of range (backend has %d)", device, a->ndevices);
    gm_stats s = {.size = sizeof s};
    gm__device *d = dev_peek(a, device);
    if (!d) { /* never used: all zero, without creating it */
        memset(&s, 0, sizeof s);
        s.max_split_size = a->cfg.max_split_size == UINT64_MAX ? -1 : (int64_t)a->cfg.max_split_size;
    } else {
        gm__devlock_lock(&d->lock);
        s = d->stats;
        gm__devlock_unlock(&d->lock);
    }
    s.size = want;
    memcpy(out, &s, want);
    return GM_OK;
}

static void reset_peak(gm_stats *s) {
#define GM__RP_ARRAY(n) for (int p = 0; p < GM_POOL_COUNT; p++) s->n[p].peak = s->n[p].current;
#define GM__RP_SINGLE(n) s->n.peak = s->n.current;
    GM_STAT_ARRAYS(GM__RP_ARRAY)
    GM_STAT_SINGLES(GM__RP_SINGLE)
#undef GM__RP_ARRAY
#undef GM__RP_SINGLE
}

static void reset_accumulated(gm_stats *s) {
#define GM__RA_ARRAY(n) for (int p = 0; p < GM_POOL_COUNT; p++) s->n[p].allocated = s->n[p].freed = 0;
#define GM__RA_SINGLE(n) s->n.allocated = s->n.freed = 0;
    GM_STAT_ARRAYS(GM__RA_ARRAY)
    GM_STAT_SINGLES(GM__RA_SINGLE)
#undef GM__RA_ARRAY
#undef GM__RA_SINGLE
    int64_t msplit = s->max_split_size; /* a setting, not a counter */
#define GM__RA_COUNTER(n) s->n = 0;
    GM_STAT_COUNTERS(GM__RA_COUNTER)
#undef GM__RA_COUNTER
    s->max_split_size = msplit;
}

static int for_each_locked(gm_allocator *a, int device, void (*fn)(gm_stats *)) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a) return gm__set_error(GM_EINVAL, "NULL allocator");
    gm__device *list[GM_MAX_DEVICES];
    int n, rc = device_list(a, device, list, &n);
    for (int i = 0; i < n; i++) {
        gm__devlock_lock(&list[i]->lock);
        fn(&list[i]->stats);
        publish(list[i]);
        gm__devlock_unlock(&list[i]->lock);
    }
    return rc;
}

int gm_reset_peak_stats(gm_allocator *a, int device) { return for_each_locked(a, device, reset_peak); }
int gm_reset_accumulated_stats(gm_allocator *a, int device) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    return for_each_locked(a, device, reset_accumulated);
}

int gm_memory_summary(gm_allocator *a, int device, bool abbreviated, char *buf, size_t len) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    gm_stats s = {.size = sizeof s};
    int rc = gm_get_stats(a, device, &s);
    if (rc != GM_OK) return rc;
    return gm__format_summary(&s, device, abbreviated, buf, len);
}

/* ---- checks and walks ----------------------------------------------------- */

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            if (errlen) snprintf(err, errlen, __VA_ARGS__);                    \
            return GM_ESTATE;                                                  \
        }                                                                      \
    } while (0)

static int check_device(gm__device *d, char *err, size_t errlen) {
    gm__fe_dev *fe = d->fe;
    int64_t cnt[GM_POOL_COUNT] = {0}, bytes[GM_POOL_COUNT] = {0}, req[GM_POOL_COUNT] = {0};
    uint64_t seen = 0;
    for (uint64_t i = 0; i <= fe->map.mask; i++) {
        gm__block_hdr *b = fe->map.slots[i].block;
        if (!fe->map.slots[i].key) continue;
        seen++;
        CHECK(b && b->ptr == fe->map.slots[i].key && b->live,
              "device %d: pointer map entry 0x%llx does not match a live block", d->index,
              (unsigned long long)fe->map.slots[i].key);
        CHECK(b->pool == GM_POOL_SMALL || b->pool == GM_POOL_LARGE, "device %d: block 0x%llx has pool %d",
              d->index, (unsigned long long)b->ptr, b->pool);
        CHECK(b->requested <= b->size, "device %d: block 0x%llx requested %llu > size %llu", d->index,
              (unsigned long long)b->ptr, (unsigned long long)b->requested, (unsigned long long)b->size);
        for (int p = 0; p < GM_POOL_COUNT; p++) {
            if (p != GM_POOL_ALL && p != b->pool) continue;
            cnt[p]++;
            bytes[p] += (int64_t)b->size;
            req[p] += (int64_t)b->requested;
        }
    }
    CHECK(seen == fe->map.count, "device %d: pointer map holds %llu entries, counts %llu", d->index,
          (unsigned long long)seen, (unsigned long long)fe->map.count);
    const gm_stats *s = &d->stats;
    static const char *const pools[] = GM_POOL_NAMES;
    for (int p = 0; p < GM_POOL_COUNT; p++) {
        CHECK(cnt[p] == s->allocation[p].current, "device %d: allocation.%s.current %lld != %lld live blocks",
              d->index, pools[p], (long long)s->allocation[p].current, (long long)cnt[p]);
        CHECK(bytes[p] == s->allocated_bytes[p].current,
              "device %d: allocated_bytes.%s.current %lld != %lld bytes in live blocks", d->index, pools[p],
              (long long)s->allocated_bytes[p].current, (long long)bytes[p]);
        CHECK(req[p] == s->requested_bytes[p].current,
              "device %d: requested_bytes.%s.current %lld != %lld requested by live blocks", d->index,
              pools[p], (long long)s->requested_bytes[p].current, (long long)req[p]);
        CHECK(s->requested_bytes[p].current <= s->allocated_bytes[p].current &&
                  s->allocated_bytes[p].current <= s->active_bytes[p].current &&
                  s->active_bytes[p].current <= s->reserved_bytes[p].current,
              "device %d: %s: requested %lld <= allocated %lld <= active %lld <= reserved %lld broken",
              d->index, pools[p], (long long)s->requested_bytes[p].current,
              (long long)s->allocated_bytes[p].current, (long long)s->active_bytes[p].current,
              (long long)s->reserved_bytes[p].current);
    }
    for (size_t i = 0; i < fe->npending; i++) {
        gm__block_hdr *b = fe->pending[i];
        CHECK(!b->live && b->uses && b->uses->done < b->uses->n,
              "device %d: pending block 0x%llx is live or has no outstanding event", d->index,
              (unsigned long long)b->ptr);
        CHECK(!gm__ptrmap_find(&fe->map, b->ptr), "device %d: pending block 0x%llx still in the pointer map",
              d->index, (unsigned long long)b->ptr);
    }
    return gm__mempool_check(d, err, errlen);
}

int gm_check(gm_allocator *a, int device, char *err, size_t errlen) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (errlen) err[0] = '\0';
    if (!a) return gm__set_error(GM_EINVAL, "gm_check: NULL allocator");
    gm__device *list[GM_MAX_DEVICES];
    int n, rc = device_list(a, device, list, &n);
    for (int i = 0; i < n && rc == GM_OK; i++) {
        gm__devlock_lock(&list[i]->lock);
        rc = check_device(list[i], err, errlen);
        gm__devlock_unlock(&list[i]->lock);
    }
    return rc;
}

int gm_walk_segments(gm_allocator *a, int device, gm_segment_cb cb, void *arg) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a || !cb) return gm__set_error(GM_EINVAL, "gm_walk_segments: NULL argument");
    gm__device *list[GM_MAX_DEVICES];
    int n, rc = device_list(a, device, list, &n);
    /* cb runs under the device lock: it must not call back into the allocator */
    for (int i = 0; i < n && rc == GM_OK; i++) {
        gm__devlock_lock(&list[i]->lock);
        rc = list[i]->pops->walk_segments(list[i]->pstate, cb, arg);
        if (rc == GM_OK) rc = gm__mempool_walk_segments(list[i], cb, arg);
        gm__devlock_unlock(&list[i]->lock);
    }
    return rc;
}
