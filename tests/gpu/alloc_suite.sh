#!/usr/bin/env bash
# One device call for the allocator's GPU suite (issue 23): install the package as a
# user does (pip, offline), then tests/gpu/alloc_suite.py with the given arguments.
# $OUT gets suite.txt, suite.json and, with --record, traces.tgz.
#   tests/gpu/alloc_suite.sh [alloc_suite.py args...]
set -u
. "$(dirname "$0")/lib.sh" /tmp/gpumem-out   # SRC, OUT, T0, gpumem_suite_start
export GPUMEM_BUILD_JOBS=$(nproc)
gpumem_suite_start "$SRC" "$OUT/suite.txt" "$T0" || exit 1   # an install that imports already is kept
rec=""
for a in "$@"; do [ "${prev:-}" = --record ] && rec=$a; prev=$a; done
python3 "$SRC/tests/gpu/alloc_suite.py" --json "$OUT/suite.json" "$@"
[ -n "$rec" ] && [ -d "$rec" ] && cp "$rec"/*.pickle.gz "$OUT"/ && ls -la "$rec" # one file each: $OUT files are at most 16 MiB
echo "total $(( $(date +%s) - T0 )) s"
