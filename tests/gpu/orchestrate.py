"""Run the GPU tests and benchmarks after run_gpu.sh has built everything;
log each step under LOGS and print one results table at the end.

    python3 orchestrate.py --build BUILD --out OUT --logs LOGS [--traces DIR] [--budget SECONDS]

Every risky step runs in its own process with its own timeout, so a hang or
crash costs one step (one test, one bench cell), not the run. On a timeout
the step leaves a trail: test processes dump every thread's Python stack
(faulthandler), the replay bench prints its phase, event index and native
stack (its --timeout watchdog), and if gdb is installed orchestrate attaches
it for every thread's native stack before killing the process.

Order, most important first: GPU suites for both policies (short per-test
timeouts), replay bench for policy gpumem (its default gpumem_chunks:auto, and
granule / run chunks as gpumem-granule / gpumem-run) and torch-native on every
trace, GPT-2 small gpumem vs native, ResNet-50 losses, the torch-policy replay
cells, then the rest if time is left. Steps that would not fit in the budget
are marked SKIP. OUT gets results.json only; logs go to LOGS (run_gpu.sh
tars them into OUT/logs.tgz).
"""
import argparse
import glob
import json
import re
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
T0 = time.time()
ROWS = []  # (section, name, result, detail)
SUITE_TEST_TIMEOUT = int(os.environ.get("GPUMEM_TEST_TIMEOUT", "25"))  # s per GPU test (slowest ~5 s on the H200)
BENCH_CELL_TIMEOUT = 40  # s per (trace, allocator) replay process
BENCH_REPS = 5  # repetitions per cell (allocator made anew each time); the tables show the median one
PAIR_ROUNDS = 21  # alternating untimed passes per trace in the paired warm comparison
SUITE = os.environ.get("GPUMEM_GPU_SUITE", "tests/gpu/test_gpumem_gpu.py")  # replaceable to test orchestrate


def row(section, name, result, detail=""):
    ROWS.append((section, name, result, detail))
    print("[%5.0fs] %-8s %-42s %-5s %s" % (time.time() - T0, section, name, result, detail), flush=True)


def gdb_stack(pid):
    """Every thread's native stack of pid, via gdb if present (best effort)."""
    if not shutil.which("gdb"):
        return "[orchestrate] no gdb on this machine: no native stack\n"
    try:
        p = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                            "-ex", "thread apply all bt 40"], capture_output=True, text=True, timeout=25,
                           errors="replace")
        out = "\n".join(l for l in (p.stdout + p.stderr).splitlines()
                        if l.startswith(("#", "Thread", "warning: process", "ptrace", "Could not attach")))
        return "[orchestrate] gdb native stacks of pid %d:\n%s\n" % (pid, out[-20000:])
    except Exception as e:  # noqa: BLE001
        return "[orchestrate] gdb failed: %r\n" % (e,)


def run(a, name, cmd, timeout, env=None, stack_at=None, stall=None):
    """Run cmd in its own process group, log to LOGS/name.log; returns (rc, text).
    rc 124 when orchestrate killed it at `timeout`; at `stack_at` seconds (default
    timeout - 6), or after `stall` seconds without an output line, a
    still-running process gets one gdb stack dump first."""
    log = os.path.join(a.logs, name + ".log")
    e = dict(os.environ)
    e.update(env or {})
    timeout = max(5, min(timeout, int(left(a.budget)) - 5))
    stack_at = stack_at if stack_at is not None else max(1, timeout - 6)
    t = time.time()
    lines = []
    last = [time.time()]
    p = subprocess.Popen(cmd, cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", start_new_session=True)

    def reader():
        for line in p.stdout:
            lines.append(line)
            last[0] = time.time()

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    rc, dumped, extra = None, False, ""
    while rc is None:
        try:
            rc = p.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            el = time.time() - t
            if (el >= stack_at or (stall and time.time() - last[0] >= stall)) and not dumped:
                dumped = True
                extra += "\n[orchestrate] still running after %.0fs; last line: %s\n" % (
                    el, lines[-1].strip() if lines else "(none)")
                extra += gdb_stack(p.pid)
            if time.time() - t >= timeout:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()
                rc = 124
                extra += "[orchestrate] TIMEOUT after %ds: killed\n" % timeout
    th.join(5)
    text = "".join(lines) + extra
    with open(log, "w") as f:
        f.write("$ %s\n(%.1fs, rc %d)\n%s" % (" ".join(cmd), time.time() - t, rc, text))
    return rc, text


def left(budget):
    return budget - (time.time() - T0)


def tail(text, n=3):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:])[-300:]


