"""GPU tests for issue 28: CUDA graphs, torch.compile(mode="reduce-overhead")
and torch.cuda.MemPool on gpumem's private pools, and the same program on
PyTorch's own allocator for comparison.

    python3 tests/gpu/test_graphs.py [--only a,b] [--json FILE]                 # native
    python3 -m gpumem run --conf policy:gpumem -- python3 tests/gpu/test_graphs.py --json FILE

Which allocator runs is whatever the process has: `gpumem run` installs
gpumem (the shim), a plain python keeps torch's. Each test resets the peak
statistics after emptying the cache, and records max_memory_reserved() (the
table in tests/gpu/graphs_run.sh compares it with native's) and, under
gpumem, the device calls made while each capture was under way, by kind and
by whose pools made them, the device's own or private ones
(gpumem_torch_capture_calls): a capture must free, unmap and synchronise
nothing. Prints one line per test and a summary; exit 1 if any failed.
"""
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_runner import allocator_mode, parse_args, run_tests  # noqa: E402 (the loop the GPU test scripts share)

MIB = 1 << 20
# device-call kinds a capture must not make (gm_bcall_name names)
FORBIDDEN = {"FREE", "VA_RELEASE", "PHYS_RELEASE", "UNMAP", "EVENT_SYNC", "EVENT_QUERY"}
_STATE = {"captures": []}


def _gpumem():
    """gpumem's library (ctypes) when gpumem is torch's allocator here, else None."""
    try:
        import gpumem.torch as gt
        if not gt.status()["installed"]:
            return None
        from gpumem import _lib
        return _lib.load()
    except Exception:  # noqa: BLE001 (no gpumem: native)
        return None


def _counts(fn, *args):
    """{kind name: count} from a gpumem_torch_*_calls entry point (fn), or None."""
    import ctypes
    lib = _gpumem()
    buf = (ctypes.c_uint64 * 64)()
    n = fn(*args, buf, 64)
    if n < 0:
        return None
    return {lib.gm_bcall_name(k).decode(): int(buf[k]) for k in range(n)}


# whose policy instance made a call during a capture (gm_pool_capture_calls' `who`)
WHO = ("the device's own pools", "private pools")


def _calls():
    """{"device": {kind: n}, WHO[0]: {...}, WHO[1]: {...}} so far on the current device, or None
    (native). "device" counts every device call; the others only those made while a capture
    was under way (between beginAllocateToPool and endAllocateToPool), by whose instance."""
    lib = _gpumem()
    if lib is None:
        return None
    import torch
    dev = torch.cuda.current_device()
    out = {"device": _counts(lib.gpumem_torch_backend_calls, dev)}
    if hasattr(lib, "gpumem_torch_capture_calls"):
        for who, name in enumerate(WHO):
            out[name] = _counts(lib.gpumem_torch_capture_calls, dev, who)
    return out if out["device"] is not None else None


def _delta(after, before):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


