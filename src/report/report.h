/* report.h — where the memory went: every allocation of a trace attributed
 * to a category (parameters, gradients, optimizer state, activations,
 * temporaries, other), with the rule that decided it, and the timeline /
 * peak / frame tables `gpumem report` draws from it (docs/report.md).
 *
 * Attribution (attrib.c) reads only the trace: the allocation's own Python
 * frames when it has them; the phase of the nearest framed event before it
 * when it has none (autograd runs backward on a C++ thread, so torch records
 * no Python frames there); and, in a trace with no frames at all, the
 * allocation's lifetime. Frames named by gpumem's own tags (the history ring,
 * gpumem.torch.track) decide outright. */
#ifndef GPUMEM_REPORT_REPORT_H
#define GPUMEM_REPORT_REPORT_H

#include "trace/trace.h"
#include "util/text.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Categories: gm_category and GM_CATEGORY_LIST in gpumem/gpumem.h (the
 * history tags use them too). */

/* How an allocation's category was decided; the report says how many bytes
 * each rule decided. UNKNOWN bytes are in category OTHER. */
#define GM_ATTR_METHODS(X)                                                                     \
    X(TAGGED, "tagged", "a gpumem category tag recorded with the allocation")                  \
    X(FRAMES, "frames", "the allocation's own frames (Python frames or gpumem scopes)")        \
    X(PHASE, "phase", "no frames of its own: the phase (forward, backward, optimizer step) "   \
                      "of the nearest framed event before it")                                 \
    X(LIFETIME, "lifetime", "no frames: alive for half the trace or more; parameters, or "    \
                            "optimizer state if made after the first free with the size of "   \
                            "an earlier long-lived allocation")                                \
    X(STEPS, "inferred", "no frames: inferred from the steps live memory shows (it rises "     \
                         "through forward to a high point, falls through backward): after a "  \
                         "high point the first allocations with the parameters' sizes are "    \
                         "gradients; alive at one high point activations, at none "            \
                         "temporaries, across steps other; made in the setup and freed later " \
                         "(a model cast) parameters")                                          \
    X(UNKNOWN, "unknown", "no frames and no lifetime or step rule applies")

typedef enum gm_attr_method {
#define GM__AM_ENUM(n, s, d) GM_AM_##n,
    GM_ATTR_METHODS(GM__AM_ENUM)
#undef GM__AM_ENUM
    GM_AM_COUNT
} gm_attr_method;

/* Phases of a training step, decided from frames. */
#define GM_PHASES(X)                                                           \
    X(NONE, "none") X(PARAM, "parameter setup") X(FORWARD, "forward")          \
    X(BACKWARD, "backward") X(OPTIMIZER, "optimizer step") X(OTHER, "other")

typedef enum gm_phase {
#define GM__PH_ENUM(n, s) GM_PH_##n,
    GM_PHASES(GM__PH_ENUM)
#undef GM__PH_ENUM
    GM_PH_COUNT
} gm_phase;

const char *gm__attr_method_name(int m);
const char *gm__attr_method_help(int m);
const char *gm__phase_name(int ph);

/* The filenames of gpumem's tag frames: a frame {name: "<category>",
 * filename: GM_TAG_CATEGORY_FILE} fixes the category of the allocation
 * whose stack holds it; {name: "<scope path>", filename: GM_TAG_SCOPE_FILE}
 * names the scope it was made in. */
#define GM_TAG_CATEGORY_FILE "<gpumem category>"
#define GM_TAG_SCOPE_FILE "<gpumem scope>"
/* Scopes with these names mark a phase (gpumem.torch.track opens them
 * around forward, backward and optimizer.step; python/gpumem/track.py
 * spells the same names). */
#define GM_SCOPE_FORWARD "forward"
#define GM_SCOPE_BACKWARD "backward"
#define GM_SCOPE_OPTIMIZER "optimizer.step"
/* The scope of everything else while tracking (inputs, zero_grad, user code):
 * no phase of its own, and no module path. */
#define GM_SCOPE_UNTRACKED "untracked"

#define GM_ATTR_ALIVE UINT32_MAX /* end of an allocation never freed */

/* The one call that records Python frames with a snapshot (said wherever a
 * trace without frames leaves categories inferred or unknown). */
#define GM_RECORD_FRAMES_CALL                                                               \
    "torch.cuda.memory._record_memory_history(max_entries=1000000, context=\"all\", "     \
    "stacks=\"python\")"

