#!/usr/bin/env bash
# One device run for issue 28 (CUDA graphs, torch.compile reduce-overhead,
# MemPool on gpumem's private pools): a fresh `pip install
# --no-build-isolation ./python` (offline, as tests/gpu/dropin_run.sh does),
# then tests/gpu/test_graphs.py from another directory under PyTorch's own
# allocator (native), `gpumem run --conf policy:gpumem` and
# `gpumem run --conf policy:torch`, and a table: each test's status, its
# peak reserved memory against native's, and the device calls gpumem made
# during its captures. Writes pip.log, graphs-*.txt/json into $OUT.
#   tests/gpu/graphs_run.sh [--only test,test]
set -u
. "$(dirname "$0")/lib.sh" /tmp/gpumem-out   # SRC, OUT, T0, gpumem_device_run_start, gpumem_run_mode
export NCCL_NVLS_ENABLE=0 GPUMEM_BUILD_JOBS=$(nproc)
gpumem_device_run_start "$SRC" "$OUT" "$T0" || exit 1
rc=0
for mode in native gpumem torch; do
  gpumem_run_mode $mode 170 "$SRC/tests/gpu/test_graphs.py" "$OUT/graphs-$mode" "^(PASS|FAIL|SKIP|==|torch )" "$@" || rc=1
done
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
runs = {}
for m in ("native", "gpumem", "torch"):
    try:
        runs[m] = {r["test"]: r for r in json.load(open(os.path.join(out, "graphs-%s.json" % m)))["results"]}
    except (OSError, ValueError):
        runs[m] = {}
tests = list(runs["native"] or runs["gpumem"] or runs["torch"])
mib = lambda n: "%.1f" % (n / 2**20) if n is not None else "-"
print("\n%-24s %-6s %-6s %-6s %10s %10s %10s  %s" % ("test", "native", "gpumem", "torch", "res MiB nat",
                                                     "gpumem", "torch", "device calls while capturing, by whose pools (gpumem | torch)"))
for t in tests:
    row = [runs[m].get(t, {}) for m in ("native", "gpumem", "torch")]
    res = [r.get("max_reserved") for r in row]
    flag = "".join(" >native(%s)" % m for m, v in zip(("gpumem", "torch"), res[1:])
                   if v is not None and res[0] is not None and v > res[0])
    def fmt(cc):  # {who: {kind: n}} (test_graphs.py): the calls made while capturing, by whose pools
        cc = cc or {}
        if cc and not isinstance(next(iter(cc.values())), dict):
            cc = {"device": cc}  # an older test_graphs.py: device-wide only
        parts = []
        for who, tag in (("the device's own pools", "own"), ("private pools", "pools"), ("device", "device")):
            if cc.get(who) and (tag != "device" or len(cc) == 1):
                parts.append(tag + ":" + ",".join("%s=%d" % kv for kv in sorted(cc[who].items())))
        return " ".join(parts) or "none"
    calls = " | ".join(fmt(r.get("capture_calls")) for r in row[1:])
    print("%-24s %-6s %-6s %-6s %10s %10s %10s  %s%s" % (t, *(r.get("status", "-") for r in row),
                                                        *(mib(v) for v in res), calls, flag))
EOF
echo "total $(( $(date +%s) - T0 )) s"
exit $rc
