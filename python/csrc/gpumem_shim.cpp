// gpumem_shim.cpp — gpumem as PyTorch's CUDA allocator in full (the module
// gpumem._C, built against the installed torch by python/setup.py).
//
// A subclass of torch's CUDAPluggableAllocator whose allocation, free,
// statistics, memory fraction, record_stream, empty_cache, history, snapshot,
// OOM observers and OOM exception all answer from libgpumem_torch.so, so that
// torch.cuda.memory_allocated(), memory_stats(), memory_summary(),
// max_memory_allocated(), reset_peak_memory_stats(),
// set_per_process_memory_fraction(), _record_memory_history()/_snapshot(),
// the profiler's memory columns and torch.OutOfMemoryError keep working.
//
// The C library is not linked: install(path) dlopens the very file the
// ctypes side (gpumem._lib) loaded and resolves its gpumem_torch_* entry
// points, so both sides see one allocator. Everything the shim adds to a
// call is behind a flag that is off unless torch's profiler records memory
// or memory history is on; otherwise an allocation is one call into the
// library, as with the plain pluggable entry points.
//
// CUDA graphs and private pools (torch.cuda.graph, torch.compile's
// reduce-overhead mode, torch.cuda.MemPool / use_mem_pool): torch hands the
// allocator a pool id and a stream filter at beginAllocateToPool; the shim
// keeps the filters of the captures under way per device and, while there
// are any, asks them for each allocation's stream and sends a match to the
// library's pool (gpumem_torch_alloc_pool); the library keeps the pools
// (src/core/mempool.c). With no capture under way an allocation pays one
// atomic load (a plain load on x86) for this.
//
// torch.cuda.MemPool(allocator=...) (e.g. NCCL's ncclMemAlloc through a
// CUDAPluggableAllocator): the library's pool gets its segments from that
// allocator's raw_alloc / raw_delete (gm_pool_options.seg_alloc), and
// gpumem places blocks in them and counts them; use_on_oom and no_split
// are the pool's options too. Not supported (fails with a message naming
// gpumem): IPC handles.
#include <torch/extension.h>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <dlfcn.h>

#include <map>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gpumem/gpumem.h"
#include "gpumem_torch.h"  // src/torch/: the entry points' declarations

