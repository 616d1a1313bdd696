/* pickle_value.h — private to the pickle reader (pickle.c builds values,
 * pickle_value.c reads them): how a gm__pval is stored. The low 3 bits tag
 * it: 0 a pointer to a pobj (0 itself = absent), 1 a small int shifted left
 * by 3, 2 None/False/True; everything else lives in a pobj in the arena. */
#ifndef GPUMEM_PICKLE_VALUE_H
#define GPUMEM_PICKLE_VALUE_H

#include "pickle.h"

#include <stdint.h>

#define PV_TAG(v) ((v) & 7u)
#define TAG_PTR 0u
#define TAG_INT 1u
#define TAG_SPECIAL 2u
#define PV_NONE ((gm__pval)0x02)
#define PV_FALSE ((gm__pval)0x0A)
#define PV_TRUE ((gm__pval)0x12)
#define SMALL_MIN (-((int64_t)1 << 60))
#define SMALL_MAX (((int64_t)1 << 60) - 1)

typedef struct pobj {
    uint32_t type;
    uint32_t hash; /* interned strings */
    uint64_t len;  /* str/bytes: bytes; list/tuple/set: items; dict: pairs */
    uint64_t cap;
    union {
        int64_t i;
        double f;
        char *s;
        gm__pval *items;
        const char *name;
    } u;
} pobj;

static inline pobj *PO(gm__pval v) { return (pobj *)(uintptr_t)v; }
static inline gm__pval PV(pobj *o) { return (gm__pval)(uintptr_t)o; }

#endif /* GPUMEM_PICKLE_VALUE_H */
