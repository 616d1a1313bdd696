#!/usr/bin/env python3
"""Measure training memory on a real GPU, for checking `gpumem estimate`.

For each configuration (model, batch, sequence/image, precision, optimizer,
accumulation, checkpointing, attention) it runs the loop the estimator
models -- forward under torch.autocast where named, loss, backward (with
GradScaler for fp16), optimizer.step(), zero_grad(set_to_none=True) -- for a
few steps, in this one process, and records torch.cuda.max_memory_allocated()
and max_memory_reserved() per step. It also runs the four workloads of
../shared/traces/workloads.py as they are written, and, for a fit plan
(--fit-plan: capacity and the batch `gpumem estimate --fit batch` named),
runs batches around that answer under
torch.cuda.set_per_process_memory_fraction((capacity - context) / total)
to find whether the named batch fits and which is the largest that does.

Writes $OUT/estimate_measured.json (rewritten after every configuration, so
a run cut short still returns what it measured). Compare with
tools/estimate_compare.py; results in bench/RESULTS.md.

usage: estimate_measure.py [--fit-plan plan.json] [--workloads path/to/workloads.py] [--only NAME,...]
"""
import argparse, gc, json, os, platform, sys, time, traceback

import torch

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
RESULT = {"configs": [], "workloads": [], "fit": []}
CONTEXT = 512 << 20  # the estimator's GM_EST_CUDA_CONTEXT


def save():
    with open(os.path.join(OUT, "estimate_measured.json"), "w") as f:
        json.dump(RESULT, f, indent=1)


def clear():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    try:
        torch._C._cuda_clearCublasWorkspaces()
    except Exception:
        pass
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


# ---- models -------------------------------------------------------------------

LLAMA_SMALL = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)


def hf_config(name):
    import transformers as T
    if name in ("gpt2", "gpt2-medium"):
        cfg = T.GPT2Config() if name == "gpt2" else T.GPT2Config(n_embd=1024, n_layer=24, n_head=16)
        cfg.architectures = ["GPT2LMHeadModel"]
        return cfg, T.GPT2LMHeadModel
    if name == "bert-base-uncased":
        cfg = T.BertConfig()
        cfg.architectures = ["BertForMaskedLM"]
        return cfg, T.BertForMaskedLM
    if name == "bert-seqcls":
        cfg = T.BertConfig()
        cfg.architectures = ["BertForSequenceClassification"]
        return cfg, T.BertForSequenceClassification
    if name == "llama-small":
        cfg = T.LlamaConfig(**LLAMA_SMALL)
        cfg.architectures = ["LlamaForCausalLM"]
        return cfg, T.LlamaForCausalLM
    if name == "vit-hf":
        cfg = T.ViTConfig()
        cfg.architectures = ["ViTForImageClassification"]
        cfg.num_labels = 1000
        return cfg, T.ViTForImageClassification
    raise KeyError(name)


def build(c):
    """-> (model, batch_fn, is_hf, config_dict or None)"""
    name = c["model"]
    B = c["batch"]
    if name in ("resnet18", "resnet50", "vit_b_16"):
        import torchvision
        with torch.device("cuda"):
            m = getattr(torchvision.models, name)()
        img = c.get("image", 224)

        def batch_fn():
            return (torch.randn(B, 3, img, img, device="cuda"), torch.randint(0, 1000, (B,), device="cuda"))
        return m, batch_fn, False, None
    cfg, cls = hf_config(name)
    attn = c.get("attention", "sdpa")
    with torch.device("cuda"):
        try:
            m = cls._from_config(cfg, attn_implementation=attn)
        except TypeError:
            cfg._attn_implementation = attn
            m = cls(cfg)
    S = c.get("seq")
    if name == "vit-hf":
        img = cfg.image_size

        def batch_fn():
            return {"pixel_values": torch.randn(B, 3, img, img, device="cuda"),
                    "labels": torch.randint(0, 1000, (B,), device="cuda")}
    elif name == "bert-seqcls":
        def batch_fn():
            return {"input_ids": torch.randint(0, cfg.vocab_size, (B, S), device="cuda"),
                    "labels": torch.randint(0, 2, (B,), device="cuda")}
    else:
        def batch_fn():
            ids = torch.randint(0, cfg.vocab_size, (B, S), device="cuda")
            return {"input_ids": ids, "labels": ids}
    d = cfg.to_dict()
    d["attn_implementation_used"] = getattr(m.config, "_attn_implementation", None)
    return m, batch_fn, True, d


def make_opt(name, params):
    params = list(params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2)
    raise KeyError(name)


