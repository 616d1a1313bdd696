/* policy_torch_tree.c — the ordered sets behind the torch policy's pools
 * (torch uses std::set<Block*> ordered by (stream, size, ptr), and by
 * (stream, ptr) for unmapped ranges) and the recycling of block structs.
 *
 * The sets are intrusive treaps: the links live in the block, so inserting
 * and erasing never allocate host memory, and best-fit is one descent.
 * Block structs come from chunks and are recycled through a free list, so
 * steady-state replay makes no host allocation at all. */
#include "policy_torch.h"

#include <stdlib.h>
#include <string.h>

#define TP_CHUNK_BLOCKS 256

void tp_set_init(tp_set *s, int by_addr) {
    s->root = NULL;
    s->count = 0;
    s->by_addr = by_addr;
}

/* <0, 0, >0 like memcmp: order of block b against key (stream,size,ptr) */
static inline int key_cmp(int by_addr, const tp_block *b, gm_stream stream, uint64_t size,
                          gm_devptr ptr) {
    if (b->h.stream != stream) return b->h.stream < stream ? -1 : 1;
    if (!by_addr && b->h.size != size) return b->h.size < size ? -1 : 1;
    if (b->h.ptr != ptr) return b->h.ptr < ptr ? -1 : 1;
    return 0;
}

static inline int blk_cmp(int by_addr, const tp_block *a, const tp_block *b) {
    return key_cmp(by_addr, a, b->h.stream, b->h.size, b->h.ptr);
}

/* split t into < key (l) and >= key (r) */
static void split(int by_addr, tp_block *t, const tp_block *key, tp_block **l, tp_block **r) {
    while (t) {
        if (blk_cmp(by_addr, t, key) < 0) {
            *l = t;
            l = &t->right;
            t = t->right;
        } else {
            *r = t;
            r = &t->left;
            t = t->left;
        }
    }
    *l = NULL;
    *r = NULL;
}

/* every key of a < every key of b */
static tp_block *merge(tp_block *a, tp_block *b) {
    tp_block *root = NULL, **link = &root;
    while (a && b) {
        if (a->prio > b->prio) {
            *link = a;
            link = &a->right;
            a = a->right;
        } else {
            *link = b;
            link = &b->left;
            b = b->left;
        }
    }
    *link = a ? a : b;
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

void tp_set_insert(tp_state *st, tp_set *s, tp_block *b) {
    b->prio = next_prio(st);
    b->left = b->right = NULL;
    tp_block **link = &s->root;
    /* descend while the nodes outrank the new one, then split below it */
    while (*link && (*link)->prio >= b->prio)
        link = blk_cmp(s->by_addr, b, *link) < 0 ? &(*link)->left : &(*link)->right;
    split(s->by_addr, *link, b, &b->left, &b->right);
    *link = b;
    s->count++;
}

void tp_set_erase(tp_set *s, tp_block *b) {
    tp_block **link = &s->root;
    while (*link != b) {
        if (!*link) return; /* not present: callers check in_set first */
        link = blk_cmp(s->by_addr, b, *link) < 0 ? &(*link)->left : &(*link)->right;
    }
    *link = merge(b->left, b->right);
    b->left = b->right = NULL;
    s->count--;
}

tp_block *tp_set_first(const tp_set *s) {
    tp_block *t = s->root;
    if (!t) return NULL;
    while (t->left) t = t->left;
    return t;
}

tp_block *tp_set_lower_bound(const tp_set *s, gm_stream stream, uint64_t size, gm_devptr ptr) {
    tp_block *t = s->root, *best = NULL;
    while (t) {
        if (key_cmp(s->by_addr, t, stream, size, ptr) >= 0) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best;
}

tp_block *tp_set_below(const tp_set *s, gm_stream stream, uint64_t size, gm_devptr ptr) {
    tp_block *t = s->root, *best = NULL;
    while (t) {
        if (key_cmp(s->by_addr, t, stream, size, ptr) < 0) {
            best = t;
            t = t->right;
        } else {
            t = t->left;
        }
    }
    return best;
}

tp_block *tp_set_next(const tp_set *s, const tp_block *b) {
    if (b->right) {
        tp_block *t = b->right;
        while (t->left) t = t->left;
        return t;
    }
    tp_block *t = s->root, *best = NULL;
    while (t) {
        if (blk_cmp(s->by_addr, t, b) > 0) {
            best = t;
            t = t->left;
        } else {
            t = t->right;
        }
    }
    return best;
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
