#!/usr/bin/env bash
# One device run for issue 46 (sleep/wake, MemPool(allocator=...),
# use_on_oom, no_split, _set_allocator_settings): a fresh `pip install
# --no-build-isolation ./python` (offline, as graphs_run.sh does), then
# tests/gpu/test_interop.py from another directory under PyTorch's own
# allocator (native) and `gpumem run --conf policy:gpumem`, and a table of
# each test's status and the sleep/wake numbers (memory released per
# cudaMemGetInfo and nvidia-smi, wake time against re-creating the model).
# Writes pip.log, interop-*.txt/json into $OUT. Under 5 minutes on an H100.
#   tests/gpu/interop_run.sh [--only test,test]
set -u
. "$(dirname "$0")/lib.sh" /tmp/gpumem-out   # SRC, OUT, T0, gpumem_device_run_start, gpumem_run_mode
export NCCL_NVLS_ENABLE=0 GPUMEM_BUILD_JOBS=$(nproc)
gpumem_device_run_start "$SRC" "$OUT" "$T0" || exit 1
TEST="$SRC/tests/gpu/test_interop.py"
SHOW="^(PASS|FAIL|SKIP|==|torch |Traceback|[A-Za-z]*Error)"
rc=0
gpumem_run_mode native 120 "$TEST" "$OUT/interop-native" "$SHOW" "$@"   # torch's own behaviour, for reference
gpumem_run_mode gpumem 150 "$TEST" "$OUT/interop-gpumem" "$SHOW" "$@" || rc=1
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
runs = {}
for m in ("native", "gpumem"):
    try:
        runs[m] = {r["test"]: r for r in json.load(open(os.path.join(out, "interop-%s.json" % m)))["results"]}
    except (OSError, ValueError):
        runs[m] = {}
tests = list(runs["gpumem"] or runs["native"])
print("\n%-20s %-6s %-6s  %s" % ("test", "native", "gpumem", "gpumem's detail"))
for t in tests:
    n, g = runs["native"].get(t, {}), runs["gpumem"].get(t, {})
    print("%-20s %-6s %-6s  %s" % (t, n.get("status", "-"), g.get("status", "-"), g.get("detail", "")[:200]))
nums = (runs["gpumem"].get("sleep_wake") or {}).get("numbers")
if nums:
    print("\nsleep/wake (gpumem):")
    for k, v in nums.items():
        print("  %-45s %s" % (k, ("%.3f" % v) if isinstance(v, float) else v))
PY
echo "total $(( $(date +%s) - T0 )) s"
exit $rc
