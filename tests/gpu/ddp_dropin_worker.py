"""One rank of the two-GPU DDP check in test_torch_dropin.py (run through
`gpumem run -- torchrun --nproc-per-node 2`): a few DDP steps over NCCL, then
torch's per-device statistics on this rank compared with gpumem's. Prints
one JSON line."""
import json
import os

import torch
import torch.distributed as dist

import gpumem.torch as gt


def main():
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        loss = model(torch.randn(64, 1024, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    a, ga = torch.cuda.memory_allocated(), gt.memory_allocated()
    ok = gt.status()["mode"] == "shim" and a == ga > 0 and torch.cuda.memory_reserved() == gt.memory_reserved()
    print(json.dumps({"rank": rank, "ok": ok, "allocated": a, "gm_allocated": ga,
                      "device": torch.cuda.current_device()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
