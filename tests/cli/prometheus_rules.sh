#!/usr/bin/env bash
# prometheus_rules.sh — issues 27 and 45: the Prometheus rules in
# deploy/prometheus/ pass `promtool check rules` and their unit tests
# (`promtool test rules`: the alerts fire on a made-up job with a fragmented
# rank, an OOM, retries and a drifting rank, and on a leaking rank (its
# step-start baseline grows; time to OOM), not on one that only caches, and
# not before); every PromQL expression of the Grafana dashboards parses
# (checked as recording rules); and every gpumem_* metric the rules and
# dashboards name is one the exporter serves (a live scrape of a sim
# producer with NVML's families declared). Skips (77) without promtool
# (Debian package `prometheus`).
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
SRC=${GPUMEM_SOURCE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
export GPUMEM_SHM_TAG="rules$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, need, start_exporter
need promtool python3 curl
need_exporter

promtool check rules "$SRC/deploy/prometheus/gpumem-rules.yml"
(cd "$SRC/deploy/prometheus" && promtool test rules gpumem-rules.test.yml)

# the dashboards' expressions, as recording rules promtool parses
python3 - "$SRC/contrib" "$tmp/dash-rules.yml" <<'PY'
import glob, json, sys
out = ["groups:", "  - name: dashboards", "    rules:"]
n = 0
def walk(x):
    global n
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "expr" and isinstance(v, str) and v:
                e = v.replace("$run_id", "x").replace("$__range", "1h").replace("$gpu", ".*") \
                     .replace("$instance", ".*").replace("$comm", ".*")
                out.append("      - record: dashboard_expr_%d" % n)
                out.append("        expr: %s" % json.dumps(e))
                n += 1
            else:
                walk(v)
    elif isinstance(x, list):
        for v in x:
            walk(v)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    walk(json.load(open(f)))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("ok: %d dashboard expressions" % n)
PY
promtool check rules "$tmp/dash-rules.yml"

# every gpumem_* family named in contrib/ is served by the exporter
"$GPUMEM" demo --steps 2 --step-ms 0 --hold 60 --model 8MiB --label rules >"$tmp/p.json" 2>/dev/null &
pids+=($!)
wait_for 30 test -s "$tmp/p.json" || { echo "FAIL: producer did not start"; exit 1; }
start_exporter --interval 0.1 --no-nvml   # url
wait_for 20 curl -fsS -o "$tmp/m.txt" "$url"
python3 - "$SRC/contrib" "$tmp/m.txt" "$SRC/deploy" <<'PY'
import glob, re, sys
served = set(re.findall(r"^# TYPE (\S+) ", open(sys.argv[2]).read(), re.M))
named = set()
for f in glob.glob(sys.argv[1] + "/*.json") + glob.glob(sys.argv[3] + "/*/*.yml") + glob.glob(sys.argv[3] + "/*/*.yaml"):
    for m in re.findall(r"\bgpumem_[a-z_]+", open(f).read()):
        named.add((m, f))
missing = sorted((m, f) for m, f in named if m not in served)
assert not missing, "named in contrib/ or deploy/ but not served by the exporter: %s" % missing
print("ok: %d metric names in contrib/ and deploy/, all served" % len({m for m, _ in named}))
PY
echo PASS