def where(text):
    """The most telling lines of a hang: watchdog/faulthandler frames in our code."""
    keep = [l.strip() for l in text.splitlines()
            if l.startswith(("WATCHDOG timeout", "PROGRESS", "Timeout ("))
            or ("File " in l and ("tests/gpu" in l or "gpumem" in l))
            or ("gm_" in l and l.startswith("#")) or "tp_" in l]
    return " | ".join(keep[-4:])[-300:]


def gpu_count():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return sum(1 for l in p.stdout.splitlines() if l.startswith("GPU "))
    except Exception:  # noqa: BLE001
        return 0


def step_cpu_tests(a):
    rc, text = run(a, "python_cpu_tests", [sys.executable, "-m", "unittest", "discover", "-s", "python/tests", "-v"],
                   30)
    row("python", "package CPU tests (sim backend)", "PASS" if rc == 0 else "FAIL", tail(text, 2))


def step_gpu_suite(a, conf, cap):
    """The in-process suite, one process per run; after a test hangs or crashes
    the suite restarts after it, so every other test still runs."""
    pol = conf.split(":")[1]
    after, part, t0 = None, 0, time.time()
    while True:
        cmd = [sys.executable, SUITE, "--timeout", str(SUITE_TEST_TIMEOUT)]
        if after:
            cmd += ["--after", after]
        budget = int(cap - (time.time() - t0))
        if budget < 20:
            row("gpu " + pol, "rest of suite", "SKIP", "suite time cap %ds spent" % cap)
            return
        rc, text = run(a, "gpu_suite_%s_%d" % (pol, part), cmd, budget, env={"GPUMEM_CONF": conf},
                       stall=max(2, SUITE_TEST_TIMEOUT - 5))
        part += 1
        started, finished = None, True
        for l in text.splitlines():
            w = l.split()
            if len(w) >= 2 and w[0] == "START":
                started, finished = w[1], False
            elif len(w) >= 2 and w[0] in ("PASS", "FAIL", "SKIP") and w[1].startswith("test_"):
                finished = True
                row("gpu " + pol, w[1], w[0], " ".join(w[2:])[:100])
        if finished or not started:
            if rc != 0 and not started:
                row("gpu " + pol, "suite", "FAIL", "rc %d: %s" % (rc, tail(text, 3)))
            return
        hung = rc == 124 or "Timeout (" in text
        row("gpu " + pol, started, "FAIL", ("HANG >%ds: " % SUITE_TEST_TIMEOUT if hung else "CRASH rc %d: " % rc)
            + (where(text) or tail(text, 3)))
        after = started


def workload(a, model, alloc, conf, steps, timeout):
    tag = "%s_%s%s" % (model, alloc, "_" + conf.split(":")[1] if conf else "")
    if left(a.budget) < timeout * 0.6:
        row("model", tag, "SKIP", "time budget")
        return None
    res = os.path.join(a.logs, tag + ".json")
    cmd = [sys.executable, "tests/gpu/gpu_workloads.py", "--model", model, "--alloc", alloc, "--steps", str(steps),
           "--out", res]
    if conf:
        cmd += ["--conf", conf]
    rc, text = run(a, "workload_" + tag, cmd, timeout, env={"GPUMEM_STEP_TIMEOUT": str(timeout - 4)},
                   stack_at=timeout - 8)
    if rc != 0 or not os.path.exists(res):
        hung = rc == 124 or "Timeout (" in text
        row("model", tag, "FAIL", "rc %d: %s" % (rc, (where(text) if hung else "") or tail(text, 2)))
        return None
    with open(res) as f:
        r = json.load(f)
    row("model", tag, "PASS", "step %.2f ms, device peak used %.2f GiB" % (r["step_ms_median"],
                                                                          r["device_peak_used"] / 2**30))
    return r


def compare(model, ref, got, rtol):
    if ref is None or got is None:
        return
    n = min(len(ref["losses"]), len(got["losses"]))
    diffs = [abs(x - y) / max(abs(x), 1e-12) for x, y in zip(ref["losses"][:n], got["losses"][:n])]
    worst = max(diffs) if diffs else float("inf")
    exact = sum(1 for d in diffs if d == 0)
    tag = "%s losses gpumem(%s) == native" % (model, got["conf"].split(":")[1])
    row("model", tag, "PASS" if worst <= rtol else "FAIL",
        "%d/%d exact, max rel diff %.2e (tol %.0e); gpumem invariants %s" % (exact, n, worst, rtol, got["invariants"]))


