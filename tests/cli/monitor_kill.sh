#!/usr/bin/env bash
# monitor_kill.sh — a producer killed with SIGKILL in the middle of training
# leaves its segment behind; the next view must not report its numbers, must
# remove the segment, and must still report the producer that lives.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
command -v python3 >/dev/null || { echo "skip: python3 needed to parse the output"; exit 77; }
export GPUMEM_SHM_TAG="kill$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for

smi_pids() { "$GPUMEM" smi --no-nvml --format json | python3 -c 'import json,sys; print(" ".join(str(p["pid"]) for p in json.load(sys.stdin)["processes"]))'; }

# the victim trains without pause (allocating all the time); the survivor holds
"$GPUMEM" demo --step-ms 0 --model 16MiB --label victim 2>/dev/null >/dev/null &
victim=$!; pids+=($victim)
"$GPUMEM" demo --steps 1 --step-ms 0 --hold 120 --model 16MiB --label survivor >"$tmp/s.json" 2>/dev/null &
survivor=$!; pids+=($survivor)
for _ in $(seq 300); do
    [ -s "$tmp/s.json" ] && [[ " $(smi_pids) " == *" $victim "* ]] && break
    sleep 0.1
done
[[ " $(smi_pids) " == *" $victim "* ]] || { echo "FAIL: victim never published"; exit 1; }

seg=$(segment_of "$victim")
[ -n "$seg" ] || { echo "FAIL: no segment for the victim"; ls /dev/shm; exit 1; }
kill -9 "$victim"; wait "$victim" 2>/dev/null || true
[ -e "/dev/shm/$seg" ] || { echo "FAIL: expected the killed producer to leave its segment"; exit 1; }

"$GPUMEM" smi --no-nvml --format json >"$tmp/after.json"
python3 - "$tmp" "$victim" "$survivor" <<'PY'
import json, sys
tmp, victim, survivor = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = json.load(open(f"{tmp}/after.json"))
pids = [p["pid"] for p in s["processes"]]
assert victim not in pids, f"killed producer {victim} still reported: {pids}"
w = json.loads(open(f"{tmp}/s.json").read().splitlines()[0])
(g,) = [p for p in s["processes"] if p["pid"] == survivor]
for k in ("allocated", "reserved", "peak_reserved", "num_ooms"):
    assert g[k] == w[k], (k, g[k], w[k])
print("ok: killed producer gone, survivor exact")
PY
[ ! -e "/dev/shm/$seg" ] || { echo "FAIL: stale segment $seg not cleaned"; exit 1; }

# a survivor that exits normally removes its own segment
kill -TERM "$survivor"; wait "$survivor" 2>/dev/null || true
left=$(ls /dev/shm | grep -c -E "^gpumem-$GPUMEM_SHM_TAG\." || true)
[ "$left" = 0 ] || { echo "FAIL: $left segments left after a clean exit"; ls /dev/shm; exit 1; }
echo PASS
