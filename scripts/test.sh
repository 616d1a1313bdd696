#!/usr/bin/env bash
# scripts/test.sh — the one test command: configure, build and run the tests
# (the cmocka programs of tests/unit, tests/integration and tests/stress, the
# CLI tests of tests/cli and the source checks) with CTest, then the Python
# package's tests against an unsanitized build of the library.
# By default a Debug build with AddressSanitizer + UndefinedBehaviorSanitizer,
# the configuration CI runs, so a leak or UB fails the run here too, and the
# fast set: every test but those labelled "long" (the soak, the fault sweeps,
# the long plan and property runs, the pip install; tests/CMakeLists.txt),
# which CI runs (.ci/run) and --all adds. It uses build folders of its own
# (build-test, build-test-py), so the Release build in build/ that the
# README's first command makes is never reconfigured.
#
# usage: scripts/test.sh [options] [-- extra ctest args]
#   --all             every test, the long ones too, and build the benchmarks (as CI)
#   --build-dir DIR   build directory (default: build-test)
#   --no-sanitize     plain build (faster; no ASan/UBSan)
#   --release         RelWithDebInfo instead of Debug
#   -j N              parallel build/test jobs (default: 2)
#   -R REGEX          run only the tests matching REGEX (ctest -R; `ctest --test-dir build-test -N` lists them)
#   -L LABEL          run only the tests labelled LABEL (ctest -L): unit, integration, stress,
#                     check (the source checks); their long ones with --all, or -L long alone
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=build-test
sanitize=ON
btype=Debug
jobs=2
ctest_extra=()
all=false
while [ $# -gt 0 ]; do
  case "$1" in
    --all) all=true; shift ;;
    --build-dir) build=$2; shift 2 ;;
    --no-sanitize) sanitize=OFF; shift ;;
    --sanitize) sanitize=ON; shift ;;
    --release) btype=RelWithDebInfo; shift ;;
    -j) jobs=$2; shift 2 ;;
    -R) ctest_extra+=(-R "$2"); shift 2 ;;
    -L) ctest_extra+=(-L "$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; ctest_extra+=("$@"); break ;;
    *) echo "test.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$root/$build" ;; esac

# Sanitizer failures must fail the test, with a stack to act on.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# the fast set: no label "long" (unless --all or -R picks tests by name), no benchmarks to build
labels=(-LE long)
bench=OFF
if $all; then labels=(); bench=ON; fi
prev=
for a in "${ctest_extra[@]}"; do
  { [ "$a" = -R ] || { [ "$prev" = -L ] && [ "$a" = long ]; }; } && labels=()
  prev=$a
done
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="$btype" -DGPUMEM_SANITIZE="$sanitize" -DGPUMEM_BENCH="$bench"
cmake --build "$build" -j"$jobs"
# --timeout: a hung test fails instead of stalling CI.
set +e
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 600 "${labels[@]}" "${ctest_extra[@]}" 2>&1 |
    tee "$build/ctest-output.txt"
rc=${PIPESTATUS[0]}
set -e

# CTest prints a skipped test as "***Skipped" with no reason; each of ours
# prints one (a missing ../shared, tool or package): show it here.
sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$build/ctest-output.txt" | while read -r t; do
    reason=$(awk -v t="\"$t\" start time" '
        index($0, t) == 1 { on = 1; next }
        on && /^<end of output>/ { exit }
        on && /^Output:/ { out = 1; next }
        on && out && !/^-+$/ && NF { last = $0 }
        END { print last }' "$build/Testing/Temporary/LastTest.log")
    echo "skipped: $t: ${reason:-no reason printed}"
done

# The Python package's tests: the ctypes binding cannot load an ASan build
# into a plain python3, so they get an unsanitized build of their own.
if [ "${#ctest_extra[@]}" = 0 ] && [ -d "$root/python/tests" ]; then
    pybuild="$build-py"
    cmake -S "$root" -B "$pybuild" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUMEM_SANITIZE=OFF \
        -DGPUMEM_TESTS=OFF -DGPUMEM_BENCH=OFF >/dev/null
    cmake --build "$pybuild" -j"$jobs" --target gpumem_torch gpumem_cli >/dev/null
    if python3 -c 'import pytest' 2>/dev/null; then runner=(python3 -m pytest -q "$root/python/tests")
    else runner=(python3 -m unittest discover -s "$root/python/tests"); fi
    echo "python tests: ${runner[*]}"
    if ! PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" GPUMEM_LIB="$pybuild/libgpumem_torch.so" \
         GPUMEM_SHARED="$root/../shared" timeout 900 "${runner[@]}"; then
        echo "python tests FAILED"
        rc=1
    fi
fi
exit "$rc"