def step_gpt2(a, results, conf, steps=20):
    if "gpt2_native" not in results:
        results["gpt2_native"] = workload(a, "gpt2", "native", None, steps, 110)
    got = workload(a, "gpt2", "gpumem", conf, steps, 110)
    results["gpt2_" + conf] = got
    compare("gpt2", results["gpt2_native"], got, 1e-5)


def step_resnet(a, results, conf):
    if "resnet50_native" not in results:
        results["resnet50_native"] = workload(a, "resnet50", "native", None, 4, 90)
    # adaptive_avg_pool2d's backward has no deterministic kernel: looser tolerance
    got = workload(a, "resnet50", "gpumem", conf, 4, 90)
    results["resnet50_" + conf] = got
    compare("resnet50", results["resnet50_native"], got, 1e-3)


def step_multi_gpu(a):
    n = gpu_count()
    if n < 2:
        row("multi", "2-GPU NCCL all-reduce + DDP", "SKIP", "%d GPU(s)" % n)
        return
    rc, text = run(a, "multi_gpu", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                    "--nproc_per_node=2", "tests/gpu/multi_gpu.py"], 120,
                   env={"NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "GPUMEM_CONF": "policy:gpumem"})
    # the two ranks share stdout, so their lines can run together: match, don't split
    oks = re.findall(r"RANK (\d+) OK (\{[^}]*\})", text)
    ranks = {r for r, _ in oks}
    row("multi", "2-GPU NCCL all-reduce + DDP", "PASS" if rc == 0 and ranks == {"0", "1"} else "FAIL",
        ("; ".join("rank %s %s" % o for o in oks) if oks else tail(text, 3))[:300])


def convert_traces(a):
    """Event files for the bench (once); [] when there is nothing to replay."""
    traces = sorted(glob.glob(os.path.join(a.traces, "*.pickle.gz"))) if a.traces else []
    if not traces:
        row("replay", "traces", "FAIL", "no *.pickle.gz in %r" % a.traces)
        return []
    evdir = os.path.join(a.build, "events")
    os.makedirs(evdir, exist_ok=True)
    files = []
    for t in traces:
        dst = os.path.join(evdir, os.path.basename(t).replace(".pickle.gz", ".bin"))
        if os.path.exists(dst) and os.path.getmtime(dst) >= os.path.getmtime(t):
            files.append(dst)
            continue
        rc, text = run(a, "convert_" + os.path.basename(dst), [sys.executable, "bench/trace_to_events.py", t, dst], 60)
        if rc == 0:
            files.append(dst)
        else:
            row("replay", "convert " + os.path.basename(t), "FAIL", tail(text, 1))
    return files


def pin_cpu():
    """Every replay cell's replaying thread on the same CPU (--pin: that
    thread only, after CUDA started its own threads, which keep every CPU;
    taskset on the whole process put them on the same core)."""
    cpus = sorted(os.sched_getaffinity(0))
    return ["--pin", str(cpus[len(cpus) // 2])] if cpus else []


def median(xs):
    """The middle value (the upper one of an even count), as the tables have
    always shown it."""
    return statistics.median_high(xs)


def tagged(text, tag):
    """The JSON objects of the bench's `TAG {json}` lines, in order."""
    return [json.loads(l[len(tag) + 1:]) for l in text.splitlines() if l.startswith(tag + " {")]


def median_rows(rows, keys, field):
    """Of the repetitions of one cell, per value of `keys` (in the order they
    first appear: cold before warm), the row whose `field` is the median (the
    whole row, so its numbers stay consistent)."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for g in groups.values():
        g = sorted(g, key=lambda r: r[field])
        m = dict(g[len(g) // 2])
        m["reps"] = len(g)
        out.append(m)
    return out


def bench_and_events(a, results, section):
    """The replay bench's path, with the traces converted to its event files
    (once per run, in results["events"]), or None (a FAIL row said why)."""
    bench = os.path.join(a.build, "gpu_replay_bench")
    if not os.path.exists(bench):
        row(section, "gpu_replay_bench", "FAIL", "not built (see build_ext.log)")
        return None
    if "events" not in results:
        results["events"] = convert_traces(a)
    return bench


def step_replay(a, results, allocs):
    """One process per (trace, allocator): a hang loses that cell only."""
    bench = bench_and_events(a, results, "replay")
    if not bench:
        return
    for f in results["events"]:
        for al in allocs:
            tag = "%s %s" % (os.path.basename(f)[:-4], al)
            if left(a.budget) < 15:
                row("replay", tag, "SKIP", "time budget")
                continue
            rc, text = run(a, "replay_%s_%s" % (os.path.basename(f)[:-4], al),
                           [bench, "--alloc", al, "--reps", str(BENCH_REPS), "--timeout",
                            str(BENCH_CELL_TIMEOUT - 4)] + pin_cpu() + [f],
                           BENCH_CELL_TIMEOUT, stack_at=BENCH_CELL_TIMEOUT - 8)
            res = median_rows(tagged(text, "RESULT"), ("pass",), "ns_mean")
            results.setdefault("replay", []).extend(res)
            bulk_all = tagged(text, "BULK")
            results.setdefault("bulk", []).extend(median_rows(bulk_all, (), "ns_mean_untimed"))
            if bulk_all:  # the best repetition too: noise only ever adds time
                best = dict(min(bulk_all, key=lambda r: r["ns_mean_untimed"]))
                results.setdefault("bulk_best", []).append(best)
            # the first repetition's cold and warm passes
            results.setdefault("calls", []).extend(tagged(text, "CALLS")[:2])
            if rc != 0 or len(res) != 2:
                hung = rc == 124 or "WATCHDOG" in text
                row("replay", tag, "FAIL", ("HANG: " + (where(text) or tail(text, 3))) if hung
                    else "rc %d: %s" % (rc, tail(text, 3)))
            else:
                w = res[1]
                row("replay", tag, "PASS", "warm median %d ns, p99 %d ns, ratio %.4f" % (
                    w["ns_median"], w["ns_p99"], res[0]["peak_reserved"] / max(1, res[0]["peak_requested"])))


def native_unless_done(results):
    """torch-native for a replay step, unless an earlier step replayed it."""
    return [] if any(r["allocator"] == "torch-native" for r in results.get("replay") or []) else ["torch-native"]


def step_paired(a, results):
    """Warm speedup measured in pairs: gpumem's default and torch native in one
    process, alternating untimed passes (the bench's --pair), one process per
    trace. Each round's ratio compares passes milliseconds apart, so a slow
    spell of the host hits both allocators; the rows of step_replay come from
    separate processes minutes apart."""
    bench = bench_and_events(a, results, "paired")
    if not bench:
        return
    for f in results["events"]:
        tag = os.path.basename(f)[:-4]
        if left(a.budget) < 15:
            row("paired", tag, "SKIP", "time budget")
            continue
        rc, text = run(a, "paired_" + tag, [bench, "--pair", str(PAIR_ROUNDS), "--timeout",
                                            str(BENCH_CELL_TIMEOUT - 4)] + pin_cpu() + [f],
                       BENCH_CELL_TIMEOUT, stack_at=BENCH_CELL_TIMEOUT - 8)
        pairs = tagged(text, "PAIR")
        results.setdefault("pairs", []).extend(pairs)
        if rc != 0 or len(pairs) != PAIR_ROUNDS:
            row("paired", tag, "FAIL", "rc %d, %d of %d rounds: %s" % (rc, len(pairs), PAIR_ROUNDS, tail(text, 3)))
        else:
            sp = sorted(p["speedup"] for p in pairs)
            row("paired", tag, "PASS", "speedup median %.2fx (%.2f-%.2f)" % (median(sp), sp[0], sp[-1]))


def print_paired(results):
    by = {}
    for p in results.get("pairs") or []:
        by.setdefault(p["trace"], []).append(p)
    if not by:
        return
    print("\nWarm speedup in pairs (untimed passes of gpumem's default and torch native alternating in one process,"
          " %d rounds; ns/op medians):" % PAIR_ROUNDS)
    print("  %-28s %8s %8s %9s %15s %11s" % ("trace", "gpumem", "native", "speedup", "min-max", "rounds >=5x"))
    for tr, ps in sorted(by.items()):
        sp = sorted(p["speedup"] for p in ps)
        print("  %-28s %8.1f %8.1f %8.2fx %7.2f-%.2fx %8d/%d" % (
            tr[:28], median([p["gpumem_ns"] for p in ps]), median([p["native_ns"] for p in ps]), median(sp),
            sp[0], sp[-1],
            sum(1 for x in sp if x >= 5), len(sp)))


def print_tables(a, results):
    print("\n================ gpumem GPU results ================")
    npass = sum(1 for r in ROWS if r[2] == "PASS")
    nfail = sum(1 for r in ROWS if r[2] == "FAIL")
    print("%-8s %-44s %-5s %s" % ("section", "check", "res", "detail"))
    for s, n, r, d in ROWS:
        print("%-8s %-44s %-5s %s" % (s, n[:44], r, d[:110]))
    rep = results.get("replay") or []
    if rep:
        print("\nTrace replay, device 0 (ns per alloc/free; peak reserved / peak requested; each row the median of %d "
              "repetitions by mean, a fresh allocator each):" % BENCH_REPS)
        print("%-34s %-14s %-4s %8s %8s %8s %10s %7s %5s" % ("trace", "allocator", "pass", "median", "p99", "mean",
                                                          "peak_res", "ratio", "fails"))
        for r in rep:
            ratio = r["peak_reserved"] / r["peak_requested"] if r["peak_requested"] else float("nan")
            print("%-34s %-14s %-4s %8.0f %8.0f %8.1f %9.2fG %7.4f %5d" % (
                r["trace"][:34], r["allocator"], r["pass"], r["ns_median"], r["ns_p99"], r["ns_mean"],
                r["peak_reserved"] / 2**30, ratio, r["fails"]))
        by = {(r["trace"], r["allocator"], r["pass"]): r for r in rep}
        bulk = {(b["trace"], b["allocator"]): b["ns_mean_untimed"] for b in results.get("bulk") or []}
        bbest = {(b["trace"], b["allocator"]): b["ns_mean_untimed"] for b in results.get("bulk_best") or []}
        paired = {}
        for p in results.get("pairs") or []:
            paired.setdefault(p["trace"], []).append(p["speedup"])
        print("\nTargets (issue 4): warm mean >= 5x faster than torch-native, warm p99 <= 1000 ns, "
              "cold mean <= torch-native cold, ratio <= 1.01 (paired: median of the replay-paired rounds):")
        # gpumem-gpumem: the default (gpumem_chunks:auto); -granule / -run: the other chunk modes;
        # -slack0: gpumem_slack:0, the least-memory setting (moves memory in every step)
        for tr in sorted({r["trace"] for r in rep}):
            nat_w, nat_c = by.get((tr, "torch-native", "warm")), by.get((tr, "torch-native", "cold"))
            for al in ("gpumem-gpumem", "gpumem-granule", "gpumem-run", "gpumem-slack0"):
                g_w, g_c = by.get((tr, al, "warm")), by.get((tr, al, "cold"))
                if not (g_w and g_c):
                    continue
                sp = nat_w["ns_mean"] / g_w["ns_mean"] if nat_w and g_w["ns_mean"] else float("nan")
                cold = ("%.2fx" % (g_c["ns_mean"] / nat_c["ns_mean"])) if nat_c and nat_c["ns_mean"] else "n/a"
                ratio = g_c["peak_reserved"] / g_c["peak_requested"] if g_c["peak_requested"] else float("nan")
                nb, gb = bulk.get((tr, "torch-native")), bulk.get((tr, al))
                spb = ("%.2fx (%.0f vs %.0f ns)" % (nb / gb, gb, nb)) if nb and gb else "n/a"
                nbb, gbb = bbest.get((tr, "torch-native")), bbest.get((tr, al))
                if nbb and gbb:
                    spb += ", best %.2fx" % (nbb / gbb)
                if al == "gpumem-gpumem" and paired.get(tr):
                    spb += ", paired %.2fx" % median(paired[tr])
                print("  %-34s %-13s warm speedup %6.2fx  untimed %s  warm p99 %6.0f ns  cold time vs native %s  "
                      "ratio %.4f" % (tr[:34], al, sp, spb, g_w["ns_p99"], cold, ratio))
    print_paired(results)
    for pas, title in (("cold", "First pass"), ("warm", "Warm pass (only where it made any)")):
        calls = [c for c in results.get("calls") or [] if c["pass"] == pas and (pas == "cold" or c["calls"])]
        if calls:
            print("\n%s device calls (gpumem): kind count / ms inside the driver" % title)
        for c in calls:
            total = sum(v[1] for v in c["calls"].values()) / 1000
            print("  %-28s %-14s %7.1f ms: %s" % (c["trace"][:28], c["allocator"], total, ", ".join(
                "%s %d / %.1f" % (k, v[0], v[1] / 1000) for k, v in sorted(c["calls"].items(), key=lambda x: -x[1][1]))))
    g = {k: v for k, v in results.items() if k.startswith("gpt2_") and v}
    if g:
        print("\nGPT-2 small training (batch 8 x 512, bf16 autocast, AdamW):")
        print("%-22s %12s %14s %14s %16s" % ("allocator", "step ms", "peak alloc", "peak reserved",
                                             "device peak used"))
        for k, v in g.items():
            print("%-22s %12.2f %13.2fG %13.2fG %15.2fG" % (
                k, v["step_ms_median"], (v["peak_allocated"] or 0) / 2**30, (v["peak_reserved"] or 0) / 2**30,
                v["device_peak_used"] / 2**30))
        nat, gm = g.get("gpt2_native"), g.get("gpt2_policy:gpumem")
        if nat and gm:
            print("  gpumem step time vs native: %+.2f%% (target <= +1%%); device peak used: %+.2f GiB" % (
                100 * (gm["step_ms_median"] / nat["step_ms_median"] - 1),
                (gm["device_peak_used"] - nat["device_peak_used"]) / 2**30))
    print("\n%d PASS, %d FAIL, %d SKIP; %.0f s; logs in %s (OUT/logs.tgz)" % (
        npass, nfail, sum(1 for r in ROWS if r[2] == "SKIP"), time.time() - T0, a.logs))
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"rows": ROWS, "results": results}, f, indent=1)
    return nfail


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--logs", default=None)
    ap.add_argument("--traces", default=None)
    ap.add_argument("--budget", type=float, default=420)
    ap.add_argument("--only", default=None, help="comma-separated step names (debugging)")
    a = ap.parse_args()
    a.logs = a.logs or a.out
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.logs, exist_ok=True)
    results = {}
    steps = [("cpu", lambda: step_cpu_tests(a)),
             ("suite-gpumem", lambda: step_gpu_suite(a, "policy:gpumem", 75)),
             ("suite-torch", lambda: step_gpu_suite(a, "policy:torch", 75)),
             ("replay-gpumem-native", lambda: step_replay(a, results, ["gpumem-gpumem", "gpumem-granule", "gpumem-run",
                                                                        "torch-native"])),
             ("replay-paired", lambda: step_paired(a, results)),
             ("gpt2-gpumem", lambda: step_gpt2(a, results, "policy:gpumem")),
             ("resnet50-gpumem", lambda: step_resnet(a, results, "policy:gpumem")),
             ("gpt2-run", lambda: step_gpt2(a, results, "policy:gpumem,gpumem_chunks:run")),
             ("resnet50-run", lambda: step_resnet(a, results, "policy:gpumem,gpumem_chunks:run")),
             ("replay-torch", lambda: step_replay(a, results, ["gpumem-torch"])),
             ("multi", lambda: step_multi_gpu(a)),
             ("gpt2-torch", lambda: step_gpt2(a, results, "policy:torch", 6)),
             ("resnet50-torch", lambda: step_resnet(a, results, "policy:torch")),
             # the least-memory setting, for the memory / speed trade-off (bench/gpumem_policy_tradeoff.md)
             ("replay-slack0", lambda: step_replay(a, results, ["gpumem-slack0"] + native_unless_done(results))),
             ("gpt2-slack0", lambda: step_gpt2(a, results, "policy:gpumem,gpumem_slack:0"))]
    only = set(a.only.split(",")) if a.only else None
    for name, fn in steps:
        if only and name not in only:
            continue
        if left(a.budget) < 20:
            row("budget", name, "SKIP", "time budget spent")
            continue
        print("[%5.0fs] == step %s (%.0fs left)" % (time.time() - T0, name, left(a.budget)), flush=True)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (a broken step must not hide the others)
            row(name, "orchestrator error", "FAIL", repr(e)[:200])
    results.pop("events", None)
    sys.exit(1 if print_tables(a, results) else 0)


if __name__ == "__main__":
    if shutil.which("nvidia-smi") is None:
        print("warning: nvidia-smi not found", file=sys.stderr)
    main()
