"""GPU tests for issue 46: the pools and lifecycles others build on gpumem.

    python3 tests/gpu/test_interop.py [--only a,b] [--json FILE]              # native (torch's allocator)
    python3 -m gpumem run --conf policy:gpumem -- python3 tests/gpu/test_interop.py --json FILE

- sleep_wake: a real model (a 8-layer, d_model 4096 fp16 transformer, 1.6 B
  parameters) in gt.sleepable("weights") and a KV-cache-like tensor in
  gt.sleepable("kv"): gt.sleep("weights", offload=True) and gt.sleep("kv")
  give the memory back (device free memory, nvidia-smi), every address stays,
  gt.wake() maps it back, the weights' contents are restored (the model's
  output is bitwise the same) and the times are compared with re-creating
  the model (building it on the GPU) and with reloading its weights from a
  host copy, pageable (load_state_dict) and page-locked (pin_memory(), then
  .to("cuda", non_blocking=True), as offload copies); wake's GB/s. gpumem only.
- mempool_allocator: torch.cuda.MemPool(allocator=CUDAPluggableAllocator(a
  counting cuMemAlloc allocator compiled here)): the pool's memory comes
  from that allocator, memory_allocated() counts it, all of it goes back
  when the pool goes.
- use_on_oom: MemPool(use_on_oom=True) serves an allocation that the
  device's own memory (limited by a memory fraction) cannot.
- no_split: MemPool(no_split=True) gives each allocation a segment of its own.
- allocator_settings: torch.cuda.memory._set_allocator_settings reaches
  gpumem (accepted, refused with the key named). gpumem only.
Prints one line per test and a summary; exit 1 if any failed.
"""
import ctypes
import gc
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_runner import allocator_mode, parse_args, run_tests  # noqa: E402 (the loop the GPU test scripts share)

MIB = 1 << 20
GIB = 1 << 30
_ROWS = {}  # test -> measured numbers for the table (interop_run.sh prints them)


def _gt():
    """gpumem.torch when gpumem is torch's allocator here, else None (native)."""
    try:
        import gpumem.torch as gt
        return gt if gt.status()["installed"] else None
    except Exception:  # noqa: BLE001
        return None


