#!/usr/bin/env bash
# tune_cli.sh — 'gpumem tune' ranks settings by predicted peak reserved,
# includes the gpumem policy and the exact line to use, and flags OOMs.
set -u
: "${GPUMEM:?}"
fail() { echo "FAIL: $*"; exit 1; }
SRC=${GPUMEM_SHARED:-/nonexistent}/traces/resnet50_sgd_amp.pickle.gz
if [ ! -f "$SRC" ]; then echo "skip: $SRC absent"; exit 77; fi
out=$("$GPUMEM" tune "$SRC" --json) || fail "tune exit $?"
echo "$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
r = j["results"]
assert len(r) >= 12, len(r)
ok = [x for x in r if not x["oom"] and not x["failed"]]
assert [x["peak_reserved"] for x in ok] == sorted(x["peak_reserved"] for x in ok)
assert any(x["policy"] == "gpumem" and "gpumem run" in x["line"] for x in r)
assert any(x["line"] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" for x in r)
assert any("max_split_size_mb:128" in x["conf"] for x in r)
' || fail "json: $out"
# at 6 GiB the trace (peak requested 5.64 GiB) cannot fit with most settings
# (a ranked row with OOM in its flag column; the legend below the table names OOM too)
"$GPUMEM" tune "$SRC" --capacity 6GiB | grep -qE '^ +[0-9]+ .* OOM ' || fail "no OOM flagged at 6 GiB"
"$GPUMEM" tune "$SRC" --capacity nonsense 2>/dev/null; [ $? -eq 2 ] || fail "bad capacity"
echo ok
