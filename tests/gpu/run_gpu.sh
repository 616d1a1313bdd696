#!/usr/bin/env bash
# Everything gpumem does on the GPU, in one call (target: under 9 minutes):
# build the C library with CMake (Release), the torch-dependent helpers and the
# replay bench (build_ext.sh), install the Python package, then run the GPU
# tests and benchmarks (orchestrate.py) and print the results table.
#
#   tests/gpu/run_gpu.sh [TRACES_DIR]     (default: $GPUMEM_TRACES, else ../shared/traces)
#
# Logs go to $OUT (default /tmp/gpumem-out); the table is also in $OUT/table.txt.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
BUILD=${GPUMEM_BUILD:-$SRC/build-gpu-run}
TRACES=${1:-${GPUMEM_TRACES:-$SRC/../shared/traces}}
mkdir -p "$OUT" "$BUILD"
export NCCL_NVLS_ENABLE=0
export PYTHONUNBUFFERED=1
START=$(date +%s)
cd "$SRC"

echo "== probe" | tee "$OUT/probe.log"
{
  date -u; git -C "$SRC" log --oneline -1 2>/dev/null
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
  cmake --version | head -1; gcc --version | head -1; nvcc --version 2>/dev/null | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  python3 -c 'import transformers, torchvision; print("transformers", transformers.__version__, "torchvision", torchvision.__version__)'
  python3 -c 'import pytest; print("pytest", pytest.__version__)' 2>&1 | tail -1
  echo "traces: $TRACES"; ls "$TRACES" 2>&1
} >>"$OUT/probe.log" 2>&1
cat "$OUT/probe.log"

echo "== cmake build ($BUILD)"
if ! { cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_SANITIZE=OFF &&
       cmake --build "$BUILD" -j"$(nproc)"; } >"$OUT/cmake.log" 2>&1; then
  echo "CMake build FAILED; last lines of $OUT/cmake.log:"; tail -30 "$OUT/cmake.log"
  # the torch library is what the GPU tests need: try building just that
  cmake --build "$BUILD" -j"$(nproc)" --target gpumem_torch gpumem >>"$OUT/cmake.log" 2>&1 || true
fi
ls -la "$BUILD"/libgpumem* 2>&1 | tee -a "$OUT/cmake.log"
if [ ! -f "$BUILD/libgpumem_torch.so" ]; then
  echo "FATAL: $BUILD/libgpumem_torch.so was not built (see $OUT/cmake.log)"; exit 1
fi

echo "== CPU unit tests (ctest, 90 s cap)"
(cd "$BUILD" && timeout 90 ctest -j"$(nproc)" --timeout 30 >"$OUT/ctest.log" 2>&1)
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/ctest.log" | tail -15

echo "== torch helpers and replay bench"
bash "$SRC/tests/gpu/build_ext.sh" "$BUILD" "$OUT/build_ext.log"

echo "== python package"
cp -f "$BUILD"/libgpumem_torch*.so "$SRC/python/gpumem/" 2>/dev/null
if pip install --no-deps --no-build-isolation --no-index "$SRC/python" >"$OUT/pip.log" 2>&1; then
  echo "pip install ./python: ok"
else
  echo "pip install ./python FAILED (see $OUT/pip.log); tests use PYTHONPATH=python instead"
fi
export GPUMEM_LIB="$BUILD/libgpumem_torch.so"
export PYTHONPATH="$SRC/python${PYTHONPATH:+:$PYTHONPATH}"

SPENT=$(( $(date +%s) - START ))
BUDGET=$(( 510 - SPENT ))
echo "== tests and benchmarks (budget ${BUDGET}s)"
python3 "$SRC/tests/gpu/orchestrate.py" --build "$BUILD" --out "$OUT" --traces "$TRACES" --budget "$BUDGET" \
  | tee "$OUT/orchestrate.log"
RC=${PIPESTATUS[0]}
sed -n '/================ gpumem GPU results/,$p' "$OUT/orchestrate.log" >"$OUT/table.txt"
echo "total $(( $(date +%s) - START )) s, exit $RC"
exit "$RC"
