"""GPU tests of gpumem inside PyTorch (one process, gpumem installed at import
with $GPUMEM_CONF). Run with pytest, or directly: python3 test_gpumem_gpu.py
(a tiny runner below, for machines without pytest). Needs one CUDA GPU.

Cross-process checks (losses equal to the native allocator's, multi-GPU) are
run by orchestrate.py (gpu_workloads.py, multi_gpu.py): they need fresh processes.

Direct runs take --timeout S (per test: faulthandler dumps every thread's
Python stack and exits 124 when one test runs longer) and --after NAME (run
only the tests after NAME in the order below: orchestrate.py restarts the
suite there after a hang). Each test prints "START name" before it runs."""
import ctypes
import faulthandler
import os
import sys
import threading
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import gpumem.torch as gt  # noqa: E402

CONF = os.environ.get("GPUMEM_CONF") or None
gt.install(CONF)  # before any CUDA use: the module import is the earliest point
MIB = 1 << 20
GIB = 1 << 30


class raises:  # noqa: N801 (pytest.raises-like, without pytest)
    def __init__(self, *types):
        self.types = types
        self.value = None

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            raise AssertionError("expected %s, nothing was raised" % (self.types,))
        if not issubclass(et, self.types):
            return False
        self.value = ev
        return True


def test_installed_and_second_install_refused():
    x = torch.ones(1, device="cuda")  # CUDA is initialised now
    assert gt.is_installed()
    st = gt.status()
    print("gpumem status:", st)
    with raises(RuntimeError) as r:
        gt.install("policy:torch" if CONF != "policy:torch" else "policy:gpumem")
    assert "already installed" in str(r.value)
    del x


def test_stats_agree_with_allocations():
    torch.cuda.synchronize()
    base = gt.memory_stats()
    n = 10 * MIB + 123
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    s = gt.memory_stats()
    assert s["requested_bytes.all.current"] - base["requested_bytes.all.current"] == n, (s, base)
    assert s["allocation.all.current"] - base["allocation.all.current"] == 1
    assert s["allocated_bytes.all.current"] - base["allocated_bytes.all.current"] >= n
    assert gt.memory_reserved() >= gt.memory_allocated()
    assert gt.max_memory_allocated() >= gt.memory_allocated()
    small = torch.empty(100, dtype=torch.float32, device="cuda")  # 400 B: the small pool
    s2 = gt.memory_stats()
    assert s2["allocation.small_pool.current"] - s["allocation.small_pool.current"] == 1
    del x, small
    s3 = gt.memory_stats()
    assert s3["requested_bytes.all.current"] == base["requested_bytes.all.current"]
    assert s3["allocation.all.current"] == base["allocation.all.current"]
    gt.reset_peak_memory_stats()
    assert gt.max_memory_allocated() == gt.memory_allocated()
    assert gt.check() == ""


