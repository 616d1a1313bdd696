#!/usr/bin/env bash
# fleet_gpu.sh — issue 45 on the GPU machine: build gpumem (Release), run two
# small training processes that log each step with gpumem.callbacks (one on
# gpumem's allocator, leaking 4 MiB a step; one on torch's own allocator,
# published by gpumem.publish_native, not leaking), then check with the node
# agent's view (`gpumem smi --all-users --format json`, and one exporter
# scrape when built with libmicrohttpd) that
#  - the device UUID gpumem reports is nvidia-smi's (the DCGM join key), and
#    the exporter's series carry UUID, modelName and Hostname;
#  - each process's step record counts its steps, its step-start baseline grew
#    by the leak (gpumem) or not at all (native), categories and the largest
#    free block are published for gpumem's allocator;
#  - the callbacks' baseline_growth_bytes equal the leak.
# Prints a table (check | want | got | ok); exit 0 = all passed.
#
#   tests/gpu/fleet_gpu.sh            (OUT=/tmp/gpumem-fleet by default)
set -u
. "$(dirname "$0")/lib.sh" /tmp/gpumem-fleet   # SRC, OUT, gpumem_kill_on_exit, gpumem_build
BUILD=${GPUMEM_BUILD:-$SRC/build-gpu-fleet}
export PYTHONPATH="$SRC/python${PYTHONPATH:+:$PYTHONPATH}"
export GPUMEM_SHM_TAG="fleet$$"
gpumem_kill_on_exit

gpumem_build "$BUILD"   # sets GPUMEM
export GPUMEM_LIB="$BUILD"
nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader | tee "$OUT/nvsmi.csv"

cat >"$OUT/train.py" <<'PY'
import json, sys, time
mode, out, steps = sys.argv[1], sys.argv[2], 30
if mode == "gpumem":
    import gpumem.torch as gt
    gt.install("policy:gpumem", label="fleet-gpumem")
import torch
if mode == "native":
    import gpumem.publish_native as pn
    pn.start(label="fleet-native", interval=0.2)
