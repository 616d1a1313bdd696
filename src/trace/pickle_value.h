/* pickle_value.h — private to the pickle reader (pickle.c builds values,
 * pickle_value.c reads them): how a gm__pval is stored. The low 3 bits tag
 * it: 0 a pointer to a pobj (0 itself = absent), 1 a small int shifted left
 * by 3, 2 None/False/True; everything else lives in a pobj in the arena. */
#ifndef GPUMEM_PICKLE_VALUE_H
#define GPUMEM_PICKLE_VALUE_H

#include "pickle.h"

#include <stdbool.h>
#include <stdint.h>

#define PV_TAG(v) ((v) & 7u)
#define TAG_PTR 0u
#define TAG_INT 1u
#define TAG_SPECIAL 2u
#define TAG_CONV 3u /* a container released after its client converted it: the client's tag << 3 */
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

/* Containers (list, tuple, dict, set) carry more: what streaming needs to
 * release one safely (pickle.c, "streaming"). o.hash counts the container
 * references to it (saturating at UINT32_MAX: never released). */
typedef struct pcont {
    pobj o;
    uint64_t seq;  /* creation order */
    uint64_t tag;  /* the client's (gm__pv_set_tag), 0: none */
    uint64_t memo; /* 1 + the memo index that holds it, 0: none, UINT64_MAX: more than one */
    uint32_t flags;
    uint32_t pad;
} pcont;
/* PC_HOLDS: some item is a container (releasing this one looks at its items) */
enum { PC_CHECKED = 1, PC_STREAMED = 2, PC_QUEUED = 4, PC_HOLDS = 8 };

#define PV_CONT_TYPES ((1u << GM__PT_LIST) | (1u << GM__PT_TUPLE) | (1u << GM__PT_DICT) | (1u << GM__PT_SET))
static inline bool pv_is_cont(gm__ptype t) { return (unsigned)t < 32 && ((1u << t) & PV_CONT_TYPES); }

static inline pobj *PO(gm__pval v) { return (pobj *)(uintptr_t)v; }
static inline pcont *PC(gm__pval v) { return (pcont *)(uintptr_t)v; }

/* gm__pv_type, inline for the reader's own loops */
static inline gm__ptype pv_type(gm__pval v) {
    switch (PV_TAG(v)) {
    case TAG_PTR: return v ? (gm__ptype)PO(v)->type : GM__PT_ABSENT;
    case TAG_INT: return GM__PT_INT;
    case TAG_SPECIAL: return v == PV_NONE ? GM__PT_NONE : GM__PT_BOOL;
    case TAG_CONV: return GM__PT_CONVERTED;
    }
    return GM__PT_ABSENT;
}

/* pv_is_cont(pv_type(v)), without the switch: the reader asks it of every
 * item it stores or releases */
static inline bool pv_cont(gm__pval v) { return PV_TAG(v) == TAG_PTR && v && pv_is_cont((gm__ptype)PO(v)->type); }

static inline gm__pval PV(pobj *o) { return (gm__pval)(uintptr_t)o; }

#endif /* GPUMEM_PICKLE_VALUE_H */
