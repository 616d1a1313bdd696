/* history.h — the allocation history ring (history.c), as the allocator front
 * end and the backend wrapper feed it, and as the dump (src/report/
 * history_dump.c) reads it. Actions are gm_trace_action values (action.h);
 * GM__HIST_TAG marks a gm_history_tag. */
#ifndef GPUMEM_CORE_HISTORY_H
#define GPUMEM_CORE_HISTORY_H

#include "gpumem/gpumem.h"
#include "action.h"

#include <stdint.h>

#define GM__HIST_TAG 15
#define GM__HIST_NO_CAT 0xff

typedef struct gm__hist_entry {
    uint64_t tick; /* gm__hist_tick() */
    uint64_t addr, size, stream;
    uint32_t scope;   /* scope node, 0 = none (gm__hist_scope_*) */
    uint8_t action;   /* gm_trace_action or GM__HIST_TAG */
    uint8_t device;
    uint8_t category; /* GM__HIST_TAG: the category */
} gm__hist_entry;

extern int gm__history_on; /* read relaxed on every allocator operation */

void gm__history_record(int device, int action, uint64_t addr, uint64_t size, uint64_t stream);
/* A free: free_requested, and free_completed too when `completed`. */
void gm__history_record_free(int device, uint64_t addr, uint64_t size, uint64_t stream, int completed);
/* After an OOM (no lock held): records it and dumps if asked to. */
void gm__history_oom(int device, uint64_t size, uint64_t stream);
/* gm_history_dump_on_oom's work (src/report/history_dump.c): after an OOM,
 * dump(path, format) (NULL path: stop). A copy of path is kept. */
int gm__history_set_oom_dump(int (*dump)(const char *path, int format), const char *path, int format);

/* The hooks: one predictable branch when the history is off. */
static inline void gm__history_note(int device, int action, uint64_t addr, uint64_t size, uint64_t stream) {
    if (__builtin_expect(__atomic_load_n(&gm__history_on, __ATOMIC_RELAXED), 0))
        gm__history_record(device, action, addr, size, stream);
}
static inline void gm__history_note_free(int device, uint64_t addr, uint64_t size, uint64_t stream,
                                         int completed) {
    if (__builtin_expect(__atomic_load_n(&gm__history_on, __ATOMIC_RELAXED), 0))
        gm__history_record_free(device, addr, size, stream, completed);
}

/* The segment observer (gm_set_segment_observer): NULL, or the pair in
 * effect. Pairs are never freed (an observer may be running when another is
 * set), so one load gives a matching cb and arg. */
typedef struct gm__seg_observer {
    gm_segment_observer cb;
    void *arg;
    struct gm__seg_observer *older; /* the one set before: kept, never freed */
} gm__seg_observer;
extern gm__seg_observer *gm__seg_observer_now; /* read relaxed on every device segment call */

/* A segment call succeeded (the backend wrapper, under the device lock):
 * into the history ring, and to the observer. `event` is a GM_SEGMENT_*;
 * the ring's action is the trace action of the same name (both follow
 * torch's order). */
_Static_assert(GM_TA_SEGMENT_FREE - GM_TA_SEGMENT_ALLOC == GM_SEGMENT_FREE &&
                   GM_TA_SEGMENT_MAP - GM_TA_SEGMENT_ALLOC == GM_SEGMENT_MAP &&
                   GM_TA_SEGMENT_UNMAP - GM_TA_SEGMENT_ALLOC == GM_SEGMENT_UNMAP && GM_SEGMENT_ALLOC == 0,
               "GM_SEGMENT_* and the trace's segment actions are in one order");
static inline void gm__segment_note(int device, int event, uint64_t addr, uint64_t size) {
    gm__history_note(device, GM_TA_SEGMENT_ALLOC + event, addr, size, 0);
    gm__seg_observer *o = __atomic_load_n(&gm__seg_observer_now, __ATOMIC_RELAXED);
    if (__builtin_expect(o != NULL, 0)) {
        o = __atomic_load_n(&gm__seg_observer_now, __ATOMIC_ACQUIRE); /* its fields, written before */
        if (o) o->cb(device, event, addr, size, o->arg);
    }
}

/* ---- for the dump -------------------------------------------------------- */

/* A copy of the ring, oldest first (malloc'd; free it), and the clock to
 * turn ticks into microseconds: us = (t0_ns + (tick - t0_tick) * ns_per_tick) / 1000. */
typedef struct gm__hist_copy {
    gm__hist_entry *e;
    size_t n;
    uint64_t dropped;
    uint64_t t0_tick;
    double t0_ns, ns_per_tick;
} gm__hist_copy;
int gm__history_copy(gm__hist_copy *out);
/* Scope node: its name and its parent (0 = none); valid ids come from the
 * entries. Names stay valid for the life of the process. */
const char *gm__hist_scope_name(uint32_t node);
uint32_t gm__hist_scope_parent(uint32_t node);

#endif /* GPUMEM_CORE_HISTORY_H */