def train(c, limit_fraction=None):
    """Run config c; returns its record (peaks per step)."""
    clear()
    rec = dict(c)
    m, batch_fn, hf, cfgd = build(c)
    if cfgd is not None:
        rec["hf_config"] = cfgd
    rec["parameters"] = sum(p.numel() for p in m.parameters())
    prec = c.get("precision", "bf16-autocast")
    if prec == "bf16":
        m = m.to(torch.bfloat16)
    if c.get("checkpointing"):
        m.gradient_checkpointing_enable()
    m.train()
    opt = make_opt(c.get("optimizer", "adamw"), m.parameters())
    dtype = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}.get(prec)
    scaler = torch.amp.GradScaler("cuda") if prec == "fp16-autocast" else None
    crit = torch.nn.CrossEntropyLoss()
    accum = c.get("accum", 1)
    steps = c.get("steps", 3)
    torch.cuda.synchronize()
    gc.collect()
    if limit_fraction is not None:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(limit_fraction)
    torch.cuda.reset_peak_memory_stats()
    rec["steps_peak_allocated"], rec["steps_peak_reserved"] = [], []
    t0 = time.time()
    oom = False
    try:
        for step in range(steps):
            torch.cuda.reset_peak_memory_stats()
            for micro in range(accum):
                inputs = batch_fn()
                with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                    if hf:
                        loss = m(**inputs).loss / accum
                    else:
                        loss = crit(m(inputs[0]), inputs[1]) / accum
                (scaler.scale(loss) if scaler else loss).backward()
                del loss
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            rec["steps_peak_allocated"].append(torch.cuda.max_memory_allocated())
            rec["steps_peak_reserved"].append(torch.cuda.max_memory_reserved())
    except torch.OutOfMemoryError:
        oom = True
    rec["oom"] = oom
    rec["seconds"] = round(time.time() - t0, 2)
    if rec["steps_peak_allocated"]:
        rec["peak_allocated"] = max(rec["steps_peak_allocated"])
        rec["peak_reserved"] = max(rec["steps_peak_reserved"])
    free, total = torch.cuda.mem_get_info()
    rec["device_used_outside_allocator"] = total - free - torch.cuda.memory_reserved()
    del m, opt, batch_fn
    if limit_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(1.0)
    clear()
    return rec


# ---- configurations (>= 12 across GPT-2, BERT, ResNet-50, plus ViT, Llama) ----

G = dict(model="gpt2", batch=8, seq=1024, precision="bf16-autocast", optimizer="adamw")
BE = dict(model="bert-base-uncased", batch=32, seq=512, precision="fp16-autocast", optimizer="adamw")
R = dict(model="resnet50", batch=128, image=224, precision="fp16-autocast", optimizer="sgd-momentum")
CONFIGS = [
    dict(G, name="gpt2"),
    dict(G, name="gpt2-ckpt", checkpointing=True),
    dict(G, name="gpt2-accum", batch=4, accum=2),
    dict(G, name="gpt2-bf16", precision="bf16"),
    dict(G, name="gpt2-sgd", optimizer="sgd"),
    dict(G, name="gpt2-sgdm", optimizer="sgd-momentum"),
    dict(G, name="gpt2-adafactor", optimizer="adafactor"),
    dict(G, name="gpt2-fp32", precision="fp32"),
    dict(G, name="gpt2-fp16", precision="fp16-autocast"),
    dict(G, name="gpt2-eager", attention="eager"),
    dict(BE, name="bert"),
    dict(BE, name="bert-ckpt", checkpointing=True),
    dict(BE, name="bert-accum", batch=16, accum=2),
    dict(BE, name="bert-fp32", precision="fp32"),
    dict(R, name="resnet50"),
    dict(R, name="resnet50-fp32", precision="fp32"),
    dict(R, name="resnet50-accum", batch=64, accum=2),
]
# run after the workloads and the fit checks, while time is left
EXTRAS = [
    dict(BE, name="bert-bf16", precision="bf16"),
    dict(BE, name="bert-seqcls", model="bert-seqcls", precision="bf16-autocast"),
    dict(R, name="resnet50-adamw", precision="bf16-autocast", optimizer="adamw"),
    dict(R, name="resnet50-bf16", precision="bf16"),
    dict(model="resnet18", name="resnet18", batch=256, image=224, precision="bf16-autocast", optimizer="adamw"),
    dict(model="vit_b_16", name="vit_b_16", batch=64, image=224, precision="bf16-autocast", optimizer="adamw"),
    dict(model="vit_b_16", name="vit_b_16-fp32", batch=64, image=224, precision="fp32", optimizer="adamw"),
    dict(model="gpt2-medium", name="gpt2-medium", batch=8, seq=1024, precision="bf16-autocast", optimizer="adamw"),
    dict(model="gpt2-medium", name="gpt2-medium-ckpt", batch=8, seq=1024, precision="bf16-autocast",
         optimizer="adamw", checkpointing=True),
    dict(model="llama-small", name="llama-small", batch=8, seq=1024, precision="bf16-autocast", optimizer="adamw"),
    dict(model="llama-small", name="llama-small-ckpt", batch=8, seq=1024, precision="bf16-autocast",
         optimizer="adamw", checkpointing=True),
    dict(model="vit-hf", name="vit-hf", batch=64, precision="bf16-autocast", optimizer="adamw"),
    dict(G, name="gpt2-adam", optimizer="adam"),
    dict(G, name="gpt2-b16-s512", batch=16, seq=512),
    dict(BE, name="bert-sgd", optimizer="sgd"),
]