namespace gpumem_shim {

namespace cca = c10::cuda::CUDACachingAllocator;
using PA = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// ---- the library's entry points (src/torch/gpumem_torch.h) ----------------

// The entry points the shim calls, by name without the gpumem_torch_ prefix;
// their types come from the header's declarations.
#define GM_SHIM_ENTRY_POINTS(X)                                               \
  X(alloc_raw) X(free_raw) X(record_stream) X(empty_cache)                    \
  X(set_memory_fraction) X(mem_get_info) X(device_count) X(reset_peak)        \
  X(reset_accumulated) X(last_error) X(get_stats) X(block) X(walk_segments)   \
  X(walk_blocks) X(config) X(note_failed_free) X(set_segment_observer)        \
  X(alloc_pool) X(pool_retain) X(pool_begin) X(pool_end) X(pool_release)     \
  X(pool_use_count) X(pool_empty_cache) X(pool_checkpoint) X(pool_restore)    \
  X(pool_checkpoint_free) X(pool_set_options)

struct Api {
#define GM_SHIM_FIELD(n) decltype(&gpumem_torch_##n) n;
  GM_SHIM_ENTRY_POINTS(GM_SHIM_FIELD)
#undef GM_SHIM_FIELD
};
Api api;
std::string api_path;

template <class F>
void resolve(void* h, const char* name, F*& out) {
  out = reinterpret_cast<F*>(dlsym(h, name));
  TORCH_CHECK(out, "gpumem: ", api_path, " lacks ", name, " (a stale build? rebuild with pip install ./python)");
}

void load_api(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(h, "gpumem: could not load ", path, ": ", dlerror());
  api_path = path;
#define GM_SHIM_RESOLVE(n) resolve(h, "gpumem_torch_" #n, api.n);
  GM_SHIM_ENTRY_POINTS(GM_SHIM_RESOLVE)
#undef GM_SHIM_RESOLVE
}

std::string last_error(const char* what) {
  const char* e = api.last_error();
  return (e && *e) ? std::string(e) : std::string("gpumem: ") + what + " failed";
}

void check(int st, const char* what) {
  TORCH_CHECK(st == 0, last_error(what));
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void gm_deleter(void* ptr);

// ---- the allocator -----------------------------------------------------------

class GpumemAllocator : public PA {
 public:
  GpumemAllocator()
      : PA([](size_t, int, cudaStream_t) -> void* { return nullptr; },
           [](void*, size_t, int, cudaStream_t) {}) {}

  // Allocation and free: the hot path.
  void* gm_alloc(size_t n, c10::DeviceIndex device, cudaStream_t stream) {
    uint64_t p = 0;
    int st;
    c10::MempoolId_t pool{0, 0};
    if (C10_UNLIKELY(ncaptures_.load(std::memory_order_acquire) > 0) && (pool = pool_for(device, stream)) !=
                                                                              c10::MempoolId_t{0, 0})
      st = api.alloc_pool(static_cast<int64_t>(n), device, reinterpret_cast<uint64_t>(stream), pool.first,
                          pool.second, &p);
    else
      st = api.alloc_raw(static_cast<int64_t>(n), device, reinterpret_cast<uint64_t>(stream), &p);
    if (C10_UNLIKELY(st != 0)) on_alloc_failure(st, n, device, stream);
    if (C10_UNLIKELY(p && (history_on_.load(std::memory_order_relaxed) || c10::memoryProfilingEnabled())))
      after_alloc(p, n, device, stream);
    return reinterpret_cast<void*>(p);
  }

  void gm_free(void* ptr) {
    if (!ptr) return;
    uint64_t p = reinterpret_cast<uint64_t>(ptr);
    bool hist = history_on_.load(std::memory_order_relaxed);
    bool prof = c10::memoryProfilingEnabled();
    gm_block_info bi{};
    int dev = -1;
    bool known = false;
    if (C10_UNLIKELY(hist || prof)) {
      bi.size_of = sizeof bi;
      known = api.block(p, &dev, &bi) == 0;
    }
    if (C10_UNLIKELY(api.free_raw(p) != 0)) {
      api.note_failed_free(); // must not throw: torch frees from destructors
      return;
    }
    if (C10_UNLIKELY(known)) after_free(p, dev, bi, hist, prof);
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device);
    void* p = gm_alloc(n, device, stream);
    return {p, p, &gm_deleter, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &gm_deleter; }
  void* raw_alloc(size_t n) override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return gm_alloc(n, device, c10::cuda::getCurrentCUDAStream(device));
  }
  void* raw_alloc_with_stream(size_t n, cudaStream_t stream) override {
    c10::DeviceIndex device = -1;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return gm_alloc(n, device, stream);
  }
  void raw_delete(void* ptr) override { gm_free(ptr); }

  // Settings and statistics.
  double getMemoryFraction(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = fraction_.find(device);
    return it == fraction_.end() ? default_fraction() : it->second;
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "gpumem: invalid fraction ", fraction, ", expected 0 <= fraction <= 1");
    check(api.set_memory_fraction(fraction, device), "set_per_process_memory_fraction");
    std::lock_guard<std::mutex> g(mu_);
    fraction_[device] = fraction;
  }
  // torch's emptyCache(mempool_id): {0, 0} the whole cache, else that pool's
  // (on every device holding it; a pool already gone has nothing cached)
  // A pool's comes from ~MemPool (after releasePool): a destructor, so a
  // failure is a warning there. During a capture neither frees anything.
  void emptyCache(c10::MempoolId_t mempool_id) override {
    if (mempool_id == c10::MempoolId_t{0, 0}) check(api.empty_cache(-1), "empty_cache");
    else if (api.pool_empty_cache(-1, mempool_id.first, mempool_id.second) != 0)
      TORCH_WARN(last_error("empty_cache(mempool_id)"));
  }
  // torch: the largest free cached block, at least the device's free memory
  // (cuDNN's benchmark mode sizes its workspace with this). gpumem keeps no
  // per-block free list to ask, so: max(device free, reserved - allocated).
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    uint64_t fr = 0, tot = 0;
    check(api.mem_get_info(device, &fr, &tot), "mem_get_info");
    gm_stats s = stats(device);
    int64_t cached = s.reserved_bytes[GM_POOL_ALL].current - s.allocated_bytes[GM_POOL_ALL].current;
    *largestBlock = std::max<size_t>(fr, cached > 0 ? static_cast<size_t>(cached) : 0);
  }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get() || ptr.get_deleter() != &gm_deleter) return; // not ours (torch ignores these too)
    check(api.record_stream(reinterpret_cast<uint64_t>(ptr.get_context()),
                            reinterpret_cast<uint64_t>(stream.stream())),
          "record_stream");
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    gm_stats s = stats(device);
    c10::CachingDeviceAllocator::DeviceStats o;
    // the field lists are gpumem.h's (GM_STAT_*), named as torch names them
