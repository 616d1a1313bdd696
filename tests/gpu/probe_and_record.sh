#!/usr/bin/env bash
# On the GPU machine: report what the image has that gpumem's build needs, and
# record the shipped example traces (examples/*.pickle.gz, baselines.json) into $OUT.
set -u
OUT=${OUT:-/tmp/out}
echo "== probe"; nvidia-smi --query-gpu=name,memory.total,memory.reserved,memory.used,memory.free,driver_version --format=csv
for h in zlib.h cmocka.h ncurses.h microhttpd.h cjson/cJSON.h; do
  if [ -e /usr/include/$h ]; then echo "have $h"; else echo "MISSING $h"; fi
done
cmake --version | head -1; gcc --version | head -1; nvcc --version | tail -1
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.device_count())'
cat /etc/os-release | head -2
echo "== record"
PYTHONUNBUFFERED=1 python3 examples/record_examples.py "$OUT" && ls -la "$OUT"