typedef struct gm_attr_alloc {
    uint64_t addr, size, stream;
    uint32_t ev;    /* its alloc event, index within the device's events */
    uint32_t end;   /* the event that freed it, or GM_ATTR_ALIVE */
    uint32_t stack; /* as gm_trace_event.stack */
    uint8_t cat, method, phase;
} gm_attr_alloc;

typedef struct gm_attribution {
    int device;
    const gm_trace *trace;
    const gm_trace_event *ev; /* the device's events */
    size_t nevents;
    gm_attr_alloc *allocs; /* in event order */
    size_t nallocs;
    int free_action;       /* GM_TA_FREE_COMPLETED, or FREE_REQUESTED in old traces */
    bool has_frames;       /* some event of the device has a stack */
    size_t nsteps;         /* without frames: the steps (high points of live memory) found */
    /* live requested bytes: peak and the first event where it is reached
     * (the same pairing as replay: its peak equals replay's peak_requested) */
    int64_t peak_bytes;
    size_t peak_ev;
    uint64_t peak_by[GM_CAT_COUNT][GM_AM_COUNT];  /* live at the peak */
    uint64_t bytes_by[GM_CAT_COUNT][GM_AM_COUNT]; /* all allocated bytes */
    uint64_t count_by[GM_CAT_COUNT];
    uint64_t unknown_frees, double_allocs;
    uint64_t oversized_allocs; /* > GM_LIMIT_ALLOC_BYTES: counted as 0 bytes, as replay skips them */
} gm_attribution;

int gm__attribute(const gm_trace *t, int device, gm_attribution **out);
/* For a trace without frames: which categories are inferred, and the one
 * call that records frames (GM_RECORD_FRAMES_CALL), into buf; "" when the
 * trace has frames. Returns buf. */
const char *gm__attr_frames_note(const gm_attribution *a, char *buf, size_t len);
void gm__attribution_free(gm_attribution *a);
/* Sum over methods / categories. */
uint64_t gm__attr_peak_cat(const gm_attribution *a, int cat);
uint64_t gm__attr_peak_method(const gm_attribution *a, int method);

/* ---- frame / scope table (like torch.profiler's key_averages) ---------- */

typedef struct gm_frame_row {
    uint32_t name, filename; /* strings of the trace; UINT32_MAX + phase for the
                                "no Python frames" rows (see gm__frame_row_label) */
    int32_t line;            /* of the first frame seen */
    uint64_t self_bytes, total_bytes;   /* allocated in it (innermost) / under it */
    uint64_t self_peak, total_peak;     /* of those, live at the peak */
    uint64_t self_calls, total_calls;   /* allocations */
    bool scope;                         /* a gpumem scope, not a Python function */
} gm_frame_row;

/* Rows grouped by function (name, file), sorted by total_peak then
 * total_bytes, descending. Allocations without frames form one row per
 * phase. */
int gm__frame_table(const gm_attribution *a, gm_frame_row **rows, size_t *nrows);
/* "forward (modeling_gpt2.py:123)" / "[no frames: backward]" into buf. */
const char *gm__frame_row_label(const gm_attribution *a, const gm_frame_row *r, char *buf, size_t len);

/* ---- timeline: replay under the torch policy --------------------------- */

typedef struct gm_tl_point {
    double t;                        /* seconds since the first event */
    uint32_t ev;                     /* event index */
    int64_t cat[GM_CAT_COUNT];       /* live requested bytes per category */
    int64_t allocated, reserved;     /* allocator's allocated / reserved */
} gm_tl_point;

typedef struct gm_seg_block {
    uint64_t offset, size; /* within the segment; size = requested bytes */
    uint8_t cat;
} gm_seg_block;

typedef struct gm_seg_map {
    uint64_t address, total_size, allocated_size;
    uint64_t stream;
    bool large, expandable;
    gm_seg_block *blocks;
    size_t nblocks;
} gm_seg_map;

typedef struct gm_timeline {
    gm_tl_point *pts;
    size_t npts;
    size_t peak_pt;         /* the point of the allocated peak (never dropped) */
    int64_t peak_requested, peak_allocated, peak_reserved;
    gm_seg_map *segs;       /* at the requested peak */
    size_t nsegs;
    char conf[256];         /* the configuration replayed under */
    bool oom;
    double seconds;
} gm_timeline;

/* Replays the device's alloc/free stream on a sim device under cfg (NULL =
 * torch defaults) and samples the categories, allocated and reserved into
 * at most max_points points (the maximum of each bucket, so no peak is
 * dropped), plus the segment map at the requested peak. */
int gm__timeline_build(const gm_attribution *a, const gm_config *cfg, size_t max_points,
                      gm_timeline **out);
void gm__timeline_free(gm_timeline *tl);

