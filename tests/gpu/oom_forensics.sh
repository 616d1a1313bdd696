#!/usr/bin/env bash
# oom_forensics.sh — on the GPU machine (issue 27): three jobs driven into
# out of memory under `gpumem run --oom-report DIR`, each with a planted
# cause, must each leave a report and a snapshot in DIR whose verdict names
# that cause, and must still raise torch.OutOfMemoryError as before:
#   capacity       a batch too big for the device (an MLP's activations), policy:gpumem;
#   fragmentation  policy:torch, every cached 1 GiB segment split by a 600 MiB
#                  tensor, then 8 GiB asked for (the bytes exist, in pieces);
#   outside        most of the device taken by cuMemAlloc through libcuda
#                  (ctypes: memory no allocator of torch's knows), then 20 GiB asked for.
# Prints one table row per case; exit 0 = every verdict right. Under 5
# minutes on one H200 (build included).
#
#   tests/gpu/oom_forensics.sh        (OUT=/tmp/gpumem-oom by default)
set -u
. "$(dirname "$0")/lib.sh" /tmp/gpumem-oom   # SRC, OUT, gpumem_build
BUILD=${GPUMEM_BUILD:-$SRC/build-gpu-oom}
rm -rf "$OUT"   # a fresh one
mkdir -p "$OUT"
# the installed package (pip install --no-build-isolation ./python) has the
# shim, under which the OOM is torch.OutOfMemoryError; the source tree's
# package has not, and the OOM is gpumem's RuntimeError. Either is accepted.
(cd /tmp && python3 -c 'import torch, gpumem._C' 2>/dev/null) || export PYTHONPATH="$SRC/python${PYTHONPATH:+:$PYTHONPATH}"
export GPUMEM_PYTHON=${GPUMEM_PYTHON:-python3}

gpumem_build "$BUILD"   # sets GPUMEM
export GPUMEM_LIB="$BUILD"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader

cat >"$OUT/oom_case.py" <<'PY'
import ctypes, sys
import torch
case = sys.argv[1]
GIB = 1 << 30
dev = torch.device("cuda", 0)
torch.zeros(1, device=dev)  # the context, current on this thread
hold = []
try:
    if case == "capacity":
        # 8 layers of 8192 x 8192 and a batch of 2^20 rows: 32 GiB per activation
        model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(8)]).to(dev)
        x = torch.randn(1 << 20, 8192, device=dev)
        model(x).sum().backward()
    elif case == "fragmentation":
        free, _ = torch.cuda.mem_get_info(dev)
        k = (free - 3 * GIB) // GIB
        blocks = [torch.empty(GIB, dtype=torch.uint8, device=dev) for _ in range(k)]
        del blocks  # k cached 1 GiB segments
        hold = [torch.empty(600 << 20, dtype=torch.uint8, device=dev) for _ in range(k)]  # one in each
        torch.empty(8 * GIB, dtype=torch.uint8, device=dev)
    elif case == "outside":
        cuda = ctypes.CDLL("libcuda.so.1")
        free, _ = torch.cuda.mem_get_info(dev)
        ptr = ctypes.c_uint64(0)
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(free - 10 * GIB))
        assert rc == 0, "cuMemAlloc_v2 failed: %d" % rc
        torch.empty(20 * GIB, dtype=torch.uint8, device=dev)
    print("FAIL: no out of memory")
    sys.exit(1)
except (torch.OutOfMemoryError, RuntimeError) as e:  # RuntimeError: no shim (gpumem._C)
    if not isinstance(e, torch.OutOfMemoryError) and "out of memory" not in str(e):
        raise
    print("raised %s (as without --oom-report): %s" % (type(e).__name__, str(e).splitlines()[0][:160]))
    sys.exit(0)
PY

status=0
printf "\n%-14s %-30s %-30s %-12s %s\n" case expected verdict "largest free" report
for spec in "capacity|policy:gpumem|out of capacity" "fragmentation|policy:torch|fragmentation" \
            "outside|policy:gpumem|memory outside the allocator"; do
    IFS='|' read -r case conf want <<<"$spec"
    dir="$OUT/$case"
    timeout 120 "$GPUMEM" run --conf "$conf" --oom-report "$dir" -- python3 "$OUT/oom_case.py" "$case" \
        >"$OUT/$case.out" 2>&1
    rc=$?
    report=$(ls "$dir"/gpumem-oom-*-0.txt 2>/dev/null | head -1)
    got=$([ -n "$report" ] && sed -n 's/^verdict: //p' "$report" || echo "no report")
    lfb=$([ -n "$report" ] && sed -n 's/^largest free block: //p' "$report" || echo -)
    snap=$([ -n "$report" ] && [ -s "${report%.txt}.pickle" ] && echo yes || echo no)
    printf "%-14s %-30s %-30s %-12s %s\n" "$case" "$want" "$got" "${lfb:--}" "${report:-none} (snapshot: $snap)"
    if [ "$rc" != 0 ] || ! grep -q "^raised " "$OUT/$case.out"; then
        echo "  FAIL: $case did not raise the usual out-of-memory error (exit $rc):"; tail -5 "$OUT/$case.out"; status=1
    else
        echo "  $(grep '^raised ' "$OUT/$case.out" | cut -c1-150)"
    fi
    [ "$got" = "$want" ] || { echo "  FAIL: $case: verdict '$got', expected '$want'"; status=1; }
    [ "$snap" = yes ] || { echo "  FAIL: $case: no snapshot"; status=1; }
done
for case in capacity fragmentation outside; do
    r=$(ls "$OUT/$case"/gpumem-oom-*-0.txt 2>/dev/null | head -1)
    [ -n "$r" ] && { echo; echo "== $case: $r"; sed -n '1,/^the allocator/p' "$r"; }
done
echo
[ "$status" = 0 ] && echo "PASS: three planted causes, three right verdicts" || echo "FAILED"
exit "$status"