def _smi_used_mib():
    """The GPU's used memory as nvidia-smi reports it (MiB), or None."""
    import torch
    try:
        idx = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or str(torch.cuda.current_device())
        out = subprocess.run(["nvidia-smi", "-i", idx, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return int(out.splitlines()[0])
    except Exception:  # noqa: BLE001
        return None


def _free():
    import torch
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def _model(torch):
    layer = torch.nn.TransformerEncoderLayer(d_model=4096, nhead=32, dim_feedforward=16384, batch_first=True,
                                             dtype=torch.float16, device="cuda")
    return torch.nn.TransformerEncoder(layer, num_layers=8, enable_nested_tensor=False).eval()


def _pin_cost(nbytes):
    """Seconds to page-lock nbytes of host memory and to give it back (cuMemHostAlloc, cuMemFreeHost in
    torch's current context), the part of sleep and wake that is not copying; (None, None) if unavailable."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        p = ctypes.c_void_p()
        t0 = time.time()
        if cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes), ctypes.c_uint(1)) != 0:
            return None, None
        t_pin = time.time() - t0
        t0 = time.time()
        cu.cuMemFreeHost(p)
        return t_pin, time.time() - t0
    except OSError:
        return None, None


def test_sleep_wake():
    import torch
    gt = _gt()
    if gt is None:
        return "SKIP gpumem only (gpumem.torch.sleep)"
    torch.manual_seed(0)
    t0 = time.time()
    with gt.sleepable("weights"):
        model = _model(torch)
    torch.cuda.synchronize()
    t_create = time.time() - t0
    with gt.sleepable("kv"):
        kv = torch.randn(1 << 29, dtype=torch.float16, device="cuda")  # 1 GiB
    x = torch.randn(4, 256, 4096, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        y0 = model(x)
    ptrs = [p.data_ptr() for p in model.parameters()] + [kv.data_ptr()]
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    host = {k: v.to("cpu") for k, v in model.state_dict().items()}  # for the reload baseline
    free0, smi0 = _free(), _smi_used_mib()
    t0 = time.time()
    rel_w = gt.sleep("weights", offload=True)
    t_sleep = time.time() - t0
    rel_kv = gt.sleep("kv")
    free1, smi1 = _free(), _smi_used_mib()
    assert rel_w >= nbytes, "released %d bytes of %d bytes of weights" % (rel_w, nbytes)
    assert free1 - free0 >= rel_w + rel_kv - 64 * MIB, "device free memory rose %d, released %d" % (
        free1 - free0, rel_w + rel_kv)
    # the rest of the program allocates as usual; the sleeping pools do not
    scratch = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    del scratch
    try:
        with gt.sleepable("weights"):
            torch.empty(MIB, dtype=torch.uint8, device="cuda")
        raise AssertionError("an allocation in a sleeping pool did not raise")
    except RuntimeError as e:
        assert "asleep" in str(e), e
    assert gt.sleep("weights", offload=True) == 0  # twice: nothing more
    t0 = time.time()
    gt.wake("kv")
    t_wake_kv = time.time() - t0
    t0 = time.time()
    gt.wake("weights")
    torch.cuda.synchronize()
    t_wake = time.time() - t0
    gt.wake("weights")  # twice: nothing
    free2, smi2 = _free(), _smi_used_mib()
    assert [p.data_ptr() for p in model.parameters()] + [kv.data_ptr()] == ptrs, "an address moved"
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v.cpu(), host[k])]
    assert not changed, "contents not restored: %s" % changed[:3]
    with torch.no_grad():
        y1 = model(x)
    assert torch.allclose(y0, y1, atol=1e-3), "the model's output changed (max diff %g)" % float((y0 - y1).abs().max())
    # the baselines: re-create the model on the GPU; reload its weights from the host copy
    del kv
    torch.cuda.synchronize()
    t0 = time.time()
    model2 = _model(torch)
    torch.cuda.synchronize()
    t_recreate = time.time() - t0
    t0 = time.time()
    model2.load_state_dict(host)
    torch.cuda.synchronize()
    t_reload = time.time() - t0
    # the fair one: the host copy already page-locked (as offload's is), copied in without a wait per tensor
    pinned = {k: v.pin_memory() for k, v in host.items()}
    torch.cuda.synchronize()
    t0 = time.time()
    on_gpu = {k: v.to("cuda", non_blocking=True) for k, v in pinned.items()}
    torch.cuda.synchronize()
    t_reload_pinned = time.time() - t0
    assert all(torch.equal(on_gpu[k].cpu(), host[k]) for k in host), "the pinned reload differs"
    del model2, model, host, pinned, on_gpu
    gc.collect()
    wake_gbs = nbytes / max(t_wake, 1e-9) / 1e9
    t_pin, t_unpin = _pin_cost(nbytes)
    _ROWS["sleep_wake"] = {
        "weights GiB": nbytes / GIB, "released GiB": (rel_w + rel_kv) / GIB,
        "free rose GiB": (free1 - free0) / GIB, "free after wake GiB": (free2 - free0) / GIB,
        "nvidia-smi used MiB (before, asleep, woken)": (smi0, smi1, smi2),
        "create s": t_create, "sleep(offload) s": t_sleep, "wake(offload) s": t_wake, "wake(kv, no offload) s": t_wake_kv,
        "re-create s": t_recreate, "reload from host s": t_reload, "reload from pinned host s": t_reload_pinned,
        "sleep(offload) GB/s": nbytes / max(t_sleep, 1e-9) / 1e9, "wake(offload) GB/s": wake_gbs,
        "cuMemHostAlloc of the weights' size s (in sleep)": t_pin, "cuMemFreeHost of it s (in wake)": t_unpin,
    }
    return ("released %.2f GiB (free +%.2f GiB, nvidia-smi %s -> %s -> %s MiB); addresses kept, weights restored bit for bit; "
            "sleep %.3f s, wake %.3f s = %.1f GB/s (kv %.3f s) vs re-create %.3f s, reload from host %.3f s, "
            "from pinned host %.3f s"
            % ((rel_w + rel_kv) / GIB, (free1 - free0) / GIB, smi0, smi1, smi2, t_sleep, t_wake, wake_gbs, t_wake_kv,
               t_recreate, t_reload, t_reload_pinned))


_ALLOC_C = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <sys/types.h>
static int (*mem_alloc)(unsigned long long *, size_t), (*mem_free)(unsigned long long);
static long calls, live;
static void load(void) {
    if (mem_alloc) return;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    mem_alloc = (int (*)(unsigned long long *, size_t))dlsym(h, "cuMemAlloc_v2");
    mem_free = (int (*)(unsigned long long))dlsym(h, "cuMemFree_v2");
}
void *ca_alloc(ssize_t size, int device, void *stream) {
    unsigned long long p = 0;
    load();
    if (mem_alloc(&p, (size_t)size)) return NULL;
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&live, size, __ATOMIC_RELAXED);
    return (void *)p;
}
void ca_free(void *ptr, ssize_t size, int device, void *stream) {
    load();
    mem_free((unsigned long long)ptr);
    __atomic_sub_fetch(&live, size, __ATOMIC_RELAXED);
}
long ca_calls(void) { return calls; }
long ca_live(void) { return live; }
"""


def _counting_allocator():
    """(path of a shared library with ca_alloc/ca_free over cuMemAlloc, its ctypes handle)."""
    d = tempfile.mkdtemp(prefix="gpumem-ca-")
    src, so = os.path.join(d, "ca.c"), os.path.join(d, "libca.so")
    with open(src, "w") as f:
        f.write(_ALLOC_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, src, "-ldl"], check=True)
    lib = ctypes.CDLL(so)
    lib.ca_calls.restype = lib.ca_live.restype = ctypes.c_long
    return so, lib


def _in_segments(segs, ptr):
    return any(s["address"] <= ptr < s["address"] + s["total_size"] for s in segs)


def test_mempool_allocator():
    import torch
    so, ca = _counting_allocator()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(so, "ca_alloc", "ca_free")
    pool = torch.cuda.MemPool(alloc.allocator())
    a0 = torch.cuda.memory_allocated()
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(64 * MIB // 4, device="cuda")
        u = torch.ones(1000, device="cuda")
    calls, live = ca.ca_calls(), ca.ca_live()
    assert calls >= 1 and live >= 64 * MIB, "the pool's allocator gave %d calls, %d bytes" % (calls, live)
    counted = torch.cuda.memory_allocated() - a0
    assert counted >= 64 * MIB, "memory_allocated() rose %d" % counted
    segs = pool.snapshot()
    assert _in_segments(segs, t.data_ptr()) and _in_segments(segs, u.data_ptr()), "tensors outside the pool"
    assert float(t.sum()) == 64 * MIB // 4
    del t, u, pool
    gc.collect()
    torch.cuda.empty_cache()
    left = ca.ca_live()
    assert left == 0, "%d bytes of the allocator's memory still held after the pool went" % left
    _ROWS["mempool_allocator"] = {"allocator calls": calls, "allocator MiB": live / MIB, "counted MiB": counted / MIB}
    return "%d calls to the pool's allocator, %.1f MiB from it, memory_allocated +%.1f MiB, all back" % (
        calls, live / MIB, counted / MIB)


def _mempool_params(torch):
    import inspect
    try:
        return inspect.signature(torch.cuda.MemPool.__init__).parameters
    except (TypeError, ValueError):
        return {}


def test_use_on_oom():
    import torch
    if "use_on_oom" not in _mempool_params(torch):
        return "SKIP torch.cuda.MemPool has no use_on_oom"
    pool = torch.cuda.MemPool(use_on_oom=True)
    with torch.cuda.use_mem_pool(pool):
        big = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
    del big  # cached in the pool
    torch.cuda.synchronize()
    total = torch.cuda.mem_get_info()[1]
    limit = torch.cuda.memory_reserved() + 300 * MIB
    torch.cuda.set_per_process_memory_fraction(limit / total)
    hold = []
    try:
        hold.append(torch.empty(256 * MIB, dtype=torch.uint8, device="cuda"))
        t = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")  # past the limit: the pool's memory
        inside = _in_segments(pool.snapshot(), t.data_ptr())
        assert inside, "the allocation past the limit did not come from the use_on_oom pool"
        del t
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        del hold
    del pool
    gc.collect()
    return "an allocation past the memory fraction was served from the use_on_oom pool"


def test_no_split():
    import torch
    if "no_split" not in _mempool_params(torch):
        return "SKIP torch.cuda.MemPool has no no_split"
    pool = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.empty(3 * MIB, dtype=torch.uint8, device="cuda") for _ in range(3)]
    segs = pool.snapshot()
    per = [sum(b["state"] != "inactive" for b in s["blocks"]) for s in segs]
    nseg = sum(1 for s in segs if any(_in_segments([s], t.data_ptr()) for t in ts))
    assert nseg == 3 and max(per) == 1, "3 allocations in %d segments, blocks per segment %s" % (nseg, per)
    del ts, pool
    gc.collect()
    return "3 allocations, 3 segments of one block each"


def test_allocator_settings():
    import torch
    gt = _gt()
    if gt is None:
        return "SKIP gpumem only"
    torch.cuda.memory._set_allocator_settings("per_process_memory_fraction:0.9")
    frac = torch.cuda.get_per_process_memory_fraction() if hasattr(torch.cuda, "get_per_process_memory_fraction") \
        else None
    assert frac in (None, 0.9), frac
    torch.cuda.memory._set_allocator_settings("per_process_memory_fraction:1")
    refused = []
    for bad, key in (("gpumem_slack:0", "gpumem_slack"), ("no_such_key:1", "no_such_key"),
                     ("policy:torch", "policy")):
        try:
            torch.cuda.memory._set_allocator_settings(bad)
        except Exception as e:  # noqa: BLE001 (GpumemError)
            assert key in str(e), "refusal of %r does not name %s: %s" % (bad, key, e)
            refused.append(key)
        else:
            raise AssertionError("%r was accepted" % bad)
    return "fraction applied (%s); refused, naming the key: %s" % (frac, ", ".join(refused))


TESTS = [test_allocator_settings, test_mempool_allocator, test_no_split, test_use_on_oom, test_sleep_wake]


def main():
    only, jpath = parse_args(sys.argv[1:], "test_interop.py")
    import torch
    mode = allocator_mode(_gt() is not None)

    def before():  # each test starts from an empty cache
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    return run_tests(TESTS, only, jpath, lambda results: {"mode": mode, "results": results}, width=20, cut=400,
                     before=before, fields=lambda name: {"numbers": _ROWS.get(name)})


if __name__ == "__main__":
    sys.exit(main())
