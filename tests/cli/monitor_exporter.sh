#!/usr/bin/env bash
# monitor_exporter.sh — `gpumem exporter` without a Prometheus server: the
# scrape carries the producer's exact values with HELP/TYPE lines, unknown
# paths get 404, a bad --listen is refused, and a producer killed with
# SIGKILL disappears from the scrapes instead of leaving frozen numbers.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
export GPUMEM_SHM_TAG="exp$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, need, start_exporter
need curl python3
need_exporter

if "$GPUMEM" exporter --listen nowhere 2>/dev/null; then echo "FAIL: bad --listen accepted"; exit 1; fi

"$GPUMEM" demo --steps 2 --step-ms 0 --hold 120 --model 16MiB --label held >"$tmp/held.json" 2>/dev/null &
pids+=($!); held=$!
"$GPUMEM" demo --step-ms 0 --model 16MiB --label victim >/dev/null 2>&1 &
pids+=($!); victim=$!
wait_for 30 test -s "$tmp/held.json" || { echo "FAIL: producer did not start"; exit 1; }

start_exporter --interval 0.1 --no-nvml   # url
base=${url%/metrics}
# the whole scrape first: grep -q stops reading at its match, and under
# pipefail curl's "Failed writing body" would then fail the check
scrape() { curl -fsS "$url" >"$tmp/scrape.txt"; }
scrape_has() { scrape && grep -q "$1" "$tmp/scrape.txt"; }
wait_for 20 scrape_has "pid=\"$victim\"" || { echo "FAIL: victim never scraped"; curl -sS "$url"; exit 1; }

code=$(curl -s -o /dev/null -w '%{http_code}' "$base/nope")
[ "$code" = 404 ] || { echo "FAIL: /nope answered $code"; exit 1; }

curl -fsS "$url" >"$tmp/m1.txt"
python3 - "$tmp" "$held" <<'PY'
import json, re, sys
tmp, pid = sys.argv[1], sys.argv[2]
w = json.loads(open(f"{tmp}/held.json").readline())
text = open(f"{tmp}/m1.txt").read()
fams = {"gpumem_process_allocator_allocated_bytes": "allocated", "gpumem_process_allocator_reserved_bytes": "reserved",
        "gpumem_process_allocator_peak_reserved_bytes": "peak_reserved", "gpumem_process_allocator_requested_bytes": "requested",
        "gpumem_process_allocator_ooms_total": "num_ooms", "gpumem_process_allocator_retries_total": "num_alloc_retries"}
for fam, key in fams.items():
    assert f"# HELP {fam} " in text and f"# TYPE {fam} " in text, fam
    m = re.search(r'^%s\{gpu="0",pid="%s"\} (\d+)$' % (fam, pid), text, re.M)
    assert m, f"no {fam} series for pid {pid}"
    assert int(m.group(1)) == w[key], (fam, m.group(1), w[key])
assert re.search(r'^gpumem_process_info\{gpu="0",pid="%s",uid="\d+",source="gpumem",comm="[^"]*",label="held"[^}]*\} 1$' % pid,
                 text, re.M), "no gpumem_process_info for pid %s" % pid
assert "gpumem_nvml_available 0" in text
print("ok: exporter series equal the producer's stats")
PY

kill -9 "$victim"; wait "$victim" 2>/dev/null || true
no_victim() { scrape && ! grep -q "pid=\"$victim\"" "$tmp/scrape.txt"; }
wait_for 20 no_victim || { echo "FAIL: killed producer still exported"; exit 1; }
scrape_has "pid=\"$held\"" || { echo "FAIL: live producer lost"; exit 1; }
# a busy port: one line in gpumem's words with the reason, not the HTTP
# library's "Failed to bind to port 0"
busy_port=$(echo "$url" | sed -n 's|http://127.0.0.1:\([0-9]*\)/.*|\1|p')
rc=0; err=$("$GPUMEM" exporter --listen "127.0.0.1:$busy_port" --no-nvml 2>&1 >/dev/null) || rc=$?
[ "$rc" = 1 ] || { echo "FAIL: busy port exit $rc"; exit 1; }
[ "$(echo "$err" | wc -l)" = 1 ] && echo "$err" | grep -q "Address already in use" && ! echo "$err" | grep -q "Failed to bind" ||
    { echo "FAIL: busy port message: $err"; exit 1; }
echo PASS
