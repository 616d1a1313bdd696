/* check.c — the torch policy's self-check and segment walk.
 *
 * tp_check recounts every stat the policy keeps from the block lists and
 * compares it with the device's stats, and verifies the structure: the
 * blocks of a segment tile it exactly and link both ways, no two free
 * neighbours are left unmerged, every free block is in its pool set and no
 * other block is, the sets are well-formed treaps (walked directly, bounded
 * by their counts, so a cycle is reported instead of looped round: every
 * block reached once, in key order, heap-ordered priorities, only free
 * blocks of the right pool and kind), no set operation was ever refused,
 * and expandable segments map exactly the pages their mapped blocks touch. */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct tp_count {
    int64_t segment[GM_POOL_COUNT], reserved[GM_POOL_COUNT];
    int64_t active[GM_POOL_COUNT], active_bytes[GM_POOL_COUNT];
    int64_t isplit[GM_POOL_COUNT], isplit_bytes[GM_POOL_COUNT];
    int64_t oversize_segments;
    uint64_t in_blocks[GM_POOL_COUNT], in_unmapped[GM_POOL_COUNT];
} tp_count;

static void add(int64_t arr[GM_POOL_COUNT], int pool, int64_t v) {
    arr[GM_POOL_ALL] += v;
    arr[pool] += v;
}

static int page_present(const tp_seg *s, uint64_t i) {
    return i < s->nhandles && s->handles[i].present;
}

/* expandable: unmapped blocks are whole absent pages, mapped ones sit on
 * present pages */
static int check_pages(const tp_seg *s, const tp_block *b, char *err, size_t errlen) {
    uint64_t off = b->h.ptr - s->base;
    if (!b->mapped) {
        if (off % s->page || b->h.size % s->page)
            return gm__check_fail(err, errlen, "unmapped block 0x%llx is not page aligned",
                        (unsigned long long)b->h.ptr);
        for (uint64_t i = off / s->page; i < (off + b->h.size) / s->page; i++)
            if (page_present(s, i))
                return gm__check_fail(err, errlen, "unmapped block 0x%llx covers a mapped page",
                            (unsigned long long)b->h.ptr);
        return GM_OK;
    }
    for (uint64_t i = off / s->page; i < (off + b->h.size + s->page - 1) / s->page; i++)
        if (!page_present(s, i))
            return gm__check_fail(err, errlen, "mapped block 0x%llx covers an unmapped page",
                        (unsigned long long)b->h.ptr);
    return GM_OK;
}

static int check_block(const tp_state *st, const tp_seg *s, const tp_block *b, tp_count *c,
                       char *err, size_t errlen) {
    int pool = s->pool;
    if (b->seg != s || b->h.pool != s->pool || b->h.stream != s->stream)
        return gm__check_fail(err, errlen, "block 0x%llx disagrees with its segment 0x%llx",
                    (unsigned long long)b->h.ptr, (unsigned long long)s->base);
    if (b->h.size == 0) return gm__check_fail(err, errlen, "empty block at 0x%llx", (unsigned long long)b->h.ptr);
    if (b->next && b->next->prev != b)
        return gm__check_fail(err, errlen, "broken links after block 0x%llx", (unsigned long long)b->h.ptr);
    if (b->next && b->next->h.ptr != b->h.ptr + b->h.size)
        return gm__check_fail(err, errlen, "blocks 0x%llx and 0x%llx do not tile their segment",
                    (unsigned long long)b->h.ptr, (unsigned long long)b->next->h.ptr);
    if (!s->expandable && !b->mapped)
        return gm__check_fail(err, errlen, "unmapped block in a plain segment");
    if (s->expandable && check_pages(s, b, err, errlen)) return GM_ESTATE;
    if (b->allocated) {
        if (b->in_set != TP_SET_NONE)
            return gm__check_fail(err, errlen, "block 0x%llx in use but in a free pool",
                        (unsigned long long)b->h.ptr);
        add(c->active, pool, 1);
        add(c->active_bytes, pool, (int64_t)b->h.size);
        return GM_OK;
    }
    if (b->next && !b->next->allocated && b->next->mapped == b->mapped)
        return gm__check_fail(err, errlen, "free neighbours 0x%llx and 0x%llx are not merged",
                    (unsigned long long)b->h.ptr, (unsigned long long)b->next->h.ptr);
    if (b->in_set != (b->mapped ? TP_SET_BLOCKS : TP_SET_UNMAPPED))
        return gm__check_fail(err, errlen, "free block 0x%llx is not in its pool set",
                    (unsigned long long)b->h.ptr);
    if (b->mapped) c->in_blocks[pool]++;
    else c->in_unmapped[pool]++;
    if (b->mapped && !s->expandable && tp_is_split(b)) {
        add(c->isplit, pool, 1);
        add(c->isplit_bytes, pool, (int64_t)b->h.size);
    }
    (void)st;
    return GM_OK;
}

