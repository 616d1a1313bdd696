/* frontend.h — private to the allocator front end (allocator.c, ptrmap.c,
 * events.c, stats.c, config.c, pools.c): the per-device front-end state
 * (its pointer map: ptrmap.h), the blocks waiting for stream events and the
 * text writer. Not for policies. */
#ifndef GPUMEM_FRONTEND_H
#define GPUMEM_FRONTEND_H

#include "internal.h"
#include "ptrmap.h"

#include <stdatomic.h>

/* ---- record_stream bookkeeping -------------------------------------------- */

/* Extra streams a live block was used on; at free time one event per stream
 * is recorded into `events`, and the block waits until all have completed. */
struct gm__stream_uses {
    uint32_t n, cap;
    uint32_t done;    /* events[0..done) already completed and destroyed */
    gm_stream *streams;
    gm_event *events; /* n entries once the block is freed */
    bool deferred;    /* freed during a capture: pending, its events not yet recorded */
};

typedef struct gm__fe_dev {
    gm__ptrmap map;
    gm__block_hdr **pending; /* freed blocks waiting for their events */
    size_t npending, cap_pending;
    /* in gm__device_process_events: a block it hands back may be a private
     * pool's last, whose release asks for the events again (not nested) */
    bool in_events;
    /* [lo, hi): addresses of every block this device handed out so far; lets
     * gm_free find the device without a lock. Only ever grows. */
    _Atomic uint64_t lo, hi;
} gm__fe_dev;

/* events.c */
int gm__uses_add(gm__block_hdr *b, gm_stream stream);
void gm__uses_free(gm__block_hdr *b);
/* Record one event per extra stream of b and queue it as pending. On error
 * nothing changed (events recorded so far are destroyed). */
int gm__events_reserve_pending(gm__fe_dev *fe);
int gm__events_record(gm__device *d, gm__block_hdr *b);
/* Queue b as pending without recording (a capture allows no event; torch
 * defers them until no capture is under way): the first processing of the
 * pending list after the capture records them. */
int gm__events_defer(gm__device *d, gm__block_hdr *b);
/* Drop every pending block at destroy: wait for and destroy its events. */
void gm__events_drain(gm__device *d);

/* putbuf.c: text into a caller's buffer of len bytes (config.c, stats.c).
 * gm__put writes what fits and counts on past the end; gm__put_finish then
 * gives GM_OK, or GM_ENOSPACE naming `what` and the size needed, with the
 * text truncated and NUL-terminated. */
typedef struct gm__putbuf {
    char *buf;
    size_t len, pos;
    bool overflow;
} gm__putbuf;
void gm__put(gm__putbuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int gm__put_finish(gm__putbuf *o, const char *what);

/* allocator.c: the device holding live block ptr, returned locked (its
 * header in *out, its pointer-map slot in *slot), or NULL. */
gm__device *gm__lock_owner(gm_allocator *a, gm_devptr ptr, gm__block_hdr **out, uint64_t *slot);

/* config.c: GM_OK, or GM_ECONFIG naming the first field out of range. */
int gm__config_check(const gm_config *cfg, char *err, size_t errlen);
/* config.c: the first key fixed at the allocator's start that differs between was and now, or NULL. */
const char *gm__config_fixed_change(const gm_config *was, const gm_config *now);

/* stats.c */
int gm__format_summary(const gm_stats *s, int device, bool abbreviated, char *buf, size_t len);

#endif /* GPUMEM_FRONTEND_H */