#define GM_SHIM_CP_ARRAY(n) cp(o.n[p], s.n[p]);
#define GM_SHIM_CP_SINGLE(n) cp(o.n, s.n);
#define GM_SHIM_CP_COUNTER(n) o.n = s.n;
    for (int p = 0; p < GM_POOL_COUNT; p++) {
      GM_STAT_ARRAYS(GM_SHIM_CP_ARRAY)
    }
    GM_STAT_SINGLES(GM_SHIM_CP_SINGLE)
    GM_STAT_TORCH_COUNTERS(GM_SHIM_CP_COUNTER)
#undef GM_SHIM_CP_ARRAY
#undef GM_SHIM_CP_SINGLE
#undef GM_SHIM_CP_COUNTER
    return o;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check(api.reset_accumulated(device), "reset_accumulated_memory_stats");
  }
  void resetPeakStats(c10::DeviceIndex device) override { check(api.reset_peak(device), "reset_peak_memory_stats"); }

  // CUDA graphs and MemPools: private pools (src/core/mempool.c). The
  // library creates the pool or adds a use and starts the capture; the
  // filter stays here, asked by gm_alloc while any capture is under way.
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    check(api.pool_begin(device, mempool_id.first, mempool_id.second), "beginAllocateToPool");
    std::lock_guard<std::mutex> g(cap_mu_);
    captures_.push_back(Capture{device, mempool_id, std::move(filter)});
    ncaptures_.store(static_cast<int>(captures_.size()), std::memory_order_release);
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    {
      std::lock_guard<std::mutex> g(cap_mu_);
      auto it = std::find_if(captures_.begin(), captures_.end(), [&](const Capture& c) {
        return c.device == device && c.pool == mempool_id;
      });
      if (it != captures_.end()) captures_.erase(it);
      ncaptures_.store(static_cast<int>(captures_.size()), std::memory_order_release);
    }
    check(api.pool_end(device, mempool_id.first, mempool_id.second), "endAllocateToPool");
  }
  // Called from destructors (CUDAGraph::reset, ~MemPool): a failure is a
  // warning, never an exception.
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    if (api.pool_release(device, mempool_id.first, mempool_id.second) != 0)
      TORCH_WARN(last_error("releasePool"));
  }
  // torch.cuda.MemPool's constructor calls setUseOnOOM(true) for
  // MemPool(use_on_oom=True) and setNoSplit for MemPool(no_split=True); its
  // destructor (torch 2.11) calls setUseOnOOM(false) on every pool, then
  // releasePool and emptyCache(id). Both are the library pool's options
  // (gm_pool_set_options): use_on_oom serves an allocation the device's own
  // pools cannot place from the pool's memory, no_split makes every
  // allocation in the pool a device allocation of its own. false (from a
  // destructor) must not throw (a throw from ~MemPool terminates the
  // process: the first H200 run of issue 28 aborted at exit so). Declared
  // without `override`: an older torch has a two-argument setUseOnOOM, or
  // neither.
#ifdef __clang__
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Winconsistent-missing-override"
#endif
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) {
    set_pool_option(device, mempool_id, [&](gm_pool_options& o) { o.use_on_oom = use_on_oom; }, use_on_oom,
                    "MemPool(use_on_oom=True)");
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id) { setUseOnOOM(device, mempool_id, true); }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
    set_pool_option(device, mempool_id, [](gm_pool_options& o) { o.no_split = true; }, true,
                    "MemPool(no_split=True)");
  }
