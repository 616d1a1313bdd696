/* blocks.c — the allocator's live blocks, one at a time (gm_block_lookup) or
 * all of a device (gm_walk_blocks): what PyTorch's memory snapshot calls
 * active_allocated and active_pending_free blocks, and the block size
 * torch's profiler is told about. Read-only; takes each device's lock. */
#include "frontend.h"
#include "mempool.h"

#include <stddef.h>
#include <string.h>

static gm__device *dev_peek(gm_allocator *a, int i) { return __atomic_load_n(&a->devices[i], __ATOMIC_ACQUIRE); }

static void fill(gm_block_info *o, const gm__device *d, const gm__block_hdr *b) {
    memset(o, 0, sizeof *o);
    o->size_of = sizeof *o;
    o->address = b->ptr;
    o->size = b->size;
    o->requested = b->requested;
    o->stream = b->stream;
    o->pool = b->pool;
    o->live = b->live != 0;
    o->category = (int16_t)(b->category ? (int)b->category - 1 : -1);
    gm__mempool_block_id(d, b, o->pool_id);
}

int gm_block_lookup(gm_allocator *a, gm_devptr ptr, int *device, gm_block_info *out) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a || !out) return gm__set_error(GM_EINVAL, "gm_block_lookup: NULL argument");
    gm__block_hdr *b;
    uint64_t slot;
    gm__device *d = ptr ? gm__lock_owner(a, ptr, &b, &slot) : NULL;
    if (d) {
        fill(out, d, b);
        gm__devlock_unlock(&d->lock);
        if (device) *device = d->index;
        return GM_OK;
    }
    return gm__set_error(GM_EFOREIGN, "gm_block_lookup: 0x%llx is not a live allocation of this allocator",
                         (unsigned long long)ptr);
}

int gm_walk_blocks(gm_allocator *a, int device, gm_block_cb cb, void *arg) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a || !cb) return gm__set_error(GM_EINVAL, "gm_walk_blocks: NULL argument");
    if (device < -1 || device >= a->ndevices)
        return gm__set_error(GM_EDEVICE, "device %d out of range (backend has %d)", device, a->ndevices);
    int rc = GM_OK;
    for (int i = device < 0 ? 0 : device; i < (device < 0 ? a->ndevices : device + 1) && rc == GM_OK; i++) {
        gm__device *d = dev_peek(a, i);
        if (!d) continue;
        gm__fe_dev *fe = d->fe;
        gm_block_info bi;
        /* cb runs under the device lock: it must not call back into the allocator */
        gm__devlock_lock(&d->lock);
        for (uint64_t s = 0; s <= fe->map.mask && fe->map.slots && rc == GM_OK; s++) {
            if (!fe->map.slots[s].key) continue;
            fill(&bi, d, fe->map.slots[s].block);
            rc = cb(&bi, arg);
        }
        for (size_t k = 0; k < fe->npending && rc == GM_OK; k++) {
            fill(&bi, d, fe->pending[k]);
            rc = cb(&bi, arg);
        }
        gm__devlock_unlock(&d->lock);
    }
    return rc;
}

int gm_block_set_category(gm_allocator *a, gm_devptr ptr, int category) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!a || category < 0 || category >= GM_CAT_COUNT)
        return gm__set_error(GM_EINVAL, "gm_block_set_category: no allocator, or category %d is not 0..%d",
                             category, GM_CAT_COUNT - 1);
    gm__block_hdr *b;
    uint64_t slot;
    gm__device *d = ptr ? gm__lock_owner(a, ptr, &b, &slot) : NULL;
    if (!d)
        return gm__set_error(GM_EFOREIGN, "gm_block_set_category: 0x%llx is not a live allocation of this allocator",
                             (unsigned long long)ptr);
    b->category = (uint8_t)(category + 1);
    gm__devlock_unlock(&d->lock);
    return GM_OK;
}

/* category sits in what was padding; pool_id was appended for private pools: the
 * shim, the one caller outside the library, is built with the library */
_Static_assert(sizeof(gm_block_info) == 64 && offsetof(gm_block_info, category) == 46 &&
                   offsetof(gm_block_info, pool_id) == 48,
               "gm_block_info layout (x86-64/aarch64)");
