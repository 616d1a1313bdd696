/* idmap.c — the 64-bit key -> 32-bit id table of idmap.h, shared by the
 * replay compiler (address -> slot) and the trace builder (hash -> id). */
#include "idmap.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>

int gm__idmap_reserve(gm__idmap *m, size_t first_cap) {
    if (m->cap && m->count * 2 < m->cap) return GM_OK;
    gm__idmap n = {NULL, NULL, m->cap ? m->cap * 2 : first_cap, m->count};
    n.key = malloc(n.cap * sizeof *n.key);
    n.id = malloc(n.cap * sizeof *n.id);
    if (!n.key || !n.id) {
        gm__idmap_free(&n);
        return GM_ENOHOSTMEM;
    }
    memset(n.id, 0xFF, n.cap * sizeof *n.id);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->id[i] == GM__IDMAP_EMPTY) continue;
        size_t j = gm__idmap_home(&n, m->key[i]);
        while (n.id[j] != GM__IDMAP_EMPTY) j = gm__idmap_next(&n, j);
        n.key[j] = m->key[i];
        n.id[j] = m->id[i];
    }
    gm__idmap_free(m);
    *m = n;
    return GM_OK;
}

void gm__idmap_set(gm__idmap *m, size_t j, uint64_t k, uint32_t id) {
    m->key[j] = k;
    m->id[j] = id;
    m->count++;
}

size_t gm__idmap_find(const gm__idmap *m, uint64_t k) {
    size_t j = gm__idmap_home(m, k);
    while (m->id[j] != GM__IDMAP_EMPTY && m->key[j] != k) j = gm__idmap_next(m, j);
    return j;
}

void gm__idmap_del(gm__idmap *m, size_t j) {
    size_t mask = m->cap - 1;
    for (size_t i = (j + 1) & mask; m->id[i] != GM__IDMAP_EMPTY; i = (i + 1) & mask) {
        size_t h = gm__idmap_home(m, m->key[i]);
        /* move i into the hole j if its home is not in (j, i] */
        if (((i - h) & mask) >= ((i - j) & mask)) {
            m->key[j] = m->key[i];
            m->id[j] = m->id[i];
            j = i;
        }
    }
    m->id[j] = GM__IDMAP_EMPTY;
    m->count--;
}

void gm__idmap_free(gm__idmap *m) {
    free(m->key);
    free(m->id);
    m->key = NULL;
    m->id = NULL;
    m->cap = m->count = 0;
}
