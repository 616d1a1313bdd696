/* sim.c — the simulated device backend: capacity accounting, deterministic
 * fake addresses, driver-like VMM semantics and events whose completion tests
 * control. It is used by CI and by trace replay, and it is where policy bugs
 * get caught: every misuse the driver would reject (double free, unknown
 * handle, mapping over a mapped page, releasing a mapped range) is rejected
 * here too, with GM_EINVAL.
 *
 * Addresses: each device has its own region for plain allocations (placed
 * first-fit at the lowest free 2 MiB-aligned address, so freed ranges are
 * reused like the driver does) and a separate region for VA reservations.
 * One mutex guards the whole simulator. */
#include "backend/table.h"
#include "util/util.h"
#include "util/idmap.h"

#include <stdlib.h>
#include <string.h>

#define SIM_MALLOC_BASE ((uint64_t)0x7f0000000000)
#define SIM_MALLOC_STRIDE ((uint64_t)1 << 40) /* 1 TiB of fake addresses per device */
#define SIM_VA_BASE ((uint64_t)1 << 52)
#define SIM_VA_STRIDE ((uint64_t)1 << 44) /* 16 TiB of reservations per device */
#define SIM_MALLOC_ALIGN (2 * GM__MIB)

/* A sorted range; `pages` (reservations only) holds, per granule, the
 * physical handle slot + 1 mapped there (0 = unmapped), allocated lazily. */
typedef struct sim_range {
    uint64_t start, size;
    uint32_t *pages;
    uint64_t mapped_pages;
} sim_range;

typedef struct range_set {
    sim_range *v;
    size_t n, cap;
} range_set;

typedef struct sim_phys {
    uint64_t size;
    gm_devptr mapped_va; /* 0 = not mapped */
    uint8_t *data;       /* contents, allocated at the first write (gm_sim_write, copy_to_device) */
    uint32_t gen;
    bool used;
} sim_phys;

typedef struct sim_event {
    gm_stream stream;
    uint32_t gen;
    bool used, done;
} sim_event;

/* A slot table with a free list: handles are (generation << 32 | slot + 1),
 * so a stale or made-up handle is detected. */
typedef struct slots {
    void *v;
    size_t n, cap, elem;
    uint32_t *free_idx;
    size_t nfree;
} slots;

/* An address the next malloc of exactly `size` bytes should get (replay
 * uses the trace's segment addresses: torch's best fit breaks ties by
 * address, so predictions depend on where segments sit). */
typedef struct sim_hint {
    uint64_t size;
    gm_devptr addr;
    uint32_t next; /* next unused hint of the same size, + 1 (0: none) */
} sim_hint;

/* The unused hints of one size, oldest first (indexes + 1). */
typedef struct hint_list {
    uint32_t head, tail;
} hint_list;

/* A malloc tries at most this many hints of its size whose range is taken
 * before it is placed first-fit: a trace cannot make each malloc walk a
 * long list of blocked hints (replay would be quadratic). */
#define SIM_HINT_TRIES 64

typedef struct sim_dev {
    uint64_t used; /* bytes of capacity consumed */
    range_set mallocs, reservations;
    slots phys, events;
    uint64_t nphys, nevents; /* live handles of each table */
    sim_hint *hints;
    size_t nhints, caphints;
    gm__idmap hint_lists; /* size -> index into lists */
    hint_list *lists;
    size_t nlists, caplists;
    /* successful sized calls by kind and log2(bytes): what each call costs on
     * a GPU depends on its size (bench/vmm_cost.c), so replay reports them */
    uint64_t szn[GM_BCALL_COUNT][GM_SIM_SIZE_BUCKETS], szb[GM_BCALL_COUNT][GM_SIM_SIZE_BUCKETS];
} sim_dev;

static void count_size(sim_dev *d, int kind, uint64_t bytes) {
    unsigned k = bytes ? 63u - (unsigned)__builtin_clzll(bytes) : 0;
    d->szn[kind][k]++;
    d->szb[kind][k] += bytes;
}

