#!/usr/bin/env bash
# run.sh — build the libFuzzer targets with clang and run each for a bounded
# time (FUZZ_SECONDS, default 60) from its committed corpus. A crash leaves
# its input in tests/fuzz/regressions/ (commit it: test_trace replays every
# file there on each test run). Usage: tests/fuzz/run.sh [seconds]
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SECS=${1:-${FUZZ_SECONDS:-60}}
B=${FUZZ_BUILD:-$SRC/build-fuzz}
CC=clang cmake -S "$SRC" -B "$B" -DGPUMEM_FUZZ=ON -DGPUMEM_TESTS=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
# target:committed corpus (the trace corpus seeds both readers)
TARGETS="fuzz_pickle:corpus fuzz_trace:corpus fuzz_config:corpus_config fuzz_http:corpus_http fuzz_estimate_config:corpus_estimate"
cmake --build "$B" -j2 --target fuzz_pickle fuzz_trace fuzz_config fuzz_http fuzz_estimate_config
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
rc=0
for tc in $TARGETS; do
  t=${tc%%:*}; c=${tc#*:}
  mkdir -p "$WORK/$t"
  cp "$SRC/tests/fuzz/$c"/* "$WORK/$t/"
  echo "== $t for ${SECS}s"
  # -timeout: one input may take at most 10 s (a slow input is a bug: the
  # readers are linear); -rss_limit_mb: a bomb is a bug too
  "$B/tests/fuzz/$t" "$WORK/$t" -max_total_time="$SECS" -max_len=65536 -rss_limit_mb=1024 -timeout=10 \
      -artifact_prefix="$SRC/tests/fuzz/regressions/$t-" -print_final_stats=1 || rc=1
done
exit $rc