def test_many_live_tensors_keep_their_data():
    # overlapping blocks would show up as overwritten values
    g = torch.Generator().manual_seed(7)
    sizes = torch.randint(1, 3 * MIB, (300,), generator=g).tolist()
    ts = []
    for i, n in enumerate(sizes):
        ts.append(torch.full((n // 4 + 1,), float(i), device="cuda"))
        if i % 3 == 2:
            ts[i - 1] = None  # free some in between, so freed blocks get reused
    for i, t in enumerate(ts):
        if t is not None:
            assert bool((t == float(i)).all()), "tensor %d was overwritten" % i
    del ts
    assert gt.check() == ""


def _side_stream_run(use_record_stream):
    """x is made on `main`, read on `side` after a long sleep, then freed on
    main; z (same size, on main) is written at once. Without record_stream
    z may take x's memory while side has not read it yet."""
    main, side = torch.cuda.Stream(), torch.cuda.Stream()  # not the legacy default stream
    n = 8 * MIB
    with torch.cuda.stream(main):
        x = torch.ones(n, device="cuda")
        main.synchronize()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(400_000_000)  # ~0.2 s of GPU time on side
            y = x * 2
        if use_record_stream:
            x.record_stream(side)
        xptr = x.data_ptr()
        del x
        z = torch.zeros(n, device="cuda")
        reused = z.data_ptr() == xptr
    torch.cuda.synchronize()
    ok = bool((y == 2).all())
    del y, z
    return ok, reused


def test_record_stream_protects_side_stream_data():
    ok, _ = _side_stream_run(True)
    assert ok, "data read on the side stream was overwritten although record_stream was called"


def test_without_record_stream_the_test_is_sensitive():
    # the control: shows the test above would catch an ignored record_stream
    ok, reused = _side_stream_run(False)
    if not reused:
        raise unittest.SkipTest("memory was not reused at once; the control cannot show corruption")
    assert not ok, "memory was reused while the side stream still had to read it, yet no corruption seen"


def _oom_exc():
    return torch.OutOfMemoryError if gt.native_oom() else RuntimeError


def test_oom_raises_and_training_continues():
    with raises(torch.OutOfMemoryError, RuntimeError) as r:
        with gt.oom_guard():
            torch.empty(64 * 1024 * GIB, dtype=torch.uint8, device="cuda")
    assert isinstance(r.value, torch.OutOfMemoryError), type(r.value)
    assert "out of memory" in str(r.value).lower(), str(r.value)
    print("OOM message:", str(r.value)[:600])
    # fill the device, then free and train
    held = []
    with raises(torch.OutOfMemoryError, RuntimeError) as r2:
        with gt.oom_guard():
            for _ in range(400):
                held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
    assert isinstance(r2.value, torch.OutOfMemoryError)
    assert len(held) > 10, "only %d GiB before OOM" % len(held)
    assert gt.memory_stats()["num_ooms"] >= 2
    del held
    gt.empty_cache()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert torch.isfinite(loss).item()
    assert gt.check() == ""


def test_native_oom_exception_available():
    # with the shim, OOM is torch.OutOfMemoryError without oom_guard
    if not gt.native_oom():
        raise unittest.SkipTest("the shim gpumem._C is not installed: OOM needs gt.oom_guard()")
    with raises(torch.OutOfMemoryError):
        torch.empty(64 * 1024 * GIB, dtype=torch.uint8, device="cuda")


def test_mem_get_info_and_empty_cache():
    free, total = gt.mem_get_info()
    assert 0 < free <= total
    assert abs(total - torch.cuda.get_device_properties(0).total_memory) < GIB
    x = torch.empty(4 * GIB, dtype=torch.uint8, device="cuda")
    r1 = gt.memory_reserved()
    del x
    gt.empty_cache()
    r2 = gt.memory_reserved()
    assert r2 <= r1 - 4 * GIB, (r1, r2)
    free2, _ = gt.mem_get_info()
    assert free2 > free - GIB


def test_summary_and_print():
    x = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
    text = gt.memory_summary()
    assert len(text) > 200, text
    line = gt.memory_usage_line("tag1")
    assert "tag1" in line and "allocated" in line
    gt.print_memory_usage("tag1")
    del x


def test_allocation_from_a_fresh_thread():
    # torch calls alloc on threads with no current CUDA context
    out = {}

    def work():
        try:
            t = torch.full((MIB,), 3.0, device="cuda")
            out["ok"] = bool((t == 3.0).all())
        except Exception as e:  # noqa: BLE001
            out["err"] = repr(e)

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert out.get("ok"), out


def test_invariants_hold_at_the_end():
    torch.cuda.synchronize()
    assert gt.check() == ""


def _allow_debugger():
    """Let gdb attach from a non-parent process (Yama ptrace_scope 1), so
    orchestrate.py can take a native stack of a hung test; best effort."""
    try:
        ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)  # PR_SET_PTRACER_ANY
    except Exception:  # noqa: BLE001
        pass


def _main():
    import argparse  # noqa: PLC0415
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=0, help="per-test limit in seconds (0: none)")
    ap.add_argument("--after", default=None, help="run only the tests after this one")
    a = ap.parse_args()
    faulthandler.enable()
    _allow_debugger()
    names = sorted(n for n in globals() if n.startswith("test_"))
    order = [n for n in names if n != "test_invariants_hold_at_the_end"] + ["test_invariants_hold_at_the_end"]
    if a.after:
        order = order[order.index(a.after) + 1:] if a.after in order else order
    failed = 0
    for n in order:
        print("START", n, flush=True)
        if a.timeout > 0:
            faulthandler.dump_traceback_later(a.timeout, exit=True)
        try:
            globals()[n]()
            print("PASS", n, flush=True)
        except unittest.SkipTest as e:
            print("SKIP", n, e, flush=True)
        except Exception:  # noqa: BLE001
            failed += 1
            print("FAIL", n, flush=True)
            traceback.print_exc()
        finally:
            faulthandler.cancel_dump_traceback_later()
            sys.stdout.flush()
            sys.stderr.flush()
    print("%d failed of %d" % (failed, len(order)), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    _main()
