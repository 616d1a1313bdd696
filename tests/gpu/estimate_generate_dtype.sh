#!/usr/bin/env bash
# estimate_generate_dtype.sh — issue 42, item 2, on the GPU: `gpumem estimate --generate` now loads
# the model as Hugging Face users do (from_pretrained(torch_dtype=torch.bfloat16): built in 16 bits,
# the default) and keeps the fp32 build-then-cast (.half()) as --torch-dtype fp32 --precision bf16.
# Builds gpumem (Release), then for GPT-2 medium, batch 16, a 64-token prompt and 200 new tokens
# (the shape of ../shared/traces/gpt2_generate_kvcache) measures torch.cuda.max_memory_allocated()
# of model.generate() for a model built in bf16, in fp16, in fp32 then .half(), and in fp32, and
# prints it beside the estimate. Needs torch with CUDA and transformers; no network.
#
# usage: bash tests/gpu/estimate_generate_dtype.sh     (from the repository root; $OUT gets the JSON)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cmake -S "$root" -B "$root/build-gpu-est" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_TESTS=OFF -DGPUMEM_BENCH=OFF >/dev/null
cmake --build "$root/build-gpu-est" --target gpumem_cli -j"$(nproc)" >/dev/null
GPUMEM="$root/build-gpu-est/gpumem" python3 - "$OUT/estimate_generate_dtype.json" <<'PY'
import gc, json, os, subprocess, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel

B, S, G = 16, 64, 200
cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16)  # gpt2-medium's shape


def build(how):
    if how in ("bf16", "fp16"):  # from_pretrained(torch_dtype=...) builds under that default dtype
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16 if how == "bf16" else torch.float16)
        try:
            with torch.device("cuda"):
                return GPT2LMHeadModel(cfg)
        finally:
            torch.set_default_dtype(old)
    m = GPT2LMHeadModel(cfg).cuda()  # fp32 on the GPU
    return m.half() if how == "fp32-then-half" else m


def measure(how):
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    m = build(how).eval()
    ids = torch.randint(0, cfg.vocab_size, (B, S), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        m.generate(ids, max_new_tokens=G, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del m, ids
    return peak


ARGS = {"bf16": [], "fp16": ["--torch-dtype", "fp16"], "fp32-then-half": ["--torch-dtype", "fp32", "--precision", "bf16"],
        "fp32": ["--torch-dtype", "fp32"]}
rows = []
for how, extra in ARGS.items():
    got = measure(how)
    cmd = [os.environ["GPUMEM"], "estimate", "--model", "gpt2-medium", "--batch", str(B), "--seq", str(S),
           "--generate", str(G), "--json"] + extra
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    rows.append({"model built": how, "measured": got, "predicted": j["peak_allocated"],
                 "peak at": j["peak_at"]["phase"], "command": " ".join(cmd[1:])})
print("%-16s %14s %14s %8s  %s" % ("model built", "measured", "predicted", "error", "predicted peak in"))
for r in rows:
    print("%-16s %14d %14d %+7.2f%%  %s" % (r["model built"], r["measured"], r["predicted"],
                                            100.0 * (r["predicted"] - r["measured"]) / r["measured"], r["peak at"]))
print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
json.dump(rows, open(sys.argv[1], "w"), indent=1)
PY
