/* events.c — cross-stream safety for the front end (torch's record_stream):
 * a block used on extra streams is not handed back to the policy at free time;
 * one event per extra stream is recorded and the block waits in the device's
 * pending list until every event has completed (checked at the start of each
 * malloc, like torch's process_events, or waited for by empty_cache and by a
 * policy's retry path). */
#include "frontend.h"
#include "mempool.h"
#include "history.h"
#include "action.h"

#include <stdlib.h>

int gm__uses_add(gm__block_hdr *b, gm_stream stream) {
    struct gm__stream_uses *u = b->uses;
    if (!u) {
        u = calloc(1, sizeof *u);
        if (!u) return GM_ENOHOSTMEM;
        b->uses = u;
    }
    for (uint32_t i = 0; i < u->n; i++)
        if (u->streams[i] == stream) return GM_OK; /* a set, like torch's */
    if (u->n == u->cap) {
        uint32_t nc = u->cap ? u->cap * 2 : 2;
        gm_stream *ns = realloc(u->streams, nc * sizeof *ns);
        if (!ns) return GM_ENOHOSTMEM;
        u->streams = ns;
        u->cap = nc;
    }
    u->streams[u->n++] = stream;
    return GM_OK;
}

void gm__uses_free(gm__block_hdr *b) {
    struct gm__stream_uses *u = b->uses;
    if (!u) return;
    free(u->streams);
    free(u->events);
    free(u);
    b->uses = NULL;
}

int gm__events_reserve_pending(gm__fe_dev *fe) {
    if (fe->npending < fe->cap_pending) return GM_OK;
    size_t nc = fe->cap_pending ? fe->cap_pending * 2 : 16;
    gm__block_hdr **np = realloc(fe->pending, nc * sizeof *np);
    if (!np) return GM_ENOHOSTMEM;
    fe->pending = np;
    fe->cap_pending = nc;
    return GM_OK;
}

/* One event per stream of u; on error none is left recorded. */
static int record_events(gm__device *d, struct gm__stream_uses *u) {
    /* sized to the streams recorded so far (record_stream may have added
     * streams since an earlier attempt failed) */
    gm_event *ev = realloc(u->events, u->n * sizeof *ev);
    if (!ev) return GM_ENOHOSTMEM;
    u->events = ev;
    for (uint32_t i = 0; i < u->n; i++) {
        int rc = gm__be_event_record(d, u->streams[i], &u->events[i]);
        if (rc != GM_OK) {
            while (i-- > 0) (void)gm__be_cleanup_event_destroy(d, u->events[i]);
            return rc;
        }
    }
    u->done = 0;
    u->deferred = false;
    return GM_OK;
}

int gm__events_record(gm__device *d, gm__block_hdr *b) {
    gm__fe_dev *fe = d->fe;
    int rc = gm__events_reserve_pending(fe);
    if (rc == GM_OK) rc = record_events(d, b->uses);
    if (rc == GM_OK) fe->pending[fe->npending++] = b;
    return rc;
}

int gm__events_defer(gm__device *d, gm__block_hdr *b) {
    gm__fe_dev *fe = d->fe;
    int rc = gm__events_reserve_pending(fe);
    if (rc != GM_OK) return rc;
    b->uses->done = 0;
    b->uses->deferred = true;
    fe->pending[fe->npending++] = b;
    return GM_OK;
}

/* Advance b's events; *complete when all are done (and destroyed). */
static int advance(gm__device *d, struct gm__stream_uses *u, bool synchronize, bool *complete) {
    while (u->done < u->n) {
        gm_event ev = u->events[u->done];
        int rc;
        if (synchronize) {
            rc = gm__be_event_sync(d, ev);
        } else {
            bool done = false;
            rc = gm__be_event_query(d, ev, &done);
            if (rc == GM_OK && !done) break;
        }
        if (rc != GM_OK) return rc;
        /* the event is complete: a destroy that fails twice is counted
         * (gm_backend_dropped_count) and must not hold the block back */
        (void)gm__be_cleanup_event_destroy(d, ev);
        u->done++;
    }
    *complete = u->done == u->n;
    return GM_OK;
}

int gm__device_process_events(gm__device *d, bool synchronize) {
    if (d->owner) d = d->owner; /* a private pool's policy asks for its device */
    /* no event is queried or waited for during a capture (torch: not while
     * captures are under way); the blocks wait for its end */
    if (d->capturing) return GM_OK;
    gm__fe_dev *fe = d->fe;
    if (fe->in_events) return GM_OK;
    fe->in_events = true;
    int rc = GM_OK;
    size_t j = 0, i = 0;
    /* stable compaction: blocks reach the policy in the order they were
     * freed, which keeps replays deterministic */
    for (; i < fe->npending; i++) {
        gm__block_hdr *b = fe->pending[i];
        bool complete = false;
        /* freed during a capture: its events are recorded now it is over */
        if (rc == GM_OK && b->uses->deferred) rc = record_events(d, b->uses);
        if (rc == GM_OK) rc = advance(d, b->uses, synchronize, &complete);
        if (complete) {
            gm__history_note(d->index, GM_TA_FREE_COMPLETED, b->ptr, b->requested, b->stream);
            gm__uses_free(b);
            gm__policy_free(d, b);
        } else {
            fe->pending[j++] = b;
        }
    }
    fe->npending = j;
    fe->in_events = false;
    return rc;
}

void gm__events_drain(gm__device *d) {
    gm__fe_dev *fe = d->fe;
    for (size_t i = 0; i < fe->npending; i++) {
        gm__block_hdr *b = fe->pending[i];
        struct gm__stream_uses *u = b->uses;
        for (uint32_t k = u->done; k < u->n && !u->deferred; k++) {
            (void)gm__be_event_sync(d, u->events[k]);
            (void)gm__be_cleanup_event_destroy(d, u->events[k]);
        }
        gm__uses_free(b);
        gm__policy_free(d, b);
    }
    fe->npending = 0;
    free(fe->pending);
    fe->pending = NULL;
    fe->cap_pending = 0;
}
