#!/usr/bin/env bash
# One device call: what the CUDA driver's memory calls cost on this GPU
# (bench/vmm_cost.c), and allocator-history snapshots of the GPT-2 small and
# ResNet-50 training workloads under PyTorch's own allocator (for replay off
# the GPU: their peaks are the baselines gpumem must beat on nvidia-smi).
#   OUT=... bash tests/gpu/vmm_cost.sh
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
mkdir -p "$OUT"
cd "$SRC"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
gcc -O2 -std=c11 -I"$CUDA_HOME/include" bench/vmm_cost.c -o /tmp/vmm_cost -L"$CUDA_HOME/lib64/stubs" -lcuda \
  && /tmp/vmm_cost | tee "$OUT/vmm_cost.txt"
export PYTHONPATH=$SRC/python PYTHONUNBUFFERED=1
# (shipped as examples/gpt2_small_train_bf16.pickle.gz and examples/resnet50_train_fp16.pickle.gz,
# their peaks from the .json in examples/baselines.json)
for m in gpt2:gpt2_small_train_bf16 resnet50:resnet50_train_fp16; do
  timeout 150 python3 tests/gpu/gpu_workloads.py --model ${m%%:*} --alloc native --steps 6 \
    --snapshot "$OUT/${m#*:}.pickle.gz" --out "$OUT/${m%%:*}_native.json" 2>&1 | tail -3
done
ls -la "$OUT"