static int check_segment(const tp_state *st, const tp_seg *s, tp_count *c, char *err,
                         size_t errlen) {
    const tp_block *b = s->head;
    if (!b || b->prev || b->h.ptr != s->base)
        return gm__check_fail(err, errlen, "segment 0x%llx does not start with its head block",
                    (unsigned long long)s->base);
    const tp_block *last = b;
    for (; b; b = b->next) {
        if (check_block(st, s, b, c, err, errlen)) return GM_ESTATE;
        last = b;
    }
    if (last->h.ptr + last->h.size != s->base + s->size)
        return gm__check_fail(err, errlen, "blocks of segment 0x%llx do not cover it",
                    (unsigned long long)s->base);
    if (s->expandable) {
        uint64_t present = 0;
        for (uint64_t i = 0; i < s->nhandles; i++) present += s->handles[i].present != 0;
        if (present * s->page != s->mapped_size)
            return gm__check_fail(err, errlen, "expandable segment 0x%llx: mapped size is off",
                        (unsigned long long)s->base);
        add(c->reserved, s->pool, (int64_t)s->mapped_size);
    } else {
        add(c->segment, s->pool, 1);
        add(c->reserved, s->pool, (int64_t)s->size);
        if (s->size >= st->cfg->max_split_size) c->oversize_segments++;
    }
    return GM_OK;
}

/* Is a strictly before b in the set's order? */
static int ordered(const tp_set *set, const tp_block *a, const tp_block *b) {
    if (a->h.stream != b->h.stream) return a->h.stream < b->h.stream;
    if (!set->by_addr && a->h.size != b->h.size) return a->h.size < b->h.size;
    return a->h.ptr < b->h.ptr;
}

static int check_node(const tp_set *set, int pool, const tp_block *t, const char *what, char *err,
                      size_t errlen) {
    uint8_t kind = set->by_addr ? TP_SET_UNMAPPED : TP_SET_BLOCKS;
    if (t->in_set != kind || t->allocated || t->mapped != !set->by_addr || t->h.pool != pool)
        return gm__check_fail(err, errlen, "%s set holds block 0x%llx that does not belong there (in_set %d, "
                    "allocated %d, mapped %d, pool %d)", what, (unsigned long long)t->h.ptr,
                    t->in_set, t->allocated, t->mapped, t->h.pool);
    for (int i = 0; i < 2; i++) {
        if (t->child[i] && t->child[i]->prio > t->prio)
            return gm__check_fail(err, errlen, "%s set: treap priorities out of order below 0x%llx", what,
                        (unsigned long long)t->h.ptr);
        if (t->child[i] && t->child[i]->up != t)
            return gm__check_fail(err, errlen, "%s set: child of 0x%llx does not link back to it", what,
                        (unsigned long long)t->h.ptr);
    }
    if (t == set->root && t->up)
        return gm__check_fail(err, errlen, "%s set: the root 0x%llx has a parent", what,
                    (unsigned long long)t->h.ptr);
    return GM_OK;
}

/* Walk the treap itself (not through tp_set_next, which a broken tree can
 * send round a cycle): in order, every node reached once, no deeper and no
 * more nodes than the count, keys strictly increasing, heap order of the
 * priorities; and the count equals the free blocks the segments have. */
static int check_set(const tp_set *set, int pool, uint64_t expect, const char *what, char *err,
                     size_t errlen) {
    if (set->misuse)
        return gm__check_fail(err, errlen, "%s set refused %llu operations (insert of a block already in a "
                    "set, or erase of one not in it)", what, (unsigned long long)set->misuse);
    uint64_t cap = set->count + 1, depth = 0, n = 0;
    const tp_block **stack = malloc(cap * sizeof *stack);
    if (!stack) return gm__set_error(GM_ENOHOSTMEM, "torch policy check: no host memory");
    const tp_block *t = set->root, *prev = NULL;
    int rc = GM_OK;
    while (rc == GM_OK && (t || depth)) {
        for (; t && rc == GM_OK; t = t->child[0]) {
            if (depth == cap)
                rc = gm__check_fail(err, errlen, "%s set is deeper than its %llu blocks: a cycle", what,
                          (unsigned long long)set->count);
            else if ((rc = check_node(set, pool, t, what, err, errlen)) == GM_OK)
                stack[depth++] = t;
        }
        if (rc != GM_OK) break;
        t = stack[--depth];
        if (++n > set->count)
            rc = gm__check_fail(err, errlen, "%s set reaches more blocks than its count %llu (a block "
                      "linked twice?)", what, (unsigned long long)set->count);
        else if (prev && !ordered(set, prev, t))
            rc = gm__check_fail(err, errlen, "%s set out of order at 0x%llx", what,
                      (unsigned long long)t->h.ptr);
        prev = t;
        t = t->child[1];
    }
    free(stack);
    if (rc == GM_OK && (n != set->count || n != expect))
        rc = gm__check_fail(err, errlen, "%s set holds %llu blocks (count %llu), segments have %llu", what,
                  (unsigned long long)n, (unsigned long long)set->count,
                  (unsigned long long)expect);
    return rc;
}

