/* trace.h — allocation traces: PyTorch memory snapshots and gpumem's own
 * trace format (docs/trace-format.md) read into one compact in-memory form,
 * and the replay engine that drives an allocator policy on the sim backend.
 *
 * Shared by the CLI (replay, tune, convert), the tests and the benchmarks.
 * Named gm_trace_* / gm_replay_* because they are meant to become public
 * (include/gpumem/trace.h) once the shape has settled. */
#ifndef GPUMEM_TRACE_TRACE_H
#define GPUMEM_TRACE_TRACE_H

#include "gpumem/gpumem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/action.h"

const char *gm__trace_action_name(int action); /* "alloc", ... */

typedef struct gm_trace_event {
    uint64_t addr;
    uint64_t size;   /* alloc: requested bytes; segment_*: bytes; oom: bytes asked */
    uint64_t stream;
    int64_t time_us;
    uint32_t stack;  /* 0 = no frames, else 1 + index into the stack table */
    uint8_t action;  /* gm_trace_action */
    uint8_t device;
} gm_trace_event;

typedef struct gm_trace_frame {
    uint32_t name, filename; /* indexes into strings */
    int32_t line;
} gm_trace_frame;

/* A segment of the snapshot's final state (torch: snapshot["segments"]). */
typedef struct gm_trace_segment {
    uint64_t address, total_size, allocated_size, requested_size, stream;
    uint32_t nblocks;
    uint8_t device;
    bool large, expandable;
    uint64_t pool_id[2]; /* torch's segment_pool_id: the private pool (CUDA graph, MemPool), 0, 0: none */
} gm_trace_segment;

typedef struct gm_trace {
    /* events of device d are events[dev_off[d] .. dev_off[d+1]) */
    gm_trace_event *events;
    size_t nevents;
    int ndevices;
    size_t *dev_off;
    char **strings;
    uint32_t nstrings;
    gm_trace_frame *frames;
    uint32_t nframes;
    /* stack s (0-based) is frames stack_frames[stack_off[s] .. stack_off[s+1]) */
    uint32_t *stack_frames;
    uint32_t *stack_off;
    uint32_t nstacks;
    gm_trace_segment *segments;
    size_t nsegments;
    char *alloc_conf;     /* PYTORCH_CUDA_ALLOC_CONF at recording time, or NULL */
    bool has_settings;    /* allocator_settings were present */
    const char *format;   /* "pytorch-snapshot" or "gmt" */
    uint64_t skipped;     /* events dropped: unknown action or bad fields */
} gm_trace;

/* Read a trace file of either format (detected by magic: gmt, gzip, or a
 * bare pickle). GM_EFORMAT / GM_EIO / GM_ENOHOSTMEM with the detail in
 * gm_last_error_detail(). */
int gm__trace_load_file(const char *path, gm_trace **out);
int gm__trace_load_mem(const void *data, size_t len, gm_trace **out);
/* The snapshot reader alone (input: a PyTorch snapshot pickle, maybe gzip). */
int gm__trace_from_snapshot(const void *data, size_t len, gm_trace **out);
void gm__trace_free(gm_trace *t);

/* gpumem trace format (.gmt): see docs/trace-format.md. */
#define GM_TRACE_MAGIC "GMTRACE\0"
#define GM_TRACE_VERSION 1
int gm__trace_write_gmt(const gm_trace *t, const char *path);
/* Encode into a malloc'd buffer (for tests/fuzzing). */
int gm__trace_encode_gmt(const gm_trace *t, uint8_t **out, size_t *outlen);
int gm__trace_decode_gmt(const void *data, size_t len, gm_trace **out);

/* The snapshot reader on a file read as it goes (pickle.h's
 * gm__pickle_load_stream): `head` holds its first len bytes. */
int gm__trace_from_snapshot_stream(FILE *in, const void *head, size_t len, gm_trace **out);
/* The .gmt reader likewise: the body is inflated and decoded in windows. */
int gm__trace_decode_gmt_stream(FILE *in, const void *head, size_t len, gm_trace **out);

/* Writing a file (outfile.c): never through a symbolic link at path; a
 * regular file via a temporary file beside it, renamed into place by
 * gm__outfile_close(o, true) only when every write, flush and close
 * succeeded (else removed: the previous file stays). GM_EIO with the
 * detail in gm_last_error_detail(). */
typedef struct gm__outfile {
    FILE *f;
    const char *path;
    char tmp[4096]; /* "" when writing the path itself (append, a device, a FIFO) */
    bool replaced, append;
} gm__outfile;
int gm__outfile_open(gm__outfile *o, const char *path, bool append);
int gm__outfile_close(gm__outfile *o, bool ok);
/* The whole of buf to path as above, gzip-compressed if asked. */
int gm__write_file(const char *path, const void *buf, size_t len, bool gzip);

