#!/usr/bin/env bash
# monitor_gpu.sh — on the GPU machine: build gpumem, start two training
# processes (one on libgpumem, published by default with nothing set but
# install(label=...), one on PyTorch's own allocator with
# gpumem.publish_native), hold them steady, and check that
#  - `gpumem smi --format json` agrees with nvidia-smi's
#    memory.total/reserved/used/free for every GPU, and
#  - each training process shows its allocator numbers, equal to what the
#    process itself reports, with NVML used and "outside the allocator".
# Also prints the smi table, one exporter scrape (promtool if present; skipped
# when gpumem was built without libmicrohttpd, as on the GPU machine) and a
# few log lines. Needs no cmocka, ncurses, microhttpd or cJSON. Exit 0 = all
# checks passed.
#
#   tests/gpu/monitor_gpu.sh            (OUT=/tmp/gpumem-monitor by default)
# GPUMEM_BUILD: build folder (reused if configured the same way);
# GPUMEM_MONITOR_HOLD: seconds the training processes hold still (default 120;
# they are stopped at exit anyway, this only bounds them if this script is killed).
set -u
. "$(dirname "$0")/lib.sh" /tmp/gpumem-monitor   # SRC, OUT, gpumem_kill_on_exit, gpumem_build
BUILD=${GPUMEM_BUILD:-$SRC/build-gpu-monitor}
# The installed package (pip install --no-build-isolation ./python: the shim,
# so torch's own memory API answers from gpumem) when there is one; else the
# source tree's package over this build's library.
if (cd /tmp && python3 -c 'import torch, gpumem._C') 2>/dev/null; then
    INSTALLED=1
else
    INSTALLED=0
    export PYTHONPATH="$SRC/python${PYTHONPATH:+:$PYTHONPATH}"
fi
gpumem_kill_on_exit

gpumem_build "$BUILD"   # sets GPUMEM
[ "$INSTALLED" = 1 ] || export GPUMEM_LIB="$BUILD"   # holds libgpumem_torch.so
echo "python package: $([ "$INSTALLED" = 1 ] && echo installed || echo "source tree + $BUILD")"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader

# the training job: an MLP with AdamW; after a few steps it records what its
# allocator says, then holds its memory still so every view can be compared
cat >"$OUT/train.py" <<'PY'
import json, os, sys, time
mode, out = sys.argv[1], sys.argv[2]
if mode == "gpumem":
    import gpumem.torch as gt
    gt.install("policy:gpumem", label="gpumem-train")   # no GPUMEM_PUBLISH: published by default
import torch
if mode == "native":
    import gpumem.publish_native as pn
    pub = pn.start(label="native-train", interval=0.2)
dev = torch.device("cuda:0")
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(20):
    x = torch.randn(256, 4096, device=dev)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
s = torch.cuda.memory_stats(0)   # under gpumem: answered by gpumem's shim
if mode == "native":
    pub.publish_once()
json.dump({"pid": os.getpid(), **{k: int(v) for k, v in s.items() if isinstance(v, (int, float))}},
          open(out + ".tmp", "w"))
os.rename(out + ".tmp", out)
time.sleep(float(os.environ.get("GPUMEM_MONITOR_HOLD", "120")))
PY
env -u GPUMEM_PUBLISH -u GPUMEM_PUBLISH_LABEL python3 "$OUT/train.py" gpumem "$OUT/gpumem.json" >"$OUT/train_gpumem.log" 2>&1 &
pids+=($!)
python3 "$OUT/train.py" native "$OUT/native.json" >"$OUT/train_native.log" 2>&1 &
pids+=($!)
# wait for both to hold still, but not for one that died (its log says why)
for _ in $(seq 600); do
    [ -s "$OUT/gpumem.json" ] && [ -s "$OUT/native.json" ] && break
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
    sleep 0.2
done
for f in gpumem native; do
    [ -s "$OUT/$f.json" ] || { echo "training ($f) did not reach its hold point:"; tail -20 "$OUT/train_$f.log"; exit 1; }
done
sleep 1  # let the native publisher's thread settle

echo "== gpumem smi"
"$GPUMEM" smi | tee "$OUT/smi.txt"
"$GPUMEM" smi --format json >"$OUT/smi.json"
nvidia-smi --query-gpu=memory.total,memory.reserved,memory.used,memory.free --format=csv,noheader,nounits >"$OUT/nvidia-smi.csv"
echo "== nvidia-smi (MiB): total, reserved, used, free"; cat "$OUT/nvidia-smi.csv"

echo "== exporter scrape"
# Without libmicrohttpd the exporter only says so and exits: skip, not fail.
"$GPUMEM" exporter --listen 127.0.0.1:0 --interval 0.5 >"$OUT/exporter.out" 2>&1 &
exporter=$!
pids+=($exporter)
for _ in $(seq 50); do
    grep -q serving "$OUT/exporter.out" && break
    kill -0 "$exporter" 2>/dev/null || break
    sleep 0.1
