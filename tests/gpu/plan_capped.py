"""Training at a memory cap just above the peak allocated (issue 16), on the GPU.

Two jobs, as ../shared/traces/workloads.py trains them but longer:
  gpt2  GPT-2 small, AdamW, bf16 autocast, batch 8 x 512, fixed shapes
  bert  BERT base (masked LM), AdamW, fp16 autocast, batch 32, a random
        sequence length in 32..512 every step (seeded: every run sees the
        same lengths)
each run in a fresh process under one allocator setting:
  native           torch's caching allocator (its default settings)
  gpumem           gpumem's default (policy:gpumem)
  gpumem-plan      policy:gpumem,gpumem_plan:on with step marks from the
                   optimizer (gpumem.torch.mark_steps)
first uncapped (gpumem: its peak allocated sets the cap), then with
torch.cuda.set_per_process_memory_fraction(cap / total memory), cap =
GPUMEM_CAP_X (1.03) x the uncapped peak allocated. Per run: did it finish (or
OOM, at which step), median step time over the second half of the steps,
device calls (memory_stats num_* deltas over that half), peak allocated and
reserved. One table at the end.

    python3 tests/gpu/plan_capped.py [--steps 40] [--only gpt2,bert] [--json FILE]
    python3 tests/gpu/plan_capped.py --child MODEL ALLOC CAP_BYTES STEPS   (one run; prints one JSON line)
"""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpumem_path  # noqa: E402,F401  (the installed gpumem, with its shim, when there is one)

CONFS = {"gpumem": "policy:gpumem", "gpumem-plan": "policy:gpumem,gpumem_plan:on"}


def child(model_name, alloc, cap, steps):
    gt = None
    if alloc != "native":
        import gpumem.torch as gt
        gt.install(CONFS[alloc])
    import torch
    torch.manual_seed(0)
    total = torch.cuda.mem_get_info()[1]
    if cap:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config()
        model, amp, batch, lo, hi = GPT2LMHeadModel(cfg), torch.bfloat16, 8, 512, 512
    else:
        from transformers import BertConfig, BertForMaskedLM
        cfg = BertConfig()
        model, amp, batch, lo, hi = BertForMaskedLM(cfg), torch.float16, 32, 32, 512
    model.cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if gt and "plan" in alloc:
        gt.mark_steps(opt)
    g = torch.Generator().manual_seed(1)
    # gpumem's own statistics carry its device calls (num_map, ...); torch's
    # dict has only the keys torch knows
    stats = (lambda: gt.memory_stats(0)) if gt else (lambda: torch.cuda.memory_stats(0))
    times, done, err = [], 0, None
    stats0 = {}
    for step in range(steps):
        s = int(torch.randint(lo, hi + 1, (1,), generator=g))
        ids = torch.randint(0, cfg.vocab_size, (batch, s), generator=g)
        if step == steps // 2:
            torch.cuda.synchronize()
            stats0 = stats()
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ids = ids.cuda()
            with torch.autocast("cuda", dtype=amp):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            done += 1
        except torch.OutOfMemoryError as e:
            err = "OOM at step %d: %s" % (step, str(e).splitlines()[0][:160])
            break
    s1 = stats()
    calls = {k: s1[k] - stats0.get(k, 0) for k in s1 if k.startswith("num_") and stats0 and s1[k] != stats0.get(k, 0)}
    half = times[len(times) // 2:] if done == steps else []
    print(json.dumps({"model": model_name, "alloc": alloc, "cap": cap, "steps": done, "error": err,
                      "step_ms": 1e3 * statistics.median(half) if half else None,
                      "calls_second_half": calls, "peak_allocated": torch.cuda.max_memory_allocated(),
                      "peak_reserved": torch.cuda.max_memory_reserved(), "total": total}), flush=True)


def run(model, alloc, cap, steps):
    t0 = time.time()
    p = subprocess.run([sys.executable, __file__, "--child", model, alloc, str(cap), str(steps)],
                       capture_output=True, text=True, timeout=240)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"model": model, "alloc": alloc, "cap": cap, "error": "exit %d: %s" % (p.returncode, p.stderr[-600:])}
    r = json.loads(lines[-1])
    r["seconds"] = round(time.time() - t0, 1)
    return r


def main():
    args = sys.argv[1:]
    if args[:1] == ["--child"]:
        child(args[1], args[2], int(args[3]), int(args[4]))
        return 0
    steps, only, jpath = 40, ["gpt2", "bert"], None
    while args:
        a = args.pop(0)
        if a == "--steps":
            steps = int(args.pop(0))
        elif a == "--only":
            only = args.pop(0).split(",")
        elif a == "--json":
            jpath = args.pop(0)
        else:
            print(__doc__, file=sys.stderr)
            return 2
    capx = float(os.environ.get("GPUMEM_CAP_X", "1.03"))
    rows = []
    for model in only:
        base = run(model, "gpumem", 0, steps)
        rows.append(base)
        print(json.dumps(base), flush=True)
        if not base.get("peak_allocated"):
            continue
        cap = int(base["peak_allocated"] * capx)
        for alloc in ("native", "gpumem", "gpumem-plan"):
            r = run(model, alloc, cap, steps)
            rows.append(r)
            print(json.dumps(r), flush=True)
        r = run(model, "gpumem-plan", 0, steps)
        rows.append(r)
        print(json.dumps(r), flush=True)
    print("\nmodel  allocator     cap (x peak alloc)   finished  step ms (2nd half)  vs gpumem uncapped  "
          "device calls (2nd half)   peak reserved")
    ref = {r["model"]: r.get("step_ms") for r in rows if r["alloc"] == "gpumem" and not r["cap"]}
    for r in rows:
        capn = "%.3fx" % (r["cap"] / ref_peak(rows, r["model"])) if r["cap"] else "uncapped"
        ms = r.get("step_ms")
        vs = "%+.1f%%" % (100 * (ms / ref[r["model"]] - 1)) if ms and ref.get(r["model"]) else "-"
        fin = "yes" if not r.get("error") else (r["error"][:40])
        calls = sum(v for k, v in (r.get("calls_second_half") or {}).items()
                    if k in ("num_device_alloc", "num_device_free", "num_map", "num_unmap", "num_phys_create",
                             "num_phys_release"))
        print("%-6s %-13s %-20s %-9s %-19s %-19s %-25s %s" % (
            r["model"], r["alloc"], capn, fin, "%.1f" % ms if ms else "-", vs, calls,
            "%.2f GiB" % (r["peak_reserved"] / 2**30) if r.get("peak_reserved") else "-"))
    if jpath:
        with open(jpath, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def ref_peak(rows, model):
    return next(r["peak_allocated"] for r in rows if r["model"] == model and r["alloc"] == "gpumem" and not r["cap"])


if __name__ == "__main__":
    sys.exit(main())
