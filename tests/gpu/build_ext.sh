#!/usr/bin/env bash
# Build the replay bench against PyTorch's headers, on the GPU machine, into
# BUILD (arg 1): gpu_replay_bench from bench/gpu_replay_bench.cpp (with torch
# if it links, else without). Prints one "EXT name ok|FAILED" line per try.
# (PyTorch reaches gpumem through the shim, python/csrc, built by pip.)
set -u
BUILD=${1:?usage: build_ext.sh BUILD_DIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
LOG=${2:-$BUILD/build_ext.log}
: >"$LOG"

read -r TORCH_LIB CUDA_HOME_PY ABI <<<"$(python3 - <<'EOF'
import torch, torch.utils.cpp_extension as ce
libs = ce.library_paths()
print(libs[0] if libs else "", ce.CUDA_HOME or "", int(torch._C._GLIBCXX_USE_CXX11_ABI))
EOF
)"
TORCH_INC=$(python3 - <<'EOF'
import torch.utils.cpp_extension as ce
try:
    paths = ce.include_paths(device_type="cuda")
except TypeError:
    paths = ce.include_paths(cuda=True)
print(" ".join("-I" + p for p in paths))
EOF
)
CUDA_HOME=${CUDA_HOME:-$CUDA_HOME_PY}
[ -z "$CUDA_HOME" ] && CUDA_HOME=/usr/local/cuda
CUDA_INC="-I$CUDA_HOME/include"
# torch wheels may ship the CUDA runtime headers under site-packages/nvidia/*
NV_INC=$(python3 - <<'EOF'
import glob, os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
print(" ".join("-I" + p for p in sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))))
EOF
)
CXXFLAGS="-std=c++17 -O2 -fPIC -D_GLIBCXX_USE_CXX11_ABI=$ABI $TORCH_INC $CUDA_INC $NV_INC"
TLINK="-L$TORCH_LIB -Wl,-rpath,$TORCH_LIB -lc10"
{
  echo "torch lib: $TORCH_LIB"; echo "cuda home: $CUDA_HOME"; echo "abi: $ABI"; echo "cxxflags: $CXXFLAGS"
} >>"$LOG"

try() { # name, command...
  local name=$1; shift
  echo "== $name: $*" >>"$LOG"
  if "$@" >>"$LOG" 2>&1; then echo "EXT $name ok"; return 0; fi
  echo "EXT $name FAILED (see $LOG)"; return 1
}

GMLINK="-I$SRC/include -L$BUILD -Wl,-rpath,$BUILD -lgpumem"
CUDART_DIR=$(dirname "$(find "$CUDA_HOME/lib64" "$(dirname "$TORCH_LIB")/../nvidia" -name 'libcudart.so*' 2>/dev/null | head -1)" 2>/dev/null)
try gpu_replay_bench g++ $CXXFLAGS -DWITH_TORCH "$SRC/bench/gpu_replay_bench.cpp" -o "$BUILD/gpu_replay_bench" \
    $GMLINK $TLINK -lc10_cuda \
  || try gpu_replay_bench-cudart g++ $CXXFLAGS -DWITH_TORCH "$SRC/bench/gpu_replay_bench.cpp" -o "$BUILD/gpu_replay_bench" \
    $GMLINK $TLINK -lc10_cuda -L"$CUDART_DIR" -Wl,-rpath,"$CUDART_DIR" -l:"$(basename "$(ls "$CUDART_DIR"/libcudart.so* 2>/dev/null | head -1)")" \
  || try gpu_replay_bench-notorch g++ -std=c++17 -O2 "$SRC/bench/gpu_replay_bench.cpp" -o "$BUILD/gpu_replay_bench" $GMLINK
exit 0
