#!/usr/bin/env python3
"""Per-rank memory of data-parallel training, measured against `gpumem estimate`.

One process on one GPU acts as rank 0 of N through torch's fake process group
(torch.testing._internal.distributed.fake_pg.FakeStore, backend "fake"):
collectives do not communicate, but every allocation they and the wrappers
make is real. For GPT-2, GPT-2 medium and a ~1.1B Llama (random weights,
transformers configs, no downloads), under torch DDP and FSDP2 fully_shard
(every layer, then the root; built on the meta device and materialised
sharded), it runs the estimator's loop -- bf16 autocast, loss, backward,
AdamW.step(), zero_grad(set_to_none=True), 3 steps -- records
torch.cuda.max_memory_allocated(), runs `gpumem estimate` for the same
configuration and prints a table of estimated vs measured with the error.

DDP under the fake group: its default all-reduce comm hook fails there
(/work/shared/DESIGN.md), so a no-op hook is registered that returns the
bucket as it is: the reducer still allocates and fills its buckets, which is
the memory being measured; only the averaging is skipped. Should DDP still
fail, the case is measured as one GPU plus the reducer's buckets allocated
by hand (ddp_buckets) and the table says so.

usage: python3 tests/gpu/estimate_sharded.py [--gpumem build/gpumem] [--quick]
Writes $OUT/estimate_sharded.json when OUT is set. `--config` needs a gpumem
built with cJSON (the GPU machine has none: bench/RESULTS.md, 2026-12-03, says
how the run carried it). Exit 1 if a case is more
than 10% off or fails. Runs in about 2-4 minutes on an H200.
"""
import argparse, gc, json, os, subprocess, sys, tempfile, time, traceback

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from estimate_measure import clear  # noqa: E402  (empties caches, cuBLAS workspaces, resets peaks)
STEPS = 3


def configs():
    import transformers as T
    g = T.GPT2Config()
    g.architectures = ["GPT2LMHeadModel"]
    gm = T.GPT2Config(n_embd=1024, n_layer=24, n_head=16)
    gm.architectures = ["GPT2LMHeadModel"]
    # TinyLlama-1.1B's shape
    ll = T.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                       num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    ll.architectures = ["LlamaForCausalLM"]
    return {"gpt2": (g, T.GPT2LMHeadModel), "gpt2-medium": (gm, T.GPT2LMHeadModel),
            "llama-1.1b": (ll, T.LlamaForCausalLM)}


