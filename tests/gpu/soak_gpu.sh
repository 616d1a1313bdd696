#!/usr/bin/env bash
# soak_gpu.sh — build libgpumem (Release) and tests/gpu/soak_gpu.c, then run
# the GPU soak with its data-integrity check: SECONDS per policy (default
# 20), memory fraction FRACTION (default 0.05, so that OOM happens).
#   tests/gpu/soak_gpu.sh [SECONDS] [FRACTION]
# Exit 0 clean, 1 on a mismatch or broken invariant, 77 without a GPU.
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=${GPUMEM_BUILD:-$SRC/build-soak}
cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_TESTS=OFF >/dev/null
cmake --build "$B" -j"$(nproc)" --target gpumem_static >/dev/null
cc -O2 -g -I"$SRC/include" "$SRC/tests/gpu/soak_gpu.c" "$B/libgpumem.a" \
   $(pkg-config --libs libcjson 2>/dev/null || true) -lz -lpthread -ldl -lm -o "$B/soak_gpu"
exec "$B/soak_gpu" "${1:-20}" "${2:-0.05}"
