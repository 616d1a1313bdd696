/* monitor.h — live monitoring from outside the process, shared by the
 * publisher (inside libgpumem), the views (gpumem smi/top/log/exporter), the
 * tests and the Python publisher (python/gpumem/publish_native.py, which
 * goes through the library's gm_native_publisher_*).
 *
 * Publication, version 3. A publisher makes two objects:
 *  - the data: a memfd of GM__SHM_SIZE bytes, sealed against shrinking and
 *    growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), mapped shared by
 *    the publisher alone for writing. Nobody, the owner included, can
 *    truncate it, so the publisher's stores can never fault (SIGBUS): a
 *    monitoring side channel cannot end the job it watches. Readers open it
 *    as /proc/<pid>/fd/<data_fd> and map it read-only (the seals make that
 *    safe for them too).
 *  - the beacon: /dev/shm/gpumem.<uid>.<16 random hex digits> (mode 0600),
 *    holding a copy of the header and written once with pwrite, never
 *    mapped: truncating it hides the process from the views and harms
 *    nothing. Its name is random and linked into place only once complete
 *    (O_TMPFILE + linkat, a new name on EEXIST), so another user cannot
 *    block publication by pre-creating names (defect 5), and two processes
 *    with the same pid in different PID namespaces never share one
 *    (defect 4). The publisher holds flock(LOCK_EX) on the beacon for its
 *    whole life: a reader judges liveness by that lock alone (kill(pid, 0)
 *    and /proc/<pid> mean nothing across PID namespaces), so no reader ever
 *    unlinks a live segment.
 * Layout of the data (little endian, natural alignment):
 *   [0, 1024)                 gm__shm_header (the beacon holds the same)
 *   [1024 + i*128, ...)       gm__shm_record for device i, i < ndevices
 *   [9216 + i*128, ...)       gm__shm_step for device i (version 4 on)
 * Each record is guarded by its own seqlock (`seq`, odd while written,
 * +2 per publication) so a reader copies it, retries if torn, and never
 * blocks the writer. The header is written once before `magic` is stored,
 * so a reader that sees the magic sees a complete header. Readers accept
 * version 3 (no step records, GM__SHM_SIZE_V3 bytes) too, so a node agent
 * upgraded before its jobs still sees them. */
#ifndef GPUMEM_MONITOR_H
#define GPUMEM_MONITOR_H

#include "gpumem/gpumem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define GM__SHM_DIR "/dev/shm" /* the default of gm__shm_dir() */
#define GM__SHM_MAGIC 0x314d48534d454d47ULL /* "GMEMSHM1" */
/* 4: step records after the device records; 3: memfd data + beacon,
 * identity; 2: one mapped /dev/shm file */
#define GM__SHM_VERSION 4
#define GM__SHM_VERSION_V3 3
#define GM__SHM_HEADER_SIZE 1024
#define GM__SHM_RECORD_SIZE 128
#define GM__SHM_STEP_SIZE 128
#define GM__SHM_DEVICES GM_MAX_DEVICES
#define GM__SHM_SIZE_V3 (GM__SHM_HEADER_SIZE + GM__SHM_DEVICES * GM__SHM_RECORD_SIZE)
#define GM__SHM_STEP_OFFSET GM__SHM_SIZE_V3
#define GM__SHM_SIZE (GM__SHM_SIZE_V3 + GM__SHM_DEVICES * GM__SHM_STEP_SIZE)
/* A reader looks at no more beacons than this per scan (a node agent: every
 * user's); the rest are counted as skipped (GM__SKIP_LIMIT). */
#define GM__SHM_SCAN_MAX 4096
/* The step record's block walk (largest free block, categories) is taken
 * at a step mark at most this often, so a fast loop pays for it rarely. */
#define GM__SHM_WALK_EVERY_NS 1000000000ll
/* The writer refreshes update_ns only every this many publications: reading
 * a clock, even the coarse one, costs about what the rest of a publication
 * does (bench/RESULTS.md, "Publishing cost"). A power of two (the writer
 * tests bits of the sequence). */
#define GM__SHM_TIME_EVERY 64

enum { GM__SRC_GPUMEM = 1, GM__SRC_TORCH = 2 }; /* who publishes: libgpumem or torch's own allocator */

/* Who the process is within a job: one list for the header, the
 * views' JSON/CSV keys and the exporter's labels. X(name, kind, help)
 * with kind STR (a char array in the header) or INT (int32, -1 unknown).
 * Label names avoid Prometheus's own `job` and `instance`. */
