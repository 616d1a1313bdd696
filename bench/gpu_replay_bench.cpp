// gpu_replay_bench.cpp — on the GPU, replay the alloc/free stream of real
// traces through gpumem (torch and gpumem policies, cuda backend, real device
// memory) and through PyTorch's own caching allocator driven from C++
// (raw_alloc_with_stream / raw_delete, no Python per call), in one process.
// For each allocator: a cold pass from an empty allocator (every device call
// included) and a warm pass right after (a training loop's steady state),
// with ns per operation (median, p99, mean) and peak reserved / requested.
//
// Built by tests/gpu/run_gpu.sh on the GPU machine, not by CMake here (no
// torch, no CUDA). Without -DWITH_TORCH only the gpumem rows are measured.
// Input: event files from bench/trace_to_events.py.
//
//   gpu_replay_bench [--reps N] [--backend cuda|sim] [--alloc LIST] [--timeout S] [--pin CPU]
//                    [--bulk N] [--perf] [--pair N] [--loop] EVENTS.bin...
//
// prints one "RESULT {json}" line per row, one "BULK {json}" line per
// allocator (a third pass timed as a whole: mean ns/op without per-op clock reads),
// one "CALLS {json}" line per gpumem pass (device calls by kind: [count, us inside]), and a "PROGRESS ..." line (flushed)
// before each phase, so a hang shows where it happened. --alloc picks the
// allocators, comma separated: torch-native, gpumem-torch, gpumem-gpumem
// (default: all built in), and gpumem-run / gpumem-granule (the gpumem policy
// with gpumem_chunks:run / :granule instead of its default auto) and
// gpumem-slack0 (gpumem_slack:0, the least-memory setting); only when named,
// so default runs keep their rows. --backend sim replays on the simulated device (a
// CPU check of the exact code path the GPU run takes; timings mean little).
// --timeout S: after S seconds print where the replay is (trace, allocator,
// pass, event index) and a native stack, then exit 124: a hang loses one
// run, not the whole benchmark, and leaves a trail to debug it.
// --bulk N: N untimed passes per allocator instead of one, a BULK line each
// (does a slow pass stay slow for the allocator's lifetime, or come and go?).
// --pair N: instead of the rows above, the default gpumem policy against torch
// native in alternating untimed passes, N rounds, one "PAIR {json}" line each
// (see run_pair). --loop: those passes replay the trace's steady loop
// (bench/steady_loop.h) instead of the whole trace, as a training loop runs.
// --perf: each BULK line also gets the replay thread's user-space counters
// over that pass (cycles, instructions, cache and dTLB misses, page faults,
// context switches, CPU migrations: perf_event_open, each where the kernel
// offers it; the H200 hosts offer only the software ones). Every BULK line
// names the CPU the pass ended on.
#include "gpumem/backend.h"
#include "gpumem/gpumem.h"
#include "steady_loop.h"

#ifdef WITH_TORCH
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <chrono>
#include <csignal>
#include <execinfo.h>
#include <pthread.h>
#include <sched.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct Ev {
    uint32_t op, slot;
    uint64_t size;
};

struct Trace {
    std::string name;
    std::vector<Ev> ev;
    uint64_t slots = 0;
};

static bool load(const char *path, Trace &t) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return false;
    }
    char magic[8];
    uint64_t hdr[2];
    bool ok = fread(magic, 1, 8, f) == 8 && memcmp(magic, "GMEV0001", 8) == 0 && fread(hdr, 8, 2, f) == 2;
    if (ok) {
        t.ev.resize(hdr[0]);
        t.slots = hdr[1];
        ok = fread(t.ev.data(), sizeof(Ev), hdr[0], f) == hdr[0];
    }
    fclose(f);
    if (!ok) fprintf(stderr, "%s: not a GMEV0001 event file (bench/trace_to_events.py makes them)\n", path);
    std::string p = path;
    size_t s = p.find_last_of('/');
    t.name = s == std::string::npos ? p : p.substr(s + 1);
    return ok;
}

// ---- where the replay is, for the watchdog (written outside timed calls) ----
static volatile uint64_t g_event_index;
static volatile const char *g_phase = "start";
static char g_phase_buf[4][256];
static volatile int g_phase_slot;

static void progress(const char *trace, const char *alloc, const char *what) {
    int k = (g_phase_slot + 1) & 3;
    snprintf(g_phase_buf[k], sizeof g_phase_buf[k], "%s %s %s", trace, alloc, what);
    g_phase = g_phase_buf[k];
    g_phase_slot = k;
    g_event_index = 0;
    printf("PROGRESS %s\n", g_phase_buf[k]);
    fflush(stdout);
}

