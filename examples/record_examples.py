"""Record gpumem's shipped example traces on a GPU (run by tests/gpu/run_examples.sh).

Each workload is small and deterministic. For each one this script
  1. records a PyTorch memory snapshot (torch.cuda.memory._record_memory_history
     with enabled="all") under the default allocator settings and writes it
     gzip-compressed as examples/<name>.pickle.gz, and
  2. runs it again in a fresh process under each PYTORCH_CUDA_ALLOC_CONF in
     CONFS and writes the native allocator's measured peaks to
     examples/baselines.json, so `gpumem replay` can be checked against them.

usage: python3 examples/record_examples.py OUTDIR            (all of it)
       python3 examples/record_examples.py --one NAME CONF RECORD OUTDIR   (internal)
"""
import gzip, json, os, pickle, subprocess, sys

CONFS = ["", "expandable_segments:True", "garbage_collection_threshold:0.6,max_split_size_mb:128"]


def mlp_adam_fp32(torch):
    """A 4-layer MLP trained with Adam in fp32: weights, grads, optimizer state."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                            torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                            torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.randn(512, 1024, device="cuda")
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def transformer_varlen_bf16(torch):
    """A small transformer encoder, bf16 autocast, AdamW, variable sequence
    lengths: the pattern that fragments PyTorch's allocator."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    m = torch.nn.TransformerEncoder(layer, 4).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        s = int(torch.randint(64, 513, (1,), generator=g))
        x = torch.randn(16, s, 512, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def cnn_sgd_amp(torch):
    """A small conv net with SGD+momentum and fp16 autocast with a GradScaler."""
    torch.manual_seed(0)
    c = torch.nn
    m = c.Sequential(c.Conv2d(3, 64, 3, padding=1), c.BatchNorm2d(64), c.ReLU(),
                     c.Conv2d(64, 128, 3, stride=2, padding=1), c.BatchNorm2d(128), c.ReLU(),
                     c.Conv2d(128, 256, 3, stride=2, padding=1), c.BatchNorm2d(256), c.ReLU(),
                     c.AdaptiveAvgPool2d(1), c.Flatten(), c.Linear(256, 100)).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(3):
        x = torch.randn(64, 3, 128, 128, device="cuda")
        y = torch.randint(0, 100, (64,), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)


WORKLOADS = {f.__name__: f for f in (mlp_adam_fp32, transformer_varlen_bf16, cnn_sgd_amp)}


def run_one(name, conf, record, outdir):
    import torch
    if record:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=1_000_000)
    WORKLOADS[name](torch)
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    if record:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with gzip.open(os.path.join(outdir, name + ".pickle.gz"), "wb", compresslevel=9) as f:
            pickle.dump(snap, f)
    return {"trace": name + ".pickle.gz", "PYTORCH_CUDA_ALLOC_CONF": conf,
            "peak_requested": st["requested_bytes.all.peak"],
            "peak_allocated": st["allocated_bytes.all.peak"],
            "peak_reserved": st["reserved_bytes.all.peak"],
            "num_alloc_retries": st["num_alloc_retries"],
            "allocations": st["allocation.all.allocated"],
            "segments": st["segment.all.allocated"]}


def main():
    if sys.argv[1] == "--one":
        name, conf, record, outdir = sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
        print(json.dumps(run_one(name, conf, record, outdir)))
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    runs = []
    for name in WORKLOADS:
        for conf in CONFS:
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
            p = subprocess.run([sys.executable, __file__, "--one", name, conf,
                                "1" if conf == "" else "0", outdir],
                               env=env, capture_output=True, text=True, check=True)
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines.json")
    if os.path.exists(here):  # runs another script recorded (each says where, in "measured"): kept
        with open(here) as f:
            runs += [r for r in json.load(f)["runs"] if "measured" in r]
    import torch
    meta = {"measured": "torch %s, %s, one process per run, native caching allocator"
                        % (torch.__version__, torch.cuda.get_device_name(0)),
            "runs": runs}
    with open(os.path.join(outdir, "baselines.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
