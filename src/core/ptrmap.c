/* ptrmap.c — the front end's pointer -> block map, one per device, guarded by
 * the device lock. gm_free gets only a pointer, so this lookup is on the hot
 * path of every free: open addressing with linear probing keeps it to one or
 * two cache lines, and backward-shift deletion keeps probe chains short
 * without tombstones. The lookups themselves are inline in frontend.h. */
#include "ptrmap.h"

#include <stdlib.h>

#define PM_INITIAL_BITS 10

static int pm_alloc(gm__ptrmap *m, int bits) {
    m->slots = calloc((size_t)1 << bits, sizeof *m->slots);
    if (!m->slots) return GM_ENOHOSTMEM;
    m->mask = ((uint64_t)1 << bits) - 1;
    m->shift = 64 - bits;
    m->count = 0;
    return GM_OK;
}

int gm__ptrmap_init(gm__ptrmap *m) { return pm_alloc(m, PM_INITIAL_BITS); }

void gm__ptrmap_free(gm__ptrmap *m) {
    free(m->slots);
    m->slots = NULL;
    m->count = 0;
}

int gm__ptrmap_grow(gm__ptrmap *m) {
    gm__ptrmap old = *m;
    if (pm_alloc(m, 64 - old.shift + 1) != GM_OK) {
        *m = old;
        return GM_ENOHOSTMEM;
    }
    for (uint64_t i = 0; i <= old.mask; i++)
        if (old.slots[i].key) gm__ptrmap_insert(m, old.slots[i].block);
    free(old.slots);
    return GM_OK;
}

void gm__ptrmap_remove_at(gm__ptrmap *m, uint64_t i) {
    /* backward shift: pull later entries of the chain into the hole when
     * their home slot is not between the hole and their position */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        uint64_t home = gm__ptrmap_home(m, m->slots[j].key);
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->slots[hole].block = NULL;
    m->count--;
}
