"""GPU tests: under gpumem (installed with the C++ shim), torch's own memory
API, profiler, snapshots and OOMs keep working and answer with gpumem's
statistics (issue 12). One test per row of the issue's table, plus CUDA
graphs, the `gpumem run` launcher, torchrun, the HF Trainer's memory metrics
and torch's memory viewer.

Runs against the *installed* gpumem package (pip install --no-build-isolation
./python), from any directory:

    python3 tests/gpu/test_torch_dropin.py [--only a,b] [--json FILE]

GPUMEM_CONF picks the settings (default: policy:gpumem). Tests that need a
fresh process (native comparisons, CUDA graphs, launcher) start one with this
file and a --child mode. Needs one CUDA GPU (two for the DDP test, which
skips otherwise). Prints one line per test and a summary; exit status 1 if
any test failed.
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_runner import parse_args, run_tests  # noqa: E402 (the loop the GPU test scripts share)

HERE = os.path.abspath(__file__)
MIB = 1 << 20


def _sh(cmd, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


# ---- children (each a fresh process) ------------------------------------------

def _small_model_profile():
    """{op name: self CUDA memory bytes} for a forward+backward of a small MLP."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    x = torch.randn(64, 512, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        v = getattr(e, "self_device_memory_usage", None)
        if v is None:
            v = getattr(e, "self_cuda_memory_usage", 0)
        if v:
            out[e.key] = int(v)
    table = prof.key_averages().table(sort_by="self_cuda_memory_usage", row_limit=8)
    return out, table


def child(mode):
    import torch
    if mode.startswith("gpumem"):
        import gpumem.torch as gt
        gt.install(os.environ.get("GPUMEM_CONF") or None)
    if mode.endswith("profile"):
        out, table = _small_model_profile()
        print(json.dumps({"ops": out, "table": table}))
    elif mode == "gpumem-graph":
        g = torch.cuda.CUDAGraph()
        x = torch.ones(1024, device="cuda")
        torch.cuda.synchronize()
        res = {"captured": False, "error": None}
        try:
            with torch.cuda.graph(g):
                y = x * 2
            g.replay()
            torch.cuda.synchronize()
            res["captured"] = bool((y == 2).all())
        except Exception as e:  # noqa: BLE001 (we report whatever torch raises)
            res["error"] = "%s: %s" % (type(e).__name__, e)
        torch.cuda.set_stream(torch.cuda.default_stream())
        z = torch.ones(10, device="cuda") + 1  # the process still works
        res["after"] = float(z.sum())
        print(json.dumps(res))
    elif mode == "report":  # run by the launcher tests: what the process sees
        import gpumem.torch as gt
        x = torch.ones(MIB, device="cuda")
        rank = os.environ.get("RANK")
        print(json.dumps({"status": gt.status(), "allocated": torch.cuda.memory_allocated(),
                          "gm_allocated": gt.memory_allocated() if gt.is_installed() else None,
                          "conf": os.environ.get("GPUMEM_CONF"), "rank": rank}))
        del x
    else:
        raise SystemExit("unknown child mode %s" % mode)


# ---- in-process tests (gpumem installed at startup) ------------------------------

def _gt():
    import gpumem.torch as gt
    return gt


def test_shim_installed():
    import torch
    st = _gt().status()
    assert st["installed"] and st["mode"] == "shim", st
    torch.ones(1, device="cuda")
    from gpumem import _C
    assert _C.active(), "torch's current allocator is not gpumem's"
    return "mode %s, conf %s" % (st["mode"], _gt().effective_conf(st["conf"]))


def test_memory_allocated_reserved():
    import torch
    gt = _gt()
    x = torch.empty(10 * MIB + 123, dtype=torch.uint8, device="cuda")
    a, r = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    s = gt.memory_stats()
    assert a == s["allocated_bytes.all.current"] and r == s["reserved_bytes.all.current"], (a, r, s)
    assert a >= 10 * MIB and r >= a
    del x
    assert torch.cuda.memory_allocated() == gt.memory_allocated()
    return "allocated %d, reserved %d (= gpumem's)" % (a, r)


