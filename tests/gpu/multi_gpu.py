"""Multi-GPU smoke test: one process per GPU (launched by torchrun), gpumem
installed in each, NCCL all-reduce, per-device stats checked. Each rank prints
one line "RANK r OK {...}" or raises. Run by orchestrate.py only with >= 2 GPUs.

NCCL_NVLS_ENABLE=0 must be set (NVLink multicast is off on the test machines);
TORCH_NCCL_AVOID_RECORD_STREAMS=1 keeps NCCL from relying on record_stream
calls made in C++ (they reach gpumem through the shim, gpumem._C, only)."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import gpumem.torch as gt  # noqa: E402


def main():
    gt.install(os.environ.get("GPUMEM_CONF") or None)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    n = 16 * (1 << 20)
    x = torch.full((n,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    want = world * (world + 1) / 2
    assert bool((x == want).all()), "all_reduce gave %s, want %s" % (x[:4].tolist(), want)
    # a few steps of a tiny DDP model, so NCCL buckets and streams are exercised
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(64, 1024, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    s = gt.memory_stats(local)
    assert s["allocated_bytes.all.current"] >= 4 * n, s["allocated_bytes.all.current"]
    assert s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"]
    assert gt.check(local) == ""
    dist.barrier()
    print("RANK %d OK %s" % (rank, json.dumps({
        "device": local, "allocated": s["allocated_bytes.all.current"],
        "reserved": s["reserved_bytes.all.current"], "peak_reserved": s["reserved_bytes.all.peak"]})), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
