#!/usr/bin/env bash
# final_run.sh — the last GPU call: why is GPT-2 small slower under gpumem?
# Under 6 minutes on one H200 (self-limited to GPUMEM_LIMIT=330 s):
#  1. build (CMake Release, no tests: the GPU machine has no cmocka, ncurses,
#     microhttpd or cJSON) and the package's CPU tests on the sim backend,
#     which include the GPUMEM_PROFILE counters (python/tests),
#  2. GPT-2 small step-time A/B (tests/gpu/ab_step_time.py): native,
#     policy:gpumem and policy:torch, each round three fresh processes in a
#     rotated order, warm-up then GPUMEM_AB_STEPS timed steps each (wall clock,
#     CUDA events, enqueue time); in the gpumem processes GPUMEM_PROFILE=1:
#     alloc/free calls and time inside the entry points per step, device calls
#     and memory_stats deltas in timed steps; then torch.empty+del
#     micro-benchmarks and a kernel-speed check on each allocator's memory,
#  3. tests/gpu/monitor_gpu.sh (issue 5: `gpumem smi` vs nvidia-smi and two
#     training processes' allocator numbers), its output and exit status,
#  4. one table: $OUT/final_table.txt. $OUT gets 3 files: final_table.txt,
#     final_run.txt (all output) and final_logs.tgz (every log and JSON).
#
#   tests/gpu/final_run.sh        (OUT=/tmp/gpumem-final, build in build-final/)
# Env: GPUMEM_AB_ROUNDS (3), GPUMEM_AB_STEPS (40), GPUMEM_AB_WARMUP (5), GPUMEM_LIMIT (330).
# Exit 0: every A/B process gave results and monitor_gpu.sh passed.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-final}
BUILD=${GPUMEM_BUILD:-$SRC/build-final}
LIMIT=${GPUMEM_LIMIT:-330}
ROUNDS=${GPUMEM_AB_ROUNDS:-3}
STEPS=${GPUMEM_AB_STEPS:-40}
WARMUP=${GPUMEM_AB_WARMUP:-5}
MONITOR_RESERVE=100 # seconds kept for monitor_gpu.sh after the A/B
START=$(date +%s)
LOGS="$BUILD/final-logs"
mkdir -p "$OUT" "$BUILD"
rm -rf "$LOGS" && mkdir -p "$LOGS/ab"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$SRC/python${PYTHONPATH:+:$PYTHONPATH}"
cd "$SRC"

exec > >(tee "$OUT/final_run.txt") 2>&1
TEE_PID=$!
elapsed() { echo $(( $(date +%s) - START )); }
AB_WANT=$(( 3 * ROUNDS ))
AB_DONE=0
MON_RC=skipped
BUILD_OK=0

finish() {
  local rc=$?
  {
    echo "================ gpumem final GPU run ================"
    git -C "$SRC" log --oneline -1 2>/dev/null
    echo "build: $([ "$BUILD_OK" = 1 ] && echo ok || echo FAILED); python CPU tests (sim, profile counters): $(tail -1 "$LOGS/python_tests.log" 2>/dev/null)"
    echo "monitor_gpu.sh (issue 5): exit $MON_RC; $(grep -E '^RESULT' "$LOGS/monitor.log" 2>/dev/null | tail -1)"
    grep -E '^(FAIL|SKIP) ' "$LOGS/monitor.log" 2>/dev/null | head -12 | sed 's/^/  /'
    echo "A/B processes with results: $AB_DONE of $AB_WANT"
    echo
    cat "$LOGS/ab_table.txt" 2>/dev/null || echo "(no A/B table)"
  } >"$OUT/final_table.txt"
  echo; cat "$OUT/final_table.txt"
  tar -czf "$OUT/final_logs.tgz" -C "$BUILD" final-logs 2>/dev/null || echo "could not write $OUT/final_logs.tgz"
  echo "total $(elapsed) s, exit $rc; $OUT: $(ls "$OUT" | tr '\n' ' ')"
  exec >&- 2>&-
  wait "$TEE_PID" 2>/dev/null
}
trap finish EXIT

echo "== probe"
{
  date -u; git -C "$SRC" log --oneline -1 2>/dev/null; echo "cpus $(nproc), load $(cat /proc/loadavg)"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,pstate --format=csv
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} >"$LOGS/probe.log" 2>&1
cat "$LOGS/probe.log"

echo "== build ($BUILD, -j$(nproc))"
if timeout 200 bash -c "cmake -S '$SRC' -B '$BUILD' -DCMAKE_BUILD_TYPE=Release -DGPUMEM_TESTS=OFF -DGPUMEM_SANITIZE=OFF &&
      cmake --build '$BUILD' -j$(nproc)" >"$LOGS/cmake.log" 2>&1; then
  BUILD_OK=1
