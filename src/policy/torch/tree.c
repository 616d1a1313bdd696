/* tree.c — the ordered sets behind the torch policy's pools
 * (torch uses std::set<Block*> ordered by (stream, size, ptr), and by
 * (stream, ptr) for unmapped ranges) and the recycling of block structs.
 *
 * The sets are intrusive treaps: the links live in the block, so inserting
 * and erasing never allocate host memory, and best-fit is one descent.
 * Block structs come from chunks and are recycled through a free list, so
 * steady-state replay makes no host allocation at all. */
#include "tree.h"

#include <stdlib.h>
#include <string.h>

#define TP_CHUNK_BLOCKS 256

void tp_set_init(tp_set *s, int by_addr) {
    s->root = NULL;
    s->count = 0;
    s->by_addr = by_addr;
    s->misuse = 0;
}

/* Is block t ordered before key (stream, size, ptr)? by_addr sets ignore
 * size. Written to compile to flag arithmetic: the descents below pick a
 * child by index instead of branching, since which way a search goes is a
 * coin flip the branch predictor cannot learn. */
static inline int before_key(int by_addr, const tp_block *t, gm_stream stream, uint64_t size,
                             gm_devptr ptr) {
    uint64_t ts = by_addr ? 0 : t->h.size, ks = by_addr ? 0 : size;
    gm_stream tst = t->h.stream;
    /* bitwise, not logical, operators: no branches */
    int same = (tst == stream) & (ts == ks);
    return (tst < stream) | ((tst == stream) & (ts < ks)) | (same & (t->h.ptr < ptr));
}

static inline int before(int by_addr, const tp_block *t, const tp_block *b) {
    return before_key(by_addr, t, b->h.stream, b->h.size, b->h.ptr);
}

/* split t into < key (*l) and >= key (*r); the roots of both get parent
 * `owner` (the node whose child slots l and r are) */
static void split(int by_addr, tp_block *t, const tp_block *key, tp_block *owner, tp_block **l,
                  tp_block **r) {
    tp_block **side[2] = {r, l}; /* index: t < key */
    tp_block *own[2] = {owner, owner};
    while (t) {
        int lt = before(by_addr, t, key);
        *side[lt] = t;
        t->up = own[lt];
        own[lt] = t;
        side[lt] = &t->child[lt];
        t = t->child[lt];
    }
    *side[0] = NULL;
    *side[1] = NULL;
}

/* every key of a < every key of b; the result's root gets parent up */
static tp_block *merge(tp_block *a, tp_block *b, tp_block *up) {
    tp_block *root = NULL, **link = &root;
    while (a && b) {
        if (a->prio > b->prio) {
            *link = a;
            a->up = up;
            up = a;
            link = &a->child[1];
            a = a->child[1];
        } else {
            *link = b;
            b->up = up;
            up = b;
            link = &b->child[0];
            b = b->child[0];
        }
    }
    tp_block *rest = a ? a : b;
    *link = rest;
    if (rest) rest->up = up;
    return root;
}

static uint32_t next_prio(tp_state *st) {
    uint32_t x = st->rng; /* xorshift32 */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    st->rng = x;
    return x;
}

static uint8_t set_kind(const tp_set *s) { return s->by_addr ? TP_SET_UNMAPPED : TP_SET_BLOCKS; }

int tp_set_insert(tp_state *st, tp_set *s, tp_block *b) {
    /* a block still linked in a set would end up twice in a tree: a cycle */
    if (b->in_set != TP_SET_NONE) {
        s->misuse++;
        return GM_ESTATE;
    }
    b->prio = next_prio(st);
    tp_block **link = &s->root, *up = NULL;
    /* descend while the nodes outrank the new one, then split below it */
    while (*link && (*link)->prio >= b->prio) {
        up = *link;
        link = &up->child[before(s->by_addr, up, b)];
    }
    split(s->by_addr, *link, b, b, &b->child[0], &b->child[1]);
    *link = b;
    b->up = up;
    b->in_set = set_kind(s);
    s->count++;
    return GM_OK;
}

/* Is b linked where its key says, relative to its parent and children?
 * Catches a key changed while b is in a set, or b in another set of the
 * same kind, before unlinking it breaks the tree further. */
static int linked_in_order(const tp_set *s, const tp_block *b, tp_block *const *link) {
    if (*link != b) return 0;
    if (b->up && before(s->by_addr, b->up, b) != (b->up->child[1] == b)) return 0;
    if (b->child[0] && !before(s->by_addr, b->child[0], b)) return 0;
    return !b->child[1] || before(s->by_addr, b, b->child[1]);
}

int tp_set_erase(tp_set *s, tp_block *b) {
    tp_block **link = b->up ? &b->up->child[b->up->child[1] == b] : &s->root;
    if (b->in_set != set_kind(s) || !linked_in_order(s, b, link)) {
        s->misuse++;
        return GM_ESTATE;
    }
    /* no search: the parent link leads straight to b's slot */
    *link = merge(b->child[0], b->child[1], b->up);
    b->child[0] = b->child[1] = b->up = NULL;
    b->in_set = TP_SET_NONE;
    s->count--;
    return GM_OK;
}