static void write_str(const char *s) {
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

// SIGALRM: report the phase and event, dump this thread's stack, exit 124.
static void on_alarm(int) {
    char num[32];
    int n = 0;
    uint64_t v = g_event_index;
    char tmp[32];
    do tmp[n++] = (char)('0' + v % 10); while ((v /= 10) && n < 30);
    for (int i = 0; i < n; i++) num[i] = tmp[n - 1 - i];
    num[n] = 0;
    write_str("\nWATCHDOG timeout in phase: ");
    write_str((const char *)g_phase);
    write_str(", at event index ");
    write_str(num);
    write_str("\nWATCHDOG native stack:\n");
    void *frames[64];
    int nf = backtrace(frames, 64);
    backtrace_symbols_fd(frames, nf, 2);
    write_str("WATCHDOG end\n");
    _exit(124);
}

static inline uint64_t now_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

struct Row {
    double median = 0, p99 = 0, mean = 0, max = 0;
    uint64_t ops = 0, fails = 0;
};

// One pass over the events; alloc(size) returns 0 on failure. Frees of slots
// whose alloc failed are skipped. Blocks still live at the end are freed
// untimed, so the next pass starts from the same state. PerOp: each operation
// timed on its own (median, p99, mean, max); otherwise the pass is timed as a
// whole and only the mean is set: without the ~20-40 ns a clock read adds to
// every per-operation sample, for both allocators alike.
// keep: the blocks live between passes (--loop): the pass starts from them
// and leaves its own live, nothing is freed at its end.
template <bool PerOp, class A, class F>
static Row pass(const Trace &t, A alloc, F release, std::vector<uint64_t> *keep = nullptr) {
    std::vector<uint64_t> own;
    if (!keep) own.assign(t.slots, 0);
    std::vector<uint64_t> &ptr = keep ? *keep : own;
    std::vector<uint32_t> ns;
    if (PerOp) ns.reserve(t.ev.size());
    Row r;
    uint64_t idx = 0, start = now_ns();
    for (const Ev &e : t.ev) {
        g_event_index = idx++;
        if (e.slot >= t.slots) continue;
        uint64_t t0 = PerOp ? now_ns() : 0;
        if (e.op == 0) {
            uint64_t p = alloc(e.size);
            if (!p && e.size) r.fails++;
            ptr[e.slot] = p;
        } else if (ptr[e.slot]) {
            release(ptr[e.slot]);
            ptr[e.slot] = 0;
        } else {
            continue; /* the free of a failed alloc */
        }
        r.ops++;
        if (PerOp) ns.push_back((uint32_t)std::min<uint64_t>(now_ns() - t0, UINT32_MAX));
    }
    uint64_t total = now_ns() - start;
    for (uint64_t &p : own)
        if (p) release(p), p = 0;
    if (!r.ops) return r;
    if (!PerOp) {
        r.mean = (double)total / r.ops;
        return r;
    }
    double sum = 0;
    for (uint32_t v : ns) sum += v;
    r.mean = sum / ns.size();
    r.max = *std::max_element(ns.begin(), ns.end());
    size_t mid = ns.size() / 2, p99 = std::min(ns.size() - 1, (size_t)(ns.size() * 0.99));
    std::nth_element(ns.begin(), ns.begin() + mid, ns.end());
    r.median = ns[mid];
    std::nth_element(ns.begin(), ns.begin() + p99, ns.end());
    r.p99 = ns[p99];
    return r;
}

// --perf: this thread's user-space counters, read around each BULK pass.
static bool g_perf = false;
static int g_bulk = 1;
struct Perf {
    struct Counter {
        const char *name;
        uint32_t type;
        uint64_t config;
        int fd;
    };
    Counter c[7] = {
        {"cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, -1},
        {"instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, -1},
        {"cache_misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES, -1},
        {"dtlb_misses", PERF_TYPE_HW_CACHE,
         PERF_COUNT_HW_CACHE_DTLB | (PERF_COUNT_HW_CACHE_OP_READ << 8) | (PERF_COUNT_HW_CACHE_RESULT_MISS << 16), -1},
        {"page_faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, -1},
        {"ctx_switches", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES, -1},
        {"migrations", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_MIGRATIONS, -1},
    };
    void open_all() {
        for (Counter &k : c) {
            perf_event_attr a;
            memset(&a, 0, sizeof a);
            a.size = sizeof a;
            a.type = k.type;
            a.config = k.config;
            a.disabled = 1;
            a.exclude_kernel = 1;
            a.exclude_hv = 1;
            k.fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
            if (k.fd < 0) fprintf(stderr, "perf_event_open(%s): %s\n", k.name, strerror(errno));
        }
    }
    void start() {
        for (Counter &k : c)
            if (k.fd >= 0) ioctl(k.fd, PERF_EVENT_IOC_RESET, 0), ioctl(k.fd, PERF_EVENT_IOC_ENABLE, 0);
    }
    // ", \"cycles\": n, ..." for the counters that opened
    std::string stop() {
        std::string out;
        char buf[64];
        for (Counter &k : c) {
            if (k.fd < 0) continue;
            ioctl(k.fd, PERF_EVENT_IOC_DISABLE, 0);
            uint64_t v = 0;
            if (read(k.fd, &v, sizeof v) != (ssize_t)sizeof v) continue;
            snprintf(buf, sizeof buf, ", \"%s\": %" PRIu64, k.name, v);
            out += buf;
        }
        return out;
    }
    ~Perf() {
        for (Counter &k : c)
            if (k.fd >= 0) close(k.fd);
    }
};

// g_bulk untimed passes, one BULK line each.
template <class A, class F> static void bulk_passes(const Trace &t, const char *alloc, A al, F fr) {
    Perf perf;
    if (g_perf) perf.open_all();
    for (int i = 0; i < g_bulk; i++) {
        perf.start();
        double mean = pass<false>(t, al, fr).mean;
        std::string counters = g_perf ? perf.stop() : "";
        printf("BULK {\"trace\": \"%s\", \"allocator\": \"%s\", \"ns_mean_untimed\": %.1f, \"cpu\": %d%s}\n",
               t.name.c_str(), alloc, mean, sched_getcpu(), counters.c_str());
        fflush(stdout);
    }
}

static void report(const Trace &t, const char *alloc, const char *which, const Row &r, uint64_t peak_reserved,
                   uint64_t peak_requested) {
    printf("RESULT {\"trace\": \"%s\", \"allocator\": \"%s\", \"pass\": \"%s\", \"ops\": %" PRIu64
           ", \"fails\": %" PRIu64 ", \"ns_median\": %.0f, \"ns_p99\": %.0f, \"ns_mean\": %.1f, \"ns_max\": %.0f, "
           "\"peak_reserved\": %" PRIu64 ", \"peak_requested\": %" PRIu64 "}\n",
           t.name.c_str(), alloc, which, r.ops, r.fails, r.median, r.p99, r.mean, r.max, peak_reserved,
           peak_requested);
    fflush(stdout);
}

// Device calls a pass made, by kind: count and time inside the backend's op
// (from gm_backend_call_count / gm_backend_call_ns before and after).
struct CallSnap {
    uint64_t n[GM_BCALL_COUNT], ns[GM_BCALL_COUNT];
};
static CallSnap snap_calls(gm_backend *b) {
    CallSnap c;
    for (int k = 0; k < GM_BCALL_COUNT; k++) {
        c.n[k] = gm_backend_call_count(b, 0, k);
        c.ns[k] = gm_backend_call_ns(b, 0, k);
    }
    return c;
}
static void report_calls(const Trace &t, const char *alloc, const char *which, const CallSnap &a,
                         const CallSnap &z) {
    printf("CALLS {\"trace\": \"%s\", \"allocator\": \"%s\", \"pass\": \"%s\", \"calls\": {", t.name.c_str(),
           alloc, which);
    bool first = true;
    for (int k = 0; k < GM_BCALL_COUNT; k++) {
        if (z.n[k] == a.n[k]) continue;
        printf("%s\"%s\": [%" PRIu64 ", %.1f]", first ? "" : ", ", gm_bcall_name(k), z.n[k] - a.n[k],
               (z.ns[k] - a.ns[k]) / 1000.0);
        first = false;
    }
    printf("}}\n");
    fflush(stdout);
}

// An allocator with config `conf` on b, or NULL (said on stderr).
static gm_allocator *make_gpumem(gm_backend *b, const char *conf) {
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256] = "";
    if (gm_config_parse(&cfg, conf, err, sizeof err) != GM_OK) {
        fprintf(stderr, "config %s: %s\n", conf, err);
        return nullptr;
    }
    gm_allocator *a = nullptr;
    int st = gm_allocator_create(&a, b, &cfg);
    if (st != GM_OK) {
        fprintf(stderr, "gm_allocator_create(%s): %s %s\n", conf, gm_status_name(st), gm_last_error_detail());
        return nullptr;
    }
    return a;
}

static uint64_t gpumem_alloc(gm_allocator *a, uint64_t size) {
    gm_devptr p = 0;
    return gm_malloc(a, 0, size, 0, &p) == GM_OK ? p : 0;
}

static int run_gpumem(gm_backend *b, const Trace &t, const char *conf, const char *label) {
    gm_allocator *a = make_gpumem(b, conf);
    if (!a) return 1;
    auto al = [a](uint64_t size) { return gpumem_alloc(a, size); };
    auto fr = [a](uint64_t p) { gm_free(a, p); };
    for (int which = 0; which < 2; which++) {
        progress(t.name.c_str(), label, which ? "warm" : "cold");
        gm_reset_peak_stats(a, 0);
        CallSnap c0 = snap_calls(b);
        Row r = pass<true>(t, al, fr);
        report_calls(t, label, which ? "warm" : "cold", c0, snap_calls(b));
        gm_stats s{};
        s.size = sizeof s;
        memset(&s, 0, sizeof s);
        s.size = sizeof s;
        gm_get_stats(a, 0, &s);
        report(t, label, which ? "warm" : "cold", r, (uint64_t)s.reserved_bytes[GM_POOL_ALL].peak,
               (uint64_t)s.requested_bytes[GM_POOL_ALL].peak);
        if (r.fails) fprintf(stderr, "%s %s: %" PRIu64 " allocations failed: %s\n", t.name.c_str(), label,
                             r.fails, gm_last_error_detail());
    }
    progress(t.name.c_str(), label, "bulk");
    CallSnap c0 = snap_calls(b);
    bulk_passes(t, label, al, fr);
    report_calls(t, label, "bulk", c0, snap_calls(b));
    progress(t.name.c_str(), label, "check");
    char cerr[512] = "";
    int bad = gm_check(a, 0, cerr, sizeof cerr) != GM_OK;
    if (bad) fprintf(stderr, "%s %s: gm_check FAILED: %s\n", t.name.c_str(), label, cerr);
    progress(t.name.c_str(), label, "destroy");
    gm_allocator_destroy(a);
    return bad;
}

#ifdef WITH_TORCH
namespace cca = c10::cuda::CUDACachingAllocator;

// torch native, driven like gpumem: 0 on failure
static uint64_t torch_alloc(uint64_t size) {
    try {
        return (uint64_t)(uintptr_t)cca::raw_alloc_with_stream((size_t)size, nullptr);
    } catch (...) {
        return 0;
    }
}
static void torch_free(uint64_t p) { cca::raw_delete((void *)(uintptr_t)p); }

static void run_torch(const Trace &t) {
    progress(t.name.c_str(), "torch-native", "empty_cache");
    cca::emptyCache();
    auto al = torch_alloc;
    auto fr = torch_free;
    for (int which = 0; which < 2; which++) {
        progress(t.name.c_str(), "torch-native", which ? "warm" : "cold");
        cca::resetPeakStats(0);
        Row r = pass<true>(t, al, fr);
        auto s = cca::getDeviceStats(0);
        report(t, "torch-native", which ? "warm" : "cold", r, (uint64_t)s.reserved_bytes[0].peak,
               (uint64_t)s.requested_bytes[0].peak);
    }
    progress(t.name.c_str(), "torch-native", "bulk");
    bulk_passes(t, "torch-native", al, fr);
    cca::emptyCache();
}

// --pair N: gpumem (default policy) and torch native alive side by side in this
// process; after a cold and a warm pass each, N rounds of one untimed pass
// each, alternating which goes first. The ratio of a round compares two passes
// a few milliseconds apart, so whatever slows this host for a while (the other
// tenants of its cores and caches) slows both; separate processes at separate
// times do not share it.
// --loop: every pass after the first replays the trace's steady loop
// (bench/steady_loop.h) on the blocks the pass before it left live, as a
// training loop runs; the first replays the trace up to the loop's end.
struct Loop {
    Trace head, body[2]; /* head.ev empty: no loop, replay the whole trace */
};

static void make_loop(const Trace &t, Loop &l) {
    std::vector<uint32_t> slot(t.ev.size());
    std::vector<unsigned char> is_alloc(t.ev.size());
    for (size_t i = 0; i < t.ev.size(); i++) slot[i] = t.ev[i].slot, is_alloc[i] = t.ev[i].op == 0;
    bench_loop bl;
    if (bench_loop_make(t.ev.size(), slot.data(), is_alloc.data(), (uint32_t)t.slots, &bl) != 0) {
        printf("steady loop: none in %s, the whole trace is replayed\n", t.name.c_str());
        return;
    }
    l.head.name = t.name;
    l.head.slots = 2 * t.slots;
    l.head.ev.assign(t.ev.begin(), t.ev.begin() + bl.e);
    for (int q = 0; q < 2; q++) {
        l.body[q].name = t.name;
        l.body[q].slots = 2 * t.slots;
        for (size_t i = bl.s; i < bl.e; i++) l.body[q].ev.push_back({t.ev[i].op, bl.slot[q][i - bl.s], t.ev[i].size});
    }
    printf("steady loop: events %zu..%zu of %zu\n", bl.s, bl.e, t.ev.size());
    bench_loop_free(&bl);
}

// One allocator's passes: the whole trace each time, or (a loop) its head
// once and then the loop's two renamings in turn on the blocks kept live.
template <class A, class F> struct Passes {
    const Trace &t;
    const Loop &l;
    A al;
    F fr;
    std::vector<uint64_t> live;
    int parity = -1; /* -1: the head not run yet */
    Row next() {
        if (l.head.ev.empty()) return pass<false>(t, al, fr);
        if (parity < 0) {
            live.assign(l.head.slots, 0);
            parity = 1;
            return pass<false>(l.head, al, fr, &live);
        }
        Row r = pass<false>(l.body[parity], al, fr, &live);
        parity ^= 1;
        return r;
    }
    ~Passes() {
        for (uint64_t p : live)
            if (p) fr(p);
    }
};

static int run_pair(gm_backend *b, const Trace &t, int rounds, bool loop) {
    gm_allocator *a = make_gpumem(b, "policy:gpumem"); /* not NULL: the library's default is torch's model */
    if (!a) return 1;
    auto gal = [a](uint64_t size) { return gpumem_alloc(a, size); };
    auto gfr = [a](uint64_t p) { gm_free(a, p); };
    Loop l;
    if (loop) make_loop(t, l);
    cca::emptyCache();
    uint64_t fails = 0;
    {
        Passes<decltype(torch_alloc) *, decltype(torch_free) *> np{t, l, torch_alloc, torch_free, {}};
        Passes<decltype(gal), decltype(gfr)> gp{t, l, gal, gfr, {}};
        progress(t.name.c_str(), "pair", "cold+warm");
        for (int i = 0; i < 2; i++) fails += np.next().fails + gp.next().fails;
        for (int r = 0; r < rounds; r++) {
            progress(t.name.c_str(), "pair", "round");
            double n, g;
            if (r % 2 == 0) {
                n = np.next().mean;
                g = gp.next().mean;
            } else {
                g = gp.next().mean;
                n = np.next().mean;
            }
            printf("PAIR {\"trace\": \"%s\", \"round\": %d, \"native_ns\": %.1f, \"gpumem_ns\": %.1f, "
                   "\"speedup\": %.3f, \"fails\": %" PRIu64 ", \"loop\": %s}\n",
                   t.name.c_str(), r, n, g, n / g, fails, l.head.ev.empty() ? "false" : "true");
            fflush(stdout);
        }
    } /* both keep their loops' blocks until here */
    gm_allocator_destroy(a);
    cca::emptyCache();
    return fails != 0;
}
#endif

// The gpumem allocators --alloc can name, in the order they run; the last
// three only when named, so default runs keep their rows.
struct GpumemAlloc {
    const char *name, *conf;
    bool by_default;
};
static const GpumemAlloc kGpumemAllocs[] = {
    {"gpumem-torch", "policy:torch", true},
    {"gpumem-gpumem", "policy:gpumem", true},
    {"gpumem-run", "policy:gpumem,gpumem_chunks:run", false},
    {"gpumem-granule", "policy:gpumem,gpumem_chunks:granule", false},
    {"gpumem-slack0", "policy:gpumem,gpumem_slack:0", false},
};

static bool wanted(const std::string &list, const char *name) {
    if (list.empty()) return true;
    std::string l = "," + list + ",";
    return l.find("," + std::string(name) + ",") != std::string::npos;
}

static int make_backend(const char *kind, gm_backend **b) {
    if (!strcmp(kind, "sim")) {
        gm_sim_options o;
        gm_sim_options_init(&o);
        return gm_sim_create(b, &o);
    }
    return gm_cuda_create(b);
}

int main(int argc, char **argv) {
    int reps = 1, timeout = 0, pin = -1, pair = 0;
    bool loop = false;
    const char *backend = "cuda";
    std::string allocs;
    std::vector<const char *> files;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--alloc") && i + 1 < argc) allocs = argv[++i];
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) timeout = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pin") && i + 1 < argc) pin = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bulk") && i + 1 < argc) g_bulk = std::max(1, atoi(argv[++i]));
        else if (!strcmp(argv[i], "--perf")) g_perf = true;
        else if (!strcmp(argv[i], "--pair") && i + 1 < argc) pair = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--loop")) loop = true;
        else files.push_back(argv[i]);
    }
    if (files.empty() || (strcmp(backend, "cuda") && strcmp(backend, "sim"))) {
        fprintf(stderr, "usage: gpu_replay_bench [--reps N] [--backend cuda|sim] [--alloc torch-native,"
                        "gpumem-torch,gpumem-gpumem,gpumem-run,gpumem-granule,gpumem-slack0] [--timeout S] [--pin CPU] [--bulk N] [--perf] [--pair N] "
                        "[--loop] EVENTS.bin...\n");
        return 2;
    }
#ifdef PR_SET_PTRACER
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); // let gdb attach for a stack (best effort)
#endif
    if (timeout > 0) {
        signal(SIGALRM, on_alarm);
        alarm((unsigned)timeout);
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
    progress("-", backend, "backend create");
    gm_backend *b = nullptr;
    int st = make_backend(backend, &b);
    if (st != GM_OK) {
        fprintf(stderr, "creating the %s backend: %s: %s\n", backend, gm_status_name(st), gm_last_error_detail());
        return 1;
    }
    uint64_t fr = 0, tot = 0;
    {
        // create the context and the allocators' lazy state outside the timing
        gm_allocator *a = nullptr;
        if (gm_allocator_create(&a, b, nullptr) == GM_OK) {
            gm_devptr p = 0;
            if (gm_malloc(a, 0, 1 << 20, 0, &p) == GM_OK) gm_free(a, p);
            gm_mem_get_info(a, 0, &fr, &tot);
            gm_allocator_destroy(a);
        }
    }
    fprintf(stderr, "device 0 (%s): %.1f GiB free of %.1f GiB\n", backend, fr / 1073741824.0, tot / 1073741824.0);
    if (pin >= 0) {
        // this thread only, after the driver made its own threads (they keep
        // every CPU): a process-wide taskset would put them on the same core
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(pin, &set);
        int prc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
        fprintf(stderr, "replay thread pinned to CPU %d: %s\n", pin, prc ? strerror(prc) : "ok");
    }
    bool native = wanted(allocs, "torch-native") && !strcmp(backend, "cuda");
#ifdef WITH_TORCH
    if (native) {
        progress("-", "torch-native", "init");
        cca::init(c10::cuda::device_count());
        try {
            cca::raw_delete(cca::raw_alloc_with_stream(1 << 20, nullptr));
        } catch (const std::exception &e) {
            fprintf(stderr, "torch caching allocator unusable: %s\n", e.what());
            return 1;
        }
        cca::emptyCache();
    }
#else
    if (native) fprintf(stderr, "built without torch: torch-native rows are missing\n");
#endif
    int rc = 0;
    for (const char *f : files) {
        Trace t;
        progress(f, "-", "load");
        if (!load(f, t)) {
            rc = 1;
            continue;
        }
        fprintf(stderr, "%s: %zu events, %" PRIu64 " slots\n", t.name.c_str(), t.ev.size(), t.slots);
        if (pair > 0) {
#ifdef WITH_TORCH
            if (native) rc |= run_pair(b, t, pair, loop);
#endif
            if (!native) fprintf(stderr, "--pair needs torch native (a cuda build with torch)\n"), rc = 1;
            continue;
        }
        for (int r = 0; r < reps; r++) {
#ifdef WITH_TORCH
            if (native) run_torch(t);
#endif
            for (const GpumemAlloc &g : kGpumemAllocs)
                if ((g.by_default || !allocs.empty()) && wanted(allocs, g.name))
                    rc |= run_gpumem(b, t, g.conf, g.name);
        }
    }
    progress("-", backend, "backend destroy");
    gm_backend_destroy(b);
    printf("DONE rc %d\n", rc);
    return rc;
}