#define GM_MON_IDENTITY(X)                                                                      \
    X(run_id, STR, "the job's id: $GPUMEM_RUN_ID (gpumem run --label), $TORCHELASTIC_RUN_ID or $SLURM_JOB_ID") \
    X(rank, INT, "global rank: $RANK, $SLURM_PROCID or $OMPI_COMM_WORLD_RANK")                  \
    X(local_rank, INT, "rank on its node: $LOCAL_RANK, $SLURM_LOCALID or $OMPI_COMM_WORLD_LOCAL_RANK") \
    X(world_size, INT, "ranks in the job: $WORLD_SIZE, $SLURM_NTASKS or $OMPI_COMM_WORLD_SIZE") \
    X(hostname, STR, "the publisher's host name (the pod's name under Kubernetes)")             \
    X(k8s_pod, STR, "namespace/pod from $POD_NAMESPACE and $POD_NAME (or $HOSTNAME) under Kubernetes") \
    X(cgroup, STR, "the publisher's cgroup (v2) path: its container, where it runs in one")

typedef struct gm__shm_header {
    uint64_t magic;        /* 0 */
    uint32_t version;      /* 8 */
    uint32_t header_size;  /* 12 */
    uint64_t segment_size; /* 16 */
    uint32_t record_size;  /* 24 */
    uint32_t ndevices;     /* 28 */
    int32_t pid;           /* 32: in the publisher's own PID namespace */
    uint32_t uid;          /* 36 */
    uint64_t start_time;   /* 40: field 22 of /proc/self/stat (clock ticks since boot) */
    uint64_t created_ns;   /* 48: CLOCK_REALTIME */
    uint32_t source;       /* 56: GM__SRC_* */
    int32_t data_fd;       /* 60: the memfd's descriptor in the publisher */
    char comm[32];         /* 64 */
    char label[128];       /* 96: the name views show (label given, else comm) */
    char visible[256];     /* 224: CUDA_VISIBLE_DEVICES at publish time, to map device indices */
    uint64_t nonce;        /* 480: random, the same in beacon and data (a reused fd number is refused) */
    uint64_t pidns_ino;    /* 488: inode of /proc/self/ns/pid: which namespace `pid` is in */
    int32_t rank;          /* 496: GM_MON_IDENTITY's integers, -1 when unknown */
    int32_t local_rank;    /* 500 */
    int32_t world_size;    /* 504 */
    int32_t reserved1;     /* 508 */
    char run_id[128];      /* 512: GM_MON_IDENTITY's strings */
    char hostname[64];     /* 640 */
    char k8s_pod[128];     /* 704 */
    char cgroup[160];      /* 832 */
    int32_t host_pid;      /* 992: pid in the initial PID namespace (NVML's numbers), 0 when unknowable */
    int32_t reserved2;     /* 996 */
    char pad[24];          /* 1000 */
} gm__shm_header;

/* The published numbers of one device. Field order is the layout (from
 * offset 8 of the record). Records are 128-byte aligned, so each
 * (current, peak) pair from `allocated` on starts 16-byte aligned, in the
 * order gm_stat keeps them (current, peak; allocated, freed;
 * num_alloc_retries, num_ooms): the writer moves a pair with one 16-byte
 * load and store. update_ns (CLOCK_REALTIME) is refreshed on the record's
 * first publication and then every GM__SHM_TIME_EVERY publications, so it
 * may lag the values; readers take num_allocs + num_frees as the count of
 * allocator operations (version 1 stored that sum as `updates`).
 * device_total is the device's memory as the allocator's backend reports it
 * (written once per device; 0 from an older writer or torch's allocator), so
 * a view without NVML still shows the size of a simulated or remote device. */
#define GM__SHM_FIELDS(X)                                                      \
    X(update_ns) X(allocated) X(peak_allocated) X(requested) X(peak_requested) \
    X(active) X(peak_active) X(num_allocs) X(num_frees) X(reserved)            \
    X(peak_reserved) X(num_alloc_retries) X(num_ooms) X(device_total)

typedef struct gm__shm_values {
#define GM__SHM_FIELD(n) int64_t n;
    GM__SHM_FIELDS(GM__SHM_FIELD)
#undef GM__SHM_FIELD
} gm__shm_values;

/* ---- the published statistics: one list for every monitor output ----------
 * Each allocator statistic a process publishes, once: X(name, value, torch
 * key, Prometheus suffix, type, help, table column).
 *   name    the key in smi/log JSON and the CSV column
 *   value   an expression over `v` (a const gm__shm_values *)
 *   torch   its torch.cuda.memory_stats() key, or NULL when derived
 *   prom    the family gpumem_process_allocator_<prom>; type gauge (bytes)
 *           or counter (events); help is its HELP text
 *   column  its header in the smi/top process table, or NULL
 * JSON, CSV, the table and Prometheus are written from this list
 * (format.c), and test_mon_stats checks every entry against memory_stats,
 * the shm record and each output. NVML's figures are not here: they carry
 * nvml_/driver_ names of their own. */
