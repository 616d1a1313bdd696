#!/usr/bin/env bash
# monitor_smi.sh — producers (gpumem demo on the sim backend) publish; smi
# (table, CSV, JSON) and log (JSON lines, CSV) must report exactly what each
# producer says it published.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
command -v python3 >/dev/null || { echo "skip: python3 needed to parse the output"; exit 77; }
export GPUMEM_SHM_TAG="smi$$"   # our own namespace of segments
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for

# two producers on different devices; --steps then --hold freezes their numbers
"$GPUMEM" demo --steps 2 --step-ms 0 --hold 120 --device 0 --model 64MiB --label trainer-a >"$tmp/a.json" 2>/dev/null &
pids+=($!)
"$GPUMEM" demo --steps 3 --step-ms 0 --hold 120 --device 1 --model 32MiB --oom-every 2 --capacity 1GiB \
    --label 'trainer "b"' >"$tmp/b.json" 2>/dev/null &
pids+=($!)
for f in a b; do   # wait until each has reported (bounded)
    for _ in $(seq 300); do [ -s "$tmp/$f.json" ] && break; sleep 0.1; done
    [ -s "$tmp/$f.json" ] || { echo "FAIL: producer $f did not report"; exit 1; }
done

"$GPUMEM" smi --no-nvml --format json >"$tmp/smi.json"
"$GPUMEM" smi --no-nvml --format csv >"$tmp/smi.csv"
"$GPUMEM" smi --no-nvml >"$tmp/smi.txt"
"$GPUMEM" log --no-nvml --format jsonl --count 2 --interval 0.1 --output "$tmp/log.jsonl"
"$GPUMEM" log --no-nvml --format csv --count 1 --interval 0.1 >"$tmp/log.csv"
grep -q "trainer-a" "$tmp/smi.txt" || { echo "FAIL: table lacks trainer-a"; cat "$tmp/smi.txt"; exit 1; }
grep -q "NVML" "$tmp/smi.txt" || { echo "FAIL: table does not say NVML is not used"; exit 1; }

python3 - "$tmp" <<'PY'
import csv, json, sys
tmp = sys.argv[1]
want = {}
for f in ("a", "b"):
    r = json.loads(open(f"{tmp}/{f}.json").read().splitlines()[0])
    want[r["pid"]] = r
assert max(w["num_ooms"] for w in want.values()) >= 1, "producer b should have had an OOM"
def check(rows, where):
    got = {r["pid"]: r for r in rows if r["pid"] in want}
    assert set(got) == set(want), f"{where}: producers {sorted(want)} but saw {sorted(got)}"
    for pid, w in want.items():
        g = got[pid]
        assert int(g["gpu"]) == w["gpu"], (where, g, w)
        for k in ("allocated", "reserved", "requested", "peak_allocated", "peak_reserved", "num_ooms", "num_alloc_retries"):
            assert int(g[k]) == w[k], f"{where}: pid {pid} {k} {g[k]} != {w[k]}"
        if "reserved_unallocated" in g:
            assert int(g["reserved_unallocated"]) == w["reserved"] - w["allocated"], where
        assert g["nvml_used"] in (None, ""), where   # NVML not used: null, not 0
smi = json.load(open(f"{tmp}/smi.json"))
assert smi["nvml"]["available"] is False
check(smi["processes"], "smi json")
labels = {p["label"] for p in smi["processes"]}
assert 'trainer "b"' in labels and "trainer-a" in labels, labels
rows = list(csv.DictReader(open(f"{tmp}/smi.csv")))
for r in rows:
    r["pid"] = int(r["pid"]) if r["pid"] else None
check([r for r in rows if r["pid"] in want], "smi csv")
lines = open(f"{tmp}/log.jsonl").read().splitlines()
assert len(lines) == 2, lines
for l in lines:
    check(json.loads(l)["processes"], "log jsonl")
rows = list(csv.DictReader(open(f"{tmp}/log.csv")))
for r in rows:
    r["pid"] = int(r["pid"]) if r["pid"] else None
check([r for r in rows if r["pid"] in want], "log csv")
print("ok: smi json/csv and log jsonl/csv match", len(want), "producers")
PY

# bad usage is reported, not ignored
if "$GPUMEM" smi --format xml 2>/dev/null; then echo "FAIL: --format xml accepted"; exit 1; fi
if "$GPUMEM" log --interval -1 2>/dev/null; then echo "FAIL: --interval -1 accepted"; exit 1; fi
echo PASS