class capture_calls:
    """Counts gpumem's device calls made inside the block, which holds one torch.cuda.graph.

    The device-wide count of the block includes what torch.cuda.graph's __enter__ does before
    capture_begin (torch.cuda.synchronize(), torch.cuda.empty_cache(): frees, unmaps, event
    waits that are legal there; the first H200 run counted those). The assertion is on the
    calls the library saw while the capture was under way, by the device's own pools and by
    private pools, so a failure names whose pools made the call."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        self.before = _calls()
        return self

    def __exit__(self, *exc):
        after = _calls()
        if self.before is None or after is None:
            return False
        made = {k: _delta(after[k], self.before[k]) for k in after}
        _STATE["captures"].append({"what": self.what, "calls": made})
        if WHO[0] in made:
            bad = {who: {k: v for k, v in made[who].items() if k in FORBIDDEN} for who in WHO}
            bad = {who: v for who, v in bad.items() if v}
        else:  # a library without gpumem_torch_capture_calls: the device-wide count, as before
            bad = {k: v for k, v in made["device"].items() if k in FORBIDDEN}
        if bad:
            msg = "%s: device calls during the capture that free or wait: %s (every device call of the block: " \
                  "%s)" % (self.what, bad, made["device"])
            if exc[0] is None:
                raise AssertionError(msg)
            print(msg, file=sys.stderr)  # the capture's own error propagates
        return False


def _warm(fn, n=3):
    """Run fn n times on a side stream (torch's recipe before a capture)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(n):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def _mlp(width=2048):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                               torch.nn.GELU(), torch.nn.Linear(width, 1024)).cuda()


# ---- tests -----------------------------------------------------------------------

def test_graph_forward():
    """A captured forward matches eager on replays with new inputs."""
    import torch
    model = _mlp()
    x = torch.randn(256, 1024, device="cuda")
    with torch.no_grad():
        _warm(lambda: model(x))
        g = torch.cuda.CUDAGraph()
        with capture_calls("forward"):
            with torch.cuda.graph(g):
                y = model(x)
        worst = 0.0
        for i in range(5):
            new = torch.randn(256, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
            x.copy_(new)
            g.replay()
            ref = model(new)
            worst = max(worst, float((y - ref).abs().max()))
            assert torch.allclose(y, ref, rtol=1e-4, atol=1e-4), "replay %d differs from eager by %g" % (i, worst)
    del g, y
    return "5 replays equal eager (max |diff| %.2g)" % worst


def test_graph_training_step():
    """A graphed training step (forward, backward, optimizer step) learns."""
    import torch
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    w_true = torch.randn(64, 1, device="cuda")
    static_x = torch.randn(512, 64, device="cuda")
    static_t = static_x @ w_true

    def step():  # torch's recipe: grads set to None before, so the captured backward makes them
        loss = torch.nn.functional.mse_loss(model(static_x), static_t)
        loss.backward()
        opt.step()
        return loss

    def eager_step():
        opt.zero_grad(set_to_none=True)
        return step()

    _warm(eager_step)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with capture_calls("training step"):
        with torch.cuda.graph(g):
            static_loss = step()
    losses = []
    gen = torch.Generator("cuda").manual_seed(5)
    for i in range(200):
        xb = torch.randn(512, 64, device="cuda", generator=gen)
        static_x.copy_(xb)
        static_t.copy_(xb @ w_true)
        g.replay()
        if i % 20 == 0 or i == 199:
            losses.append(float(static_loss))
    assert all(l == l for l in losses), "NaN loss: %s" % losses
    assert losses[-1] < 0.1 * losses[0], "the graphed step did not learn: losses %s" % losses
    del g, static_loss
    return "loss %.3g -> %.3g over 200 replays" % (losses[0], losses[-1])


def test_compile_reduce_overhead():
    """torch.compile(mode="reduce-overhead") (CUDA graph trees) matches eager."""
    import torch
    model = _mlp(1024)
    f = torch.compile(model, mode="reduce-overhead")
    worst = 0.0
    with torch.no_grad():
        for i in range(6):
            x = torch.randn(128, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(10 + i))
            y = f(x).clone()
            ref = model(x)
            worst = max(worst, float((y - ref).abs().max()))
            assert torch.allclose(y, ref, rtol=1e-2, atol=1e-2), "call %d differs from eager by %g" % (i, worst)
    del f
    torch._dynamo.reset()
    return "6 calls equal eager (max |diff| %.2g)" % worst


def test_compile_training_step():
    """reduce-overhead on a training step learns: graph trees record the backward after the forward,
    restoring the pool's checkpoint (getCheckpointState / setCheckpointPoolState) in between."""
    import torch
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w_true = torch.randn(64, 1, device="cuda")
    f = torch.compile(model, mode="reduce-overhead")
    losses = []
    try:
        for i in range(30):
            x = torch.randn(512, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(100 + i))
            loss = torch.nn.functional.mse_loss(f(x), x @ w_true)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss))
    finally:
        del f
        torch._dynamo.reset()
    assert losses[-1] < 0.5 * losses[0], "did not learn: %s" % losses[::5]
    return "loss %.3g -> %.3g over 30 compiled steps" % (losses[0], losses[-1])