else
  echo "build FAILED; last lines:"; tail -30 "$LOGS/cmake.log"
  timeout 100 cmake --build "$BUILD" -j"$(nproc)" --target gpumem_torch >>"$LOGS/cmake.log" 2>&1 || true
fi
if [ ! -f "$BUILD/libgpumem_torch.so" ]; then
  echo "FATAL: $BUILD/libgpumem_torch.so was not built"; exit 1
fi
export GPUMEM_LIB="$BUILD/libgpumem_torch.so"
nm -D "$GPUMEM_LIB" | grep -q gpumem_torch_profile || echo "WARNING: $GPUMEM_LIB has no gpumem_torch_profile (stale sources?)"
echo "build: $(elapsed) s"

echo "== python package CPU tests (sim backend, profile counters)"
timeout 60 python3 -m unittest discover -s "$SRC/python/tests" >"$LOGS/python_tests.log" 2>&1
tail -3 "$LOGS/python_tests.log"

echo "== GPT-2 small A/B: $ROUNDS rounds x (native, policy:gpumem, policy:torch), $WARMUP warm-up + $STEPS timed steps"
names=(native policy:gpumem policy:torch)
per_proc=30 # seconds one process is expected to take; raised to the longest seen
for r in $(seq 1 "$ROUNDS"); do
  for k in 0 1 2; do
    name=${names[$(( (k + r - 1) % 3 ))]} # rotated: no allocator always runs first or last
    left=$(( LIMIT - $(elapsed) - MONITOR_RESERVE ))
    if [ "$left" -lt "$per_proc" ]; then
      echo "SKIP round $r $name: ${left}s left before the monitor's reserve, a process takes ~${per_proc}s"
      continue
    fi
    safe=${name//:/_}
    log="$LOGS/ab/r${r}_${safe}.log"
    t0=$(date +%s)
    if [ "$name" = native ]; then
      timeout -k 5 100 python3 tests/gpu/ab_step_time.py --alloc native --name native --round "$r" \
        --warmup "$WARMUP" --steps "$STEPS" --timeout 95 --out "$LOGS/ab/r${r}_${safe}.json" >"$log" 2>&1
    else
      GPUMEM_PROFILE=1 timeout -k 5 100 python3 tests/gpu/ab_step_time.py --alloc gpumem --conf "$name" --name "$name" \
        --round "$r" --warmup "$WARMUP" --steps "$STEPS" --timeout 95 --out "$LOGS/ab/r${r}_${safe}.json" >"$log" 2>&1
    fi
    rc=$?
    dt=$(( $(date +%s) - t0 ))
    [ "$dt" -gt "$per_proc" ] && per_proc=$dt
    if [ -s "$LOGS/ab/r${r}_${safe}.json" ]; then
      AB_DONE=$(( AB_DONE + 1 ))
      echo "[$(elapsed)s] $(grep '^RESULT' "$log" | tail -1) (${dt}s)"
    else
      echo "[$(elapsed)s] FAIL round $r $name: rc $rc after ${dt}s; last lines:"; tail -15 "$log"
    fi
  done
done
python3 tests/gpu/ab_step_time.py --summarize "$LOGS/ab" >"$LOGS/ab_table.txt" 2>&1

echo "== monitor_gpu.sh (issue 5) [$(elapsed)s]"
left=$(( LIMIT - $(elapsed) - 10 ))
if [ "$left" -lt 30 ]; then
  echo "SKIP monitor_gpu.sh: only ${left}s left"
else
  mon_t=$(( left < 150 ? left : 150 ))
  OUT="$LOGS/monitor" GPUMEM_BUILD="$BUILD" GPUMEM_MONITOR_HOLD=$(( mon_t + 10 )) \
    timeout -k 5 "$mon_t" bash tests/gpu/monitor_gpu.sh >"$LOGS/monitor.log" 2>&1
  MON_RC=$?
  # its training processes hold GPU memory; they stop on their own after the
  # hold, and are stopped here (by pid, only ours) if the script was cut short
  for p in $(pgrep -f "$LOGS/monitor/train.py" 2>/dev/null); do
    grep -q "$LOGS/monitor/train.py" "/proc/$p/cmdline" 2>/dev/null && kill -9 "$p" 2>/dev/null
  done
  cat "$LOGS/monitor.log"
  echo "monitor_gpu.sh exit $MON_RC"
fi

[ "$AB_DONE" -eq "$AB_WANT" ] && [ "$MON_RC" = 0 ]