#define GM_MON_STATS(X)                                                                               \
    X(allocated, v->allocated, "allocated_bytes.all.current", "allocated_bytes", gauge,              \
      "Bytes in live allocations of the process's allocator.", "Allocated")                          \
    X(reserved, v->reserved, "reserved_bytes.all.current", "reserved_bytes", gauge,                  \
      "Bytes the process's allocator holds from the device, cached or not.", "Reserved")             \
    X(requested, v->requested, "requested_bytes.all.current", "requested_bytes", gauge,              \
      "Bytes the callers asked for, before rounding.", NULL)                                         \
    X(active, v->active, "active_bytes.all.current", "active_bytes", gauge,                          \
      "Bytes in blocks in use, freed blocks still used by a stream included.", NULL)                 \
    X(reserved_unallocated, v->reserved - v->allocated, NULL, "reserved_unallocated_bytes", gauge,   \
      "Reserved bytes not in live allocations: the allocator's cache and fragmentation.",            \
      "Res-unalloc")                                                                                 \
    X(peak_allocated, v->peak_allocated, "allocated_bytes.all.peak", "peak_allocated_bytes", gauge,  \
      "Highest allocated bytes since the peak was last reset.", NULL)                                \
    X(peak_reserved, v->peak_reserved, "reserved_bytes.all.peak", "peak_reserved_bytes", gauge,      \
      "Highest reserved bytes since the peak was last reset.", "Peak res")                           \
    X(peak_requested, v->peak_requested, "requested_bytes.all.peak", "peak_requested_bytes", gauge,  \
      "Highest requested bytes since the peak was last reset.", NULL)                                \
    X(peak_active, v->peak_active, "active_bytes.all.peak", "peak_active_bytes", gauge,              \
      "Highest active bytes since the peak was last reset.", NULL)                                   \
    X(num_alloc_retries, v->num_alloc_retries, "num_alloc_retries", "retries_total", counter,        \
      "Allocations that succeeded only after freeing the cache.", "Retries")                         \
    X(num_ooms, v->num_ooms, "num_ooms", "ooms_total", counter,                                      \
      "Allocations that failed with out of memory.", "OOMs")                                         \
    X(num_allocs, v->num_allocs, "allocation.all.allocated", "allocations_total", counter,           \
      "Allocations made.", NULL)                                                                     \
    X(num_frees, v->num_frees, "allocation.all.freed", "frees_total", counter, "Allocations freed.", \
      NULL)

typedef struct gm__shm_record {
    uint32_t seq;  /* seqlock: odd while the writer is inside */
    uint32_t used; /* 1 once the device published anything */
    gm__shm_values v;
    char pad[GM__SHM_RECORD_SIZE - 8 - sizeof(gm__shm_values)];
} gm__shm_record;

/* ---- step records (version 4): what the program's step marks
 * (gm_step_mark; gpumem.torch.step_mark / mark_steps) show, one per device,
 * under their own seqlock, written at each mark and never on the allocation
 * path. The baseline a leak moves is start_allocated; cache moves
 * start_reserved - start_allocated. X(name): int64 fields in layout order.
 *   step               marks so far (steps completed)
 *   mark_ns            CLOCK_REALTIME of the last mark
 *   start_allocated    allocated bytes at the last mark: the current step's start
 *   start_reserved     reserved bytes then
 *   peak_allocated     the highest allocated bytes of the step the last mark ended
 *   largest_free_block the largest free run inside reserved memory, at walk_step
 *   walk_step          the mark whose block walk the two lines around are (-1 none;
 *                      walks are at most one per GM__SHM_WALK_EVERY_NS)
 *   category[], untagged  live bytes by gm_category at walk_step */
#define GM__SHM_STEP_FIELDS(X) \
    X(step) X(mark_ns) X(start_allocated) X(start_reserved) X(peak_allocated) X(largest_free_block) X(walk_step)

typedef struct gm__shm_step_values {
#define GM__SHM_STEP_FIELD(n) int64_t n;
    GM__SHM_STEP_FIELDS(GM__SHM_STEP_FIELD)
#undef GM__SHM_STEP_FIELD
    int64_t category[GM_CAT_COUNT];
    int64_t untagged;
} gm__shm_step_values;

typedef struct gm__shm_step {
    uint32_t seq;  /* seqlock, as a record's */
    uint32_t used; /* 1 once a mark was published */
    gm__shm_step_values v;
    char pad[GM__SHM_STEP_SIZE - 8 - sizeof(gm__shm_step_values)];
} gm__shm_step;

/* The step statistics every output shows: X(name, value over `t` (a const
 * gm__shm_step_values *), Prometheus family suffix after gpumem_process_,
 * help). Categories are one family with a `category` label. */
