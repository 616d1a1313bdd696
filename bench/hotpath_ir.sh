#!/usr/bin/env bash
# bench/hotpath_ir.sh — warm-path instructions per operation, the number
# bench/RESULTS.md tracks between speed checks: bench_hotpath --cg under
# callgrind, counting only hp_untimed_pass (one warm pass over the traces).
# usage: bench/hotpath_ir.sh BENCH_HOTPATH_BINARY [gpumem|torch]  (default: both)
#        HOTPATH_CONF=gpumem_slack:inf bench/hotpath_ir.sh ...  (the default's steady state)
# Prints, per policy: Ir in the warm pass, operations, Ir per op. Reports only.
set -euo pipefail
bin=${1:?usage: bench/hotpath_ir.sh BENCH_HOTPATH [gpumem|torch]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export GPUMEM_SHARED=${GPUMEM_SHARED:-$root/../shared}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for policy in ${2:-gpumem torch}; do
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" --toggle-collect=hp_untimed_pass \
    "$bin" --reps 1 --cg --policy "$policy" --conf "${HOTPATH_CONF:-}" >"$tmp/stdout" 2>"$tmp/stderr"
  ir=$(sed -n 's/^summary: *//p' "$tmp/cg.out")
  ops=$(awk '$3 == "ops/pass" { n += $4 } END { print n + 0 }' "$tmp/stdout")
  awk -v p="$policy" -v ir="$ir" -v ops="$ops" \
    'BEGIN { printf "policy %-6s warm-pass Ir %.0f  ops %d  Ir/op %.1f\n", p, ir, ops, ops ? ir / ops : 0 }'
done
