#!/usr/bin/env bash
# monitor_pidns.sh — issue 26, defect 4: containers share /dev/shm and reuse
# pids. Two publishers, each PID 1 of its own PID namespace (unshare --pid,
# as two containers' first processes), both publish; a host-side `gpumem
# smi` (run twice, cleaning) reports both, under their host pids with ns_pid
# 1, and unlinks neither (before: the second replaced the first's segment,
# and the host judged the survivor stale and unlinked it). Needs root (or
# unprivileged user namespaces) for unshare: skipped otherwise.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
command -v python3 >/dev/null || { echo "skip: python3 needed to parse the output"; exit 77; }
unshare --pid --fork --mount-proc true 2>/dev/null || { echo "skip: unshare --pid --fork does not work here"; exit 77; }
export GPUMEM_SHM_TAG="pidns$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for

for c in a b; do
    unshare --pid --fork --kill-child --mount-proc "$GPUMEM" demo --steps 2 --step-ms 0 --hold 120 --model 16MiB --label "ctr-$c" \
        >"$tmp/$c.json" 2>/dev/null &
    pids+=($!)
    eval "outer_$c=$!"
done
for c in a b; do wait_for 30 test -s "$tmp/$c.json" || { echo "FAIL: container $c did not report"; exit 1; }; done
# the demo's host pid: unshare's child
host_a=$(pgrep -P "$outer_a"); host_b=$(pgrep -P "$outer_b")
# stop the demos themselves first: unshare waits on its child ignoring TERM
pids=("$host_a" "$host_b" "${pids[@]}")
segs_before=$(ls /dev/shm | grep -c "^gpumem-$GPUMEM_SHM_TAG\." || true)
[ "$segs_before" = 2 ] || { echo "FAIL: $segs_before segments for two publishers"; ls /dev/shm; exit 1; }

for i in 1 2; do "$GPUMEM" smi --no-nvml --format json >"$tmp/smi$i.json"; done
segs_after=$(ls /dev/shm | grep -c "^gpumem-$GPUMEM_SHM_TAG\." || true)
[ "$segs_after" = 2 ] || { echo "FAIL: the host-side smi unlinked a live container's segment"; exit 1; }

python3 - "$tmp" "$host_a" "$host_b" <<'PY'
import json, sys
tmp, ha, hb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in (1, 2):
    procs = {p["label"]: p for p in json.load(open(f"{tmp}/smi{i}.json"))["processes"]}
    assert set(procs) == {"ctr-a", "ctr-b"}, procs
    assert procs["ctr-a"]["pid"] == ha and procs["ctr-b"]["pid"] == hb, (procs, ha, hb)
    assert procs["ctr-a"]["ns_pid"] == 1 and procs["ctr-b"]["ns_pid"] == 1, procs
    for c in "ab":
        w = json.loads(open(f"{tmp}/{c}.json").readline())
        assert procs["ctr-" + c]["reserved"] == w["reserved"], (procs, w)
print("ok: two PID-1 publishers in their own namespaces, both seen under host pids, neither unlinked")
PY
echo PASS