/* Builders shared by the readers (trace_build.c). */
typedef struct gm__trace_builder gm__trace_builder;
gm__trace_builder *gm__tb_new(void);
void gm__tb_discard(gm__trace_builder *b);
int gm__tb_string(gm__trace_builder *b, const char *s, size_t n, uint32_t *id);
int gm__tb_frame(gm__trace_builder *b, uint32_t name, uint32_t file, int32_t line, uint32_t *id);
int gm__tb_stack(gm__trace_builder *b, const uint32_t *frames, uint32_t n, uint32_t *id1);
int gm__tb_event(gm__trace_builder *b, const gm_trace_event *e);
size_t gm__tb_nevents(const gm__trace_builder *b);
/* Event i again, on `device` (a snapshot that names one event dict twice). */
int gm__tb_event_copy(gm__trace_builder *b, size_t i, int device);
int gm__tb_segment(gm__trace_builder *b, const gm_trace_segment *s);
int gm__tb_conf(gm__trace_builder *b, const char *conf);
/* Sort events by device (stable) and hand over; the builder is consumed. */
int gm__tb_finish(gm__trace_builder *b, const char *format, gm_trace **out);

/* ---- replay ------------------------------------------------------------ */

/* The alloc/free stream of one device, resolved once and replayable many
 * times (tune runs many configurations over one program). */
typedef struct gm_replay_prog gm_replay_prog;

int gm__replay_compile(const gm_trace *t, int device, gm_replay_prog **out);
void gm__replay_prog_free(gm_replay_prog *p);
size_t gm__replay_prog_ops(const gm_replay_prog *p);
/* Peak of live requested bytes in the trace itself (no allocator involved). */
int64_t gm__replay_prog_peak_requested(const gm_replay_prog *p);
/* Events skipped because no device could have made them (an alloc over
 * GM_LIMIT_ALLOC_BYTES, a segment at address 0, ...); *first (may be NULL)
 * describes the first. */
uint64_t gm__replay_prog_bad_events(const gm_replay_prog *p, const char **first);
/* Private pools the program allocates into (the trace's nonzero
 * segment_pool_ids on its device); each is retained for the whole run. */
uint32_t gm__replay_prog_pools(const gm_replay_prog *p);
/* 1 + the pool op i (an alloc, in program order) allocates into, 0: the
 * device's own memory (tests). */
uint32_t gm__replay_op_pool(const gm_replay_prog *p, size_t i);

/* The device calls whose cost depends on their size, as gm_bcall kinds, and
 * their names in replay's JSON. */
#define GM_REPLAY_SIZED 6
extern const int gm__replay_sized_kinds[GM_REPLAY_SIZED];
extern const char *const gm__replay_sized_names[GM_REPLAY_SIZED];

/* The steady state: the events from this fraction of the trace on (after
 * warm-up), where a training loop repeats its steps. */
#define GM_REPLAY_STEADY_FROM 0.5
/* The device calls a replay reports, written once: X(name in replay's
 * output, the gm_stats counter and gm_replay_result field). The order of
 * gm__replay_call_names, steady_calls and gm__replay_calls. */
#define GM_REPLAY_CALLS(X)                                                     \
    X(device_alloc, num_device_alloc) X(device_free, num_device_free)          \
    X(va_reserve, num_va_reserve) X(va_release, num_va_release)                \
    X(phys_create, num_phys_create) X(phys_release, num_phys_release)          \
    X(map, num_map) X(unmap, num_unmap)
enum {
#define GM__REPLAY_CALL_ENUM(name, field) GM__REPLAY_CALL_##name,
    GM_REPLAY_CALLS(GM__REPLAY_CALL_ENUM)
#undef GM__REPLAY_CALL_ENUM
    GM_REPLAY_CALL_KINDS
};
extern const char *const gm__replay_call_names[GM_REPLAY_CALL_KINDS];