def run_workloads(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("gm_workloads", path)
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    for name, fn in w.WORKLOADS.items():
        clear()
        rec = {"workload": name}
        t0 = time.time()
        try:
            fn()
            rec["peak_allocated"] = torch.cuda.max_memory_allocated()
            rec["peak_reserved"] = torch.cuda.max_memory_reserved()
        except Exception:
            rec["error"] = traceback.format_exc()[-800:]
        rec["seconds"] = round(time.time() - t0, 2)
        if name == "bert_base_varseq_fp16":  # the sequence lengths its generator drew
            g = torch.Generator().manual_seed(0)
            seqs = []
            for _ in range(8):
                s = int(torch.randint(32, 512 + 1, (1,), generator=g))
                torch.randint(0, 30522, (32, s), generator=g)
                seqs.append(s)
            rec["seqs"] = seqs
        RESULT["workloads"].append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "error"}), rec.get("error", ""), flush=True)
        save()


def run_fit(plan):
    total = torch.cuda.get_device_properties(0).total_memory
    for p in plan:
        frac = (p["capacity"] - CONTEXT) / total
        tried = []
        base = p["batch"]
        for b in range(max(1, base - 1), base + 4):
            c = dict(p["config"], batch=b, steps=2)
            r = train(c, limit_fraction=frac)
            tried.append({"batch": b, "oom": r["oom"], "peak_allocated": r.get("peak_allocated"),
                          "peak_reserved": r.get("peak_reserved")})
            print("fit", p["name"], b, "OOM" if r["oom"] else "ok", r.get("peak_reserved"), flush=True)
            if r["oom"]:
                break
        ok = [t["batch"] for t in tried if not t["oom"]]
        RESULT["fit"].append({"name": p["name"], "capacity": p["capacity"], "fraction": frac,
                              "predicted_batch": base, "config": p["config"], "tried": tried,
                              "predicted_fits": any(t["batch"] == base and not t["oom"] for t in tried),
                              "largest_fitting_tried": max(ok) if ok else 0})
        save()


def run_configs(configs, only, deadline, t_start):
    for c in configs:
        if only and c["name"] not in only:
            continue
        if time.time() - t_start > deadline:
            RESULT.setdefault("skipped", []).append(c["name"])
            continue
        try:
            r = train(c)
        except Exception:
            r = dict(c, error=traceback.format_exc()[-800:])
            clear()
        RESULT["configs"].append(r)
        print(json.dumps({k: r.get(k) for k in ("name", "peak_allocated", "peak_reserved", "oom", "seconds",
                                               "steps_peak_allocated")}), r.get("error", ""), flush=True)
        save()


def main():
    t_start = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit-plan")
    ap.add_argument("--workloads")
    ap.add_argument("--only")
    ap.add_argument("--deadline", type=float, default=240.0,
                    help="seconds after which the extra configurations are skipped")
    a = ap.parse_args()
    import transformers, torchvision
    props = torch.cuda.get_device_properties(0)
    RESULT["meta"] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "gpu": props.name,
                      "total_memory": props.total_memory, "torch": torch.__version__,
                      "transformers": transformers.__version__, "torchvision": torchvision.__version__,
                      "python": platform.python_version(), "context_bytes": CONTEXT,
                      "command": " ".join(sys.argv)}
    only = set(a.only.split(",")) if a.only else None
    run_configs(CONFIGS, only, 1e9, t_start)
    if a.workloads and not only:
        run_workloads(a.workloads)
    if a.fit_plan and not only:
        with open(a.fit_plan) as f:
            run_fit(json.load(f))
    run_configs(EXTRAS, only, a.deadline, t_start)
    RESULT["meta"]["seconds"] = round(time.time() - t_start, 1)
    save()


if __name__ == "__main__":
    main()
