"""GPT-2 small step time, native allocator vs gpumem, measured carefully.

One process per (allocator, round); final_run.sh runs them interleaved and
then calls --summarize. A worker process:

    python3 ab_step_time.py --alloc native|gpumem [--conf policy:gpumem] [--warmup 5] [--steps 40]
                            --out result.json

  - trains GPT-2 small exactly as gpu_workloads.py does (batch 8 x 512, bf16
    autocast, AdamW, the same deterministic settings), warm-up steps first,
  - times every step three ways: wall clock around the step with a
    synchronize before and after, CUDA events at its start and end (GPU
    time, idle gaps included), and the enqueue time (until the last kernel
    is queued: when it is close to the wall time the step is CPU-bound, and
    allocator CPU time adds to it directly),
  - under gpumem with GPUMEM_PROFILE=1: alloc/free calls per step, the time
    spent inside the pluggable entry points, calls >= 10 us, backend (device)
    calls per step by kind, and memory_stats deltas (num_map, num_unmap,
    num_device_alloc, num_phys_create, ...) over the timed steps; under
    native, allocations and cudaMalloc calls per step from memory_stats,
  - then, with deterministic algorithms off (they make torch.empty launch a
    fill kernel): torch.empty(N) + del in a Python loop for 4 KiB, 1 MiB and
    64 MiB (torch's own per-allocation cost through CUDAPluggableAllocator,
    gpumem's part from the profile counters subtracted), and a check that
    kernels run as fast on this allocator's memory (1 GiB copy, bf16 matmul).

    python3 ab_step_time.py --summarize DIR    (DIR holds the workers' r<N>_<name>.json)

prints the comparison table: per allocator the median and mean of all timed
steps, the per-round medians (spread), the ratio to native pooled and paired
by round, the allocator's own cost, the micro-benchmark and the kernel check.
"""
import argparse
import ctypes
import glob
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpumem_path  # noqa: E402,F401  (the installed gpumem, with its shim, when there is one)

PROFILE_FIELDS = ("alloc_calls", "alloc_ns", "alloc_max_ns", "alloc_slow", "free_calls", "free_ns", "free_max_ns",
                  "free_slow")
BCALLS = ("MALLOC", "FREE", "MEM_INFO", "VA_RESERVE", "VA_RELEASE", "PHYS_CREATE", "PHYS_RELEASE", "MAP", "UNMAP",
          "EVENT_RECORD", "EVENT_QUERY", "EVENT_SYNC", "EVENT_DESTROY")
STAT_KEYS = ("num_map", "num_unmap", "num_device_alloc", "num_device_free", "num_phys_create", "num_phys_release",
             "num_va_reserve", "num_va_release", "num_alloc_retries", "num_sync_all_streams", "num_ooms",
             "allocation.all.allocated", "allocation.all.freed", "segment.all.allocated")
MICRO_SIZES = (4096, 1 << 20, 64 << 20)


# ---- gpumem's profile counters (src/torch/gpumem_torch.c) ------------------

class Profiler:
    """The GPUMEM_PROFILE counters and backend call counts, through ctypes."""

    def __init__(self):
        from gpumem import _lib  # noqa: PLC0415
        self.lib = _lib.load()
        self.ok = all(hasattr(self.lib, n) for n in ("gpumem_torch_profile", "gpumem_torch_backend_calls"))
        if not self.ok:
            return
        self.lib.gpumem_torch_profile.restype = ctypes.c_int
        self.lib.gpumem_torch_profile.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        self.has_ns = hasattr(self.lib, "gpumem_torch_backend_ns")  # an older install has counts only
        self.lib.gpumem_torch_profile_enable.restype = ctypes.c_int
        self.lib.gpumem_torch_profile_enable.argtypes = [ctypes.c_int]
        self.pbuf = (ctypes.c_uint64 * len(PROFILE_FIELDS))()
        self.bbuf = (ctypes.c_uint64 * len(BCALLS))()

    def enable(self, on):
        if self.ok:
            self.lib.gpumem_torch_profile_enable(1 if on else 0)

    def read(self, dev=0):
        """(profile dict, backend-calls dict); empty dicts without the functions."""
        if not self.ok:
            return {}, {}
        self.lib.gpumem_torch_profile(self.pbuf, len(PROFILE_FIELDS))
        n = self.lib.gpumem_torch_backend_calls(dev, self.bbuf, len(BCALLS))
        prof = dict(zip(PROFILE_FIELDS, self.pbuf))
        calls = dict(zip(BCALLS, self.bbuf)) if n > 0 else {}
        return prof, calls

    def read_ns(self, dev=0):
        """Time inside the backend per call kind so far (ns; {} without the function):
        EVENT_SYNC is a move's wait for its stream, MAP and UNMAP the driver's own work."""
        if not (self.ok and self.has_ns):
            return {}
        n = self.lib.gpumem_torch_backend_ns(dev, self.bbuf, len(BCALLS))
        return dict(zip(BCALLS, self.bbuf)) if n > 0 else {}