typedef struct sim {
    pthread_mutex_t lock;
    gm_sim_options opt;
    sim_dev *devs;
} sim;

/* ---- helpers ------------------------------------------------------------ */

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Room for one more element in the array *arrp (any T **), n of *cap
 * used, elem bytes each: the capacity doubles, starting at `first`. On
 * failure nothing changes. */
static int grow(void *arrp, size_t n, size_t *cap, size_t elem, size_t first) {
    if (n < *cap) return GM_OK;
    size_t nc = *cap ? *cap * 2 : first;
    if (!gm__realloc_array(arrp, nc, elem)) return GM_ENOHOSTMEM;
    *cap = nc;
    return GM_OK;
}

/* index of the first range with start > addr */
static size_t rs_upper(const range_set *rs, uint64_t addr) {
    size_t lo = 0, hi = rs->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (rs->v[mid].start <= addr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* the range containing addr, or NULL */
static sim_range *rs_find(range_set *rs, uint64_t addr, size_t *idx) {
    size_t i = rs_upper(rs, addr);
    if (i == 0) return NULL;
    sim_range *r = &rs->v[i - 1];
    if (addr - r->start >= r->size) return NULL;
    if (idx) *idx = i - 1;
    return r;
}

/* Insert [start, start + size) at index i of the sorted set. */
static int rs_insert_index(range_set *rs, size_t i, uint64_t start, uint64_t size) {
    if (grow(&rs->v, rs->n, &rs->cap, sizeof *rs->v, 16) != GM_OK) return GM_ENOHOSTMEM;
    memmove(&rs->v[i + 1], &rs->v[i], (rs->n - i) * sizeof *rs->v);
    rs->v[i] = (sim_range){.start = start, .size = size};
    rs->n++;
    return GM_OK;
}

/* Place `size` bytes first-fit at the lowest `align`-aligned free address in
 * [base, base + limit); insert and return its index, or -1. */
static int rs_place(range_set *rs, uint64_t base, uint64_t limit, uint64_t size, uint64_t align,
                    uint64_t *out) {
    uint64_t cand = base;
    size_t i = 0;
    for (; i < rs->n; i++) {
        if (rs->v[i].start >= cand && rs->v[i].start - cand >= size) break;
        uint64_t end = round_up(rs->v[i].start + rs->v[i].size, align);
        if (end > cand) cand = end;
    }
    if (cand - base > limit || limit - (cand - base) < size) return GM_ENOMEM;
    int rc = rs_insert_index(rs, i, cand, size);
    if (rc == GM_OK) *out = cand;
    return rc;
}

/* Insert [start, start + size) if it overlaps nothing; GM_EINVAL if it does. */
static int rs_insert_at(range_set *rs, uint64_t start, uint64_t size) {
    size_t i = rs_upper(rs, start);
    if (i > 0 && rs->v[i - 1].start + rs->v[i - 1].size > start) return GM_EINVAL;
    if (i < rs->n && rs->v[i].start < start + size) return GM_EINVAL;
    return rs_insert_index(rs, i, start, size);
}

static void rs_remove(range_set *rs, size_t i) {
    free(rs->v[i].pages);
    memmove(&rs->v[i], &rs->v[i + 1], (rs->n - i - 1) * sizeof *rs->v);
    rs->n--;
}

static void rs_free(range_set *rs) {
    for (size_t i = 0; i < rs->n; i++) free(rs->v[i].pages);
    free(rs->v);
}

/* slot tables: elements start with their own uint32 gen and bool used after a
 * payload; we access them through typed pointers below */
static void *slot_at(slots *s, size_t i) { return (char *)s->v + i * s->elem; }

static int slot_alloc(slots *s, size_t *idx) {
    if (s->nfree) {
        *idx = s->free_idx[--s->nfree];
        return GM_OK;
    }
    if (s->n == s->cap) {
        /* both arrays to the same capacity; s->cap moves once both have */
        size_t vcap = s->cap, fcap = s->cap;
        if (grow(&s->v, s->n, &vcap, s->elem, 64) != GM_OK ||
            grow(&s->free_idx, s->n, &fcap, sizeof *s->free_idx, 64) != GM_OK)
            return GM_ENOHOSTMEM;
        memset((char *)s->v + s->cap * s->elem, 0, (vcap - s->cap) * s->elem);
        s->cap = vcap;
    }
    *idx = s->n++;
    return GM_OK;
}

static void slot_release(slots *s, size_t idx) { s->free_idx[s->nfree++] = (uint32_t)idx; }

static uint64_t make_handle(size_t idx, uint32_t gen) { return ((uint64_t)gen << 32) | (idx + 1); }

static sim_phys *phys_get(sim_dev *d, gm_physmem h, size_t *idx) {
    uint64_t i = (h & 0xffffffffu);
    if (i == 0 || i > d->phys.n) return NULL;
    sim_phys *p = slot_at(&d->phys, i - 1);
    if (!p->used || p->gen != (uint32_t)(h >> 32)) return NULL;
    if (idx) *idx = i - 1;
    return p;
}

static sim_event *event_get(sim_dev *d, gm_event h) {
    uint64_t i = (h & 0xffffffffu);
    if (i == 0 || i > d->events.n) return NULL;
    sim_event *e = slot_at(&d->events, i - 1);
    if (!e->used || e->gen != (uint32_t)(h >> 32)) return NULL;
    return e;
}

/* Every op: check the device, take the lock. */
#define SIM_ENTER(ctx, dev)                                                    \
    sim *s = (sim *)(ctx);                                                     \
    if ((dev) < 0 || (dev) >= s->opt.device_count) return GM_EDEVICE;          \
    sim_dev *d = &s->devs[(dev)];                                              \
    (void)d;                                                                   \
    pthread_mutex_lock(&s->lock);                                              \
    int rc = GM_OK;
#define SIM_LEAVE()                                                            \
    pthread_mutex_unlock(&s->lock);                                            \
    return rc;

/* ---- ops ----------------------------------------------------------------- */

static void sim_destroy(void *ctx) {
    sim *s = ctx;
    for (int i = 0; i < s->opt.device_count; i++) {
        sim_dev *d = &s->devs[i];
        rs_free(&d->mallocs);
        free(d->hints);
        free(d->lists);
        gm__idmap_free(&d->hint_lists);
        rs_free(&d->reservations);
        for (size_t k = 0; k < d->phys.n; k++) free(((sim_phys *)slot_at(&d->phys, k))->data);
        free(d->phys.v);
        free(d->phys.free_idx);
        free(d->events.v);
        free(d->events.free_idx);
    }
    free(s->devs);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static int sim_device_count(void *ctx, int *count) {
    *count = ((sim *)ctx)->opt.device_count;
    return GM_OK;
}

static int sim_mem_info(void *ctx, int dev, uint64_t *free_bytes, uint64_t *total_bytes) {
    SIM_ENTER(ctx, dev)
    if (free_bytes) *free_bytes = s->opt.capacity - d->used;
    if (total_bytes) *total_bytes = s->opt.capacity;
    SIM_LEAVE()
}

/* The oldest unused hint for exactly `size` bytes whose range is free
 * (among the first SIM_HINT_TRIES of that size); it leaves its list. */
static bool take_hint(sim_dev *d, uint64_t size, uint64_t sz, gm_devptr *out) {
    if (!d->nlists) return false;
    size_t j = gm__idmap_find(&d->hint_lists, size);
    if (d->hint_lists.id[j] == GM__IDMAP_EMPTY) return false;
    hint_list *l = &d->lists[d->hint_lists.id[j]];
    uint32_t prev = 0;
    for (uint32_t k = l->head, tries = 0; k && tries < SIM_HINT_TRIES; prev = k, k = d->hints[k - 1].next, tries++) {
        sim_hint *h = &d->hints[k - 1];
        if (rs_insert_at(&d->mallocs, h->addr, sz) != GM_OK) continue;
        if (prev) d->hints[prev - 1].next = h->next;
        else l->head = h->next;
        if (l->tail == k) l->tail = prev;
        *out = h->addr;
        return true;
    }
    return false;
}

static int sim_malloc(void *ctx, int dev, uint64_t size, gm_devptr *out) {
    SIM_ENTER(ctx, dev)
    uint64_t sz = round_up(size, SIM_MALLOC_ALIGN);
    if (size == 0 || sz < size) rc = GM_EINVAL;
    else if (sz > s->opt.capacity - d->used) rc = GM_ENOMEM;
    else if (take_hint(d, size, sz, out)) {
        d->used += sz;
        rc = GM_OK;
    } else {
        rc = rs_place(&d->mallocs, SIM_MALLOC_BASE + (uint64_t)dev * SIM_MALLOC_STRIDE,
                      SIM_MALLOC_STRIDE, sz, SIM_MALLOC_ALIGN, out);
        if (rc == GM_OK) d->used += sz;
    }
    if (rc == GM_OK) count_size(d, GM_BCALL_MALLOC, sz);
    SIM_LEAVE()
}

static int sim_free(void *ctx, int dev, gm_devptr ptr) {
    SIM_ENTER(ctx, dev)
    size_t i;
    sim_range *r = rs_find(&d->mallocs, ptr, &i);
    if (!r || r->start != ptr) rc = GM_EINVAL; /* never allocated, or already freed */
    else {
        d->used -= r->size;
        count_size(d, GM_BCALL_FREE, r->size);
        rs_remove(&d->mallocs, i);
    }
    SIM_LEAVE()
}

static int sim_granularity(void *ctx, int dev, uint64_t *bytes) {
    SIM_ENTER(ctx, dev)
    *bytes = s->opt.granularity;
    SIM_LEAVE()
}

static int sim_va_reserve(void *ctx, int dev, uint64_t size, gm_devptr *out) {
    SIM_ENTER(ctx, dev)
    uint64_t g = s->opt.granularity;
    if (size == 0 || size % g) rc = GM_EINVAL;
    else
        rc = rs_place(&d->reservations, SIM_VA_BASE + (uint64_t)dev * SIM_VA_STRIDE, SIM_VA_STRIDE,
                      size, g, out);
    SIM_LEAVE()
}

static int sim_va_release(void *ctx, int dev, gm_devptr va, uint64_t size) {
    SIM_ENTER(ctx, dev)
    size_t i;
    sim_range *r = rs_find(&d->reservations, va, &i);
    if (!r || r->start != va || r->size != size) rc = GM_EINVAL;
    else if (r->mapped_pages) rc = GM_EINVAL; /* driver: still mapped */
    else rs_remove(&d->reservations, i);
    SIM_LEAVE()
}

static int sim_phys_create(void *ctx, int dev, uint64_t size, gm_physmem *out) {
    SIM_ENTER(ctx, dev)
    size_t idx;
    if (size == 0 || size % s->opt.granularity) rc = GM_EINVAL;
    else if (size > s->opt.capacity - d->used) rc = GM_ENOMEM;
    else if ((rc = slot_alloc(&d->phys, &idx)) == GM_OK) {
        sim_phys *p = slot_at(&d->phys, idx);
        p->size = size;
        p->mapped_va = 0;
        p->gen++;
        p->used = true;
        d->nphys++;
        d->used += size;
        count_size(d, GM_BCALL_PHYS_CREATE, size);
        *out = make_handle(idx, p->gen);
    }
    SIM_LEAVE()
}

static int sim_phys_release(void *ctx, int dev, gm_physmem h) {
    SIM_ENTER(ctx, dev)
    size_t idx;
    sim_phys *p = phys_get(d, h, &idx);
    if (!p || p->mapped_va) rc = GM_EINVAL;
    else {
        d->used -= p->size;
        count_size(d, GM_BCALL_PHYS_RELEASE, p->size);
        free(p->data);
        p->data = NULL;
        p->used = false;
        d->nphys--;
        slot_release(&d->phys, idx);
    }
    SIM_LEAVE()
}

/* The reservation holding all of [va, va+size), granule-aligned, or NULL. */
static sim_range *find_span(sim *s, sim_dev *d, gm_devptr va, uint64_t size) {
    uint64_t g = s->opt.granularity;
    if (size == 0 || va % g || size % g) return NULL;
    sim_range *r = rs_find(&d->reservations, va, NULL);
    if (!r || size > r->size - (va - r->start)) return NULL;
    return r;
}

static int sim_map(void *ctx, int dev, gm_devptr va, uint64_t size, gm_physmem h) {
    SIM_ENTER(ctx, dev)
    size_t idx = 0;
    uint64_t g = s->opt.granularity;
    sim_phys *p = phys_get(d, h, &idx);
    sim_range *r = find_span(s, d, va, size);
    if (!p || !r || p->mapped_va || p->size != size) {
        rc = GM_EINVAL;
        goto out;
    }
    if (!r->pages && !(r->pages = calloc(r->size / g, sizeof *r->pages))) {
        rc = GM_ENOHOSTMEM;
        goto out;
    }
    uint64_t first = (va - r->start) / g, n = size / g;
    for (uint64_t i = 0; i < n; i++)
        if (r->pages[first + i]) {
            rc = GM_EINVAL; /* a page of the range is already mapped */
            goto out;
        }
    for (uint64_t i = 0; i < n; i++) r->pages[first + i] = (uint32_t)(idx + 1);
    r->mapped_pages += n;
    p->mapped_va = va;
    count_size(d, GM_BCALL_MAP, size);
out:
    SIM_LEAVE()
}

/* Unmap [va, va+size): every page must be mapped, and the range must cover
 * whole mappings (the driver cannot unmap part of a handle). */
static int sim_unmap(void *ctx, int dev, gm_devptr va, uint64_t size) {
    SIM_ENTER(ctx, dev)
    uint64_t g = s->opt.granularity;
    sim_range *r = find_span(s, d, va, size);
    if (!r || !r->pages) {
        rc = GM_EINVAL;
        goto out;
    }
    uint64_t first = (va - r->start) / g, n = size / g;
    for (uint64_t i = 0; i < n;) { /* validate everything before changing anything */
        uint32_t slot = r->pages[first + i];
        sim_phys *p = slot ? slot_at(&d->phys, slot - 1) : NULL;
        if (!p || p->mapped_va != r->start + (first + i) * g || p->size / g > n - i) {
            rc = GM_EINVAL;
            goto out;
        }
        i += p->size / g;
    }
    for (uint64_t i = 0; i < n;) {
        sim_phys *p = slot_at(&d->phys, r->pages[first + i] - 1);
        uint64_t k = p->size / g;
        memset(&r->pages[first + i], 0, k * sizeof *r->pages);
        p->mapped_va = 0;
        i += k;
    }
    r->mapped_pages -= n;
    count_size(d, GM_BCALL_UNMAP, size);
out:
    SIM_LEAVE()
}

static int sim_event_record(void *ctx, int dev, gm_stream stream, gm_event *out) {
    SIM_ENTER(ctx, dev)
    size_t idx;
    if ((rc = slot_alloc(&d->events, &idx)) == GM_OK) {
        sim_event *e = slot_at(&d->events, idx);
        e->stream = stream;
        e->gen++;
        e->used = true;
        d->nevents++;
        e->done = !s->opt.events_manual;
        *out = make_handle(idx, e->gen);
    }
    SIM_LEAVE()
}

static int sim_event_query(void *ctx, int dev, gm_event ev, bool *done) {
    SIM_ENTER(ctx, dev)
    sim_event *e = event_get(d, ev);
    if (!e) rc = GM_EINVAL;
    else *done = e->done;
    SIM_LEAVE()
}

static int sim_event_sync(void *ctx, int dev, gm_event ev) {
    SIM_ENTER(ctx, dev)
    sim_event *e = event_get(d, ev);
    if (!e) rc = GM_EINVAL;
    else e->done = true; /* waiting on the host lets the stream's work finish */
    SIM_LEAVE()
}

static int sim_event_destroy(void *ctx, int dev, gm_event ev) {
    SIM_ENTER(ctx, dev)
    sim_event *e = event_get(d, ev);
    if (!e) rc = GM_EINVAL;
    else {
        e->used = false;
        d->nevents--;
        slot_release(&d->events, (size_t)(ev & 0xffffffffu) - 1);
    }
    SIM_LEAVE()
}

/* Contents: copy n bytes between host memory and mapped memory at addr,
 * granule by granule; GM_EINVAL (nothing copied) where a byte is not mapped.
 * Memory never written reads as zeros; a handle's buffer is made at its
 * first write. */
static int sim_copy(sim *s, sim_dev *d, gm_devptr addr, uint8_t *host, uint64_t n, bool write) {
    uint64_t g = s->opt.granularity;
    for (int pass = 0; pass < 2; pass++) { /* check every byte, then copy */
        for (uint64_t done = 0; done < n;) {
            gm_devptr a = addr + done;
            sim_range *r = rs_find(&d->reservations, a, NULL);
            uint32_t slot = r && r->pages ? r->pages[(a - r->start) / g] : 0;
            if (!slot) return GM_EINVAL;
            sim_phys *p = slot_at(&d->phys, slot - 1);
            uint64_t off = a - p->mapped_va, k = p->size - off < n - done ? p->size - off : n - done;
            if (pass == 1 && write) {
                if (!p->data && !(p->data = calloc(1, p->size))) return GM_ENOHOSTMEM;
                memcpy(p->data + off, host + done, k);
            } else if (pass == 1) {
                if (p->data) memcpy(host + done, p->data + off, k);
                else memset(host + done, 0, k);
            }
            done += k;
        }
    }
    return GM_OK;
}

static int sim_copy_to_host(void *ctx, int dev, void *dst, gm_devptr src, uint64_t size) {
    SIM_ENTER(ctx, dev)
    rc = sim_copy(s, d, src, dst, size, false);
    SIM_LEAVE()
}

static int sim_copy_to_device(void *ctx, int dev, gm_devptr dst, const void *src, uint64_t size) {
    SIM_ENTER(ctx, dev)
    rc = sim_copy(s, d, dst, (uint8_t *)(uintptr_t)src, size, true);
    SIM_LEAVE()
}

/* All of the copies under one hold of the lock; the first failure stops them. */
static int sim_copy_many(void *ctx, int dev, bool to_device, const gm_backend_copy *v, size_t n) {
    SIM_ENTER(ctx, dev)
    for (size_t i = 0; i < n && rc == GM_OK; i++) rc = sim_copy(s, d, v[i].dev, v[i].host, v[i].size, to_device);
    SIM_LEAVE()
}

/* Host memory: the simulator has no page locking, so malloc (its calls are
 * counted, and faults injected, as HOST_ALLOC by the backend table). */
static int sim_host_alloc(void *ctx, int dev, uint64_t size, void **out) {
    SIM_ENTER(ctx, dev)
    if (!(*out = size == (size_t)size ? malloc(size ? (size_t)size : 1) : NULL)) rc = GM_ENOHOSTMEM;
    SIM_LEAVE()
}

static int sim_host_free(void *ctx, int dev, void *ptr) {
    (void)ctx;
    (void)dev;
    free(ptr);
    return GM_OK;
}

static const gm_backend_ops sim_ops = {
    .version = GM_BACKEND_VERSION,
    .size = sizeof(gm_backend_ops),
    .name = "sim",
    .destroy = sim_destroy,
    .device_count = sim_device_count,
    .mem_info = sim_mem_info,
    .malloc = sim_malloc,
    .free = sim_free,
    .granularity = sim_granularity,
    .va_reserve = sim_va_reserve,
    .va_release = sim_va_release,
    .phys_create = sim_phys_create,
    .phys_release = sim_phys_release,
    .map = sim_map,
    .unmap = sim_unmap,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .event_destroy = sim_event_destroy,
    .copy_to_host = sim_copy_to_host,
    .copy_to_device = sim_copy_to_device,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .copy_many = sim_copy_many,
};

/* ---- public --------------------------------------------------------------- */

/* backend.c: the context and table of a backend object (sim only needs it to
 * reach its own state from gm_sim_complete_events). */

void gm_sim_options_init(gm_sim_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->device_count = 1;
    o->capacity = 141 * GM__GIB;
    o->granularity = 2 * GM__MIB;
    o->events_manual = false;
}

int gm_sim_create(gm_backend **out, const gm_sim_options *opts) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    if (!out) return gm__set_error(GM_EINVAL, "gm_sim_create: out is NULL");
    gm_sim_options o;
    gm_sim_options_init(&o);
    if (opts) {
        size_t n = opts->size && opts->size < sizeof o ? opts->size : sizeof o;
        memcpy(&o, opts, n);
        o.size = sizeof o;
    }
    if (o.device_count < 1 || o.device_count > GM_MAX_DEVICES)
        return gm__set_error(GM_EINVAL, "gm_sim_create: device_count %d not in 1..%d",
                             o.device_count, GM_MAX_DEVICES);
    if (o.granularity == 0 || (o.granularity & (o.granularity - 1)))
        return gm__set_error(GM_EINVAL, "gm_sim_create: granularity %llu is not a power of two",
                             (unsigned long long)o.granularity);
    if (o.capacity == 0)
        return gm__set_error(GM_EINVAL, "gm_sim_create: capacity is 0");
    sim *s = calloc(1, sizeof *s);
    if (!s) return GM_ENOHOSTMEM;
    s->devs = calloc((size_t)o.device_count, sizeof *s->devs);
    if (!s->devs) {
        free(s);
        return GM_ENOHOSTMEM;
    }
    s->opt = o;
    for (int i = 0; i < o.device_count; i++) {
        s->devs[i].phys.elem = sizeof(sim_phys);
        s->devs[i].events.elem = sizeof(sim_event);
    }
    pthread_mutex_init(&s->lock, NULL);
    int rc = gm_backend_create(out, &sim_ops, s);
    if (rc != GM_OK) sim_destroy(s);
    return rc;
}

int gm_sim_complete_events(gm_backend *b, int device, gm_stream stream) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    const gm_backend_ops *ops;
    void *ctx = b ? gm__backend_ctx(b, &ops) : NULL;
    if (!ctx || ops->destroy != sim_destroy)
        return gm__set_error(GM_EINVAL, "gm_sim_complete_events: not a sim backend");
    SIM_ENTER(ctx, device)
    for (size_t i = 0; i < d->events.n; i++) {
        sim_event *e = slot_at(&d->events, i);
        if (e->used && (stream == UINT64_MAX || e->stream == stream)) e->done = true;
    }
    SIM_LEAVE()
}

int gm_sim_call_sizes(gm_backend *b, int device, int kind, uint64_t count[GM_SIM_SIZE_BUCKETS],
                      uint64_t bytes[GM_SIM_SIZE_BUCKETS]) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    const gm_backend_ops *ops;
    void *ctx = b ? gm__backend_ctx(b, &ops) : NULL;
    if (!ctx || ops->destroy != sim_destroy)
        return gm__set_error(GM_EINVAL, "gm_sim_call_sizes: not a sim backend");
    if (kind < 0 || kind >= GM_BCALL_COUNT || !count || !bytes)
        return gm__set_error(GM_EINVAL, "gm_sim_call_sizes: bad kind %d or NULL output", kind);
    SIM_ENTER(ctx, device)
    memcpy(count, d->szn[kind], sizeof d->szn[kind]);
    memcpy(bytes, d->szb[kind], sizeof d->szb[kind]);
    SIM_LEAVE()
}

