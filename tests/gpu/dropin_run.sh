#!/usr/bin/env bash
# One device run for issue 12: a fresh `pip install --no-build-isolation
# ./python` (libgpumem_torch.so with CMake + the C++ shim against the installed
# torch), then tests/gpu/test_torch_dropin.py from another directory, under
# policy:gpumem (default) and policy:torch. Writes pip.log, dropin-*.txt/json
# and a copy of torch's allocator headers (for reading) into $OUT.
#   tests/gpu/dropin_run.sh [--only test,test]
set -u
. "$(dirname "$0")/lib.sh" /tmp/gpumem-out   # SRC, OUT, T0, gpumem_pip_install
export NCCL_NVLS_ENABLE=0 GPUMEM_BUILD_JOBS=$(nproc)
TORCH_DIR=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
git -C "$SRC" log --oneline -1 2>/dev/null || true
mkdir -p "$OUT/hdr"
cp "$TORCH_DIR"/include/torch/csrc/cuda/CUDAPluggableAllocator.h "$TORCH_DIR"/include/c10/cuda/CUDACachingAllocator.h \
   "$TORCH_DIR"/include/c10/core/CachingDeviceAllocator.h "$OUT/hdr/" 2>/dev/null
gpumem_pip_install "$SRC" "$OUT/pip.log" "$T0" || exit 1
cd /tmp  # not the source tree: the installed package must stand alone
python3 -c 'import torch, gpumem, gpumem._C, gpumem._lib as l; print("installed:", gpumem.__file__, l.find_library())' || exit 1
for conf in "" policy:torch; do
  tag=${conf:-default}; tag=${tag#policy:}
  echo "== test_torch_dropin.py GPUMEM_CONF='$conf'"
  GPUMEM_CONF=$conf timeout 300 python3 "$SRC/tests/gpu/test_torch_dropin.py" --json "$OUT/dropin-$tag.json" "$@" \
    >"$OUT/dropin-$tag.txt" 2>&1
  echo "exit $?"; grep -E "^(PASS|FAIL|SKIP|==|torch )" "$OUT/dropin-$tag.txt"
done
echo "total $(( $(date +%s) - T0 )) s"
