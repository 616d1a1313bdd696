/* ptrmap.h — the front end's pointer -> block map (ptrmap.c), one per
 * device; its lookups are inline here: every malloc inserts and every free
 * looks up and removes. */
#ifndef GPUMEM_CORE_PTRMAP_H
#define GPUMEM_CORE_PTRMAP_H

#include "internal.h"

/* ---- pointer map: open addressing, linear probing, backward-shift delete.
 * Keys are block addresses (never 0). It allocates only when it grows, so a
 * steady malloc/free loop never touches the host heap. */
typedef struct gm__pm_entry {
    gm_devptr key; /* 0 = empty */
    gm__block_hdr *block;
} gm__pm_entry;

typedef struct gm__ptrmap {
    gm__pm_entry *slots;
    uint64_t mask; /* capacity - 1 (capacity a power of two) */
    uint64_t count;
    int shift;     /* 64 - log2(capacity) */
} gm__ptrmap;

int gm__ptrmap_init(gm__ptrmap *m);
void gm__ptrmap_free(gm__ptrmap *m);
/* Double the table (gm__ptrmap_reserve's slow path). */
int gm__ptrmap_grow(gm__ptrmap *m);
/* Empty slot i, pulling later entries of its chain back (ptrmap.c). */
void gm__ptrmap_remove_at(gm__ptrmap *m, uint64_t i);

/* The lookups are inline: every malloc inserts and every free looks up and
 * removes. Blocks are >= 512-byte aligned: drop those bits, then Fibonacci
 * hash. */
static inline uint64_t gm__ptrmap_home(const gm__ptrmap *m, gm_devptr key) {
    return ((key >> 9) * 0x9E3779B97F4A7C15ull) >> m->shift;
}

/* The table stays at most 1/PM_LOAD_DIV full: at 1/2, the probe loops'
 * exits mispredicted often enough to cost more than the larger table's
 * cache lines do (bench/RESULTS.md, "the pointer map", has the figures). */
#ifndef PM_LOAD_DIV
#define PM_LOAD_DIV 4
#endif

/* Make room for one more entry (the only call that may allocate). */
static inline int gm__ptrmap_reserve(gm__ptrmap *m) {
    if ((m->count + 1) * PM_LOAD_DIV <= m->mask + 1) return GM_OK;
    return gm__ptrmap_grow(m);
}

/* Insert after gm__ptrmap_reserve succeeded: cannot fail. */
static inline void gm__ptrmap_insert(gm__ptrmap *m, gm__block_hdr *b) {
    uint64_t i = gm__ptrmap_home(m, b->ptr);
    while (m->slots[i].key) i = (i + 1) & m->mask;
    m->slots[i].key = b->ptr;
    m->slots[i].block = b;
    m->count++;
}

/* The slot holding key (never 0), or UINT64_MAX. */
static inline uint64_t gm__ptrmap_slot(const gm__ptrmap *m, gm_devptr key) {
    uint64_t i = gm__ptrmap_home(m, key);
    for (;;) {
        gm_devptr k = m->slots[i].key;
        if (k == key) return i;
        if (!k) return UINT64_MAX;
        i = (i + 1) & m->mask;
    }
}

static inline gm__block_hdr *gm__ptrmap_find(const gm__ptrmap *m, gm_devptr key) {
    if (!key) return NULL;
    uint64_t i = gm__ptrmap_slot(m, key);
    return i == UINT64_MAX ? NULL : m->slots[i].block;
}

#endif /* GPUMEM_CORE_PTRMAP_H */