def delta(after, before):
    out = {}
    for k, v in after.items():
        if k.endswith("_max_ns"):
            continue  # a running maximum, not a counter
        out[k] = v - before.get(k, 0)
    return out


# ---- the worker --------------------------------------------------------------

def alloc_stats(torch, gt):
    s = gt.memory_stats(0) if gt is not None else torch.cuda.memory_stats(0)
    return {k: int(s[k]) for k in STAT_KEYS if k in s}


def train(a, torch, gt, prof):
    from gpu_workloads import build, deterministic  # noqa: PLC0415 (the same model, batch, optimizer and settings)
    deterministic(torch)
    model, make_batch, loss_fn, opt = build("gpt2", torch)
    model = model.cuda()
    model.train()
    g = torch.Generator().manual_seed(1234)
    ev0 = [torch.cuda.Event(enable_timing=True) for _ in range(a.warmup + a.steps)]
    ev1 = [torch.cuda.Event(enable_timing=True) for _ in range(a.warmup + a.steps)]
    steps, stats0 = [], None
    t_start = time.time()
    for i in range(a.warmup + a.steps):
        timed = i >= a.warmup
        if i == a.warmup:
            torch.cuda.synchronize()
            stats0 = alloc_stats(torch, gt)
        batch = make_batch(g).cuda()
        torch.cuda.synchronize()
        # every other timed step unprofiled: clean times, and the profiling's own cost
        profiled = bool(prof) and (not timed or i % 2 == 0)
        if prof:
            prof.enable(profiled)
        p0, c0 = prof.read() if prof else ({}, {})
        t0 = time.perf_counter()
        ev0[i].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_enq = time.perf_counter()
        ev1[i].record()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        p1, c1 = prof.read() if prof else ({}, {})
        rec = {"i": i, "timed": timed, "wall_ms": 1e3 * (t1 - t0), "enqueue_ms": 1e3 * (t_enq - t0),
               "loss": float(loss.item())}
        if profiled:
            rec["prof"] = delta(p1, p0)
            rec["prof_max_ns"] = max(p1.get("alloc_max_ns", 0), p1.get("free_max_ns", 0))
        if prof:
            rec["bcalls"] = {k: v for k, v in delta(c1, c0).items() if v}
        steps.append(rec)
        del loss, batch
    torch.cuda.synchronize()
    if prof:
        prof.enable(True)
    for i, rec in enumerate(steps):
        rec["event_ms"] = ev0[i].elapsed_time(ev1[i])
    stats1 = alloc_stats(torch, gt)
    print("train: %d steps in %.1f s" % (len(steps), time.time() - t_start), flush=True)
    del model, opt
    return steps, stats0, stats1


