"""One training workload in a fresh process, under the native allocator or gpumem.

    python3 gpu_workloads.py --model gpt2|resnet50 --alloc native|gpumem [--conf policy:gpumem]
                             [--steps N] [--out result.json]

Deterministic settings (seeded random init, deterministic algorithms, no
downloads), so the losses of the same model under two allocators must agree.
Prints and writes one JSON object: losses, step times, the allocator's peaks,
and the device's peak used memory (total - free, sampled after forward and
after each step: the nvidia-smi view of the process).
"""
import argparse
import faulthandler
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def build(model_name, torch):
    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415
        cfg = GPT2Config()  # GPT-2 small: 12 layers, 768 wide, 124M parameters
        model = GPT2LMHeadModel(cfg)
        batch, seq = 8, 512

        def make_batch(g):
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
            return ids

        def loss_fn(model, ids):
            return model(input_ids=ids, labels=ids).loss

        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, make_batch, loss_fn, opt
    if model_name == "resnet50":
        import torchvision  # noqa: PLC0415
        model = torchvision.models.resnet50(weights=None)
        batch = 32

        def make_batch(g):
            x = torch.randn(batch, 3, 224, 224, generator=g)
            y = torch.randint(0, 1000, (batch,), generator=g)
            return (x, y)

        def loss_fn(model, xy):
            x, y = xy
            return torch.nn.functional.cross_entropy(model(x), y)

        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return model, make_batch, loss_fn, opt
    raise SystemExit("unknown model %r" % model_name)


def deterministic(torch):
    """Seed 0 and deterministic kernels, so losses can be compared across
    allocators (every GPU workload script starts with this)."""
    torch.manual_seed(0)
    # warn_only: resnet50 needs adaptive_avg_pool2d_backward, which has no
    # deterministic CUDA kernel; the comparison allows for that (tolerance)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--alloc", choices=["native", "gpumem"], required=True)
    ap.add_argument("--conf", default=None)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--snapshot", default=None,
                    help="record the allocator's history and write it here (.pickle.gz), for replay off the GPU")
    a = ap.parse_args()
    # a hang shows where it is: every thread's Python stack, then exit 124
    faulthandler.enable()
    if float(os.environ.get("GPUMEM_STEP_TIMEOUT", "0")) > 0:
        faulthandler.dump_traceback_later(float(os.environ["GPUMEM_STEP_TIMEOUT"]), exit=True)

    import torch  # noqa: PLC0415
    gt = None
    if a.alloc == "gpumem":
        import gpumem.torch as gt  # noqa: PLC0415
        gt.install(a.conf)
    deterministic(torch)

    if a.snapshot:
        # no stack frames: the replay needs only the events, and frames make it 100x larger
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2000000)
    model, make_batch, loss_fn, opt = build(a.model, torch)
    model = model.cuda()
    model.train()
    g = torch.Generator().manual_seed(1234)
    dev_total = torch.cuda.mem_get_info()[1]
    peak_used = 0

    def sample():
        nonlocal peak_used
        free, total = torch.cuda.mem_get_info()
        peak_used = max(peak_used, total - free)

    losses, times = [], []
    for step in range(a.steps):
        batch = make_batch(g)
        batch = tuple(t.cuda(non_blocking=True) for t in batch) if isinstance(batch, tuple) else batch.cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model, batch)
        if step == 0:
            torch.cuda.synchronize()
            sample()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        sample()
        losses.append(float(loss.item()))
        print("STEP %d loss %.6f ms %.2f" % (step, losses[-1], 1000 * times[-1]), flush=True)

    if a.snapshot:
        import gzip  # noqa: PLC0415
        import pickle  # noqa: PLC0415
        with gzip.open(a.snapshot, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
    if gt is not None:
        st = gt.memory_stats()
        status = gt.status()
        inv = gt.check()
    else:
        st = torch.cuda.memory_stats()
        status = {}
        inv = ""
    steady = times[min(3, len(times) - 1):]
    res = {
        "model": a.model, "alloc": a.alloc, "conf": a.conf, "steps": a.steps, "losses": losses,
        "step_ms_median": 1000 * statistics.median(steady), "step_ms_all": [1000 * t for t in times],
        "peak_allocated": st.get("allocated_bytes.all.peak"), "peak_reserved": st.get("reserved_bytes.all.peak"),
        "peak_requested": st.get("requested_bytes.all.peak"), "device_peak_used": peak_used,
        "device_total": dev_total, "gpumem_status": status, "invariants": inv or "ok",
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
    }
    text = json.dumps(res)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
