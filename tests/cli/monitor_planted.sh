#!/usr/bin/env bash
# monitor_planted.sh — issue 43, items 5 and 9, from the shell:
#  - a FIFO planted as a /proc file (status, stat, comm, cgroup) under
#    GPUMEM_PROC_ROOT made `gpumem smi` hang in open() and the exporter's
#    sampler with it (503 "no sample yet"); each command here runs under
#    `timeout`, so a hang fails the test instead of stalling it;
#  - a publisher whose run id is 100 'é' (cut at the field's 127 bytes in
#    the middle of a character before) and whose label holds bytes that are
#    not UTF-8: smi's and log's JSON parse in python, `promtool check
#    metrics` accepts the exporter's scrape.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
for t in curl python3 timeout mkfifo; do command -v $t >/dev/null || { echo "skip: $t not installed"; exit 77; }; done
export GPUMEM_SHM_TAG="planted$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, have_exporter, start_exporter

run_id=$(python3 -c 'print("é" * 100)')
GPUMEM_RUN_ID="$run_id" "$GPUMEM" demo --steps 2 --step-ms 0 --hold 120 --model 16MiB --label $'bad \xff\xfe label' \
    >"$tmp/producer.json" 2>/dev/null &
pids+=($!); producer=$!
wait_for 30 test -s "$tmp/producer.json" || { echo "FAIL: producer did not start"; exit 1; }

# labels: smi and log JSON, the exporter's scrape
timeout 20 "$GPUMEM" smi --no-nvml --format json >"$tmp/smi.json"
timeout 20 "$GPUMEM" log --no-nvml --count 1 --interval 0.1 >"$tmp/log.jsonl"
python3 - "$tmp" "$producer" <<'PY'
import json, sys
tmp, pid = sys.argv[1], int(sys.argv[2])
for name in ("smi.json", "log.jsonl"):
    doc = json.loads(open(f"{tmp}/{name}", encoding="utf-8").readline() if name.endswith("l") else
                     open(f"{tmp}/{name}", encoding="utf-8").read())
    (p,) = [p for p in doc["processes"] if p["pid"] == pid]
    assert p["run_id"] == "é" * 63, (name, p["run_id"])          # 126 bytes: cut between characters
    assert p["label"] == "bad \ufffd\ufffd label", (name, p["label"])
print("ok: smi and log JSON parse; run id cut on a character boundary; bad bytes are U+FFFD")
PY
have_mhd=true
have_exporter || have_mhd=false
if $have_mhd && command -v promtool >/dev/null; then
    start_exporter --interval 0.1 --no-nvml   # url
    has_producer() { curl -fsS --max-time 5 "$url" >"$tmp/metrics.txt" && grep -q "pid=\"$producer\"" "$tmp/metrics.txt"; }
    wait_for 20 has_producer || { echo "FAIL: producer never scraped"; exit 1; }
    promtool check metrics <"$tmp/metrics.txt" || { echo "FAIL: promtool check metrics"; grep label= "$tmp/metrics.txt" | head -3; exit 1; }
    echo "ok: promtool accepts the scrape"
fi

# a /proc of FIFOs: the files smi reads for a publisher in another PID
# namespace (status's NSpid), its start time (stat), names (comm, cgroup)
root=$tmp/proc
for d in self 1 "$producer" "$$"; do
    mkdir -p "$root/$d/ns"
    for f in status stat comm cgroup; do mkfifo "$root/$d/$f"; done
done
export GPUMEM_PROC_ROOT=$root
rc=0; timeout 20 "$GPUMEM" smi --no-nvml --format json >"$tmp/smi2.json" || rc=$?
[ "$rc" = 0 ] || { echo "FAIL: smi with FIFOs under GPUMEM_PROC_ROOT exited $rc (124: it hung)"; exit 1; }
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/smi2.json"
echo "ok: smi does not wait on a FIFO planted as a /proc file"
if $have_mhd; then
    start_exporter --interval 0.1 --no-nvml   # url; it reads the FIFOs of GPUMEM_PROC_ROOT
    ok_scrape() { [ "$(curl -s --max-time 5 -o "$tmp/m2.txt" -w '%{http_code}' "$url")" = 200 ]; }
    wait_for 20 ok_scrape || { echo "FAIL: the exporter never answered 200 with FIFOs under GPUMEM_PROC_ROOT"; exit 1; }
    echo "ok: the exporter answers 200"
fi
echo PASS