#define GM_MON_STEP_STATS(X)                                                                          \
    X(step, t->step, "step", "Training steps completed: the program's step marks (gm_step_mark).")   \
    X(step_start_allocated, t->start_allocated, "step_start_allocated_bytes",                        \
      "Allocated bytes at the start of the current step: growth over steps is a leak.")              \
    X(step_start_reserved, t->start_reserved, "step_start_reserved_bytes",                           \
      "Reserved bytes at the start of the current step: growth above the allocated baseline is cache.") \
    X(step_peak_allocated, t->peak_allocated, "step_peak_allocated_bytes",                           \
      "Highest allocated bytes during the last completed step.")                                     \
    X(largest_free_block, t->largest_free_block, "largest_free_block_bytes",                         \
      "Largest free block inside reserved memory at a recent step start (fragmentation).")

_Static_assert(sizeof(gm__shm_step) == GM__SHM_STEP_SIZE, "shm step record layout");
_Static_assert(sizeof(gm__shm_header) == GM__SHM_HEADER_SIZE, "shm header layout");
_Static_assert(sizeof(gm__shm_record) == GM__SHM_RECORD_SIZE, "shm record layout");
_Static_assert(offsetof(gm__shm_record, v.allocated) % 16 == 0 && offsetof(gm__shm_record, v.requested) % 16 == 0 &&
                   offsetof(gm__shm_record, v.active) % 16 == 0 && offsetof(gm__shm_record, v.num_allocs) % 16 == 0 &&
                   offsetof(gm__shm_record, v.reserved) % 16 == 0 &&
                   offsetof(gm__shm_record, v.num_alloc_retries) % 16 == 0,
               "shm record: value pairs 16-byte aligned");

/* "gpumem.<uid>." (or "gpumem-<tag>.<uid>." when GPUMEM_SHM_TAG is set, which
 * keeps concurrent test runs apart). No leading slash. */
void gm__shm_prefix(char *buf, size_t len);
/* The same without the uid ("gpumem." or "gpumem-<tag>."): a node agent's. */
void gm__shm_prefix_any(char *buf, size_t len);
/* Where beacons are: $GPUMEM_SHM_DIR when it is an absolute path (tests
 * plant crafted segments in a folder of their own), else /dev/shm. */
const char *gm__shm_dir(void);
/* The /proc the monitor reads: $GPUMEM_PROC_ROOT when it is an absolute
 * path (tests plant a fake one; a reader in a container may be given the
 * host's, mounted elsewhere), else /proc. Publication's own
 * /proc/self/fd/N links never move. */
const char *gm__proc_root(void);
/* <root>/<pid>/<what>, or <root>/self/<what> for pid 0. */
void gm__proc_path(char *buf, size_t len, int pid, const char *what);
/* Open a /proc file to read (identity.c): only a regular file, and never a
 * wait for one (O_NONBLOCK, then fstat): a FIFO planted under
 * GPUMEM_PROC_ROOT used to hang smi and the exporter's sampler). NULL (errno
 * set) for anything else. */
FILE *gm__proc_fopen(const char *path);
/* Start time of pid (field 22 of /proc/<pid>/stat; pid 0: this process).
 * GM_EIO if the process is gone or a zombie. */
int gm__proc_start_time(int pid, uint64_t *out);
/* /proc/<pid>/comm without the newline ("" if unreadable; pid 0: this process). */
void gm__proc_comm(int pid, char *buf, size_t len);
/* Inode of /proc/<pid>/ns/pid (pid 0: this process), read from the link's
 * text "pid:[N]"; 0 if unreadable or malformed. */
uint64_t gm__proc_pidns(int pid);
/* The initial PID namespace's inode (PROC_PID_INIT_INO, fixed since Linux
 * 3.8): the namespace NVML's pids are in on drivers that do not translate. */
#define GM__PIDNS_INIT_INO 0xEFFFFFFCull
/* NSpid levels the monitor reads (the kernel nests at most 32). */
#define GM__NSPID_MAX 33
/* The NSpid line of /proc/<pid>/status (pid 0: this process): the pid in
 * each PID namespace from the one /proc belongs to inwards, outermost
 * first. How many (at most max); 0 if unreadable or malformed. */
int gm__proc_nspid(int pid, int *ids, int max);
/* true when the /proc read shows the initial PID namespace: its pid 1's
 * namespace is the initial one, or (not allowed to look, as non-root) this
 * process's own namespace is. Its pids are then NVML's. */
bool gm__procfs_is_init(void);
/* This process's pid in the initial PID namespace, when it can know it
 * exactly (its /proc shows that namespace: the first NSpid), else 0. */
int gm__host_pid_self(void);
/* The pid, as this process sees it, of the process that is `ns_pid` in the
 * PID namespace with inode `pidns` (the last NSpid of /proc/<pid>/status).
 * 0 when no process here matches (a sibling container's, or gone). */