#ifdef __clang__
#pragma clang diagnostic pop
#endif
  // The pool's options as the library holds them, changed by `edit`; a
  // failure raises (strict) or is dropped (from a destructor).
  template <class Edit>
  void set_pool_option(c10::DeviceIndex device, c10::MempoolId_t id, Edit edit, bool strict, const char* what) {
    std::lock_guard<std::mutex> g(mu_);
    gm_pool_options o = pool_opts_.count(id) ? pool_opts_[id] : gm_pool_options{};
    o.size = sizeof o;
    edit(o);
    int st = api.pool_set_options(device, id.first, id.second, &o);
    if (st == 0) pool_opts_[id] = o;
    else if (strict) check(st, what);
  }
  // A MemPool's allocator: its raw_alloc / raw_delete give the library
  // pool's segments. They run under gpumem's device lock: the allocator
  // must not allocate through gpumem (a pluggable allocator of C functions,
  // as NCCL's, does not). Exceptions stop here (C calls them).
  static int other_alloc(void* ctx, int device, uint64_t size, gm_stream, gm_devptr* out) noexcept {
    try {
      c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device));
      auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
      void* p = static_cast<cca::CUDAAllocator*>(ctx)->raw_alloc_with_stream(size, stream);
      if (!p) return GM_ENOMEM;
      *out = reinterpret_cast<gm_devptr>(p);
      return 0;
    } catch (...) {
      return GM_ENOMEM;
    }
  }
  static void other_free(void* ctx, int device, gm_devptr ptr, uint64_t) noexcept {
    try {
      c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device));
      static_cast<cca::CUDAAllocator*>(ctx)->raw_delete(reinterpret_cast<void*>(ptr));
    } catch (...) {
      api.note_failed_free();
    }
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    int n = 0;
    check(api.pool_use_count(device, mempool_id.first, mempool_id.second, &n), "getPoolUseCount");
    return n;
  }
  // torch.cuda.MemPool(): its pool, made or given one more use. The type of
  // the allocator argument changed between torch releases (a shared_ptr,
  // a raw pointer): both are declared, the one matching the base's virtual
  // overrides it (no `override`, so that the other compiles too).