static int compare(const char *name, const gm_stat arr[GM_POOL_COUNT],
                   const int64_t want[GM_POOL_COUNT], char *err, size_t errlen) {
    static const char *pools[] = GM_POOL_NAMES;
    for (int i = 0; i < GM_POOL_COUNT; i++)
        if (arr[i].current != want[i])
            return gm__check_fail(err, errlen, "stat %s.%s.current is %lld, block lists say %lld", name,
                        pools[i], (long long)arr[i].current, (long long)want[i]);
    return GM_OK;
}

int tp_check(void *state, char *err, size_t errlen) {
    const tp_state *st = state;
    const gm_stats *s = &st->d->stats;
    tp_count c = {0};
    if (tp_misuse(st))
        return gm__check_fail(err, errlen, "torch policy refused %llu pool set operations (a block inserted "
                    "while in a set, or erased from a set it is not in)",
                    (unsigned long long)tp_misuse(st));
    for (const tp_seg *seg = st->segs; seg; seg = seg->next_seg)
        if (check_segment(st, seg, &c, err, errlen)) return GM_ESTATE;
    int rc;
    if ((rc = check_set(&st->small.blocks, GM_POOL_SMALL, c.in_blocks[GM_POOL_SMALL], "small pool",
                        err, errlen)) ||
        (rc = check_set(&st->large.blocks, GM_POOL_LARGE, c.in_blocks[GM_POOL_LARGE], "large pool",
                        err, errlen)) ||
        (rc = check_set(&st->small.unmapped, GM_POOL_SMALL, c.in_unmapped[GM_POOL_SMALL],
                        "small unmapped", err, errlen)) ||
        (rc = check_set(&st->large.unmapped, GM_POOL_LARGE, c.in_unmapped[GM_POOL_LARGE],
                        "large unmapped", err, errlen)))
        return rc;
    if (compare("segment", s->segment, c.segment, err, errlen) ||
        compare("reserved_bytes", s->reserved_bytes, c.reserved, err, errlen) ||
        compare("active", s->active, c.active, err, errlen) ||
        compare("active_bytes", s->active_bytes, c.active_bytes, err, errlen) ||
        compare("inactive_split", s->inactive_split, c.isplit, err, errlen) ||
        compare("inactive_split_bytes", s->inactive_split_bytes, c.isplit_bytes, err, errlen))
        return GM_ESTATE;
    if (s->oversize_segments.current != c.oversize_segments)
        return gm__check_fail(err, errlen, "stat oversize_segments.current is %lld, block lists say %lld",
                    (long long)s->oversize_segments.current, (long long)c.oversize_segments);
    if ((int64_t)st->total_allocated_memory != c.reserved[GM_POOL_ALL])
        return gm__check_fail(err, errlen, "total_allocated_memory %llu != reserved %lld",
                    (unsigned long long)st->total_allocated_memory,
                    (long long)c.reserved[GM_POOL_ALL]);
    return GM_OK;
}

/* One segment per plain allocation; expandable segments report each
 * contiguous mapped range, as torch's snapshot does. */
int tp_walk_segments(void *state, gm__segment_cb cb, void *arg) {
    const tp_state *st = state;
    for (const tp_seg *s = st->segs; s; s = s->next_seg) {
        gm_segment_info info = {.size_of = sizeof(info), .stream = s->stream, .pool = s->pool,
                                .expandable = s->expandable != 0};
        const tp_block *b = s->head;
        while (b) {
            while (b && !b->mapped) b = b->next;
            if (!b) break;
            info.address = b->h.ptr;
            info.total_size = info.allocated_size = 0;
            for (; b && b->mapped; b = b->next) {
                info.total_size += b->h.size;
                if (b->h.live) info.allocated_size += b->h.size;
            }
            info.mapped_size = info.total_size;
            int rc = cb(&info, arg);
            if (rc) return rc;
        }
    }
    return GM_OK;
}
