#!/usr/bin/env bash
# scripts/test.sh — the one test command: configure, build and run every test
# (cmocka unit/property/stress/fault tests and CLI tests) with CTest.
# By default a Debug build with AddressSanitizer + UndefinedBehaviorSanitizer,
# the configuration CI runs, so a leak or UB fails the run here too.
#
# usage: scripts/test.sh [options] [-- extra ctest args]
#   --build-dir DIR   build directory (default: build)
#   --no-sanitize     plain build (faster; no ASan/UBSan)
#   --release         RelWithDebInfo instead of Debug
#   -j N              parallel build/test jobs (default: 2)
#   -R REGEX          run only the tests matching REGEX (ctest -R)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=build
sanitize=ON
btype=Debug
jobs=2
ctest_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --no-sanitize) sanitize=OFF; shift ;;
    --sanitize) sanitize=ON; shift ;;
    --release) btype=RelWithDebInfo; shift ;;
    -j) jobs=$2; shift 2 ;;
    -R) ctest_extra+=(-R "$2"); shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; ctest_extra+=("$@"); break ;;
    *) echo "test.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$root/$build" ;; esac

# Sanitizer failures must fail the test, with a stack to act on.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="$btype" -DGPUMEM_SANITIZE="$sanitize"
cmake --build "$build" -j"$jobs"
# --timeout: a hung test fails instead of stalling CI.
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 600 "${ctest_extra[@]}"
