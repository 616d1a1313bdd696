#!/usr/bin/env bash
# The GPU checks left open on issues 12 and 13, in one device call each:
#
#   tests/gpu/open_checks.sh report TRACES_DIR   (issue 13, ~3 min)
#       tests/gpu/report_live.py   live attribution vs arithmetic, offline vs live
#       tests/gpu/backward_scopes.py  per-module backward scopes, Python stacks
#   tests/gpu/open_checks.sh plan                (issue 16, ~4 min)
#       tests/gpu/plan_capped.py   GPT-2 (fixed shapes) and BERT (variable
#       lengths) at a cap 1.03x their peak allocated: native, gpumem, gpumem_plan
#   tests/gpu/open_checks.sh ab                  (issue 12, ~5 min)
#       tests/gpu/ab_step_time.py  GPT-2 small step time: torch's allocator,
#       gpumem through the C++ shim (the default) and gpumem through torch's
#       CUDAPluggableAllocator entry points (GPUMEM_SHIM=0), GPUMEM_AB_ROUNDS
#       rounds (3) in rotated order, then the comparison table.
#
# Either first installs the package as a user does (pip install
# --no-build-isolation ./python, offline) unless gpumem._C already imports,
# and builds the CLI (CMake Release). $OUT gets run.txt and logs.tgz.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
WHAT=${1:?usage: open_checks.sh report TRACES_DIR | plan | ab}
TRACES=$(cd "${2:-$SRC/../shared/traces}" 2>/dev/null && pwd) # absolute: the checks run from /tmp
ROUNDS=${GPUMEM_AB_ROUNDS:-3}
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/logs"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 GPUMEM_BUILD_JOBS=$(nproc)
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
exec > >(tee "$OUT/run.txt") 2>&1
trap 'tar -czf "$OUT/logs.tgz" -C "$WORK" logs; echo "total $(elapsed) s"' EXIT

python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
git -C "$SRC" log --oneline -1 2>/dev/null; git -C "$SRC" status --short 2>/dev/null | head

if (cd /tmp && python3 -c 'import torch, gpumem._C' 2>/dev/null); then
  echo "== gpumem already installed with its shim"
else
  echo "== pip install --no-build-isolation ./python"
  python3 -m pip install -v --no-deps --no-build-isolation --no-index "$SRC/python" >"$WORK/logs/pip.log" 2>&1 ||
    { echo "pip install FAILED"; grep -iE "error" "$WORK/logs/pip.log" | head -30; exit 1; }
  echo "pip install: ok [$(elapsed) s]"
fi
(cd /tmp && python3 -c 'import torch, gpumem, gpumem._C, gpumem._lib as l; print("installed:", gpumem.__file__, l.find_library())') || exit 1

BUILD=$WORK/build
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_TESTS=OFF -DGPUMEM_SANITIZE=OFF >"$WORK/logs/cmake.log" 2>&1 &&
  cmake --build "$BUILD" --target gpumem_cli -j"$(nproc)" >>"$WORK/logs/cmake.log" 2>&1 ||
  { echo "CLI build FAILED"; tail -20 "$WORK/logs/cmake.log"; exit 1; }
CLI=$(find "$BUILD" -maxdepth 2 -type f -name gpumem -perm -u+x | head -1)
echo "CLI: $CLI [$(elapsed) s]"
cd /tmp # the installed package must stand alone

case $WHAT in
report)
  echo "== report_live.py"
  OUT=$WORK/logs timeout -k 5 400 python3 "$SRC/tests/gpu/report_live.py" "$CLI" "$TRACES" 2>&1 | tee "$WORK/logs/report_live.txt"
  echo "== backward_scopes.py [$(elapsed) s]"
  OUT=$WORK/logs timeout -k 5 300 python3 "$SRC/tests/gpu/backward_scopes.py" "$CLI" 2>&1 | tee "$WORK/logs/backward_scopes.txt"
  echo "backward_scopes exit ${PIPESTATUS[0]}"
  ;;
ab)
  names=(native shim noshim)
  mkdir -p "$WORK/logs/ab"
  for r in $(seq 1 "$ROUNDS"); do
    for k in 0 1 2; do
      name=${names[$(( (k + r - 1) % 3 ))]} # rotated: none always first or last
      args=(--alloc gpumem --conf policy:gpumem)
      shim=1
      case $name in native) args=(--alloc native) ;; noshim) shim=0 ;; esac
      GPUMEM_SHIM=$shim GPUMEM_PROFILE=1 timeout -k 5 120 python3 "$SRC/tests/gpu/ab_step_time.py" "${args[@]}" \
        --name "$name" --round "$r" --timeout 110 --out "$WORK/logs/ab/r${r}_$name.json" >"$WORK/logs/ab/r${r}_$name.log" 2>&1
      echo "[$(elapsed) s] round $r $name: exit $? $(grep '^RESULT' "$WORK/logs/ab/r${r}_$name.log" | tail -1)"
    done
  done
  python3 "$SRC/tests/gpu/ab_step_time.py" --summarize "$WORK/logs/ab" 2>&1 | tee "$WORK/logs/ab_table.txt"
  ;;
plan)
  timeout -k 5 500 python3 "$SRC/tests/gpu/plan_capped.py" --json "$WORK/logs/plan_capped.json" 2>&1 | tee "$WORK/logs/plan_capped.txt"
  ;;
*) echo "unknown check '$WHAT': report, plan or ab"; exit 2 ;;
esac