int gm__pid_from_ns(uint64_t pidns, int ns_pid);
/* Fill the identity fields of a header (GM_MON_IDENTITY) from this
 * process's environment, cgroup and host name (identity.c). The run id is
 * never guessed from a label: `gpumem run --label L` sets GPUMEM_RUN_ID. */
void gm__identity_fill(gm__shm_header *h);

/* ---- the writer (publish.c): an allocator's publisher is the core's
 * statistics sink (gm__sink in src/core/internal.h), set by
 * gm_allocator_publish. */
typedef struct gm__publisher gm__publisher;
void gm__publisher_update(gm__publisher *p, int device, const gm_stats *s);
void gm__publisher_set_total(gm__publisher *p, int device, uint64_t total);
/* A step mark on `device` (device lock held): the step record's counts. */
void gm__publisher_step(gm__publisher *p, int device, const gm_stats *s);
/* After the marks, no lock held: the block walk, at most once per
 * GM__SHM_WALK_EVERY_NS. */
void gm__publisher_step_walk(gm__publisher *p, gm_allocator *a, int device);
void gm__publisher_close(gm__publisher *p);
/* Called once by gm_allocator_create: publish if GPUMEM_PUBLISH=1. */
int gm__publish_from_env(gm_allocator *a);
/* The allocator's publisher (NULL unless publishing), and its mapped header. */
gm__publisher *gm__allocator_publisher(gm_allocator *a);
gm__shm_header *gm__publisher_header(gm__publisher *p);

/* Copy a record under its seqlock: GM_OK, or GM_ESTATE if still torn after
 * `max_tries` attempts (a writer stopped or killed inside its update). */
int gm__shm_read_record(const gm__shm_record *r, gm__shm_values *out, int max_tries);
int gm__shm_read_step(const gm__shm_step *r, gm__shm_step_values *out, int max_tries);
/* The same, then, while still torn, up to wait_ms more in 0.1 ms sleeps
 * (each counted in gm__shm_read_waits), each followed by a few tries: a
 * reader's first copy of a record has no earlier one to fall back on, and a
 * writer preempted inside its update made that first sample blank. */
int gm__shm_read_record_wait(const gm__shm_record *r, gm__shm_values *out, int max_tries, int wait_ms);
extern unsigned long gm__shm_read_waits;

/* ---- discovery (discover.c) -------------------------------------------- */

/* The identity of a process as readers keep it (GM_MON_IDENTITY). */
typedef struct gm__mon_ident {
#define GM__IDENT_STR(n) char n[sizeof(((gm__shm_header *)0)->n)];
#define GM__IDENT_INT(n) int n;
#define GM__IDENT_FIELD(name, kind, help) GM__IDENT_##kind(name)
    GM_MON_IDENTITY(GM__IDENT_FIELD)
#undef GM__IDENT_FIELD
#undef GM__IDENT_STR
#undef GM__IDENT_INT
} gm__mon_ident;

/* No identity: empty strings, -1 integers (a process seen by NVML only). */
void gm__ident_unknown(gm__mon_ident *id);

typedef struct gm__mon_proc {
    char shm_name[256];
    uint32_t uid; /* the publisher's user (the beacon's owner, its name's and its header's) */
    int pid;    /* as this reader sees it (mapped through the PID namespaces) */
    int ns_pid; /* as the publisher sees itself (its own PID namespace) */
    int host_pid; /* in the initial PID namespace as the publisher knew it, 0 unknown */
    gm__mon_ident id;
    uint32_t source;
    uint64_t start_time;
    char comm[32];
    char label[128];
    char visible[256];
    uint32_t ndevices;
    bool used[GM__SHM_DEVICES];
    bool torn[GM__SHM_DEVICES]; /* record never settled: values unknown */
    bool held[GM__SHM_DEVICES]; /* record kept changing: v is the last good read (cached scans) */
    gm__shm_values v[GM__SHM_DEVICES];
    bool have_step[GM__SHM_DEVICES]; /* a step record was published and read */
    gm__shm_step_values step[GM__SHM_DEVICES];
} gm__mon_proc;

/* Why a segment was skipped: X(name, Prometheus reason label). */
#define GM__SKIP_REASONS(X)                                                           \
    X(OPEN, "open")       /* could not be opened (gone, a link: O_NOFOLLOW) */       \
    X(TYPE, "type")       /* not a regular file (a FIFO, a socket, a device) */      \
    X(OWNER, "owner")     /* owner, name and header disagree on the user */          \
    X(MODE, "mode")       /* not mode 0600 as publishers make them */                \
    X(SHORT, "short")     /* shorter than a header (truncated) */                    \
    X(HEADER, "header")   /* magic, version, sizes or counts not as written */       \
    X(DATA, "data")       /* the data is no sealed memfd of the same user and nonce */ \
    X(LIMIT, "limit")     /* beyond GM__SHM_SCAN_MAX beacons in one scan */
