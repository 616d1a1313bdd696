/* idmap.h — a table from 64-bit keys to 32-bit ids,
 * open addressing with linear probing, at most half full. replay.c maps
 * device addresses to replay slots (one entry a key, deleted on free);
 * trace_build.c maps content hashes to interned ids (keys may repeat there,
 * so it compares content itself while probing).
 *
 * Keys come from files: a fixed hash would let a trace steer every key to
 * one probe chain (crafted addresses made compiling quadratic). So the home
 * slot is SipHash-1-3 of the key under a random per-process key
 * (gm__hash_bytes is the same function for interned contents): without the
 * key no input can aim at a chain, and output never depends on it (ids
 * are assigned in insertion order, never in table order). */
#ifndef GPUMEM_UTIL_IDMAP_H
#define GPUMEM_UTIL_IDMAP_H

#include <stddef.h>
#include <stdint.h>

#define GM__IDMAP_EMPTY UINT32_MAX /* an id slot never holds this */

typedef struct gm__idmap {
    uint64_t *key;
    uint32_t *id;      /* GM__IDMAP_EMPTY = empty slot */
    size_t cap, count; /* cap a power of two (0 before the first reserve) */
} gm__idmap;

/* SipHash-1-3 of n bytes under the process's random key. Every table fed
 * by a file hashes with it (this table, the pickle reader's string intern
 * table, report's scope table): one keyed hash, never a plain one. */
uint64_t gm__hash_bytes(const void *p, size_t n);
uint64_t gm__hash_u64(uint64_t k);

/* Work done on input, per thread: one step per probe of a table fed by a
 * file and per dict entry a reader scans. The readers bound it by the input
 * they consumed (snapshot.c); tests/stress/test_work.c checks steps per input byte
 * on crafted inputs, so no test depends on timing. */
extern _Thread_local uint64_t gm__work_steps;

/* Where probing for key k starts. */
static inline size_t gm__idmap_home(const gm__idmap *m, uint64_t k) {
    return (size_t)gm__hash_u64(k) & (m->cap - 1);
}
static inline size_t gm__idmap_next(const gm__idmap *m, size_t j) {
    gm__work_steps++;
    return (j + 1) & (m->cap - 1);
}

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

#endif /* GPUMEM_UTIL_IDMAP_H */