int gm_sim_live_objects(gm_backend *b, int device, gm_sim_live *out) {
    const gm_backend_ops *ops;
    void *ctx = b ? gm__backend_ctx(b, &ops) : NULL;
    if (!ctx || ops->destroy != sim_destroy)
        return gm__set_error(GM_EINVAL, "gm_sim_live_objects: not a sim backend");
    if (!out || out->size < sizeof *out)
        return gm__set_error(GM_EINVAL, "gm_sim_live_objects: NULL output or size not set");
    SIM_ENTER(ctx, device)
    memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    out->allocations = d->mallocs.n;
    out->reservations = d->reservations.n;
    for (size_t i = 0; i < d->reservations.n; i++) out->mapped_pages += d->reservations.v[i].mapped_pages;
    out->phys = d->nphys;
    out->events = d->nevents;
    out->used_bytes = d->used;
    SIM_LEAVE()
}

int gm_sim_add_address_hint(gm_backend *b, int device, uint64_t size, gm_devptr addr) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    const gm_backend_ops *ops;
    void *ctx = b ? gm__backend_ctx(b, &ops) : NULL;
    if (!ctx || ops->destroy != sim_destroy)
        return gm__set_error(GM_EINVAL, "gm_sim_add_address_hint: not a sim backend");
    if (size == 0 || addr == 0 || addr % SIM_MALLOC_ALIGN || addr + size < addr)
        return gm__set_error(GM_EINVAL, "gm_sim_add_address_hint: bad range 0x%llx+%llu",
                             (unsigned long long)addr, (unsigned long long)size);
    SIM_ENTER(ctx, device)
    if (d->nhints >= UINT32_MAX - 1) rc = GM_ENOHOSTMEM;
    if (rc == GM_OK) rc = grow(&d->hints, d->nhints, &d->caphints, sizeof *d->hints, 64);
    if (rc == GM_OK) rc = grow(&d->lists, d->nlists, &d->caplists, sizeof *d->lists, 64);
    if (rc == GM_OK) rc = gm__idmap_reserve(&d->hint_lists, 64);
    if (rc == GM_OK) {
        size_t j = gm__idmap_find(&d->hint_lists, size);
        if (d->hint_lists.id[j] == GM__IDMAP_EMPTY) {
            gm__idmap_set(&d->hint_lists, j, size, (uint32_t)d->nlists);
            d->lists[d->nlists++] = (hint_list){0, 0};
        }
        hint_list *l = &d->lists[d->hint_lists.id[j]];
        uint32_t k = (uint32_t)d->nhints + 1;
        d->hints[d->nhints++] = (sim_hint){.size = size, .addr = addr, .next = 0};
        if (l->tail) d->hints[l->tail - 1].next = k;
        else l->head = k;
        l->tail = k;
    }
    SIM_LEAVE()
}

int gm_sim_write(gm_backend *b, int device, gm_devptr addr, const void *src, uint64_t n) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    const gm_backend_ops *ops;
    void *ctx = b ? gm__backend_ctx(b, &ops) : NULL;
    if (!ctx || ops->destroy != sim_destroy || (!src && n))
        return gm__set_error(GM_EINVAL, "gm_sim_write: not a sim backend, or NULL source");
    return sim_copy_to_device(ctx, device, addr, src, n);
}

int gm_sim_read(gm_backend *b, int device, gm_devptr addr, void *dst, uint64_t n) {
    gm__clear_error(); /* a call that succeeds leaves no stale detail */
    const gm_backend_ops *ops;
    void *ctx = b ? gm__backend_ctx(b, &ops) : NULL;
    if (!ctx || ops->destroy != sim_destroy || (!dst && n))
        return gm__set_error(GM_EINVAL, "gm_sim_read: not a sim backend, or NULL destination");
    return sim_copy_to_host(ctx, device, dst, addr, n);
}