def micro(torch, prof, iters, reps):
    """torch.empty(size) + del from Python: per-pair us (best and median of reps,
    profiling off); with a profiler, as many reps again with it on for the time
    spent inside gpumem."""
    torch.use_deterministic_algorithms(False)
    out = {}
    for size in MICRO_SIZES:
        for _ in range(min(iters, 2000)):
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
        runs, inside = [], []
        for rep in range(2 * reps if prof else reps):
            profiled = rep >= reps
            if prof:
                prof.enable(profiled)
            p0, _c = prof.read() if prof else ({}, {})
            t0 = time.perf_counter()
            for _ in range(iters):
                x = torch.empty(size, dtype=torch.uint8, device="cuda")
                del x
            t1 = time.perf_counter()
            p1, _c = prof.read() if prof else ({}, {})
            if not profiled:
                runs.append(1e6 * (t1 - t0) / iters)
            elif p1:
                d = delta(p1, p0)
                inside.append((d["alloc_ns"] + d["free_ns"]) / 1e3 / max(1, d["alloc_calls"]))
        out[str(size)] = {"us_best": min(runs), "us_median": statistics.median(runs), "runs": runs,
                          "inside_gpumem_us": statistics.median(inside) if inside else None}
    if prof:
        prof.enable(True)
    torch.cuda.synchronize()
    return out


def kernels(torch):
    """Do kernels run as fast on this allocator's memory? 1 GiB copy and bf16 matmul."""
    torch.use_deterministic_algorithms(False)
    res = {}
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        b.copy_(a)
    e0.record()
    for _ in range(20):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    res["copy_GBps"] = 2 * 20 * (1 << 30) / (e0.elapsed_time(e1) / 1e3) / 1e9
    del a, b
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        z = x @ y
    e0.record()
    for _ in range(20):
        z = x @ y
    e1.record()
    torch.cuda.synchronize()
    res["matmul_TFLOPs"] = 2 * n ** 3 * 20 / (e0.elapsed_time(e1) / 1e3) / 1e12
    del x, y, z
    return res


