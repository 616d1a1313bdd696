#!/usr/bin/env bash
# One device call for the checks still open (issues 28 and 23), each stage
# bounded so the whole stays under the 10-minute call limit; the package is
# installed once (pip, offline) and reused by the later stages:
#   1. tests/gpu/graphs_run.sh: CUDA graphs, reduce-overhead, MemPool (issue 28)
#   2. tests/gpu/dropin_run.sh: torch's memory API under both policies (kept)
#   3. warm allocator ops, gpumem default against torch native, paired in one
#      process, on each trace's steady loop (tests/gpu/variants_paired.sh
#      PAIR_ARGS=--loop on examples/steps40; issue 23 goal 6; about a minute;
#      WARM_ARGS= for whole-run passes)
#   4. the allocator suite on the variable-shape jobs (issue 23), native /
#      expandable / gpumem default, SUITE_ROUNDS rounds (1) in rotated order,
#      as many as the time left allows
# $OUT gets run.txt (this output) and logs.tgz (every stage's logs and JSON:
# the device returns at most 8 files). SKIP="graphs dropin suite warm" skips stages.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
FINAL=${OUT:-/tmp/gpumem-out}
OUT=$(mktemp -d)
mkdir -p "$FINAL"
exec > >(tee "$FINAL/run.txt") 2>&1
trap 'tar -C "$OUT" -czf "$FINAL/logs.tgz" .' EXIT
export GPUMEM_PIP_REUSE=1
START=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - START) )); }
skip() { case " ${SKIP:-} " in *" $1 "*) return 0;; esac; return 1; }
if ! skip graphs; then
  echo "== 1. graphs"
  OUT=$OUT/graphs timeout -k 5 "$(left ${GRAPHS_S:-300})" bash "$SRC/tests/gpu/graphs_run.sh"
  echo "graphs exit $? [$(( $(date +%s) - START )) s]"
fi
if ! skip dropin; then
  echo "== 2. drop-in"
  OUT=$OUT/dropin timeout -k 5 "$(left ${DROPIN_S:-420})" bash "$SRC/tests/gpu/dropin_run.sh" >"$OUT/dropin.log" 2>&1
  echo "dropin exit $? [$(( $(date +%s) - START )) s]"; grep -E "^(PASS|FAIL|==|exit|total)" "$OUT/dropin.log"
fi
if ! skip warm; then
  echo "== 3. warm ops"
  OUT=$OUT/warm VARIANTS=base= ROUNDS=${WARM_ROUNDS:-1} PAIR_ARGS=${WARM_ARGS---loop} timeout -k 5 "$(left ${WARM_S:-570})" \
    bash "$SRC/tests/gpu/variants_paired.sh" "$SRC/examples/steps40" >"$OUT/warm.log" 2>&1
  echo "warm exit $? [$(( $(date +%s) - START )) s]"; sed -n '/^paired warm/,$p' "$OUT/warm.log"
fi
if ! skip suite; then
  echo "== 4. allocator suite"
  b=$(( $(left ${SUITE_S:-570}) - 25 ))
  OUT=$OUT/suite timeout -k 5 "$(left ${SUITE_S:-570})" bash "$SRC/tests/gpu/alloc_suite.sh" --steps 40 \
    --rounds "${SUITE_ROUNDS:-1}" --jobs "${SUITE_JOBS:-bert_varlen,gpt2_generate}" \
    --allocs native,expandable,gpumem --budget "$b" ${SUITE_ARGS:-} >"$OUT/suite.log" 2>&1
  echo "suite exit $? [$(( $(date +%s) - START )) s]"; sed -n '/^uncapped/,$p' "$OUT/suite.log"
fi
echo "total $(( $(date +%s) - START )) s"
