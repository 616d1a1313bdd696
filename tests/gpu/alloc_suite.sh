#!/usr/bin/env bash
# One device call for the allocator's GPU suite (issue 23): install the package as a
# user does (pip, offline), then tests/gpu/alloc_suite.py with the given arguments.
# $OUT gets suite.txt, suite.json and, with --record, traces.tgz.
#   tests/gpu/alloc_suite.sh [alloc_suite.py args...]
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GPUMEM_BUILD_JOBS=$(nproc)
START=$(date +%s)
exec > >(tee "$OUT/suite.txt") 2>&1
git -C "$SRC" log --oneline -1 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
. "$SRC/tests/gpu/pip_install.sh" # an install that imports already is kept
GPUMEM_PIP_REUSE=1 gpumem_pip_install "$SRC" /tmp/pip.log "$START" || exit 1
cd /tmp
rec=""
for a in "$@"; do [ "${prev:-}" = --record ] && rec=$a; prev=$a; done
python3 "$SRC/tests/gpu/alloc_suite.py" --json "$OUT/suite.json" "$@"
[ -n "$rec" ] && [ -d "$rec" ] && cp "$rec"/*.pickle.gz "$OUT"/ && ls -la "$rec" # one file each: $OUT files are at most 16 MiB
echo "total $(( $(date +%s) - START )) s"
