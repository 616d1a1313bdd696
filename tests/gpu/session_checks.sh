#!/usr/bin/env bash
# One device call for the checks of 2026-12-03 (issues 23, 27, 25), each
# stage bounded so the whole stays under the 10-minute call limit:
#   1. the allocator suite, 40 steps, native / expandable / gpumem default (issue 23)
#   2. tests/gpu/oom_forensics.sh: three planted OOM causes (issue 27)
#   3. tests/gpu/estimate_sharded.py --quick: per-rank estimate vs fake-PG measurement (issue 25)
# $OUT gets one log per stage.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - START) )); }
echo "== 1. allocator suite"
OUT=$OUT/suite timeout -k 5 "$(left ${SUITE_S:-270})" bash "$SRC/tests/gpu/alloc_suite.sh" --steps 40 --rounds 1 \
  --jobs gpt2_hf,resnet50_amp,llama_ckpt,bert_varlen --allocs ${ALLOCS:-native,expandable,gpumem} --budget ${BUDGET:-230} \
  >"$OUT/suite.log" 2>&1
echo "suite exit $? [$(( $(date +%s) - START )) s]"; sed -n '/^uncapped/,$p' "$OUT/suite.log"
[ "${SKIP_OOM:-0}" = 1 ] && exit 0
echo "== 2. OOM forensics"
OUT=$OUT/oom GPUMEM_BUILD=/tmp/build-gpu timeout -k 5 "$(left ${OOM_S:-470})" bash "$SRC/tests/gpu/oom_forensics.sh" >"$OUT/oom.log" 2>&1
echo "oom exit $? [$(( $(date +%s) - START )) s]"; tail -12 "$OUT/oom.log"
[ "${SKIP_EST:-0}" = 1 ] && exit 0
echo "== 3. sharded estimate"
OUT=$OUT timeout -k 5 "$(left 585)" python3 "$SRC/tests/gpu/estimate_sharded.py" --quick --gpumem /tmp/build-gpu/gpumem >"$OUT/est.log" 2>&1
echo "estimate exit $? [$(( $(date +%s) - START )) s]"; tail -25 "$OUT/est.log"