def test_shared_pool():
    """Two graphs sharing one pool (pool=g1.pool()) give the right result."""
    import torch
    x = torch.randn(1 << 20, device="cuda")
    _warm(lambda: (x * 2 + 1) * 3)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with capture_calls("graph 1 of a shared pool"):
        with torch.cuda.graph(g1):
            a = x * 2 + 1
    with capture_calls("graph 2 of a shared pool"):
        with torch.cuda.graph(g2, pool=g1.pool()):
            b = a * 3
    for i in range(3):
        x.copy_(torch.randn(1 << 20, device="cuda", generator=torch.Generator("cuda").manual_seed(20 + i)))
        g1.replay()
        g2.replay()
        assert torch.allclose(b, (x * 2 + 1) * 3, rtol=1e-5, atol=1e-5), "replay %d: wrong result" % i
    pool = g1.pool()
    segs = [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", (0, 0))) == tuple(pool)]
    assert segs, "no segment of the shared pool %s in the snapshot" % (pool,)
    held = sum(s["total_size"] for s in segs)
    del g1, g2, a, b
    return "3 replays right; the pool holds %d segment(s), %.1f MiB" % (len(segs), held / MIB)


def test_mempool():
    """MemPool/use_mem_pool allocations land in the pool (pool.snapshot())."""
    import torch
    if not hasattr(torch.cuda, "MemPool"):
        return "SKIP torch.cuda.MemPool missing"
    pool = torch.cuda.MemPool()
    outside = torch.randn(1 << 18, device="cuda")
    with torch.cuda.use_mem_pool(pool):
        t = torch.randn(1 << 22, device="cuda")
        small = torch.ones(100, device="cuda")
    snap = pool.snapshot()
    pid = tuple(pool.id)
    assert snap and all(tuple(s["segment_pool_id"]) == pid for s in snap), "pool.snapshot() %s" % snap[:2]

    def holds(segs, p):
        return any(s["address"] <= p < s["address"] + s["total_size"] for s in segs)

    assert holds(snap, t.data_ptr()) and holds(snap, small.data_ptr()), "pool tensors not in pool.snapshot()"
    assert not holds(snap, outside.data_ptr()), "a tensor made outside use_mem_pool is in the pool"
    n = pool.use_count() if hasattr(pool, "use_count") else None
    in_pool = sum(s["total_size"] for s in snap)
    del t, small, outside
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    left = [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", (0, 0))) == pid]
    assert not left, "the pool's segments outlived the pool: %s" % left[:2]
    return "pool %s: %d segment(s), %.1f MiB; use_count %s; gone with the pool" % (pid, len(snap), in_pool / MIB, n)


def test_mempool_options():
    """MemPool's constructor and destructor calls (torch 2.11: setUseOnOOM(false) in every ~MemPool,
    setUseOnOOM(true) / setNoSplit for use_on_oom / no_split): a plain MemPool made and dropped many
    times neither raises nor aborts; use_on_oom and no_split pools are accepted and allocate, under
    gpumem as natively (issue 46; tests/gpu/test_interop.py checks what they do)."""
    import inspect
    import torch
    if not hasattr(torch.cuda, "MemPool"):
        return "SKIP torch.cuda.MemPool missing"
    for _ in range(20):
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            t = torch.ones(1 << 16, device="cuda")
        del t, pool
    gc.collect()
    done = ["20 MemPools made and dropped"]
    try:
        params = inspect.signature(torch.cuda.MemPool.__init__).parameters
    except (TypeError, ValueError):  # no Python signature: the options are not tried
        params = {}
    for opt in ("use_on_oom", "no_split"):
        if opt not in params:
            continue
        p = torch.cuda.MemPool(**{opt: True})
        with torch.cuda.use_mem_pool(p):
            t = torch.ones(1 << 16, device="cuda")
        assert float(t.sum()) == 1 << 16
        del t, p
        done.append("%s accepted" % opt)
    gc.collect()
    return "; ".join(done)


def test_failed_capture():
    """A capture that fails (a synchronize inside it): torch never calls endAllocateToPool then, so the
    allocator keeps the capture as under way. torch.cuda.empty_cache() must still not raise (torch's
    skips its pools silently), and the program can go on allocating and computing."""
    import torch
    x = torch.ones(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    _STATE["failed_graph"] = g  # kept alive: torch may still ask its allocation filter
    try:
        with torch.cuda.graph(g):
            (x * 2).sum()  # an allocation in the graph's pool
            torch.cuda.synchronize()  # not allowed during a capture
    except Exception as e:  # noqa: BLE001
        why = type(e).__name__
    else:
        return "SKIP the capture with a synchronize did not fail"
    torch.cuda.empty_cache()
    z = torch.ones(1 << 22, device="cuda") * 3
    assert float(z.sum()) == 3 * (1 << 22), "wrong result after a failed capture"
    del z
    torch.cuda.empty_cache()
    return "capture failed (%s); empty_cache and new allocations work after it" % why


# the compiled training step after the others: it is the one that restores pool checkpoints; the
# failed capture last of all: its capture stays under way for the allocator (as for torch's)
TESTS = [test_graph_forward, test_graph_training_step, test_compile_reduce_overhead, test_shared_pool, test_mempool,
         test_mempool_options, test_compile_training_step, test_failed_capture]


def main():
    only, jpath = parse_args(sys.argv[1:], "test_graphs.py")
    import torch
    lib = _gpumem()
    mode = allocator_mode(lib is not None)

    def before():  # each test starts from an empty cache and fresh peaks
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        _STATE["ncap"] = len(_STATE["captures"])

    def fields(name):  # its peaks, and the device calls made during its captures
        torch.cuda.synchronize()
        calls = {}
        for c in _STATE["captures"][_STATE["ncap"]:]:
            for who, made in c["calls"].items():
                for k, v in made.items():
                    calls.setdefault(who, {})[k] = calls.get(who, {}).get(k, 0) + v
        return {"max_reserved": torch.cuda.max_memory_reserved(), "max_allocated": torch.cuda.max_memory_allocated(),
                "capture_calls": calls if lib is not None else None}

    return run_tests(TESTS, only, jpath, lambda results: {"mode": mode, "results": results,
                                                         "captures": _STATE["captures"]},
                     width=26, before=before, fields=fields)


if __name__ == "__main__":
    sys.exit(main())
