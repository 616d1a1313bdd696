/* expandable.c — torch's expandable segments
 * (expandable_segments:True): one segment per stream and pool that is a
 * reserved virtual range, mapped page by page as it grows (pages of 2 MiB
 * for the small pool, 20 MiB for the large one; the range is 9/8 of the
 * device's memory), and whose completely free pages are unmapped when the
 * cache is released. As in torch, each page is its own physical allocation
 * (one phys_create + map per page), expandable segments do not count in the
 * `segment` stat, and reserved_bytes follows what is mapped. */
#include "expandable.h"

#include <stdlib.h>

static int allocatable(const tp_block *b) { return b && !b->allocated; }

static int has_available_address_space(const tp_block *b, uint64_t size) {
    uint64_t bytes = 0;
    while (bytes < size && allocatable(b)) {
        bytes += b->h.size;
        b = b->next;
    }
    return bytes >= size;
}

/* new ExpandableSegment + its one unmapped block */
static tp_block *new_expandable_segment(tp_state *st, gm_stream stream, tp_pool *p, int *err) {
    gm__device *d = st->d;
    uint64_t page = p->is_small ? TP_SMALL_BUFFER : TP_LARGE_BUFFER;
    uint64_t total = d->total_memory;
    uint64_t max_handles = (total + total / 8 + page - 1) / page;
    tp_seg *seg = calloc(1, sizeof(*seg));
    if (!seg) {
        *err = gm__set_error(GM_ENOHOSTMEM, "torch policy: no host memory for a segment");
        return NULL;
    }
    gm_devptr va = 0;
    int rc = gm__be_va_reserve(d, page * max_handles, &va);
    if (rc < 0) {
        free(seg);
        *err = rc;
        return NULL;
    }
    tp_block *b = tp_block_new(st); /* reserved by the caller */
    seg->base = va;
    seg->size = page * max_handles;
    seg->stream = stream;
    seg->pool = p->is_small ? GM_POOL_SMALL : GM_POOL_LARGE;
    seg->expandable = 1;
    seg->page = page;
    seg->max_handles = max_handles;
    seg->head = b;
    tp_seg_link(st, seg);
    b->h.ptr = va;
    b->h.size = seg->size;
    b->h.stream = stream;
    b->h.pool = seg->pool;
    b->seg = seg;
    (void)tp_set_insert(st, &p->unmapped, b); /* fresh: cannot be refused */
    return b;
}

/* find_expandable_block: the lowest address in any of the stream's segments
 * with room for size, counting free and unmapped space. */
static tp_block *find_expandable_block(tp_state *st, gm_stream stream, tp_pool *p, uint64_t size,
                                       int *err) {
    for (tp_block *it = tp_set_lower_bound(&p->unmapped, stream, 0, 0);
         it && it->h.stream == stream; it = tp_set_next(&p->unmapped, it)) {
        tp_block *c = it;
        if (allocatable(c->prev)) c = c->prev;
        if (has_available_address_space(c, size)) return c;
    }
    return new_expandable_segment(st, stream, p, err);
}

static int grow_handles(tp_seg *s, uint64_t n) {
    if (n <= s->cap_handles) return GM_OK;
    uint64_t cap = s->cap_handles ? s->cap_handles : 16;
    while (cap < n) cap *= 2;
    void *h = realloc(s->handles, cap * sizeof(*s->handles));
    if (!h) return gm__set_error(GM_ENOHOSTMEM, "torch policy: no host memory for page handles");
    s->handles = h;
    for (uint64_t i = s->cap_handles; i < cap; i++) s->handles[i].present = 0;
    s->cap_handles = cap;
    return GM_OK;
}

/* Cleanup calls are tried twice: a passing fault must not leak a page. */
static int release_handle(gm__device *d, gm_physmem h) { return gm__be_cleanup_phys_release(d, h); }

static void trim_handles(tp_seg *s) {
    while (s->nhandles && !s->handles[s->nhandles - 1].present) s->nhandles--;
}

/* ExpandableSegment::map: pages covering [ptr, ptr+size). Sets *mapped to
 * the bytes mapped (0 when the device is out of memory). */