#ifdef __clang__
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Winconsistent-missing-override"
#endif
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) {
    retain_pool(device, mempool_id, allocator.get());
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id, cca::CUDAAllocator* allocator) {
    retain_pool(device, mempool_id, allocator);
  }
  // CUDA graph trees (torch.compile reduce-overhead) take a checkpoint of
  // the pool after every recording, and restore one before recording a
  // graph that follows another (a backward after its forward, a new
  // branch): the library's gm_pool_checkpoint_* (src/core/mempool.c). The
  // device argument was an int in older torch releases: both are declared,
  // as for createOrIncrefPool.
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) {
    return checkpoint(device, id);
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(int device, c10::MempoolId_t id) {
    return checkpoint(static_cast<c10::DeviceIndex>(device), id);
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> pps) {
    return restore(device, std::move(pps));
  }
  cca::CheckpointDelta setCheckpointPoolState(int device, std::shared_ptr<cca::AllocatorState> pps) {
    return restore(static_cast<c10::DeviceIndex>(device), std::move(pps));
  }
#ifdef __clang__
#pragma clang diagnostic pop
#endif
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override;

  // History and snapshot.
  bool isHistoryEnabled() override { return history_on_.load(); }
  void recordHistory(bool enabled, cca::CreateContextFn recorder, size_t max_entries, cca::RecordContext when,
                     bool clearHistory, const std::vector<std::string>& skip_actions) override {
    std::vector<cca::TraceEntry::Action> skip;
    for (const auto& a : skip_actions) skip.push_back(c10::CachingDeviceAllocator::parseTraceEntryAction(a));
    {
      std::lock_guard<std::mutex> g(hist_mu_);
      skip_ = std::move(skip);
      recorder_ = enabled ? recorder : nullptr;
      when_ = enabled ? when : cca::RecordContext::NEVER;
      max_entries_ = std::max<size_t>(1, max_entries);
      if (!enabled || clearHistory) {
        rings_.clear();
        if (!enabled) contexts_.clear();
      }
      history_on_.store(enabled);
    }
    // segment_map/unmap/alloc/free reach the ring from the library as they
    // happen (on_segment); set outside hist_mu_, which the observer takes
    check(api.set_segment_observer(enabled ? &on_segment : nullptr, this), "_record_memory_history");
  }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(mu_);
    observers_.push_back(std::move(observer));
  }
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;
  std::string name() override { return "gpumem"; }

 private:
  struct Capture {
    c10::DeviceIndex device;
    c10::MempoolId_t pool;
    std::function<bool(cudaStream_t)> filter;
  };
  // The pool whose capture claims this allocation, or {0, 0}. Torch asks
  // the filters under its allocator lock too; a filter queries the stream's
  // capture state (a graph) or the calling thread (use_mem_pool).
  c10::MempoolId_t pool_for(c10::DeviceIndex device, cudaStream_t stream) {
    std::lock_guard<std::mutex> g(cap_mu_);
    for (const auto& c : captures_)
      if (c.device == device && c.filter(stream)) return c.pool;
    return {0, 0};
  }
  // The library's checkpoint, freed with the last reference torch holds.
  struct PoolCheckpoint : cca::AllocatorState {
    gm_pool_checkpoint* c = nullptr;
    ~PoolCheckpoint() override {
      if (c) api.pool_checkpoint_free(c);
    }
  };
  std::shared_ptr<cca::AllocatorState> checkpoint(c10::DeviceIndex device, c10::MempoolId_t id) {
    auto st = std::make_shared<PoolCheckpoint>();
    check(api.pool_checkpoint(device, id.first, id.second, &st->c), "getCheckpointState");
    return st;
  }
  struct Restored {
    std::vector<uint64_t> freed, allocd;
  };
  // runs under the library's device lock: only appends
  static void restored(gm_devptr ptr, uint64_t, bool allocated, void* arg) noexcept {
    auto* r = static_cast<Restored*>(arg);
    try {
      (allocated ? r->allocd : r->freed).push_back(ptr);
    } catch (...) {
    }
  }
  // torch's delta: every block of the pool freed, every block of the
  // checkpoint allocated again; the DataPtrs free through gpumem.
  cca::CheckpointDelta restore(c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> pps) {
    auto* st = dynamic_cast<PoolCheckpoint*>(pps.get());
    TORCH_CHECK(st && st->c, "gpumem: setCheckpointPoolState: not a checkpoint gpumem took");
    Restored r;
    check(api.pool_restore(st->c, &restored, &r), "setCheckpointPoolState");
    cca::CheckpointDelta delta;
    for (uint64_t p : r.freed) delta.ptrs_freed.push_back(reinterpret_cast<void*>(p));
    for (uint64_t p : r.allocd)
      delta.dataptrs_allocd.emplace_back(reinterpret_cast<void*>(p), reinterpret_cast<void*>(p), &gm_deleter,
                                         c10::Device(c10::DeviceType::CUDA, device));
    return delta;
  }
  // A pool made, or given one more use; one with an allocator of its own
  // (not gpumem itself) takes its segments from it.
  void retain_pool(c10::DeviceIndex device, c10::MempoolId_t mempool_id, cca::CUDAAllocator* other) {
    check(api.pool_retain(device, mempool_id.first, mempool_id.second), "createOrIncrefPool");
    if (!other || other == this) return;
    try {
      set_pool_option(device, mempool_id, [&](gm_pool_options& o) {
        o.seg_alloc = &other_alloc;
        o.seg_free = &other_free;
        o.seg_ctx = other;
      }, true, "MemPool(allocator=...)");
    } catch (...) {
      api.pool_release(device, mempool_id.first, mempool_id.second); // the MemPool is not made: no use left
      throw;
    }
  }

  template <class S>
  static void cp(S& d, const gm_stat& s) {
    d.current = s.current;
    d.peak = s.peak;
    d.allocated = s.allocated;
    d.freed = s.freed;
  }
  static gm_stats stats(int device) {
    gm_stats s{};
    s.size = sizeof s;
    check(api.get_stats(device, &s), "memory_stats");
    return s;
  }
  double default_fraction() {
    gm_config c{};
    c.size = sizeof c;
    return api.config(&c, nullptr, 0) == 0 ? c.per_process_memory_fraction : 1.0;
  }

  struct Ring {
    std::vector<cca::TraceEntry> v;
    size_t next = 0;
  };
  void record(cca::TraceEntry::Action action, int device, uint64_t addr, uint64_t size, cudaStream_t stream,
              std::shared_ptr<c10::GatheredContext> ctx, c10::MempoolId_t pool = {0, 0}) {
    cca::TraceEntry te(action, static_cast<c10::DeviceIndex>(device), addr, size, stream, pool,
                       c10::getApproximateTime(), std::move(ctx));
    te.time_.t_ = now_us(); // snapshot() hands times out in microseconds
    if (device < 0 || std::find(skip_.begin(), skip_.end(), action) != skip_.end()) return;
    if (rings_.size() <= static_cast<size_t>(device)) rings_.resize(device + 1);
    Ring& r = rings_[device];
    if (r.v.size() < max_entries_) {
      r.v.push_back(std::move(te));
    } else {
      r.v[r.next] = std::move(te);
      r.next = (r.next + 1) % max_entries_;
    }
  }

  // The library's segment observer (gm_set_segment_observer), on while
  // history is on. It runs under gpumem's device lock, so it only appends to
  // the ring: lock order is device lock -> hist_mu_, and nothing in this file
  // calls into the library while holding hist_mu_. No context: gathering one
  // may take the GIL. It must not throw into C.
  static void on_segment(int device, int event, gm_devptr addr, uint64_t size, void* arg) noexcept {
    cca::TraceEntry::Action action;
    switch (event) {
      case GM_SEGMENT_ALLOC: action = cca::TraceEntry::SEGMENT_ALLOC; break;
      case GM_SEGMENT_FREE: action = cca::TraceEntry::SEGMENT_FREE; break;
      case GM_SEGMENT_MAP: action = cca::TraceEntry::SEGMENT_MAP; break;
      case GM_SEGMENT_UNMAP: action = cca::TraceEntry::SEGMENT_UNMAP; break;
      default: return;
    }
    auto* self = static_cast<GpumemAllocator*>(arg);
    try {
      std::lock_guard<std::mutex> g(self->hist_mu_);
      if (self->history_on_.load()) self->record(action, device, addr, size, nullptr, nullptr);
    } catch (...) {
      // out of host memory for the ring: the entry is lost, the allocation is not
    }
  }

  void after_alloc(uint64_t p, size_t n, int device, cudaStream_t stream) {
    gm_block_info bi{};
    bi.size_of = sizeof bi;
    uint64_t size = n;
    c10::MempoolId_t pool{0, 0};
    if (api.block(p, nullptr, &bi) == 0) {
      size = bi.size;
      pool = {bi.pool_id[0], bi.pool_id[1]};
    }
    if (c10::memoryProfilingEnabled()) {
      gm_stats s = stats(device);
      c10::reportMemoryUsageToProfiler(reinterpret_cast<void*>(p), static_cast<int64_t>(size),
                                       s.allocated_bytes[GM_POOL_ALL].current, s.reserved_bytes[GM_POOL_ALL].current,
                                       c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    }
    if (history_on_.load(std::memory_order_relaxed)) {
      cca::CreateContextFn rec;
      cca::RecordContext when;
      {
        std::lock_guard<std::mutex> g(hist_mu_);
        rec = recorder_;
        when = when_;
      }
      // gather outside our lock: it may take the GIL
      std::shared_ptr<c10::GatheredContext> ctx = (rec && when != cca::RecordContext::NEVER) ? rec() : nullptr;
      std::lock_guard<std::mutex> g(hist_mu_);
      if (!history_on_.load()) return;
      if (ctx) contexts_[p] = ctx;
      record(cca::TraceEntry::ALLOC, device, p, size, stream,
             when == cca::RecordContext::ALLOC || when == cca::RecordContext::ALL ? ctx : nullptr, pool);
    }
  }

  void after_free(uint64_t p, int device, const gm_block_info& bi, bool hist, bool prof) {
    if (prof) {
      gm_stats s = stats(device);
      c10::reportMemoryUsageToProfiler(reinterpret_cast<void*>(p), -static_cast<int64_t>(bi.size),
                                       s.allocated_bytes[GM_POOL_ALL].current, s.reserved_bytes[GM_POOL_ALL].current,
                                       c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    }
    if (hist) {
      cca::CreateContextFn rec;
      cca::RecordContext when;
      {
        std::lock_guard<std::mutex> g(hist_mu_);
        rec = recorder_;
        when = when_;
      }
      std::shared_ptr<c10::GatheredContext> ctx = (rec && when == cca::RecordContext::ALL) ? rec() : nullptr;
      std::lock_guard<std::mutex> g(hist_mu_);
      contexts_.erase(p);
      if (!history_on_.load()) return;
      auto stream = reinterpret_cast<cudaStream_t>(bi.stream);
      c10::MempoolId_t pool{bi.pool_id[0], bi.pool_id[1]};
      record(cca::TraceEntry::FREE_REQUESTED, device, p, bi.size, stream, ctx, pool);
      // gpumem does not report when a free held back by record_stream
      // completes; the trace marks it complete at once
      record(cca::TraceEntry::FREE_COMPLETED, device, p, bi.size, stream, ctx, pool);
    }
  }

  void on_alloc_failure(int st, size_t n, c10::DeviceIndex device, cudaStream_t stream) {
    std::string msg = last_error("allocation");
    if (st != GM_ENOMEM) TORCH_CHECK(false, msg);
    uint64_t fr = 0, tot = 0;
    api.mem_get_info(device, &fr, &tot);
    gm_stats s{};
    s.size = sizeof s;
    api.get_stats(device, &s);
    c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(n), s.allocated_bytes[GM_POOL_ALL].current,
                                     s.reserved_bytes[GM_POOL_ALL].current,
                                     c10::Device(c10::DeviceType::CUDA, device));
    if (history_on_.load()) {
      std::lock_guard<std::mutex> g(hist_mu_);
      record(cca::TraceEntry::OOM, device, fr, n, stream, nullptr);
    }
    std::vector<cca::OutOfMemoryObserver> obs;
    double frac;
    {
      std::lock_guard<std::mutex> g(mu_);
      obs = observers_;
      auto it = fraction_.find(device);
      frac = it == fraction_.end() ? 1.0 : it->second;
    }
    size_t limit = frac < 1.0 ? static_cast<size_t>(frac * static_cast<double>(tot)) : tot;
    for (const auto& o : obs) o(device, n, limit, fr);
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
  }

  std::mutex cap_mu_; // captures_
  std::vector<Capture> captures_;
  std::atomic<int> ncaptures_{0};

  std::mutex mu_; // fraction_, observers_, pool_opts_
  std::unordered_map<int, double> fraction_;
  std::map<c10::MempoolId_t, gm_pool_options> pool_opts_; // what set_pool_option last gave each pool
  std::vector<cca::OutOfMemoryObserver> observers_;

  std::atomic<bool> history_on_{false};
  std::mutex hist_mu_; // everything below
  cca::CreateContextFn recorder_ = nullptr;
  cca::RecordContext when_ = cca::RecordContext::NEVER;
  size_t max_entries_ = 1;
  std::vector<cca::TraceEntry::Action> skip_;
  std::vector<Ring> rings_;
  std::unordered_map<uint64_t, std::shared_ptr<c10::GatheredContext>> contexts_;

  friend struct SnapshotBuilder;
};