def test_training_loop_helper():
    import torch
    gt = _gt()
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    lines = []
    for epoch in range(3):
        for _ in range(4):
            loss = model(torch.randn(32, 256, device="cuda")).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        a, r = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        assert (a, r) == (gt.memory_allocated(), gt.memory_reserved())
        lines.append("epoch %d: allocated %.1f MiB, reserved %.1f MiB" % (epoch, a / MIB, r / MIB))
    return lines[-1]


def test_peak_reset_summary_stats():
    import torch
    gt = _gt()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    assert torch.cuda.max_memory_allocated() == base == gt.max_memory_allocated()
    x = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    del x
    peak = torch.cuda.max_memory_allocated()
    assert peak >= base + 64 * MIB and peak == gt.max_memory_allocated(), (peak, base)
    assert torch.cuda.max_memory_reserved() == gt.max_memory_reserved()
    ts, gs = torch.cuda.memory_stats(), gt.memory_stats()
    common = [k for k in ts if k in gs]
    diff = {k: (ts[k], gs[k]) for k in common if ts[k] != gs[k]}
    assert len(common) >= 100 and not diff, (len(common), diff)
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
    summ = torch.cuda.memory_summary()
    assert "Allocated memory" in summ and "GPU reserved memory" in summ, summ[:400]
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    return "%d memory_stats keys equal gpumem's; peak %d" % (len(common), peak)


def _tiles(seg):
    return sum(b["size"] for b in seg["blocks"]) == seg["total_size"]


