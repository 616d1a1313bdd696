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
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 GPUMEM_BUILD_JOBS=$(nproc)
T0=$(date +%s)
. "$SRC/tests/gpu/pip_install.sh"
gpumem_device_run_start "$SRC" "$OUT" "$T0" || exit 1
TEST="$SRC/tests/gpu/test_interop.py"
rc=0
for mode in native gpumem; do
  echo "== test_interop.py: $mode"
  if [ "$mode" = native ]; then
    timeout 120 python3 "$TEST" --json "$OUT/interop-$mode.json" "$@" >"$OUT/interop-$mode.txt" 2>&1
  else
    timeout 150 python3 -m gpumem run --conf policy:gpumem -- python3 "$TEST" --json "$OUT/interop-$mode.json" "$@" \
      >"$OUT/interop-$mode.txt" 2>&1
  fi
  r=$?; echo "exit $r"; [ $r -ne 0 ] && [ $mode = gpumem ] && rc=1  # native: torch's own behaviour, for reference
  grep -E "^(PASS|FAIL|SKIP|==|torch |Traceback|[A-Za-z]*Error)" "$OUT/interop-$mode.txt"
done
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
