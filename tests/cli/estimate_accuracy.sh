#!/usr/bin/env bash
# estimate_accuracy.sh — 'gpumem estimate' against the committed GPU
# measurements (bench/estimate_measured.json, tests/gpu/estimate_measure.py on
# the H200): every prediction within 10% of max_memory_allocated, every
# strategy's saving within 5 percentage points (known misses bounded), every
# --fit batch answer one that fitted. A change to the model that breaks this
# fails CI.
set -u
: "${GPUMEM:?}" "${GPUMEM_SOURCE:?}"
python3 "$GPUMEM_SOURCE/bench/estimate_compare.py" --gpumem "$GPUMEM" \
    --measured "$GPUMEM_SOURCE/bench/estimate_measured.json" --check