def test_history_snapshot():
    import torch
    gt = _gt()
    conf = gt.effective_conf(gt.status()["conf"])
    vmm = "policy:gpumem" in conf or "expandable_segments:True" in conf
    reserved0 = torch.cuda.memory_reserved()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    keep = [torch.empty(n * MIB, dtype=torch.uint8, device="cuda") for n in (1, 3, 7)]
    tmp = torch.empty(5 * MIB, device="cuda")
    del tmp
    # more than is cached: memory must grow, and the trace must say so
    grow = torch.empty(reserved0 + 64 * MIB, dtype=torch.uint8, device="cuda")
    snap = torch.cuda.memory._snapshot()
    reserved1 = torch.cuda.memory_reserved()
    torch.cuda.memory._record_memory_history(enabled=None)
    assert reserved1 > reserved0, (reserved0, reserved1)
    segs = snap["segments"]
    assert segs and all(_tiles(s) for s in segs), "segments empty or blocks do not tile them"
    total = sum(s["total_size"] for s in segs)
    if "policy:gpumem" in conf:  # one segment per mapped run, as torch's expandable segments
        assert total == reserved1, ("segments add up to %d, reserved %d" % (total, reserved1))
        assert all(s["is_expandable"] for s in segs), "policy:gpumem segments not expandable"
    live = sum(b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated")
    assert live == gt.memory_allocated() == torch.cuda.memory_allocated(), (live, gt.memory_allocated())
    tr = snap["device_traces"][torch.cuda.current_device()]
    acts = [e["action"] for e in tr]
    assert acts.count("alloc") >= 4 and "free_requested" in acts and "free_completed" in acts, acts[:20]
    grew = "segment_map" if vmm else "segment_alloc"
    assert grew in acts, "memory grew by %d bytes but no %s in the trace" % (reserved1 - reserved0, grew)
    sign = {"segment_map": 1, "segment_alloc": 1, "segment_unmap": -1, "segment_free": -1}
    net = sum(sign[e["action"]] * e["size"] for e in tr if e["action"] in sign)
    assert net == reserved1 - reserved0, ("segment events add up to %d, reserved grew %d" % (net, reserved1 - reserved0))
    framed = [e for e in tr if e["action"] == "alloc" and e.get("frames")]
    assert framed, "no Python frames on alloc events"
    mine = [b for s in segs for b in s["blocks"] if b["state"] == "active_allocated" and b.get("frames")]
    assert any(any(f["filename"].endswith("test_torch_dropin.py") for f in b["frames"]) for b in mine), \
        "no block carries this file's frames"
    path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    html = path + ".html"
    rc, out, err = _sh([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", path, "-o", html])
    assert rc == 0, err[-2000:]
    size = os.path.getsize(html)
    assert size > 1000, size
    _STATE["snapshot"] = path
    del keep, grow
    return "%d segments, %d trace events (%d with frames); trace_plot HTML %d bytes" % (
        len(segs), len(tr), len(framed), size)


def test_record_stream_reaches_gpumem():
    import torch
    side = torch.cuda.Stream()
    x = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    ptr = x.data_ptr()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.add_(1)
    x.record_stream(side)
    del x  # gpumem keeps the block until side's work is done: listed as pending
    snap = torch.cuda.memory._snapshot()
    states = {b["state"] for s in snap["segments"] for b in s["blocks"]
              if s["address"] <= ptr < s["address"] + s["total_size"]}
    assert "active_pending_free" in states, states
    torch.cuda.synchronize()
    return "freed block waits for the recorded stream (active_pending_free)"


def test_empty_cache():
    import torch
    gt = _gt()
    x = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    del x
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    assert after < before and after == gt.memory_reserved(), (before, after)
    return "reserved %d -> %d" % (before, after)


def test_memory_fraction_enforced():
    import torch
    free, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(0.25)
    try:
        assert abs(torch.cuda.get_per_process_memory_fraction() - 0.25) < 1e-9 \
            if hasattr(torch.cuda, "get_per_process_memory_fraction") else True
        ok = torch.empty(int(total * 0.1), dtype=torch.uint8, device="cuda")
        del ok
        try:
            torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            msg = str(e)
        else:
            raise AssertionError("an allocation over the fraction succeeded")
        assert "gpumem" in msg and "fraction" in msg, msg
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    x = torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")  # allowed again
    del x
    torch.cuda.empty_cache()
    return "0.3 of the device refused under fraction 0.25: " + msg[:120]


def test_oom_type_and_observer():
    import torch
    gt = _gt()
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, alloc, total, free: seen.append((dev, alloc)))
    n0 = torch.cuda.memory_stats()["num_ooms"]
    _, total = torch.cuda.mem_get_info()
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        msg = str(e)
    else:
        raise AssertionError("no OOM")
    assert msg.startswith("gpumem: CUDA out of memory. Tried to allocate"), msg
    assert torch.cuda.memory_stats()["num_ooms"] == n0 + 1 == gt.memory_stats()["num_ooms"]
    assert seen and seen[-1][1] == 2 * total, seen
    x = torch.ones(10, device="cuda")  # still works
    assert float(x.sum()) == 10
    return msg[:160]


def test_profiler_matches_native():
    env = {"GPUMEM_RUN": ""}
    res = {}
    for mode in ("native-profile", "gpumem-profile"):
        rc, out, err = _sh([sys.executable, HERE, "--child", mode], env)
        assert rc == 0, (mode, err[-3000:])
        res[mode] = json.loads(out.strip().splitlines()[-1])
    nat, gm = res["native-profile"]["ops"], res["gpumem-profile"]["ops"]
    assert gm and any(v > 0 for v in gm.values()), "every op shows 0 bytes under gpumem:\n" + \
        res["gpumem-profile"]["table"]
    diff = {k: (nat.get(k), gm.get(k)) for k in set(nat) | set(gm) if nat.get(k) != gm.get(k)}
    _STATE["profile"] = {"native": nat, "gpumem": gm, "table": res["gpumem-profile"]["table"]}
    assert not diff, "per-op self CUDA memory differs (native, gpumem): %s" % diff
    return "%d ops with CUDA memory, all equal to native" % len(gm)


def test_cuda_graph():
    rc, out, err = _sh([sys.executable, HERE, "--child", "gpumem-graph"], {"GPUMEM_RUN": ""})
    assert rc == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    assert r["after"] == 20.0, r
    assert r["captured"], r  # issue 28: private pools (tests/gpu/test_graphs.py tests them in depth)
    return "torch.cuda.graph works under gpumem"


def _launch(args, env=None):
    return _sh([sys.executable, "-m", "gpumem", "run"] + args, env)


def test_launcher_runs_unmodified_script():
    rc, out, err = _launch(["--conf", "policy:torch", "--", sys.executable, HERE, "--child", "report"])
    assert rc == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    assert r["status"]["mode"] == "shim" and r["allocated"] == r["gm_allocated"] >= MIB, r
    assert r["conf"] == "policy:torch", r
    rc, out, err = _launch(["--native", "--", sys.executable, HERE, "--child", "report"])
    assert rc == 0, err[-3000:]
    r2 = json.loads(out.strip().splitlines()[-1])
    assert not r2["status"]["installed"], r2
    rc, _, _ = _launch(["--", sys.executable, "-c", "import torch, sys; sys.exit(3)"])
    assert rc == 3, rc
    rc, _, _ = _launch(["--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert rc == -15, rc
    return "shim installed in the child; --native keeps torch's; exit 3 and SIGTERM pass through"


def test_torchrun_workers():
    import torch
    n = min(2, torch.cuda.device_count())
    rc, out, err = _launch(["--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", str(n), HERE, "--child", "report"])
    assert rc == 0, err[-3000:]
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(rows) == n and all(r["status"]["mode"] == "shim" for r in rows), rows
    return "%d torchrun worker(s) ran on gpumem" % n


def test_hf_trainer_memory_metrics():
    try:
        import transformers
    except ImportError:
        return "SKIP transformers not installed"
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=128, vocab_size=1000, n_positions=64)
    model = GPT2LMHeadModel(cfg)

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            ids = torch.randint(0, 1000, (64,))
            return {"input_ids": ids, "labels": ids}

    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=3,
                             skip_memory_metrics=False, report_to=[], logging_steps=1, save_strategy="no",
                             disable_tqdm=True)
    out = Trainer(model=model, args=args, train_dataset=DS()).train()
    m = out.metrics
    keys = [k for k in m if k.startswith("train_mem_gpu")]
    assert "train_mem_gpu_alloc_delta" in m and "train_mem_gpu_peaked_delta" in m, m
    assert m["train_mem_gpu_alloc_delta"] > 0, m
    return "transformers %s: %s" % (transformers.__version__, ", ".join("%s=%s" % (k, m[k]) for k in keys))


def test_ddp_two_gpus():
    import torch
    if torch.cuda.device_count() < 2:
        return "SKIP needs 2 GPUs (run on nvidia-h200-x2)"
    script = os.path.join(os.path.dirname(HERE), "ddp_dropin_worker.py")
    rc, out, err = _launch(["--", sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", "2", script])
    assert rc == 0, err[-3000:]
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and all(r["ok"] for r in rows), rows
    return "; ".join("rank %d on cuda:%d allocated %d (= gpumem's)" % (r["rank"], r["device"], r["allocated"])
                     for r in rows)


TESTS = [test_shim_installed, test_memory_allocated_reserved, test_training_loop_helper,
         test_peak_reset_summary_stats, test_history_snapshot, test_record_stream_reaches_gpumem, test_empty_cache,
         test_memory_fraction_enforced, test_oom_type_and_observer, test_profiler_matches_native, test_cuda_graph,
         test_launcher_runs_unmodified_script, test_torchrun_workers, test_hf_trainer_memory_metrics,
         test_ddp_two_gpus]
_STATE = {}


def main():
    args = sys.argv[1:]
    if args[:1] == ["--child"]:
        child(args[1])
        return 0
    only, jpath = parse_args(args, "test_torch_dropin.py")
    import torch
    import gpumem.torch as gt
    gt.install(os.environ.get("GPUMEM_CONF") or None)
    print("torch %s, GPU %s, gpumem %s" % (torch.__version__, torch.cuda.get_device_name(0), gt.status()),
          flush=True)
    return run_tests(TESTS, only, jpath, lambda results: {"results": results, "profile": _STATE.get("profile")},
                     width=36)


if __name__ == "__main__":
    sys.exit(main())