enum {
#define GM__SKIP_ENUM(n, s) GM__SKIP_##n,
    GM__SKIP_REASONS(GM__SKIP_ENUM)
#undef GM__SKIP_ENUM
    GM__SKIP_COUNT
};

typedef struct gm__scan_result {
    gm__mon_proc *procs;
    int nprocs;
    int cleaned; /* segments of dead producers removed by this scan */
    int skipped; /* segments that were unreadable, foreign or still initialising */
    int skipped_by[GM__SKIP_COUNT]; /* the same by reason (GM__SKIP_REASONS) */
    int unreachable; /* live segments whose process this reader cannot see (another container) */
} gm__scan_result;

/* Read every segment of this user. Segments of dead producers (nobody holds
 * the beacon's lock) are unlinked when `clean` is set, and never reported. */
int gm__shm_scan(gm__scan_result *out, bool clean);
/* The same, keeping segments mapped between scans (what a sampling monitor
 * wants: no mmap/munmap per segment and sample). */
typedef struct gm__shm_cache gm__shm_cache;
gm__shm_cache *gm__shm_cache_create(void);
void gm__shm_cache_destroy(gm__shm_cache *c);
int gm__shm_scan_cached(gm__shm_cache *c, gm__scan_result *out, bool clean);
/* Node mode (a node agent: root, or a pod with hostIPC and hostPID): the
 * cache's scans read every user's beacons, each verified against its owner
 * (the uid in its name, the file's owner, the header's uid and the data's
 * owner must agree), and unlink only stale beacons of the reader's own uid. */
void gm__shm_cache_all_users(gm__shm_cache *c, bool on);
void gm__scan_result_free(gm__scan_result *r);

/* ---- NVML (nvml.c) ------------------------------------------------------ */

/* The NVML entry points gpumem uses, loaded with dlopen("libnvidia-ml.so.1")
 * or replaced by tests. Return values are nvmlReturn_t (0 = success). A NULL
 * entry means the symbol is absent. Pointers to NVML structs are void *. */
typedef struct gm__nvml_fns {
    int (*init)(void);
    int (*shutdown)(void);
    int (*driver_version)(char *buf, unsigned len);
    int (*device_count)(unsigned *count);
    int (*device_handle)(unsigned index, void **dev);
    int (*device_name)(void *dev, char *buf, unsigned len);
    int (*device_uuid)(void *dev, char *buf, unsigned len);
    int (*device_pci)(void *dev, void *pci_info);     /* nvmlDeviceGetPciInfo_v3 */
    int (*memory_v2)(void *dev, void *mem);           /* nvmlDeviceGetMemoryInfo_v2 */
    int (*memory_v1)(void *dev, void *mem);           /* nvmlDeviceGetMemoryInfo */
    int (*utilization)(void *dev, void *util);        /* nvmlDeviceGetUtilizationRates */
    int (*procs_v3)(void *dev, unsigned *count, void *infos); /* ..._v3 */
    int (*procs_v1)(void *dev, unsigned *count, void *infos); /* nvmlDeviceGetComputeRunningProcesses */
} gm__nvml_fns;

#define GM__NVML_MEMORY_V2_VERSION 0x02000028u /* sizeof(nvmlMemory_v2_t) | 2 << 24 */
#define GM__NVML_NOT_AVAILABLE UINT64_MAX         /* NVML_VALUE_NOT_AVAILABLE */

typedef struct gm__nvml gm__nvml;

typedef struct gm__mon_dev {
    int index;
    bool have_info; /* name, uuid, pci */
    char name[96], uuid[96], pci_bus_id[32];
    bool have_mem, have_reserved; /* have_reserved false with the v1 fallback */
    bool have_alloc_total;        /* no NVML: total from the allocators' backends */
    uint64_t total, reserved, used, free;
    bool have_util;
    uint32_t util_gpu, util_mem;
} gm__mon_dev;

typedef struct gm__nvml_proc {
    int pid;
    bool have_used;
    uint64_t used;
} gm__nvml_proc;

/* fns == NULL: load libnvidia-ml.so.1. Without it returns GM_ENODRIVER and
 * says why in `why`. */
int gm__nvml_open(gm__nvml **out, const gm__nvml_fns *fns, char *why, size_t whylen);
void gm__nvml_close(gm__nvml *n);
int gm__nvml_device_count(gm__nvml *n, int *count);
int gm__nvml_device(gm__nvml *n, int index, gm__mon_dev *out);
/* *out is malloc'd (free it). */
int gm__nvml_processes(gm__nvml *n, int index, gm__nvml_proc **out, int *count);
/* true once GetMemoryInfo_v2 was unavailable and v1 was used instead */
bool gm__nvml_mem_v1_fallback(const gm__nvml *n);
/* bytes per record of GetComputeRunningProcesses_v3 in use: 24 or 32 */
int gm__nvml_proc_record_size(const gm__nvml *n);