typedef struct gm_replay_result {
    int64_t peak_requested, peak_allocated, peak_reserved;
    int64_t trace_peak_requested; /* computed from the trace alone */
    int64_t segments;             /* segment.all.allocated */
    int64_t num_alloc_retries, num_ooms;
#define GM__REPLAY_CALL_FIELD(name, field) int64_t field;
    GM_REPLAY_CALLS(GM__REPLAY_CALL_FIELD) /* the whole replay's device calls */
#undef GM__REPLAY_CALL_FIELD
    /* the same sized calls by size (gm_sim_call_sizes), kinds in
     * gm__replay_sized_kinds order: n[i][k] calls, bytes[i][k] bytes of 2^k.. */
    uint64_t sized_n[GM_REPLAY_SIZED][GM_SIM_SIZE_BUCKETS];
    uint64_t sized_bytes[GM_REPLAY_SIZED][GM_SIM_SIZE_BUCKETS];
    uint64_t allocs, frees;          /* replayed */
    uint64_t unknown_frees;          /* free_completed of an address never allocated */
    uint64_t double_allocs;          /* alloc of an address still live in the trace */
    uint32_t private_pools;          /* pools allocated into (segment_pool_id; CUDA graphs, MemPools) */
    uint64_t bad_events;             /* events no device could have made (skipped): */
    char bad_first[160];             /* the first of them, described */
    uint64_t events;                 /* trace events of the device */
    bool oom;
    size_t oom_event;                /* index of the failing event within the device's events */
    uint64_t oom_size;               /* bytes it asked for */
    char oom_detail[512];            /* gm_last_error_detail() at the OOM */
    int error;                       /* a non-OOM failure (GM_*), 0 if none */
    char error_detail[256];
    double seconds;                  /* wall time of the replay loop */
    /* the steady state (events from steady_from x the trace's on): peaks
     * and device calls there; a trace that repeats its steps should make
     * none once its memory is laid out */
    double steady_from;
    bool steady_started;             /* the replay got that far (no OOM before) */
    int64_t steady_peak_reserved, steady_peak_requested;
    int64_t steady_device_calls;     /* all kinds */
    /* the host's waits for a stream before memory moved (num_stream_waits):
     * the whole run's, and the steady state's */
    int64_t stream_waits, steady_stream_waits;
    int64_t steady_calls[GM_REPLAY_CALL_KINDS];
} gm_replay_result;

/* r's device calls (the whole replay), in gm__replay_call_names' order. */
void gm__replay_calls(const gm_replay_result *r, int64_t out[GM_REPLAY_CALL_KINDS]);

/* Replay on a fresh sim device of `capacity` bytes (0 = 141 GiB) with cfg
 * (NULL = torch defaults). Returns GM_OK even on OOM (see r->oom); errors
 * only when the allocator or backend cannot be created. */
int gm__replay_run(const gm_replay_prog *p, const gm_config *cfg, uint64_t capacity,
                  gm_replay_result *r);
/* Device 0's live statistics in a simulation (single-threaded: read
 * without the lock or a copy of gm_stats, as a replay does after every op);
 * NULL before the device's first use (its statistics are all zero). */
const gm_stats *gm__replay_live_stats(gm_allocator *a);
/* The same with the steady state from another fraction of the trace, [0, 1). */
int gm__replay_run_steady(const gm_replay_prog *p, const gm_config *cfg, uint64_t capacity, double steady_from,
                         gm_replay_result *r);

/* ---- tune (tune.c) ------------------------------------------------------
 * Replays a program under every setting of the policy table's tune lists and
 * ranks them: those that fit first, by peak reserved, then by conf. */
typedef struct gm_tune_entry {
    char conf[192];      /* the setting, as a user writes it ("" = torch defaults) */
    gm_config cfg;
    gm_replay_result r;
    int rc;              /* gm__replay_run's status; err says why when not GM_OK */
    char err[256];
} gm_tune_entry;

/* *out: calloc'ed, *n entries, ranked; free() it. */
int gm__tune_run(const gm_replay_prog *p, uint64_t capacity, int threads, gm_tune_entry **out, int *n);
/* Ran out of memory, or failed: not a candidate. */
bool gm__tune_failed(const gm_tune_entry *e);
/* Device calls of a (cold) replay: allocations, VMM creates, maps, unmaps. */
int64_t gm__tune_device_calls(const gm_replay_result *r);

/* Which setting to name: "best for memory" is the lowest peak reserved that
 * fits; "recommended" the lowest whose device calls stay within
 * GM_TUNE_CALLS_FACTOR x PyTorch default's, or GM_TUNE_CALLS_ONCE (a warm-up
 * paid once, under a second at what an H200 takes per handle brought in:
 * bench/RESULTS.md, "what each driver memory call costs"), and whose steady-state calls
 * (replay's second half, what every later step pays) within
 * GM_TUNE_STEADY_FACTOR x the default's, or GM_TUNE_STEADY_MIN. A setting far
 * above moves memory in every step: gpumem_slack:0 on the GPT-2 trace, its
 * device calls and its step time on the H200 against the default's, are in
 * bench/RESULTS.md ("step time A/B and monitoring"). Indexes into the ranked
 * entries, -1 if none. */
#define GM_TUNE_CALLS_FACTOR 10.0
#define GM_TUNE_CALLS_ONCE 20000
#define GM_TUNE_STEADY_FACTOR 4
#define GM_TUNE_STEADY_MIN 16
typedef struct gm_tune_choice {
    int def, best, rec;
} gm_tune_choice;
void gm__tune_choose(const gm_tune_entry *e, int n, gm_tune_choice *out);
/* e's device calls as a multiple of the default's (1 when there is none). */
double gm__tune_calls_ratio(const gm_tune_entry *e, const gm_tune_entry *def);

#endif /* GPUMEM_TRACE_TRACE_H */
