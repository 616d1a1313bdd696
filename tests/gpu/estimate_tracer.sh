#!/usr/bin/env bash
# One device call for the tracer's check (issue 44): install the package as a user
# does (pip, offline), then tests/gpu/estimate_tracer.py: each model traced on
# fake tensors and estimated, then run on the GPU under PyTorch's default
# allocator and expandable_segments; a table of estimated vs measured peak
# reserved. $OUT gets estimate_tracer.txt and estimate_tracer.json.
#   tests/gpu/estimate_tracer.sh [estimate_tracer.py args...]
# --deadline S (default 300) bounds the Python part: the table is printed by
# then, whichever models failed; each row says the mode that ran (fake, or meta
# and why fake failed). A backstop kills it 60 s after the deadline.
set -u
. "$(dirname "$0")/lib.sh" /tmp/gpumem-out   # SRC, OUT, T0, gpumem_suite_start
export OUT GPUMEM_BUILD_JOBS=$(nproc) TOKENIZERS_PARALLELISM=false
gpumem_suite_start "$SRC" "$OUT/estimate_tracer.txt" "$T0" || exit 1   # an install that imports already is kept
deadline=300
prev=
for arg in "$@"; do
    [ "$prev" = --deadline ] && deadline=${arg%.*}
    case $arg in --deadline=*) deadline=${arg#--deadline=}; deadline=${deadline%.*} ;; esac
    prev=$arg
done
timeout -k 5 $((deadline + 60)) python3 "$SRC/tests/gpu/estimate_tracer.py" "$@"
rc=$?
echo "total $(( $(date +%s) - T0 )) s"
exit $rc