/* ---- the timeline stacked by scope (scopes.c) --------------------------- */

/* Deepest module path cut the report offers, and the name of the series
 * holding every scope outside a view's top N. */
#define GM_SCOPE_DEPTH_MAX 8
#define GM_SCOPE_OTHERS "other scopes"

typedef struct gm_scope_view {
    int depth;          /* module paths cut at this many components */
    size_t nscopes;     /* distinct scopes at this depth */
    size_t nseries;     /* the top N by bytes at the peak, then GM_SCOPE_OTHERS if more */
    char **names;       /* "transformer.h.3", "modeling_gpt2.py:1062 > :922", "[backward]" */
    int64_t *at_peak;   /* live bytes at the peak (sums to the peak) */
    int64_t *max;       /* the series' own maximum */
    int64_t *values;    /* values[s * npts + p]: live bytes at the timeline's point p */
} gm_scope_view;

typedef struct gm_scope_series {
    const char *source; /* where the scopes came from, in words */
    bool by_scope;      /* some allocation has a gpumem module scope */
    bool by_frames;     /* some allocation is keyed by Python forward frames */
    size_t npts;        /* = the timeline's */
    int nviews;         /* depths 1..nviews (at least 1) */
    gm_scope_view views[GM_SCOPE_DEPTH_MAX];
} gm_scope_series;

/* Live requested bytes per scope at tl's points, at every depth up to the
 * deepest scope (GM_SCOPE_DEPTH_MAX at most), top_n scopes per depth by
 * bytes at the peak plus GM_SCOPE_OTHERS. Every point's series sum to the
 * point's categories' sum. scopes.c says how a scope is decided. */
int gm__scope_series_build(const gm_attribution *a, const gm_timeline *tl, size_t top_n, gm_scope_series **out);
void gm__scope_series_free(gm_scope_series *ss);
/* The series as one JSON object; deltas: each point minus the one before
 * (the HTML, smaller), else the values (--json). */
void gm__scope_series_json(FILE *f, const gm_scope_series *ss, bool deltas);

/* ---- outputs ------------------------------------------------------------ */

typedef struct gm_report_opts {
    const char *title;     /* the trace path */
    size_t max_rows;       /* frame table rows (0 = 50) */
    const gm_scope_series *scopes; /* the timeline by scope (NULL: none) */
} gm_report_opts;

int gm__report_write_text(FILE *f, const gm_attribution *a, const gm_timeline *tl,
                         const gm_frame_row *rows, size_t nrows, const gm_report_opts *o);
int gm__report_write_html(FILE *f, const gm_attribution *a, const gm_timeline *tl,
                         const gm_frame_row *rows, size_t nrows, const gm_report_opts *o);
/* One JSON object: the peak breakdown by category and method, the replay's peaks. */
int gm__report_write_json(FILE *f, const gm_attribution *a, const gm_timeline *tl, const gm_report_opts *o);
/* Chrome trace event JSON (Perfetto loads it): counter tracks per category
 * and reserved, slices for the phases and scopes. */
int gm__report_write_perfetto(FILE *f, const gm_attribution *a, const gm_timeline *tl);

/* ---- writing torch snapshots (snapshot_write.c) ------------------------ */

/* A gm_trace as a PyTorch memory snapshot pickle (protocol 4), gzip'd when
 * path ends in ".gz"; both readers of gpumem and PyTorch's memory_viz load it. */
int gm__trace_write_snapshot(const gm_trace *t, const char *path);
int gm__trace_encode_snapshot(const gm_trace *t, uint8_t **out, size_t *len);

/* The history ring (src/core/history.c) as a gm_trace (history_dump.c):
 * scopes become frames {path element, GM_TAG_SCOPE_FILE} (innermost
 * first), tags a frame {category, GM_TAG_CATEGORY_FILE} on the tagged
 * allocation. *dropped: entries the ring had dropped. */
int gm__history_to_trace(gm_trace **out, uint64_t *dropped);
/* The history as torch memory snapshot bytes (malloc'd): what an OOM report
 * keeps beside it (src/monitor/oom_report.c, lent by the layer above). */
int gm__history_snapshot_bytes(uint8_t **out, size_t *len);

/* The report's byte and share formatting: the library's one byte formatter
 * (gm__format_bytes, util/text.h) and a percentage of a whole (0 of 0 is 0). */
static inline const char *gm__report_bytes(double b, char *buf, size_t len) {
    return gm__format_bytes((int64_t)b, buf, len);
}
static inline double gm__report_pct(uint64_t part, uint64_t whole) {
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

#endif /* GPUMEM_REPORT_REPORT_H */
