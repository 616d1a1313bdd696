#!/usr/bin/env bash
# prometheus.sh — a real Prometheus server on loopback scrapes `gpumem
# exporter`; its HTTP query API must return the values the producers
# published, with a process label holding a quote, a backslash and a
# newline; `promtool check metrics` must accept the exposition.
# Skips (77) without prometheus/promtool (Debian package `prometheus`).
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
"$GPUMEM" exporter --help >/dev/null 2>&1 || true
export GPUMEM_SHM_TAG="prom$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, need, start_exporter
need prometheus promtool python3 curl
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

label=$'job "q" back\\slash\nnewline'
"$GPUMEM" demo --steps 2 --step-ms 0 --hold 300 --model 32MiB --oom-every 2 --capacity 512MiB \
    --label "$label" >"$tmp/producer.json" 2>/dev/null &
pids+=($!)
wait_for 30 test -s "$tmp/producer.json" || { echo "FAIL: producer did not start"; exit 1; }

start_exporter --interval 0.2 --no-nvml   # url
eport=$(echo "$url" | sed 's/.*:\([0-9]*\)\/metrics/\1/')
case "$url" in http://127.0.0.1:*) ;; *) echo "FAIL: exporter not on loopback: $url"; exit 1;; esac

curl -fsS "$url" -o "$tmp/metrics.txt"
curl -fsS -D "$tmp/headers.txt" -o /dev/null "$url"
grep -qi '^content-type: text/plain; version=0.0.4' "$tmp/headers.txt" || { echo "FAIL: content type"; cat "$tmp/headers.txt"; exit 1; }
promtool check metrics <"$tmp/metrics.txt" || { echo "FAIL: promtool check metrics"; cat "$tmp/metrics.txt"; exit 1; }
grep -q 'label="job \\"q\\" back\\\\slash\\nnewline"' "$tmp/metrics.txt" || { echo "FAIL: label not escaped"; cat "$tmp/metrics.txt"; exit 1; }

pport=$(free_port)
cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpumem
    static_configs:
      - targets: ["127.0.0.1:$eport"]
YML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
    --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$tmp/prom.log" 2>&1 &
pids+=($!)
wait_for 60 curl -fsS "http://127.0.0.1:$pport/-/ready" || { echo "FAIL: prometheus not ready"; tail "$tmp/prom.log"; exit 1; }

query() { curl -fsS -G "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1"; }
has_result() { query "$1" | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["data"]["result"] else 1)'; }
producer=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["pid"])' "$tmp/producer.json")
wait_for 60 has_result "gpumem_process_allocator_ooms_total{pid=\"$producer\"}" \
    || { echo "FAIL: prometheus never scraped the producer"; tail "$tmp/prom.log"; exit 1; }

# series carry {gpu, pid}; who the process is joins from gpumem_process_info
who='* on (instance, gpu, pid) group_left (label) gpumem_process_info'
for fam in allocated reserved peak_reserved requested; do
    query "gpumem_process_allocator_${fam}_bytes{pid=\"$producer\"} $who" >"$tmp/q_$fam.json"
done
query "gpumem_process_allocator_ooms_total{pid=\"$producer\"} $who" >"$tmp/q_ooms.json"
query "gpumem_process_allocator_retries_total{pid=\"$producer\"} $who" >"$tmp/q_retries.json"
python3 - "$tmp" "$label" <<'PY'
import json, sys
tmp, label = sys.argv[1], sys.argv[2]
w = json.loads(open(f"{tmp}/producer.json").readline())
checks = {"allocated": "allocated", "reserved": "reserved", "peak_reserved": "peak_reserved",
          "requested": "requested", "ooms": "num_ooms", "retries": "num_alloc_retries"}
for q, key in checks.items():
    (res,) = json.load(open(f"{tmp}/q_{q}.json"))["data"]["result"]
    m, (_, value) = res["metric"], res["value"]
    assert m["label"] == label, (m["label"], label)
    assert m["gpu"] == "0" and m["job"] == "gpumem", m
    assert int(float(value)) == w[key], f"{q}: prometheus {value} != published {w[key]}"
assert w["num_ooms"] >= 1
print("ok: prometheus returned the published values; label round-tripped:", repr(label))
PY
echo PASS