import gpumem.callbacks as cb
model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048)).cuda()
opt = torch.optim.AdamW(model.parameters())
kept, logs = [], []
for i in range(steps):
    loss = model(torch.randn(256, 2048, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if mode == "gpumem":
        kept.append(torch.empty(4 << 20, dtype=torch.uint8, device="cuda"))   # the leak: 4 MiB a step
    torch.cuda.synchronize()
    logs.append(cb.log_step(None))
json.dump({"steps": steps, "logs": logs}, open(out, "w"))
time.sleep(600)
PY
python3 "$OUT/train.py" gpumem "$OUT/gpumem.json" >"$OUT/gpumem.log" 2>&1 &
pids+=($!)
python3 "$OUT/train.py" native "$OUT/native.json" >"$OUT/native.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do [ -s "$OUT/gpumem.json" ] && [ -s "$OUT/native.json" ] && break; sleep 0.1; done
[ -s "$OUT/gpumem.json" ] && [ -s "$OUT/native.json" ] || { echo "training did not finish"; tail "$OUT"/*.log; exit 1; }
sleep 1
"$GPUMEM" smi --all-users --format json >"$OUT/smi.json"
"$GPUMEM" smi --all-users | tee "$OUT/smi.txt"
scrape=""
if ! "$GPUMEM" exporter --listen nowhere 2>&1 | grep -q "built without"; then
    "$GPUMEM" exporter --node --listen 127.0.0.1:0 --interval 0.2 >"$OUT/exporter.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q serving "$OUT/exporter.out" && break; sleep 0.1; done
    url=$(sed -n 's/.*serving \(http:[^ ]*\).*/\1/p' "$OUT/exporter.out")
    sleep 0.5
    curl -fsS "$url" >"$OUT/metrics.txt" 2>/dev/null && scrape="$OUT/metrics.txt"
fi
python3 - "$OUT" "$scrape" <<'PY'
import csv, json, re, sys
out, scrape = sys.argv[1], sys.argv[2]
MIB = 1 << 20
rows = []
def check(name, want, got, ok):
    rows.append((name, str(want), str(got), "ok" if ok else "FAIL"))
nv = {int(r[0]): r[1].strip() for r in csv.reader(open(out + "/nvsmi.csv"))}
smi = json.load(open(out + "/smi.json"))
check("node mode", True, smi["all_users"], smi["all_users"] is True)
for d in smi["devices"]:
    check("UUID of GPU %d" % d["gpu"], nv.get(d["gpu"]), d["uuid"], nv.get(d["gpu"]) == d["uuid"])
procs = {p["label"]: p for p in smi["processes"] if p["label"] in ("fleet-gpumem", "fleet-native")}
g, n = procs.get("fleet-gpumem"), procs.get("fleet-native")
check("both processes seen", 2, len(procs), g is not None and n is not None)
if g and n:
    gl = json.load(open(out + "/gpumem.json"))["logs"]
    nl = json.load(open(out + "/native.json"))["logs"]
    gs, ns = g["step"] or {}, n["step"] or {}
    check("gpumem: steps", 30, gs.get("step"), gs.get("step") == 30)
    check("native: steps", 30, ns.get("step"), ns.get("step") == 30)
    check("gpumem: step start = allocated after the last step", gl[-1]["gpumem/allocated_bytes"],
          gs.get("step_start_allocated"), gs.get("step_start_allocated") == gl[-1]["gpumem/allocated_bytes"])
    check("gpumem: callbacks' baseline growth", 29 * 4 * MIB, gl[-1]["gpumem/baseline_growth_bytes"],
          gl[-1]["gpumem/baseline_growth_bytes"] == 29 * 4 * MIB)
    check("native: callbacks' baseline growth", 0, nl[-1]["gpumem/baseline_growth_bytes"],
          nl[-1]["gpumem/baseline_growth_bytes"] == 0)
    check("gpumem: step peak >= step start", ">= %s" % gs.get("step_start_allocated"), gs.get("step_peak_allocated"),
          (gs.get("step_peak_allocated") or 0) >= (gs.get("step_start_allocated") or 1))
    check("gpumem: largest free block published", ">= 0", gs.get("largest_free_block"),
          isinstance(gs.get("largest_free_block"), int))
    check("gpumem: categories published", "a dict", type(gs.get("categories")).__name__, isinstance(gs.get("categories"), dict))
    check("native: no step peak (torch's allocator)", None, ns.get("step_peak_allocated"), ns.get("step_peak_allocated") is None)
    check("uid recorded", "an int", g.get("uid"), isinstance(g.get("uid"), int))
if scrape:
    m = open(scrape).read()
    u = nv.get(0, "")
    check("exporter: device series with UUID, modelName, Hostname", "present", "",
          bool(re.search(r'^gpumem_device_memory_total_bytes\{gpu="0",UUID="%s",modelName="[^"]+",Hostname="[^"]+"\}' % re.escape(u), m, re.M)))
    check("exporter: process series keyed by UUID", "present", "",
          bool(re.search(r'^gpumem_process_step_start_allocated_bytes\{gpu="\d+",UUID="GPU-[^"]+",pid="\d+"\} \d+$', m, re.M)))
    check("exporter: info with uid", "present", "", bool(re.search(r'^gpumem_process_info\{.*uid="\d+".*label="fleet-gpumem"', m, re.M)))
else:
    check("exporter", "scraped", "not built with libmicrohttpd: skipped", True)
w = [max(len(r[i]) for r in rows + [("check", "want", "got", "ok")]) for i in range(4)]
print("================ gpumem fleet (issue 45) on the GPU")
for r in [("check", "want", "got", "ok")] + rows:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
sys.exit(0 if all(r[3] == "ok" for r in rows) else 1)
PY