def worker(a):
    import faulthandler  # noqa: PLC0415
    faulthandler.enable()
    if a.timeout > 0:
        faulthandler.dump_traceback_later(a.timeout, exit=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    t_proc = time.time()
    import torch  # noqa: PLC0415
    gt, prof = None, None
    if a.alloc == "gpumem":
        import gpumem.torch as gt  # noqa: PLC0415
        gt.install(a.conf, backend=os.environ.get("GPUMEM_AB_BACKEND", "cuda"))
        p = Profiler()
        if p.ok and os.environ.get("GPUMEM_PROFILE", "0") not in ("", "0"):
            prof = p
        elif not p.ok:
            print("WARNING: libgpumem_torch.so lacks the profile functions: no allocator cost numbers", flush=True)
    res = {"alloc": a.alloc, "conf": a.conf, "name": a.name, "round": a.round, "pid": os.getpid(),
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "loadavg_start": os.getloadavg(),
           "cpus": len(os.sched_getaffinity(0)), "profile": prof is not None}
    steps, s0, s1 = train(a, torch, gt, prof)
    res["steps"] = steps
    res["stats_timed_delta"] = {k: s1[k] - s0.get(k, 0) for k in s1}
    res["stats_end"] = s1
    res["micro"] = micro(torch, prof, a.micro_iters, 3)
    res["micro_iters"] = a.micro_iters
    res["kernels"] = kernels(torch)
    res["loadavg_end"] = os.getloadavg()
    res["process_s"] = time.time() - t_proc
    if gt is not None:
        res["invariants"] = gt.check() or "ok"
    with open(a.out + ".tmp", "w") as f:
        json.dump(res, f)
    os.rename(a.out + ".tmp", a.out)
    w = [s["wall_ms"] for s in steps if s["timed"]]
    print("RESULT %s round %s: wall median %.2f ms mean %.2f ms over %d steps; process %.1f s"
          % (a.name, a.round, statistics.median(w), statistics.mean(w), len(w), res["process_s"]), flush=True)


# ---- the summary -------------------------------------------------------------

def med(xs):
    return statistics.median(xs) if xs else float("nan")


def mean(xs):
    return statistics.mean(xs) if xs else float("nan")


def summarize(d):
    runs = []
    for p in sorted(glob.glob(os.path.join(d, "r*_*.json"))):
        try:
            with open(p) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            print("unreadable %s: %s" % (p, e))
    if not runs:
        print("A/B: no results in %s" % d)
        return 1
    names = []
    for r in runs:
        if r["name"] not in names:
            names.append(r["name"])
    names.sort(key=lambda n: (n != "native", n))
    by = {n: [r for r in runs if r["name"] == n] for n in names}
    timed = {n: [[s for s in r["steps"] if s["timed"]] for r in by[n]] for n in names}
    lines = []
    out = lines.append
    nat = by.get("native")
    nat_med = med([s["wall_ms"] for rr in timed.get("native", []) for s in rr]) if nat else None
    nat_round = {r["round"]: med([s["wall_ms"] for s in r["steps"] if s["timed"]]) for r in nat or []}
    out("GPT-2 small step time (batch 8x512, bf16 autocast, AdamW), %d timed steps per process, fresh processes "
        "interleaved; ms" % len(timed[names[0]][0]))
    out("%-14s %3s %8s %8s %8s %8s %8s  %-26s %8s %-20s" % (
        "allocator", "n", "wall med", "wall avg", "event md", "event av", "enq med", "per-round wall medians",
        "vs nat", "paired by round"))
    for n in names:
        allw = [s["wall_ms"] for rr in timed[n] for s in rr]
        alle = [s["event_ms"] for rr in timed[n] for s in rr]
        allq = [s["enqueue_ms"] for rr in timed[n] for s in rr]
        rmed = [(r["round"], med([s["wall_ms"] for s in r["steps"] if s["timed"]])) for r in by[n]]
        vs = "%+.2f%%" % (100 * (med(allw) / nat_med - 1)) if nat_med else "-"
        paired = [m / nat_round[rd] for rd, m in rmed if rd in nat_round]
        ptxt = ("%.3f..%.3f" % (min(paired), max(paired))) if paired and n != "native" else "-"
        out("%-14s %3d %8.2f %8.2f %8.2f %8.2f %8.2f  %-26s %8s %-20s" % (
            n, len(by[n]), med(allw), mean(allw), med(alle), mean(alle), med(allq),
            " / ".join("%.1f" % m for _, m in sorted(rmed)), vs, ptxt))
    out("  (wall: synchronize..synchronize; event: CUDA events at step start/end; enq: until the last kernel is "
        "queued; enq close to wall = CPU-bound step)")
    out("  per-step spread, all timed steps: " + ", ".join(
        "%s p10-p90 %.1f-%.1f ms" % (n, pct([s["wall_ms"] for rr in timed[n] for s in rr], 10),
                                     pct([s["wall_ms"] for rr in timed[n] for s in rr], 90)) for n in names))
    out("")
    out("Allocator work per timed step (mean over timed steps of all rounds):")
    for n in names:
        allss = [s for rr in timed[n] for s in rr]
        ss = [s for s in allss if "prof" in s]
        st = [r["stats_timed_delta"] for r in by[n]]
        nsteps = max(1, len(timed[n][0]))
        if ss:
            ac = mean([s["prof"]["alloc_calls"] for s in ss])
            fc = mean([s["prof"]["free_calls"] for s in ss])
            ins = mean([(s["prof"]["alloc_ns"] + s["prof"]["free_ns"]) / 1e3 for s in ss])
            slow = sum(s["prof"]["alloc_slow"] + s["prof"]["free_slow"] for s in ss)
            mx = max(s.get("prof_max_ns", 0) for s in ss) / 1e3
            bc = {}
            for s in allss:
                for k, v in s.get("bcalls", {}).items():
                    bc[k] = bc.get(k, 0) + v
            out("  %-14s %.0f allocs + %.0f frees; %.1f us inside gpumem's entry points (%.3f%% of the median "
                "step, %.0f ns per call); calls >= 10 us: %d; longest call of the whole run %.1f us"
                % (n, ac, fc, ins, 100 * ins / 1e3 / med([s["wall_ms"] for s in ss]), 1e3 * ins / max(1, ac + fc),
                   slow, mx))
            out("  %-14s backend (device) calls in all timed steps: %s" % ("", json.dumps(bc) if bc else "none"))
            unp = [s["wall_ms"] for s in allss if "prof" not in s]
            out("  %-14s profiled steps median %.2f ms, unprofiled %.2f ms (the counters' own cost, within noise)"
                % ("", med([s["wall_ms"] for s in ss]), med(unp)))
        else:
            alloc = mean([d.get("allocation.all.allocated", 0) / nsteps for d in st])
            out("  %-14s %.0f allocs per step (memory_stats)" % (n, alloc))
        keys = [k for k in STAT_KEYS if k.startswith("num_")]
        tot = {k: sum(d.get(k, 0) for d in st) for k in keys if any(k in d for d in st)}
        out("  %-14s memory_stats deltas over the timed steps of %d rounds: %s"
            % ("", len(st), ", ".join("%s %d" % kv for kv in tot.items() if kv[1]) or "all zero"))
    out("")
    out("torch.empty(N) + del from Python (us per pair, best of 3 x %s; deterministic algorithms off):"
        % (runs[0].get("micro_iters", "?")))
    out("  %-14s %10s %10s %10s   %s" % ("allocator", "4 KiB", "1 MiB", "64 MiB", "inside gpumem (1 MiB)"))
    for n in names:
        vals = []
        for sz in MICRO_SIZES:
            vals.append(med([r["micro"][str(sz)]["us_best"] for r in by[n] if "micro" in r]))
        ins = [r["micro"][str(1 << 20)]["inside_gpumem_us"] for r in by[n] if "micro" in r]
        ins = [x for x in ins if x is not None]
        out("  %-14s %10.3f %10.3f %10.3f   %s" % (n, vals[0], vals[1], vals[2], ("%.3f us" % med(ins)) if ins else "-"))
    if nat:
        nat_m = med([r["micro"][str(1 << 20)]["us_best"] for r in nat if "micro" in r])
        for n in names:
            if n == "native":
                continue
            g = med([r["micro"][str(1 << 20)]["us_best"] for r in by[n] if "micro" in r])
            ins = [x for x in (r["micro"][str(1 << 20)]["inside_gpumem_us"] for r in by[n] if "micro" in r)
                   if x is not None]
            if ins:
                out("  %-14s 1 MiB: %+.3f us vs native, of which gpumem's own %.3f us -> the pluggable path "
                    "(torch's CUDAPluggableAllocator bookkeeping) %+.3f us per alloc+free"
                    % (n, g - nat_m, med(ins), g - nat_m - med(ins)))
    out("")
    out("Kernels on the allocator's memory (median over rounds): " + "; ".join(
        "%s copy %.0f GB/s, matmul %.0f TFLOP/s" % (
            n, med([r["kernels"]["copy_GBps"] for r in by[n] if "kernels" in r]),
            med([r["kernels"]["matmul_TFLOPs"] for r in by[n] if "kernels" in r])) for n in names))
    losses = {n: [s["loss"] for s in by[n][0]["steps"]] for n in names}
    if "native" in losses:
        for n in names:
            if n != "native":
                md = max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(losses[n], losses["native"])), default=0)
                out("  losses %s vs native: max rel diff %.2e over %d steps" % (n, md, len(losses[n])))
    inv = {n: sorted({r.get("invariants", "n/a") for r in by[n]}) for n in names}
    out("  gpumem invariants: %s; load average at process start: %s" % (
        ", ".join("%s %s" % (n, "/".join(v)) for n, v in inv.items() if n != "native"),
        " ".join("%.1f" % r["loadavg_start"][0] for r in runs)))
    print("\n".join(lines))
    return 0


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--summarize", metavar="DIR")
    ap.add_argument("--alloc", choices=["native", "gpumem"])
    ap.add_argument("--conf", default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--round", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--micro-iters", type=int, default=20000)
    ap.add_argument("--timeout", type=float, default=0, help="dump stacks and exit after this many seconds")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.summarize:
        return summarize(a.summarize)
    if not a.alloc or not a.out:
        ap.error("--alloc and --out are required (or --summarize DIR)")
    a.name = a.name or (a.alloc if a.alloc == "native" else (a.conf or "gpumem"))
    worker(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
