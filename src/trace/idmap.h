/* idmap.h — private to src/trace: a table from 64-bit keys to 32-bit ids,
 * open addressing with linear probing, at most half full. replay.c maps
 * device addresses to replay slots (one entry a key, deleted on free);
 * trace_build.c maps content hashes to interned ids (keys may repeat there,
 * so it compares content itself while probing). */
#ifndef GPUMEM_TRACE_IDMAP_H
#define GPUMEM_TRACE_IDMAP_H

#include <stddef.h>
#include <stdint.h>

#define GM__IDMAP_EMPTY UINT32_MAX /* an id slot never holds this */

typedef struct gm__idmap {
    uint64_t *key;
    uint32_t *id;      /* GM__IDMAP_EMPTY = empty slot */
    size_t cap, count; /* cap a power of two (0 before the first reserve) */
} gm__idmap;

/* Where probing for key k starts. Keys are mixed first: addresses are
 * aligned and close together, so their low bits alone would cluster. */
static inline size_t gm__idmap_home(const gm__idmap *m, uint64_t k) {
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
}
static inline size_t gm__idmap_next(const gm__idmap *m, size_t j) { return (j + 1) & (m->cap - 1); }

/* Room for one more entry: doubles the table when it is half full (the
 * first call allocates `first_cap` slots, a power of two). GM_ENOHOSTMEM
 * leaves the table as it was. */
int gm__idmap_reserve(gm__idmap *m, size_t first_cap);
/* Fill slot j, which probing found empty. */
void gm__idmap_set(gm__idmap *m, size_t j, uint64_t k, uint32_t id);
/* The slot holding key k, or the empty slot where it would go. */
size_t gm__idmap_find(const gm__idmap *m, uint64_t k);
/* Empty slot j, moving later entries back so every probe still finds them. */
void gm__idmap_del(gm__idmap *m, size_t j);
void gm__idmap_free(gm__idmap *m);

#endif /* GPUMEM_TRACE_IDMAP_H */