static tp_block *pred_of(tp_block *b) {
    if (b->child[0]) {
        tp_block *t = b->child[0];
        while (t->child[1]) t = t->child[1];
        return t;
    }
    while (b->up && b->up->child[0] == b) b = b->up;
    return b->up;
}

static tp_block **link_to(tp_set *s, tp_block *b) {
    return b->up ? &b->up->child[b->up->child[1] == b] : &s->root;
}

int tp_set_rekey(tp_state *st, tp_set *s, tp_block *b, int dir) {
    tp_block **link = link_to(s, b);
    if (b->in_set != set_kind(s) || *link != b) {
        s->misuse++;
        return GM_ESTATE;
    }
    /* a key that only went down (up) can only have passed its predecessor
     * (successor): look at that side alone */
    const tp_block *l = dir > 0 ? NULL : pred_of(b), *r = dir < 0 ? NULL : tp_set_next(s, b);
    if ((!l || before(s->by_addr, l, b)) && (!r || before(s->by_addr, b, r))) return GM_OK;
    *link = merge(b->child[0], b->child[1], b->up);
    b->child[0] = b->child[1] = b->up = NULL;
    b->in_set = TP_SET_NONE;
    s->count--;
    return tp_set_insert(st, s, b);
}

int tp_set_replace(tp_state *st, tp_set *s, tp_block *old, tp_block *b) {
    tp_block **link = link_to(s, old);
    if (old->in_set != set_kind(s) || *link != old || b->in_set != TP_SET_NONE) {
        s->misuse++;
        return GM_ESTATE;
    }
    *link = b;
    b->up = old->up;
    b->prio = old->prio;
    for (int i = 0; i < 2; i++) {
        b->child[i] = old->child[i];
        if (b->child[i]) b->child[i]->up = b;
        old->child[i] = NULL;
    }
    old->up = NULL;
    old->in_set = TP_SET_NONE;
    b->in_set = set_kind(s);
    return tp_set_rekey(st, s, b, 1);
}

uint64_t tp_misuse(const tp_state *st) {
    return st->small.blocks.misuse + st->small.unmapped.misuse + st->large.blocks.misuse +
           st->large.unmapped.misuse;
}

tp_block *tp_set_first(const tp_set *s) {
    tp_block *t = s->root;
    if (!t) return NULL;
    while (t->child[0]) t = t->child[0];
    return t;
}

tp_block *tp_set_lower_bound(const tp_set *s, gm_stream stream, uint64_t size, gm_devptr ptr) {
    tp_block *t = s->root, *best = NULL;
    while (t) {
        int lt = before_key(s->by_addr, t, stream, size, ptr);
        best = lt ? best : t;
        t = t->child[lt];
    }
    return best;
}

tp_block *tp_set_below(const tp_set *s, gm_stream stream, uint64_t size, gm_devptr ptr) {
    tp_block *t = s->root, *best = NULL;
    while (t) {
        int lt = before_key(s->by_addr, t, stream, size, ptr);
        best = lt ? t : best;
        t = t->child[lt];
    }
    return best;
}

tp_block *tp_set_next(const tp_set *s, const tp_block *b) {
    (void)s;
    if (b->child[1]) {
        tp_block *t = b->child[1];
        while (t->child[0]) t = t->child[0];
        return t;
    }
    /* up past the ancestors whose right subtree b is in */
    while (b->up && b->up->child[1] == b) b = b->up;
    return b->up;
}

/* ---- block structs ---- */

int tp_reserve(tp_state *st, uint64_t n) {
    while (st->nfree < n) {
        tp_chunk *c = malloc(sizeof(tp_chunk) + TP_CHUNK_BLOCKS * sizeof(tp_block));
        if (!c) return gm__set_error(GM_ENOHOSTMEM, "torch policy: no host memory for block structs");
        c->next = st->chunks;
        st->chunks = c;
        for (int i = TP_CHUNK_BLOCKS - 1; i >= 0; i--) {
            c->blocks[i].tmp_next = st->free_list;
            st->free_list = &c->blocks[i];
        }
        st->nfree += TP_CHUNK_BLOCKS;
    }
    return GM_OK;
}

tp_block *tp_block_new(tp_state *st) {
    if (!st->free_list && tp_reserve(st, 1) < 0) return NULL;
    tp_block *b = st->free_list;
    st->free_list = b->tmp_next;
    st->nfree--;
    memset(b, 0, sizeof(*b));
    return b;
}

void tp_block_put(tp_state *st, tp_block *b) {
    b->tmp_next = st->free_list;
    st->free_list = b;
    st->nfree++;
}

void tp_blocks_destroy(tp_state *st) {
    while (st->chunks) {
        tp_chunk *c = st->chunks;
        st->chunks = c->next;
        free(c);
    }
    st->free_list = NULL;
    st->nfree = 0;
}