/* ---- collector (collect.c) ---------------------------------------------- */

/* How a row's pid and NVML's (host) pid are known to be one process
 * (pidmap.c has the rules; docs/monitoring.md, "Inside containers"). */
enum {
    GM_PIDMAP_NONE,     /* host pid unknown: no NVML row joined, and no way to know it */
    GM_PIDMAP_EXACT,    /* by the kernel's own numbers (NSpid, the initial namespace) */
    GM_PIDMAP_INFERRED, /* by the only plausible match (reader inside a PID namespace) */
    GM_PIDMAP_UNMAPPED, /* an NVML-only row seen from inside a PID namespace: pid is NVML's */
};
const char *gm__pidmap_name(int how); /* "exact", "inferred", "unmapped", NULL */

/* One row per (process, GPU): the allocator's numbers from shared memory
 * and/or NVML's used memory. */
typedef struct gm__mon_row {
    int pid;    /* as this reader sees it (NVML's number on an NVML-only row) */
    int ns_pid; /* the publisher's own view of its pid; == pid outside containers, 0 unknown */
    int host_pid; /* in the initial PID namespace (NVML's), 0 unknown */
    int pid_map;  /* GM_PIDMAP_*: how host_pid is known */
    int device;
    gm__mon_ident id; /* empty strings and -1 when unknown (NVML-only rows) */
    uint32_t source; /* 0: seen by NVML only */
    char comm[32];
    char label[128];
    bool have_alloc, torn, held; /* held: the record kept changing; v is its last good read */
    gm__shm_values v;
    bool have_nvml_used;
    uint64_t nvml_used;
    bool have_uid; /* published rows: the publisher's user */
    uint32_t uid;
    bool have_step; /* the device's step record (gm_step_mark) */
    gm__shm_step_values step;
} gm__mon_row;

typedef struct gm__mon_sample {
    uint64_t time_ns; /* CLOCK_REALTIME */
    bool nvml;        /* NVML loaded and initialised */
    bool nvml_mem_v1;
    char nvml_note[192]; /* why NVML is absent, or the fallback in use */
    int ndevices;
    gm__mon_dev *devs;
    int nrows;
    gm__mon_row *rows;
    int nproducers, cleaned;
    int skipped_by[GM__SKIP_COUNT]; /* segments skipped, by reason */
    bool all_users; /* node mode: every user's segments */
    char hostname[64]; /* this node: $NODE_NAME (Kubernetes' downward API), else gethostname() */
    bool host_view; /* the /proc read is the initial PID namespace's: every pid is exact */
} gm__mon_sample;

/* ---- NVML's pids and the published rows (pidmap.c) ------------------------
 * For one device: which row (index into rows, or -1) each of NVML's n
 * processes is, and how it is known (GM_PIDMAP_*). host_view: the reader's
 * /proc is the initial namespace's, so NVML's pids are its own (exact).
 * Only rows of `device` that publish (source != 0) and have no NVML figure
 * yet are candidates. */
void gm__pidmap_match(const gm__mon_row *rows, int nrows, int device, const gm__nvml_proc *np, int n,
                      bool host_view, int *row_of, int *how);

typedef struct gm__collector gm__collector;

/* nvml_fns: NULL = the real library; use gm__collector_create_nonvml for none */
int gm__collector_create(gm__collector **out, const gm__nvml_fns *nvml_fns, bool try_nvml);
void gm__collector_destroy(gm__collector *c);
/* Node mode (gm__shm_cache_all_users) for every later sample. */
void gm__collector_all_users(gm__collector *c, bool on);
int gm__collector_sample(gm__collector *c, gm__mon_sample *out);
void gm__sample_free(gm__mon_sample *s);
int gm__sample_copy(gm__mon_sample *dst, const gm__mon_sample *src);

/* A thread that samples every interval_s and keeps the latest sample. */
typedef struct gm__sampler gm__sampler;
int gm__sampler_start(gm__sampler **out, gm__collector *c, double interval_s);
/* Copy of the latest sample and its sequence number (0 = none yet). If
 * `after` is given, first wait up to timeout_s for a sample newer than it. */
int gm__sampler_latest(gm__sampler *s, gm__mon_sample *out, uint64_t *seqno, uint64_t after, double timeout_s);
void gm__sampler_stop(gm__sampler *s);
/* Ask the sampler to stop and wake everyone waiting in gm__sampler_latest
 * (they return at once); then wait at most `seconds` for its thread. true
 * when it stopped and was freed; false when it is still inside a sample:
 * then it is left running, and the caller must keep the collector alive
 * (the exporter exits anyway, so SIGTERM is served within a second). */
