/* idmap.c — the 64-bit key -> 32-bit id table of idmap.h, shared by the
 * replay compiler (address -> slot) and the trace builder (hash -> id). */
#include "util/idmap.h"

#include "gpumem/gpumem.h"
#include "util/util.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---- keyed hash: SipHash-1-3 (Aumasson & Bernstein), random key ----------- */

_Thread_local uint64_t gm__work_steps;

static uint64_t g_k0, g_k1;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

static void init_key(void) {
    uint64_t k[2] = {0, 0};
    if (getrandom(k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) {
        /* no entropy pool yet (early boot): time, pid and an address */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        k[0] = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
        k[1] = (uint64_t)(uintptr_t)&ts ^ ((uint64_t)ts.tv_sec << 32);
    }
    g_k0 = k[0];
    g_k1 = k[1];
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

typedef struct sip {
    uint64_t v0, v1, v2, v3;
} sip;

static inline void sip_round(sip *s) {
    s->v0 += s->v1; s->v1 = ROTL(s->v1, 13); s->v1 ^= s->v0; s->v0 = ROTL(s->v0, 32);
    s->v2 += s->v3; s->v3 = ROTL(s->v3, 16); s->v3 ^= s->v2;
    s->v0 += s->v3; s->v3 = ROTL(s->v3, 21); s->v3 ^= s->v0;
    s->v2 += s->v1; s->v1 = ROTL(s->v1, 17); s->v1 ^= s->v2; s->v2 = ROTL(s->v2, 32);
}

static inline sip sip_start(void) {
    pthread_once(&g_key_once, init_key);
    return (sip){g_k0 ^ 0x736f6d6570736575ull, g_k1 ^ 0x646f72616e646f6dull, g_k0 ^ 0x6c7967656e657261ull,
                 g_k1 ^ 0x7465646279746573ull};
}

static inline void sip_block(sip *s, uint64_t m) {
    s->v3 ^= m;
    sip_round(s);
    s->v0 ^= m;
}

/* the last block (the length in its top byte), then the finalization */
static inline uint64_t sip_end(sip *s, uint64_t last) {
    sip_block(s, last);
    s->v2 ^= 0xff;
    sip_round(s);
    sip_round(s);
    sip_round(s);
    return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

uint64_t gm__hash_bytes(const void *p, size_t n) {
    sip s = sip_start();
    const uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t m;
        memcpy(&m, b + i, 8); /* little-endian hosts only: the key is random anyway */
        sip_block(&s, m);
    }
    uint64_t last = (uint64_t)n << 56;
    for (size_t k = 0; i + k < n; k++) last |= (uint64_t)b[i + k] << (8 * k);
    return sip_end(&s, last);
}

/* gm__hash_bytes(&k, 8) without its loops (every address a replay or a
 * report pairs is hashed twice) */
uint64_t gm__hash_u64(uint64_t k) {
    sip s = sip_start();
    sip_block(&s, k);
    return sip_end(&s, (uint64_t)8 << 56);
}

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
    gm__work_steps++;
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