static int seg_map(tp_state *st, tp_seg *s, gm_devptr ptr, uint64_t size, uint64_t *mapped) {
    gm__device *d = st->d;
    uint64_t begin = (ptr - s->base) / s->page;
    uint64_t end = (ptr + size - s->base + s->page - 1) / s->page;
    *mapped = 0;
    int rc = grow_handles(s, end);
    if (rc < 0) return rc;
    if (end > s->nhandles) s->nhandles = end;
    uint64_t i;
    for (i = begin; i < end; i++) {
        rc = gm__be_phys_create(d, s->page, &s->handles[i].h);
        if (rc < 0) break;
        s->handles[i].present = 1;
    }
    uint64_t created = i;
    if (rc == GM_OK) {
        for (i = begin; i < end; i++) {
            rc = gm__be_map(d, s->base + i * s->page, s->page, s->handles[i].h);
            if (rc < 0) break;
        }
        for (uint64_t j = begin; rc < 0 && j < i; j++)
            (void)gm__be_cleanup_unmap(d, s->base + j * s->page, s->page);
    }
    if (rc < 0) { /* give back what this call created */
        for (uint64_t j = begin; j < created; j++) {
            (void)release_handle(d, s->handles[j].h);
            s->handles[j].present = 0;
        }
        trim_handles(s);
        return rc == GM_ENOMEM ? GM_OK : rc;
    }
    s->mapped_size += (end - begin) * s->page;
    *mapped = (end - begin) * s->page;
    return GM_OK;
}

/* map_block: 1 mapped, 0 out of memory, <0 error */
static int map_block(tp_state *st, tp_block *to_map, uint64_t size) {
    gm__device *d = st->d;
    tp_pool *p = tp_pool_of(st, to_map->h.pool);
    uint64_t mapped = 0;
    int rc = seg_map(st, to_map->seg, to_map->h.ptr, size, &mapped);
    if (rc < 0) return rc;
    if (mapped == 0) return 0;
    if (tp_set_erase(&p->unmapped, to_map) < 0) return GM_ESTATE; /* pages stay mapped */
    to_map->mapped = 1;
    if (mapped < to_map->h.size) {
        tp_block *rem = tp_block_new(st); /* reserved */
        rem->h.ptr = to_map->h.ptr + mapped;
        rem->h.size = to_map->h.size - mapped;
        rem->h.stream = to_map->h.stream;
        rem->h.pool = to_map->h.pool;
        rem->seg = to_map->seg;
        rem->prev = to_map;
        rem->next = to_map->next;
        if (rem->next) rem->next->prev = rem;
        to_map->next = rem;
        (void)tp_set_insert(st, &p->unmapped, rem);
        to_map->h.size = mapped;
    }
    tp_try_merge_blocks(st, to_map, to_map->prev, p);
    tp_try_merge_blocks(st, to_map, to_map->next, p);
    tp_pool_insert_block(st, p, to_map);
    st->total_allocated_memory += mapped;
    gm__stat_pool_add(d->stats.reserved_bytes, to_map->h.pool, (int64_t)mapped);
    return 1;
}

tp_block *tp_try_allocate_expandable_block(tp_state *st, gm_stream stream, tp_pool *p,
                                           uint64_t size, int *err) {
    *err = GM_OK;
    tp_block *c = find_expandable_block(st, stream, p, size, err);
    if (!c) return NULL;
    int rc;
    if (!c->mapped) {
        rc = map_block(st, c, c->h.size < size ? c->h.size : size);
        if (rc <= 0) {
            *err = rc;
            return NULL;
        }
    }
    while (c->h.size < size) {
        /* free -> unmapped -> ...: map the next range, which merges with c */
        uint64_t remaining = size - c->h.size;
        tp_block *nc = c->next;
        rc = tp_reserve(st, 2);
        if (rc == GM_OK) rc = map_block(st, nc, remaining < nc->h.size ? remaining : nc->h.size);
        if (rc <= 0) {
            *err = rc;
            return NULL;
        }
        c = nc;
    }
    if (tp_set_erase(&p->blocks, c) < 0) {
        *err = GM_ESTATE;
        return NULL;
    }
    return c;
}

/* Unmap pages [begin, end) of s after the stream's work is done (torch
 * synchronizes the stream: unmapping does not wait for the GPU). Returns
 * the number of pages unmapped in *done, which is less than asked only
 * when a backend call failed (the error is returned). */
