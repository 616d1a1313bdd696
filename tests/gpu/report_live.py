"""Live attribution check on the GPU (issue 13): GPT-2 small (AdamW, bf16
autocast) and ResNet-50 (SGD momentum, fp16 AMP) trained exactly as
../shared/traces/workloads.py records them, under gpumem with
gpumem.torch.track(model, optimizer); the history is dumped and attributed by
`gpumem report --json`, and compared with arithmetic you can check:

  parameters at the peak   = sum(numel x element size)                (1%)
  optimizer state at peak  = 2 x fp32 parameter bytes (Adam), 1 x (SGD momentum)  (1%)
  gradients per step       = parameter bytes                          (1%)
  activations + temporaries at the peak = max_memory_allocated - the rest (2%)
  offline attribution of the recorded trace (frames) vs live, per category (5%)

usage: python3 tests/gpu/report_live.py GPUMEM_CLI [TRACES_DIR]
Each workload runs in its own process (gpumem must be installed before CUDA
starts). Prints one table; exit 0 even when a check misses (the table says).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpumem_path  # noqa: E402,F401  (the installed gpumem, with its shim, when there is one)


def child(name, dump):
    import gpumem.torch as gt
    from gpumem import track as tk
    gt.install()
    import torch
    torch.manual_seed(0)
    if name == "gpt2_small_adamw_bf16":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config()
        model = GPT2LMHeadModel(cfg)
        tr = gt.track(model, history=4_000_000)
        model.cuda().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tr.track_optimizer(opt)
        g = torch.Generator().manual_seed(0)
        steps = 4
        for _ in range(steps):
            ids = torch.randint(0, cfg.vocab_size, (8, 1024), generator=g).cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=ids, labels=ids)  # as workloads.py: `out` (bf16 logits) lives
                loss = out.loss                         # through backward, so the peaks match
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        state_factor = 2
    else:
        import torchvision
        model = torchvision.models.resnet50()
        tr = gt.track(model, history=4_000_000)
        model.cuda().train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        tr.track_optimizer(opt)
        scaler = torch.amp.GradScaler("cuda")
        crit = torch.nn.CrossEntropyLoss()
        steps = 4
        for _ in range(steps):
            x = torch.randn(128, 3, 224, 224, device="cuda")
            y = torch.randint(0, 1000, (128,), device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = crit(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        state_factor = 1
    torch.cuda.synchronize()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    fp32 = sum(p.numel() * 4 for p in model.parameters())
    st = gt.memory_stats()
    tr.dump(dump)
    tr.close()
    print(json.dumps({"params": params, "state_expected": state_factor * fp32, "steps": steps,
                      "max_allocated": st["allocated_bytes.all.peak"],
                      "peak_requested": st["requested_bytes.all.peak"],
                      "history": list(tk.history_counts())}))


def pct(a, b):
    return 100.0 * (a - b) / b if b else float("nan")


def main():
    cli = sys.argv[1]
    traces = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "..", "..", "shared", "traces")
    rows, ok_all = [], True
    for name in ("gpt2_small_adamw_bf16", "resnet50_sgd_amp"):
        dump = os.path.join(os.environ.get("OUT") or tempfile.mkdtemp(), "live_" + name + ".pickle.gz")
        t0 = time.time()
        p = subprocess.run([sys.executable, __file__, "--child", name, dump], capture_output=True, text=True,
                           timeout=240)
        if p.returncode:
            print("== %s FAILED (%.0f s)\n%s\n%s" % (name, time.time() - t0, p.stdout[-2000:], p.stderr[-4000:]))
            ok_all = False
            continue
        m = json.loads(p.stdout.strip().splitlines()[-1])
        rep = json.loads(subprocess.run([cli, "report", dump, "--json"], check=True, capture_output=True,
                                        text=True).stdout)
        cat = {k: v["peak"] for k, v in rep["categories"].items()}
        alloc = {k: v["allocated"] for k, v in rep["categories"].items()}
        act_tmp = cat["activations"] + cat["temporaries"]
        rest = m["max_allocated"] - cat["parameters"] - cat["gradients"] - cat["optimizer_state"] - cat["other"]
        checks = [
            ("history covers every allocation: report peak == requested_bytes.all.peak",
             rep["peak_requested"], m["peak_requested"], 0.0),
            ("parameters at peak vs sum(numel x elsize)", cat["parameters"], m["params"], 1.0),
            ("optimizer state at peak vs %s x fp32 params" % (2 if "adam" in name else 1),
             cat["optimizer_state"], m["state_expected"], 1.0),
            ("gradients allocated per step vs params", alloc["gradients"] / m["steps"], m["params"], 1.0),
            ("activations+temporaries vs max_allocated - rest", act_tmp, rest, 2.0),
        ]
        offline_path = os.path.join(traces, name + ".pickle.gz")
        if os.path.exists(offline_path):
            off = json.loads(subprocess.run([cli, "report", offline_path, "--json"], check=True,
                                            capture_output=True, text=True).stdout)
            for k in ("parameters", "optimizer_state", "activations", "temporaries", "gradients"):
                checks.append(("offline (frames) vs live: %s at peak" % k, off["categories"][k]["peak"], cat[k], 5.0))
        print("== %s (%.0f s; history %s recorded/held/dropped; unknown at peak %d B, other %d B)"
              % (name, time.time() - t0, m["history"], rep["methods"]["unknown"], cat["other"]))
        for what, got, want, tol in checks:
            d = pct(got, want) if want else 0.0
            ok = (abs(d) <= tol if tol else got == want) if want else got == 0
            ok_all &= ok
            print("  %-62s %16.0f %16.0f %+8.3f%%  %s" % (what, got, want, d, "ok" if ok else "MISS (tol %g%%)" % tol))
        rows.append((name, cat, m))
    print("ALL OK" if ok_all else "SOME CHECKS MISSED")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
