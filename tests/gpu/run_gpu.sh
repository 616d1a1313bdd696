#!/usr/bin/env bash
# Everything gpumem does on the GPU, in one call (the whole run stops itself
# at 8 minutes, so the 10-minute device call always gets its results back):
# build the C library with CMake (Release), the torch-dependent helpers and the
# replay bench (build_ext.sh), then run the GPU tests and benchmarks
# (orchestrate.py: each risky step its own process with its own timeout, most
# important first) and print the results table.
#
#   tests/gpu/run_gpu.sh [TRACES_DIR]     (default: $GPUMEM_TRACES, else ../shared/traces)
#
# $OUT (default /tmp/gpumem-out) gets at most four files: table.txt,
# results.json, logs.tgz (every step's log, stacks of hung steps included)
# and run.txt (this script's output). GPUMEM_ONLY=step,step runs only those
# orchestrate.py steps (names in orchestrate.py, e.g. multi,replay-gpumem-native). The device returns only a few files,
# so nothing else is written there.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
BUILD=${GPUMEM_BUILD:-$SRC/build-gpu-run}
TRACES=${1:-${GPUMEM_TRACES:-$SRC/../shared/traces}}
LIMIT=${GPUMEM_LIMIT:-480} # seconds for the whole script
START=$(date +%s)
LOGS="$BUILD/logs"
mkdir -p "$OUT" "$BUILD"
rm -rf "$LOGS" && mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0
export PYTHONUNBUFFERED=1
cd "$SRC"

# everything this script prints also goes to run.txt
exec > >(tee "$OUT/run.txt") 2>&1
TEE_PID=$!

finish() {
  local rc=$?
  [ -f "$LOGS/orchestrate.log" ] && sed -n '/================ gpumem GPU results/,$p' "$LOGS/orchestrate.log" >"$OUT/table.txt"
  tar -czf "$OUT/logs.tgz" -C "$BUILD" logs 2>/dev/null || echo "could not write $OUT/logs.tgz"
  echo "total $(( $(date +%s) - START )) s, exit $rc; $OUT: $(ls "$OUT" | tr '\n' ' ')"
  exec >&- 2>&-
  wait "$TEE_PID" 2>/dev/null # run.txt complete before the device collects OUT
}
trap finish EXIT

# Traces: fail fast and say so, rather than find out after the build.
if ! ls "$TRACES"/*.pickle.gz >/dev/null 2>&1; then
  if ls "$SRC"/examples/*.pickle.gz >/dev/null 2>&1; then
    echo "WARNING: no *.pickle.gz traces in '$TRACES' (missing or empty): the replay bench uses the"
    echo "         shipped examples/*.pickle.gz instead (baselines: examples/baselines.json)."
    echo "         For the real traces pass their folder: tests/gpu/run_gpu.sh /path/to/traces"
    TRACES="$SRC/examples"
  else
    echo "FATAL: no *.pickle.gz traces in '$TRACES' and no examples/*.pickle.gz in $SRC; nothing to replay"
    exit 2
  fi
fi

echo "== probe"
{
  date -u; git -C "$SRC" log --oneline -1 2>/dev/null; git -C "$SRC" status --short 2>/dev/null | head -20
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
  cmake --version | head -1; gcc --version | head -1; nvcc --version 2>/dev/null | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  python3 -c 'import transformers, torchvision; print("transformers", transformers.__version__, "torchvision", torchvision.__version__)'
  echo "gdb: $(command -v gdb || echo none); ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo n/a)"
  echo "traces: $TRACES"; ls "$TRACES" 2>&1
} >"$LOGS/probe.log" 2>&1
cat "$LOGS/probe.log"

echo "== cmake build ($BUILD, -j$(nproc))"
if ! timeout 240 bash -c "cmake -S '$SRC' -B '$BUILD' -DCMAKE_BUILD_TYPE=Release -DGPUMEM_SANITIZE=OFF &&
       cmake --build '$BUILD' -j$(nproc)" >"$LOGS/cmake.log" 2>&1; then
  echo "CMake build FAILED; last lines of cmake.log:"; tail -30 "$LOGS/cmake.log"
  # the torch library is what the GPU tests need: try building just that
  timeout 120 cmake --build "$BUILD" -j"$(nproc)" --target gpumem_torch gpumem >>"$LOGS/cmake.log" 2>&1 || true
fi
grep -E "warning|error" "$LOGS/cmake.log" | sort | uniq -c | sort -rn | head -10
ls -la "$BUILD"/libgpumem* 2>&1 | tee -a "$LOGS/cmake.log"
if [ ! -f "$BUILD/libgpumem_torch.so" ]; then
  echo "FATAL: $BUILD/libgpumem_torch.so was not built (see cmake.log in logs.tgz)"; exit 1
fi
echo "build: $(( $(date +%s) - START )) s"

echo "== replay bench"
timeout 180 bash "$SRC/tests/gpu/build_ext.sh" "$BUILD" "$LOGS/build_ext.log"
echo "build_ext: $(( $(date +%s) - START )) s"

echo "== python package"
cp -f "$BUILD"/libgpumem_torch*.so "$SRC/python/gpumem/" 2>/dev/null
if timeout 60 pip install --no-deps --no-build-isolation --no-index "$SRC/python" >"$LOGS/pip.log" 2>&1; then
  echo "pip install ./python: ok"
else
  echo "pip install ./python FAILED (see pip.log); tests use PYTHONPATH=python instead"
fi
export GPUMEM_LIB="$BUILD/libgpumem_torch.so"
export PYTHONPATH="$SRC/python${PYTHONPATH:+:$PYTHONPATH}"

BUDGET=$(( LIMIT - ($(date +%s) - START) - 15 ))
echo "== tests and benchmarks (budget ${BUDGET}s)"
# the hard stop is a little later than the budget: orchestrate stops starting
# steps in time and prints its table; this only catches orchestrate itself hanging
timeout -k 5 $(( BUDGET + 20 )) python3 "$SRC/tests/gpu/orchestrate.py" --build "$BUILD" --out "$OUT" \
  --logs "$LOGS" --traces "$TRACES" --budget "$BUDGET" ${GPUMEM_ONLY:+--only "$GPUMEM_ONLY"} \
  | tee "$LOGS/orchestrate.log"
exit "${PIPESTATUS[0]}"