static int seg_unmap_pages(tp_state *st, tp_seg *s, uint64_t begin, uint64_t end, uint64_t *done) {
    gm__device *d = st->d;
    gm_event ev = 0;
    *done = 0;
    int rc = gm__be_event_record(d, s->stream, &ev);
    if (rc < 0) return rc;
    rc = gm__be_event_sync(d, ev);
    (void)gm__be_cleanup_event_destroy(d, ev);
    if (rc < 0) return rc;
    for (uint64_t i = begin; i < end; i++) {
        rc = gm__be_unmap(d, s->base + i * s->page, s->page);
        if (rc < 0) break;
        rc = gm__be_phys_release(d, s->handles[i].h);
        if (rc < 0) rc = gm__be_phys_release(d, s->handles[i].h);
        if (rc < 0) { /* keep the page: map it back so nothing leaks */
            (void)gm__be_map(d, s->base + i * s->page, s->page, s->handles[i].h);
            break;
        }
        s->handles[i].present = 0;
        (*done)++;
    }
    s->mapped_size -= *done * s->page;
    trim_handles(s);
    return rc;
}

static void splice_free(tp_state *st, tp_pool *p, tp_block *nb, tp_block *before, tp_block *after) {
    nb->prev = before;
    nb->next = after;
    if (before) before->next = nb;
    else nb->seg->head = nb;
    if (after) after->prev = nb;
    tp_pool_insert_block(st, p, nb);
}

/* unmap_block: unmap the whole pages inside free block b; the partial pages
 * at either end stay mapped as free blocks. Needs 2 reserved blocks. */
int tp_unmap_block(tp_state *st, tp_block *b) {
    gm__device *d = st->d;
    tp_seg *s = b->seg;
    tp_pool *p = tp_pool_of(st, b->h.pool);
    uint64_t begin = (b->h.ptr - s->base + s->page - 1) / s->page;
    uint64_t end = (b->h.ptr + b->h.size - s->base) / s->page;
    if (begin >= end) return GM_OK;
    uint64_t done = 0;
    int rc = seg_unmap_pages(st, s, begin, end, &done);
    if (done == 0) return rc;
    gm_devptr ustart = s->base + begin * s->page;
    uint64_t usize = done * s->page;
    if (tp_set_erase(&p->blocks, b) < 0) return GM_ESTATE;
    uint64_t before = ustart - b->h.ptr;
    if (before > 0) {
        tp_block *bf = tp_block_new(st);
        bf->h = b->h;
        bf->h.size = before;
        bf->mapped = 1;
        bf->seg = s;
        splice_free(st, p, bf, b->prev, b);
    }
    uint64_t after = b->h.size - before - usize;
    if (after > 0) {
        tp_block *af = tp_block_new(st);
        af->h = b->h;
        af->h.ptr = ustart + usize;
        af->h.size = after;
        af->mapped = 1;
        af->seg = s;
        splice_free(st, p, af, b, b->next);
    }
    b->h.ptr = ustart;
    b->h.size = usize;
    b->mapped = 0;
    tp_try_merge_blocks(st, b, b->prev, p);
    tp_try_merge_blocks(st, b, b->next, p);
    (void)tp_set_insert(st, &p->unmapped, b);
    st->total_allocated_memory -= usize;
    gm__stat_pool_add(d->stats.reserved_bytes, b->h.pool, -(int64_t)usize);
    return rc;
}

/* The segment is one unmapped block again: give its range back. If the
 * backend refuses (twice), the segment stays as it is, unmapped, and the
 * error goes to the caller (empty_cache); a later empty_cache tries again. */
int tp_release_expandable_segment(tp_state *st, tp_block *b) {
    tp_seg *s = b->seg;
    tp_pool *p = tp_pool_of(st, b->h.pool);
    int rc = gm__be_va_release(st->d, s->base, s->size);
    if (rc < 0) rc = gm__be_va_release(st->d, s->base, s->size);
    if (rc < 0) return rc;
    if (tp_set_erase(&p->unmapped, b) < 0) return GM_ESTATE; /* corrupt */
    tp_seg_unlink(st, s);
    free(s->handles);
    free(s);
    tp_block_put(st, b);
    return GM_OK;
}

void tp_expandable_destroy(tp_state *st, tp_seg *s) {
    for (uint64_t i = 0; i < s->nhandles; i++) {
        if (!s->handles[i].present) continue;
        (void)gm__be_cleanup_unmap(st->d, s->base + i * s->page, s->page);
        (void)release_handle(st->d, s->handles[i].h);
        s->handles[i].present = 0;
    }
    (void)gm__be_cleanup_va_release(st->d, s->base, s->size);
}