done
url=$(sed -n 's/.*serving \(http:[^ ]*\).*/\1/p' "$OUT/exporter.out")
if grep -q "without libmicrohttpd" "$OUT/exporter.out"; then
    echo "SKIP exporter: this gpumem was built without libmicrohttpd"
elif [ -z "$url" ]; then
    echo "SKIP exporter: it did not start serving:"; head -5 "$OUT/exporter.out"
elif ! command -v curl >/dev/null; then
    echo "SKIP exporter scrape: no curl on this machine"
else
    curl -fsS "$url" >"$OUT/metrics.txt" && grep -E '^gpumem_(device|process)' "$OUT/metrics.txt" | head -40
    command -v promtool >/dev/null && { promtool check metrics <"$OUT/metrics.txt" && echo "promtool: ok"; }
fi
echo "== log (3 samples)"
"$GPUMEM" log --count 3 --interval 0.5 --format csv | tee "$OUT/log.csv"

echo "== bench_publish (publishing cost per allocator op, collector CPU) on a quiet host"
if [ -x "$BUILD/bench/bench_publish" ]; then
    timeout 60 "$BUILD/bench/bench_publish" | tee "$OUT/bench_publish.txt"
else
    echo "SKIP bench_publish: $BUILD/bench/bench_publish was not built"
fi

echo "== checks"
python3 - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
MiB = 1 << 20
smi = json.load(open(f"{out}/smi.json"))
fails = []
def check(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg)
    if not ok:
        fails.append(msg)
check(smi["nvml"]["available"], "NVML loaded (%s)" % (smi["nvml"]["memory_info"],))
rows = [r for r in csv.reader(open(f"{out}/nvidia-smi.csv"))]
check(len(rows) == len(smi["devices"]), "GPU count: nvidia-smi %d, gpumem %d" % (len(rows), len(smi["devices"])))
for i, (r, d) in enumerate(zip(rows, smi["devices"])):
    nv = dict(zip(("total", "reserved", "used", "free"), (int(v.strip()) if v.strip().isdigit() else None for v in r)))
    for k in ("total", "reserved", "used", "free"):
        g = d["driver_reserved" if k == "reserved" else k]
        if nv[k] is None or g is None:
            check(nv[k] is None and g is None, f"gpu{i} {k}: nvidia-smi {nv[k]} MiB, gpumem {g}")
            continue
        # nvidia-smi rounds to MiB; used/free may move by a little between the two reads
        tol = 1 if k in ("total", "reserved") else 64
        check(abs(g // MiB - nv[k]) <= tol, f"gpu{i} {k}: nvidia-smi {nv[k]} MiB, gpumem {g / MiB:.1f} MiB")
    if None not in (d["total"], d["driver_reserved"], d["used"], d["free"]):
        check(d["total"] == d["driver_reserved"] + d["used"] + d["free"], f"gpu{i} total == reserved + used + free")
for mode, label, source in (("gpumem", "gpumem-train", "gpumem"), ("native", "native-train", "torch")):
    own = json.load(open(f"{out}/{mode}.json"))
    rs = [p for p in smi["processes"] if p["pid"] == own["pid"] and p["gpu"] == 0]
    check(len(rs) == 1, f"{mode}: pid {own['pid']} shown on gpu0")
    if not rs:
        continue
    p = rs[0]
    print(f"     {mode}: {json.dumps(p)}")
    check(p["label"] == label and p["source"] == source, f"{mode}: label {p['label']!r} source {p['source']}")
    # every published statistic with a memory_stats key equals the process's own memory_stats()
    torch_keys = {"allocated": "allocated_bytes.all.current", "reserved": "reserved_bytes.all.current",
                  "requested": "requested_bytes.all.current", "active": "active_bytes.all.current",
                  "peak_allocated": "allocated_bytes.all.peak", "peak_reserved": "reserved_bytes.all.peak",
                  "peak_requested": "requested_bytes.all.peak", "peak_active": "active_bytes.all.peak",
                  "num_alloc_retries": "num_alloc_retries", "num_ooms": "num_ooms",
                  "num_allocs": "allocation.all.allocated", "num_frees": "allocation.all.freed"}
    for name, key in torch_keys.items():
        check(p[name] == own.get(key), f"{mode}: {name} {p[name]} == memory_stats()[{key!r}] {own.get(key)}")
    check(p["nvml_used"] is not None and p["nvml_used"] >= p["reserved"],
          f"{mode}: NVML used {p['nvml_used']} >= reserved {p['reserved']}")
    if p["outside_allocator"] is not None:
        print(f"     {mode}: outside the allocator {p['outside_allocator'] / MiB:.0f} MiB (context, cuBLAS, ...)")
print("RESULT:", "PASS" if not fails else "FAIL (%d)" % len(fails))
sys.exit(1 if fails else 0)
PY
