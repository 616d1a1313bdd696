#!/usr/bin/env bash
# monitor_python.sh — python/gpumem/publish_native.py writes gpumem's segment
# format from Python (for processes that keep PyTorch's allocator): smi must
# read exactly the stats it was given, and stop() must remove the segment.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
SRC=${GPUMEM_SOURCE:-$(cd "$(dirname "$0")/../.." && pwd)}
command -v python3 >/dev/null || { echo "skip: python3 not installed"; exit 77; }
export GPUMEM_SHM_TAG="py$$"
tmp=$(mktemp -d)
trap 'kill -9 $pypid 2>/dev/null || true; wait $pypid 2>/dev/null || true; "$GPUMEM" smi --no-nvml >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT

# a fake torch.cuda.memory_stats(), so no torch or GPU is needed
python3 - "$SRC/python/gpumem/publish_native.py" "$tmp" <<'PY' &
import importlib.util, json, os, sys, time
spec = importlib.util.spec_from_file_location("publish_native", sys.argv[1])
pn = importlib.util.module_from_spec(spec); spec.loader.exec_module(pn)
tmp = sys.argv[2]
stats = {1: {"allocated_bytes.all.current": 3 << 20, "reserved_bytes.all.current": 8 << 20,
             "requested_bytes.all.current": (3 << 20) - 7, "reserved_bytes.all.peak": 10 << 20,
             "allocated_bytes.all.peak": 5 << 20, "num_ooms": 2, "num_alloc_retries": 4,
             "allocation.all.allocated": 11, "allocation.all.freed": 9}}
pub = pn.start(label='torch "native"', interval=0.05, devices=[0, 1], stats_fn=lambda d: stats.get(d, {}))
time.sleep(0.3)
open(os.path.join(tmp, "ready"), "w").write(str(os.getpid()))
while not os.path.exists(os.path.join(tmp, "stop")):
    time.sleep(0.05)
pub.stop()
open(os.path.join(tmp, "stopped"), "w").write(pub.path)
time.sleep(60)
PY
pypid=$!
for _ in $(seq 100); do [ -s "$tmp/ready" ] && break; sleep 0.1; done
[ -s "$tmp/ready" ] || { echo "FAIL: python publisher did not start"; exit 1; }

"$GPUMEM" smi --no-nvml --format json >"$tmp/smi.json"
python3 - "$tmp" "$pypid" <<'PY'
import json, sys
tmp, pid = sys.argv[1], int(sys.argv[2])
rows = [p for p in json.load(open(f"{tmp}/smi.json"))["processes"] if p["pid"] == pid]
assert len(rows) == 1, rows          # device 0 had no stats: not published
r = rows[0]
assert r["gpu"] == 1 and r["source"] == "torch" and r["label"] == 'torch "native"', r
want = {"allocated": 3 << 20, "reserved": 8 << 20, "requested": (3 << 20) - 7, "peak_reserved": 10 << 20,
        "peak_allocated": 5 << 20, "num_ooms": 2, "num_alloc_retries": 4, "num_allocs": 11, "num_frees": 9,
        "reserved_unallocated": 5 << 20}
for k, v in want.items():
    assert r[k] == v, (k, r[k], v)
print("ok: python publisher read back exactly")
PY
seg=$(ls /dev/shm | grep -E "^gpumem-$GPUMEM_SHM_TAG\.[0-9]+\.$pypid\.torch\$")
[ "$(stat -c %a "/dev/shm/$seg")" = 600 ] || { echo "FAIL: segment mode is not 0600"; exit 1; }
touch "$tmp/stop"
for _ in $(seq 100); do [ -s "$tmp/stopped" ] && break; sleep 0.1; done
[ ! -e "/dev/shm/$seg" ] || { echo "FAIL: stop() left the segment"; exit 1; }
echo PASS
