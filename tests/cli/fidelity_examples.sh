#!/usr/bin/env bash
# fidelity_examples.sh — the replay fidelity check on the traces this
# repository ships (examples/, recorded on an H200 by examples/record_examples.py),
# so a clone without ../shared still checks the torch model against real peaks.
# The gpumem policy's goals are for the real traces; here they are printed only.
set -u
: "${GPUMEM_SOURCE:?GPUMEM_SOURCE must name the source tree}"
exec bash "$(dirname "$0")/fidelity.sh" "$GPUMEM_SOURCE/examples/baselines.json" --gpumem-info