def layers_of(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def ddp_buckets(model, cap_mb=25, first=1 << 20):
    """DDP's reducer buckets without DDP (the fallback when DDP itself fails
    under the fake group): parameters last-registered first, a bucket closing
    once it reaches its limit (1 MiB, then bucket_cap_mb), one flat tensor
    each in the parameters' dtype, kept for the run."""
    out, acc, n, limit = [], 0, 0, first
    for p in reversed(list(model.parameters())):
        acc += p.numel() * p.element_size()
        n += p.numel()
        if acc >= limit:
            out.append(torch.empty(n, dtype=p.dtype, device="cuda"))
            acc, n, limit = 0, 0, cap_mb << 20
    if n:
        out.append(torch.empty(n, dtype=p.dtype, device="cuda"))
    return out


def measure(cfg, cls, shard, world, batch, seq, emulate_ddp=False):
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    model = net = opt = x = buckets = loss = None
    try:
        clear()
        if shard == "fsdp":
            from torch.distributed.fsdp import fully_shard
            with torch.device("meta"):
                model = cls(cfg)
            for layer in layers_of(model):
                fully_shard(layer)
            fully_shard(model)
            model.to_empty(device="cuda")
            net = model
        elif emulate_ddp:
            with torch.device("cuda"):  # parameters straight on the GPU, as the estimate assumes
                model = cls(cfg)
            net = model
            buckets = ddp_buckets(model)  # held for the run
        else:
            with torch.device("cuda"):
                model = cls(cfg)
            net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=25)

            def noop(state, bucket):  # the fake group cannot all-reduce; keep the bucket
                fut = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut
            net.register_comm_hook(None, noop)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
        for _ in range(STEPS):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = net(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss = None
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    finally:
        model = net = opt = x = buckets = loss = None  # noqa: F841 (drop every reference before the next case)
        dist.destroy_process_group()
        clear()


def estimate(gpumem, cfg_path, shard, world, batch, seq):
    a = [gpumem, "estimate", "--config", cfg_path, "--batch", str(batch), "--seq", str(seq),
         "--precision", "bf16-autocast", "--optimizer", "adamw", "--steps", str(STEPS),
         "--world-size", str(world), "--shard", shard, "--json"]
    p = subprocess.run(a, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError("%s: %s" % (" ".join(a), p.stderr.strip()))
    j = json.loads(p.stdout)
    return j["peak_allocated"], j["peak_reserved"]["torch"], " ".join(a[1:-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpumem", default=os.environ.get("GPUMEM", os.path.join(ROOT, "build", "gpumem")))
    ap.add_argument("--quick", action="store_true", help="one world size per strategy")
    o = ap.parse_args()
    torch.cuda.init()
    cfgs = configs()
    tmp = tempfile.mkdtemp()
    paths = {}
    for name, (cfg, _) in cfgs.items():
        paths[name] = os.path.join(tmp, name + ".json")
        cfg.to_json_file(paths[name])
    # (model, strategy, world, batch, seq): DDP's per-rank memory does not
    # depend on the world size, so one each; FSDP at 2, 8 and 64 ranks
    worlds = [8] if o.quick else [2, 8, 64]
    cases = []
    for name, batch, seq in (("gpt2", 8, 1024), ("gpt2-medium", 4, 1024), ("llama-1.1b", 2, 1024)):
        cases.append((name, "ddp", 8, batch, seq))
        cases += [(name, "fsdp", w, batch, seq) for w in worlds]
    rows, bad = [], 0
    t0 = time.time()
    for name, shard, world, batch, seq in cases:
        row = {"model": name, "shard": shard, "world": world, "batch": batch, "seq": seq}
        try:
            est, est_res, cmd = estimate(o.gpumem, paths[name], shard, world, batch, seq)
            meas = None
            try:
                meas, meas_res = measure(cfgs[name][0], cfgs[name][1], shard, world, batch, seq)
            except Exception:
                if shard != "ddp":
                    raise
                traceback.print_exc()
                print("DDP failed under the fake group: measuring one GPU plus DDP's buckets allocated by hand",
                      file=sys.stderr)
            if meas is None:  # outside the handler: the failed attempt's frames (and tensors) are gone
                gc.collect()
                meas, meas_res = measure(cfgs[name][0], cfgs[name][1], shard, world, batch, seq, emulate_ddp=True)
                row["ddp_emulated"] = True
            row.update(estimated=est, measured=meas, estimated_reserved=est_res, measured_reserved=meas_res,
                       error_pct=100.0 * (est - meas) / meas, command="gpumem " + cmd)
            bad += abs(row["error_pct"]) > 10
        except Exception as e:
            traceback.print_exc()
            row["error"] = str(e)[:300]
            bad += 1
        rows.append(row)
        print("  %-12s %-5s %3d ranks: %s" % (name, shard, world, row.get("error_pct", row.get("error"))),
              file=sys.stderr, flush=True)
    print("%-12s %-5s %5s %5s %5s %12s %12s %8s" % ("model", "shard", "ranks", "batch", "seq", "estimated",
                                                     "measured", "error"))
    for r in rows:
        if "error_pct" in r:
            print("%-12s %-5s %5d %5d %5d %9.3f GiB %9.3f GiB %+7.1f%%%s" % (
                r["model"], r["shard"], r["world"], r["batch"], r["seq"], r["estimated"] / 2**30,
                r["measured"] / 2**30, r["error_pct"], "  (buckets by hand)" if r.get("ddp_emulated") else ""))
        else:
            print("%-12s %-5s %5d %5d %5d  FAILED: %s" % (r["model"], r["shard"], r["world"], r["batch"], r["seq"],
                                                           r["error"]))
    print("%d of %d cases within 10%% of max_memory_allocated (%.0f s; %s, torch %s)" % (
        len(rows) - bad, len(rows), time.time() - t0, torch.cuda.get_device_name(0), torch.__version__))
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "estimate_sharded.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cases": rows}, f,
                      indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