bool gm__sampler_stop_within(gm__sampler *s, double seconds);

/* ---- output (format.c) -------------------------------------------------- */

typedef struct gm__sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} gm__sbuf;
void gm__sbuf_printf(gm__sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gm__sbuf_free(gm__sbuf *b);

void gm__format_json(const gm__mon_sample *s, gm__sbuf *b, bool one_line);
void gm__format_csv_header(gm__sbuf *b);
void gm__format_csv(const gm__mon_sample *s, gm__sbuf *b);
/* A label for a table cell (smi, top): valid UTF-8 cut on a character
 * boundary to fit len, controls as '?' so the row stays one line. */
void gm__format_printable(char *dst, const char *src, size_t len);
void gm__format_table(const gm__mon_sample *s, gm__sbuf *b);
void gm__format_prometheus(const gm__mon_sample *s, gm__sbuf *b);
/* A row's PID cell: the pid, "?" after it when joined to NVML by inference,
 * "^" when it is NVML's number, unmapped (gpumem smi and top). */
const char *gm__format_pid(const gm__mon_row *r, char *buf, size_t len);
/* The lines explaining those marks, when a row carries one. */
void gm__format_pid_note(const gm__mon_sample *s, gm__sbuf *b);

/* ---- the exporter's request targets (http_route.c) ------------------------ */

enum { GM_HTTP_INDEX, GM_HTTP_METRICS, GM_HTTP_NOT_FOUND, GM_HTTP_BAD_METHOD };
/* Percent-decode s in place (never longer); %00 and malformed escapes are
 * left as written, so no request target can smuggle a NUL. New length. */
size_t gm__http_unescape(char *s);
/* The page for a method and a decoded path: exact matches only. */
int gm__http_route(const char *method, const char *path);
/* Prometheus label value escaping: backslash, double quote, newline. */
void gm__prom_escape(gm__sbuf *b, const char *s);

/* ---- OOM forensics (oom_report.c) ----------------------------------------- */

enum { GM_OOM_CAPACITY, GM_OOM_FRAGMENTATION, GM_OOM_OUTSIDE };
typedef struct gm__oom_facts {
    int device;
    uint64_t requested, device_total, device_free;
    int64_t allocated, reserved;
    bool have_blocks; /* the walk below worked */
    uint64_t largest_free_block;
    int64_t by_category[GM_CAT_COUNT], untagged; /* live bytes */
    int policy;
    bool expandable;
} gm__oom_facts;
/* The facts of an OOM on `device` of `size` bytes, through the public API
 * (call with no allocator lock held). */
int gm__oom_gather(gm_allocator *a, int device, uint64_t size, gm__oom_facts *f);
/* GM_OOM_*; the predicted saving of the fix and the shortfall beyond free
 * and cached memory (oom_report.c's top comment has the rules). */
int gm__oom_verdict(const gm__oom_facts *f, uint64_t *saving, uint64_t *shortfall);
const char *gm__oom_verdict_name(int verdict);
/* The text report; `who` holds pid, comm and the identity fields. */
void gm__oom_report_text(const gm__oom_facts *f, const gm__shm_header *who, const char *detail, const char *snapshot,
                         gm__sbuf *b);
/* The allocation history as torch memory snapshot bytes, malloc'd
 * (gm__history_snapshot_bytes, from the report layer: the caller above both
 * lends it, so monitor needs no report). */
typedef int (*gm__snapshot_fn)(uint8_t **out, size_t *len);
/* Write <dir>/gpumem-oom-<pid>-<n>-<random>.txt (+ .pickle when history is
 * on and snapshot is given), as new files only (oom_report.c: files); path
 * gets the report's path ("" once GM_OOM_REPORTS_MAX were written or when
 * it could not be written: GM_EIO, the detail says why), snap_note why the
 * snapshot was not written ("" when it was, or none was asked for). */
int gm__oom_report_write(gm_allocator *a, int device, uint64_t size, const char *dir, const char *detail,
                         gm__snapshot_fn snapshot, char *path, size_t len, char *snap_note, size_t note_len);
/* With GPUMEM_OOM_REPORT=DIR: make DIR and record allocation history (for
 * the snapshot). Call once when the allocator is made. */
int gm__oom_report_setup(void);
/* With GPUMEM_OOM_REPORT=DIR: the report of this OOM, its path on stderr,
 * or one line there saying what was not written and why. */
void gm__oom_report_from_env(gm_allocator *a, int device, uint64_t size, const char *detail,
                             gm__snapshot_fn snapshot);

#endif /* GPUMEM_MONITOR_H */
