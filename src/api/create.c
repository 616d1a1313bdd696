/* create.c — gm_allocator_create: the core's allocator (src/core/allocator.c)
 * with what the layers above lend it. This folder is the library's top floor
 * (docs/architecture.md): it may call every layer, and none calls it.
 *
 *  - the OOM explanation's tail from the estimator (gm__est_oom_explain), when
 *    the caller said what holds the memory (gm_block_set_category);
 *  - publication for the monitor when GPUMEM_PUBLISH=1 (gm_allocator_publish
 *    sets the core's statistics sink). */
#include "estimate/estimate.h"
#include "frontend.h"
#include "internal.h"
#include "monitor/monitor.h"

/* gm__hooks.explain_oom: what the tagged live blocks hold, by category, and
 * the estimator's changes that would have made the allocation fit. Nothing
 * (0) when no live block is tagged. */
static int explain_oom(const gm__device *d, uint64_t requested, uint64_t device_free, uint64_t device_total,
                       char *tail, size_t len) {
    int64_t alloc = d->stats.allocated_bytes[GM_POOL_ALL].current;
    int64_t resv = d->stats.reserved_bytes[GM_POOL_ALL].current;
    const gm_config *c = d->cfg;
    gm_est_oom_info info = {.device = d->index, .requested = requested, .device_total = device_total,
                            .device_free = device_free, .allocated = (uint64_t)alloc, .reserved = (uint64_t)resv,
                            .expandable_segments = c->expandable_segments,
                            .gpumem_policy = c->policy == GM_POLICY_GPUMEM, .tail_only = true};
    if (d->fraction_set && d->memory_fraction < 1.0) info.limit = d->allowed_memory_maximum;
    const gm__fe_dev *fe = d->fe;
    for (uint64_t i = 0; fe && i <= fe->map.mask; i++) {
        const gm__block_hdr *b = fe->map.slots[i].key ? fe->map.slots[i].block : NULL;
        if (!b || !b->live || !b->category || b->category > GM_EST_NCAT) continue;
        info.by_category[b->category - 1] += (int64_t)b->size;
        info.have_categories = true;
    }
    if (!info.have_categories) return 0;
    /* live bytes no tag claims: what the forward and backward passes made */
    int64_t tagged = 0;
    for (int k = 0; k < GM_EST_NCAT; k++) tagged += info.by_category[k];
    if (alloc > tagged && !info.by_category[GM_EST_CAT_ACTS]) info.by_category[GM_EST_CAT_ACTS] = alloc - tagged;
    gm__est_oom_explain(&info, tail, len);
    return 1;
}

static const gm__hooks hooks = {.explain_oom = explain_oom};

int gm_allocator_create(gm_allocator **out, gm_backend *backend, const gm_config *cfg) {
    int rc = gm__allocator_create(out, backend, cfg, &hooks);
    if (rc != GM_OK) return rc;
    gm__publish_from_env(*out); /* optional: the allocator works without it */
    gm__clear_error();
    return GM_OK;
}
