# tests/gpu/lib.sh — sourced (never run) by the GPU scripts, first thing after
# `set -u`, with the output folder to use when $OUT is not set:
#     . "$(dirname "$0")/lib.sh" /tmp/gpumem-out
# (the argument is needed: without one, `.` would hand the script's own
# arguments to this file). It gives
#   SRC  the source tree;  OUT  $OUT or the default, made;  T0  the start
#   (date +%s);  PYTHONUNBUFFERED=1, exported;
#   the install functions of pip_install.sh (gpumem_pip_install,
#   gpumem_device_run_start, gpumem_suite_start);
#   gpumem_kill_on_exit, gpumem_build, gpumem_run_mode (below).
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$1}
mkdir -p "$OUT"
T0=$(date +%s)
export PYTHONUNBUFFERED=1
. "$SRC/tests/gpu/pip_install.sh"

# gpumem_kill_on_exit: the processes the script adds to pids (pids+=($!)) get
# SIGTERM when it exits, and SIGKILL a second later.
gpumem_kill_on_exit() {
  pids=()
  trap gpumem_kill_pids EXIT
}
gpumem_kill_pids() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
}

# gpumem_build BUILD: configure (Release, no tests) and build gpumem in BUILD,
# logs in $OUT/cmake.log and $OUT/build.log; sets GPUMEM (the CLI). When the
# build fails, prints the build log's tail and exits the script with 1.
gpumem_build() {
  echo "== build ($1)"
  cmake -S "$SRC" -B "$1" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_TESTS=OFF >"$OUT/cmake.log" 2>&1 &&
    cmake --build "$1" -j"$(nproc)" >"$OUT/build.log" 2>&1 || { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
  GPUMEM="$1/gpumem"
}

# gpumem_run_mode MODE SECONDS TEST BASE PATTERN [ARGS...]: run the test file
# TEST (python3 TEST --json BASE.json ARGS, its output in BASE.txt) under MODE,
# "native" (a plain python3: PyTorch's own allocator) or a gpumem policy
# (`python3 -m gpumem run --conf policy:MODE`), for at most SECONDS; print
# "== TEST's name: MODE", its exit status and the lines of its output that
# PATTERN (grep -E) matches. Returns the test's exit status.
gpumem_run_mode() {
  local mode=$1 secs=$2 test=$3 base=$4 pattern=$5 r
  shift 5
  echo "== ${test##*/}: $mode"
  if [ "$mode" = native ]; then
    timeout "$secs" python3 "$test" --json "$base.json" "$@" >"$base.txt" 2>&1
  else
    timeout "$secs" python3 -m gpumem run --conf "policy:$mode" -- python3 "$test" --json "$base.json" "$@" \
      >"$base.txt" 2>&1
  fi
  r=$?
  echo "exit $r"
  grep -E "$pattern" "$base.txt"
  return $r
}