std::shared_ptr<GpumemAllocator> g_alloc;

void gm_deleter(void* ptr) { g_alloc->gm_free(ptr); }

int seg_cb(const gm_segment_info* s, void* arg) {
  static_cast<std::vector<gm_segment_info>*>(arg)->push_back(*s);
  return 0;
}
int blk_cb(const gm_block_info* b, void* arg) {
  static_cast<std::vector<gm_block_info>*>(arg)->push_back(*b);
  return 0;
}

// cudagraph trees' check: the pool's live blocks are exactly the expected ones.
bool GpumemAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                               const std::unordered_set<void*>& expected_live_allocations) {
  std::vector<gm_block_info> blks;
  check(api.walk_blocks(device, blk_cb, &blks), "checkPoolLiveAllocations");
  size_t n = 0;
  for (const auto& b : blks) {
    if (!b.live || c10::MempoolId_t{b.pool_id[0], b.pool_id[1]} != mempool_id) continue;
    if (!expected_live_allocations.count(reinterpret_cast<void*>(b.address))) return false;
    n++;
  }
  return n == expected_live_allocations.size();
}

// Segments are gpumem's (gm_walk_segments: a cudaMalloc'd segment under
// policy:torch, a run of mapped memory in an arena under policy:gpumem, as
// torch reports expandable segments); blocks are the
// live and stream-waiting allocations in each, with the gaps between them as
// inactive blocks, so each segment's blocks tile it as torch's viewer expects.
// torch's snapshot(mempool_id): {0, 0} every segment, else that pool's only.
cca::SnapshotInfo GpumemAllocator::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  cca::SnapshotInfo r;
  int ndev = 0;
  check(api.device_count(&ndev), "device_count");
  std::unordered_map<uint64_t, std::shared_ptr<c10::GatheredContext>> ctx;
  {
    std::lock_guard<std::mutex> g(hist_mu_);
    ctx = contexts_;
    r.device_traces.resize(ndev);
    for (size_t d = 0; include_traces && d < rings_.size() && d < static_cast<size_t>(ndev); d++) {
      const Ring& ring = rings_[d];
      auto& out = r.device_traces[d];
      for (size_t i = 0; i < ring.v.size(); i++) out.push_back(ring.v[(ring.next + i) % ring.v.size()]);
    }
  }
  for (int d = 0; d < ndev; d++) {
    std::vector<gm_segment_info> segs;
    std::vector<gm_block_info> blks;
    check(api.walk_segments(d, seg_cb, &segs), "snapshot");
    check(api.walk_blocks(d, blk_cb, &blks), "snapshot");
    std::sort(segs.begin(), segs.end(), [](auto& a, auto& b) { return a.address < b.address; });
    std::sort(blks.begin(), blks.end(), [](auto& a, auto& b) { return a.address < b.address; });
    size_t bi = 0;
    for (const auto& s : segs) {
      c10::MempoolId_t owner{s.pool_id[0], s.pool_id[1]};
      if (mempool_id != c10::MempoolId_t{0, 0} && owner != mempool_id) continue;
      cca::SegmentInfo si;
      si.owner_private_pool_id = owner;
      si.device = static_cast<c10::DeviceIndex>(d);
      si.address = s.address;
      si.total_size = s.total_size;
      si.stream = reinterpret_cast<void*>(s.stream);
      si.is_large = s.pool == GM_POOL_LARGE;
      si.is_expandable = s.expandable;
      uint64_t at = s.address, end = s.address + s.total_size;
      while (bi < blks.size() && blks[bi].address < s.address) bi++; // outside every segment: skip
      for (; bi < blks.size() && blks[bi].address < end; bi++) {
        const gm_block_info& b = blks[bi];
        if (b.address > at) {
          cca::BlockInfo gap;
          gap.size = b.address - at;
          si.blocks.push_back(gap);
        }
        cca::BlockInfo bl;
        bl.size = b.size;
        bl.requested_size = b.requested;
        bl.allocated = b.live;
        bl.active = true;
        auto it = ctx.find(b.address);
        if (it != ctx.end()) bl.context_when_allocated = it->second;
        si.blocks.push_back(bl);
        si.active_size += b.size;
        if (b.live) {
          si.allocated_size += b.size;
          si.requested_size += b.requested;
        }
        at = b.address + b.size;
      }
      if (at < end) {
        cca::BlockInfo gap;
        gap.size = end - at;
        si.blocks.push_back(gap);
      }
      r.segments.push_back(std::move(si));
    }
  }
  gm_config c{};
  c.size = sizeof c;
  char conf[512] = "";
  r.config_metadata = cca::AllocatorConfigInfo{};
  if (api.config(&c, conf, sizeof conf) == 0) {
    r.config_metadata.garbage_collection_threshold = c.garbage_collection_threshold;
    r.config_metadata.max_split_size = c.max_split_size == UINT64_MAX ? SIZE_MAX : c.max_split_size;
    r.config_metadata.expandable_segments = c.expandable_segments;
    r.config_metadata.release_lock_on_malloc = c.release_lock_on_cudamalloc;
    r.config_metadata.last_allocator_settings = conf;
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++)
      r.config_metadata.roundup_power2_divisions.push_back(c.roundup_power2_divisions[i]);
  }
  return r;
}

// ---- Python ------------------------------------------------------------------

void install(const std::string& path) {
  TORCH_CHECK(!g_alloc, "gpumem: the shim is already installed (", api_path, ")");
  load_api(path);
  auto a = std::make_shared<GpumemAllocator>();
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
  g_alloc = a;
}

bool installed() { return static_cast<bool>(g_alloc); }

// True when torch's current CUDA allocator is this shim.
bool active() { return g_alloc && cca::get() == g_alloc.get(); }

} // namespace gpumem_shim

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gpumem as PyTorch's CUDA allocator (see python/csrc/gpumem_shim.cpp)";
  m.def("install", &gpumem_shim::install, "Make gpumem (the library at path) torch's CUDA allocator");
  m.def("installed", &gpumem_shim::installed);
  m.def("active", &gpumem_shim::active);
  m.def("library_path", []() { return gpumem_shim::api_path; });
}
