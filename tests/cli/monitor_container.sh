#!/usr/bin/env bash
# monitor_container.sh — issue 27, PIDs right inside a container, in real
# PID namespaces. A publisher runs as PID 1 of its own namespace (unshare
# --pid --mount-proc, as a container's first process); a stand-in
# libnvidia-ml.so.1 (tests/fake_nvml) lists its host pid, as drivers that do
# not translate PIDs do, beside a small process of "another container".
#  - host: smi joins the publisher's row to NVML's exactly (NSpid): pid and
#    host_pid the host's, ns_pid 1, pid_map exact; the exporter adds ns_pid.
#  - inside (nsenter into its PID and mount namespaces): the row is pid 1,
#    joined to the host pid by inference and marked so (JSON pid_map, the
#    table's "1?" and note, the exporter's host_pid and pid_map labels);
#    NVML's other process is shown unmapped, not named from a /proc where
#    its number may be someone else.
#  - inside, with two processes that could both be it: no join at all.
# Needs root (or user namespaces) for unshare and nsenter: skipped otherwise.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
command -v python3 >/dev/null || { echo "skip: python3 needed to parse the output"; exit 77; }
command -v nsenter >/dev/null || { echo "skip: nsenter not installed"; exit 77; }
unshare --pid --fork --mount-proc true 2>/dev/null || { echo "skip: unshare --pid --fork does not work here"; exit 77; }
[ -n "${GPUMEM_FAKE_NVML_DIR:-}" ] && [ -e "$GPUMEM_FAKE_NVML_DIR/libnvidia-ml.so.1" ] ||
    { echo "skip: no fake libnvidia-ml.so.1 (GPUMEM_FAKE_NVML_DIR; built by tests/CMakeLists.txt)"; exit 77; }
export GPUMEM_SHM_TAG="ctr$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, have_exporter
export LD_LIBRARY_PATH="$GPUMEM_FAKE_NVML_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

unshare --pid --fork --kill-child --mount-proc "$GPUMEM" demo --steps 2 --step-ms 0 --hold 120 --model 16MiB \
    --label ctr >"$tmp/ctr.json" 2>/dev/null &
outer=$!
pids+=($outer)
wait_for 30 test -s "$tmp/ctr.json" || { echo "FAIL: the container's publisher did not report"; exit 1; }
host=$(pgrep -P "$outer")
pids=("$host" "${pids[@]}") # the demo first: unshare waits on its child ignoring TERM
inside() { nsenter -t "$host" -p -m "$@"; }

# NVML: the publisher under its host pid with room for its reserved bytes
# (context included), and a process too small to be it
export GPUMEM_FAKE_NVML_PROCS="$host:68719476736,999999:4096"
"$GPUMEM" smi --format json >"$tmp/host.json"
inside "$GPUMEM" smi --format json >"$tmp/inside.json"
inside "$GPUMEM" smi >"$tmp/inside.txt"
export GPUMEM_FAKE_NVML_PROCS="$host:68719476736,999999:68719476736"
inside "$GPUMEM" smi --format json >"$tmp/ambiguous.json"
export GPUMEM_FAKE_NVML_PROCS="$host:68719476736,999999:4096"

exporter=false
if have_exporter && command -v curl >/dev/null; then
    exporter=true
    # inside the container: dies with its PID 1 (the demo) at the latest
    inside timeout 60 "$GPUMEM" exporter --listen 127.0.0.1:0 --interval 0.1 >"$tmp/exporter.out" 2>&1 &
    pids+=($!)
    wait_for 20 grep -q serving "$tmp/exporter.out" || { echo "FAIL: exporter did not start"; cat "$tmp/exporter.out"; exit 1; }
    url=$(sed -n 's/.*serving \(http:[^ ]*\).*/\1/p' "$tmp/exporter.out")
    scrape_joined() { curl -fsS "$url" >"$tmp/inside.prom" && grep -q 'pid_map="inferred"' "$tmp/inside.prom"; }
    wait_for 20 scrape_joined || { echo "FAIL: no inferred series inside"; cat "$tmp/inside.prom"; exit 1; }
fi

python3 - "$tmp" "$host" "$exporter" <<'PY'
import json, re, sys
tmp, host, exporter = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "true"
w = json.loads(open(f"{tmp}/ctr.json").readline())
def rows(name):
    d = json.load(open(f"{tmp}/{name}.json"))
    return d, {(p["label"], p["pid"]): p for p in d["processes"]}
d, r = rows("host")
assert d["host_view"] is True, d
p = r[("ctr", host)]
assert (p["ns_pid"], p["host_pid"], p["pid_map"]) == (1, host, "exact"), p
assert p["nvml_used"] == 68719476736 and p["reserved"] == w["reserved"], (p, w)
assert len(d["processes"]) == 2, d["processes"]

d, r = rows("inside")
assert d["host_view"] is False, d
p = r[("ctr", 1)]
assert (p["ns_pid"], p["host_pid"], p["pid_map"]) == (1, host, "inferred"), p
assert p["nvml_used"] == 68719476736 and p["reserved"] == w["reserved"], (p, w)
o = r[("?", 999999)]
assert (o["pid_map"], o["host_pid"], o["reserved"]) == ("unmapped", None, None), o
assert len(d["processes"]) == 2, d["processes"]
t = open(f"{tmp}/inside.txt").read()
assert re.search(r"^0 +1\? +ctr ", t, re.M), t
assert "pid?: inside a PID namespace" in t and re.search(r"^0 +999999\^ ", t, re.M), t

d, r = rows("ambiguous")
p = r[("ctr", 1)]
assert p["nvml_used"] is None and p["pid_map"] is None and p["host_pid"] is None, p
assert len(d["processes"]) == 3, d["processes"]

if exporter:
    m = open(f"{tmp}/inside.prom").read()
    pat = r'^gpumem_process_info\{gpu="0",pid="1",host_pid="%d",pid_map="inferred",uid="\d+",source="gpumem",comm="[^"]*",label="ctr"[^}]*\} 1$' % host
    assert re.search(pat, m, re.M), m
    s = re.search(r'^gpumem_process_allocator_reserved_bytes\{gpu="0",pid="1"\} (\d+)$', m, re.M)
    assert s and int(s.group(1)) == w["reserved"], m
print("ok: host view exact, inside inferred and marked, no guess between equals" + (", exporter labels" if exporter else ""))
PY
echo PASS
