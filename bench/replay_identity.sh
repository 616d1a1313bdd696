#!/usr/bin/env bash
# bench/replay_identity.sh — does a change keep replay's behaviour? Records
# `gpumem replay --json` for every trace (../shared/traces/*.pickle.gz and
# examples/*.pickle.gz) under a fixed set of settings, then compares another
# build's output byte for byte, one line per case: identical / different.
#
# usage: bench/replay_identity.sh record GPUMEM_BINARY DIR
#        bench/replay_identity.sh compare GPUMEM_BINARY DIR
# record writes DIR/<trace>__<case>.json; compare replays with GPUMEM_BINARY
# and diffs against DIR. Exit status: 0 all identical, 1 any different.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-}; bin=${2:-}; dir=${3:-}
if [ -z "$mode" ] || [ -z "$bin" ] || [ -z "$dir" ] || [ ! -x "$bin" ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2
fi
shared=${GPUMEM_SHARED:-$root/../shared}
# name|replay arguments (the settings are gpumem's PYTORCH_CUDA_ALLOC_CONF syntax)
cases=(
  "torch|--conf policy:torch"
  "torch_expandable|--conf expandable_segments:True"
  "torch_maxsplit128|--conf max_split_size_mb:128"
  "torch_roundup_gc|--conf roundup_power2_divisions:4,garbage_collection_threshold:0.6"
  "torch_cap4g|--conf policy:torch --capacity 4GiB"
  "gpumem|--conf policy:gpumem"
  "gpumem_slack0|--conf policy:gpumem,gpumem_slack:0"
  "gpumem_slackinf|--conf policy:gpumem,gpumem_slack:inf"
  "gpumem_plan|--conf policy:gpumem,gpumem_plan:on"
  "gpumem_granule|--conf policy:gpumem,gpumem_chunks:granule"
  "gpumem_cap4g|--conf policy:gpumem --capacity 4GiB"
)
mkdir -p "$dir"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
rc=0; n=0; same=0
for trace in "$shared"/traces/*.pickle.gz "$root"/examples/*.pickle.gz; do
  [ -f "$trace" ] || continue
  t=$(basename "$trace" .pickle.gz)
  for c in "${cases[@]}"; do
    name=${c%%|*}; args=${c#*|}
    # shellcheck disable=SC2086
    "$bin" replay --json $args "$trace" >"$tmp/raw.json" 2>"$tmp/err.txt"
    st=$?
    # "seconds" is the replay's wall time: the one field that may differ
    sed -E 's/"seconds":[-0-9.e+]+,?//' "$tmp/raw.json" >"$tmp/out.json"
    echo "exit=$st" >>"$tmp/out.json"
    cat "$tmp/err.txt" >>"$tmp/out.json"
    f="$dir/${t}__${name}.json"
    if [ "$mode" = record ]; then cp "$tmp/out.json" "$f"; echo "recorded $t $name"; continue; fi
    n=$((n + 1))
    if cmp -s "$tmp/out.json" "$f"; then same=$((same + 1)); echo "identical  $t $name"
    else rc=1; echo "DIFFERENT  $t $name"; diff "$f" "$tmp/out.json" | head -5; fi
  done
done
[ "$mode" = compare ] && echo "$same of $n cases identical"
exit $rc
