#!/usr/bin/env bash
# run.sh — build the libFuzzer targets with clang and run each from its
# committed corpus. Two modes:
#   FUZZ_RUNS=N  (what CI uses): N inputs per target from a fixed seed
#                (FUZZ_SEED, default 1), so a given commit fuzzes the same
#                inputs on every machine: CI is reproducible, never flaky.
#   otherwise    explore for FUZZ_SECONDS (or $1) seconds per target, from
#                a random seed: run it locally to find new bugs.
# A crash leaves its input in tests/fuzz/regressions/ (commit it: test_trace
# replays every file there on each test run) and is printed, base64, at the
# end, so a CI log's tail is enough to reproduce it.
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SECS=${1:-${FUZZ_SECONDS:-60}}
B=${FUZZ_BUILD:-$SRC/build-fuzz}
# libFuzzer ships in clang's runtime package, which Debian only recommends:
# say so plainly instead of failing at link time
probe=$(mktemp -d)
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$probe/p.c"
if ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
  cat "$probe/err" >&2
  echo "run.sh: clang cannot link a libFuzzer target: install clang and its runtime (Debian: apt-get install clang libclang-rt-dev, or scripts/install-deps.sh)" >&2
  rm -rf "$probe"; exit 1
fi
rm -rf "$probe"
CC=clang cmake -S "$SRC" -B "$B" -DGPUMEM_FUZZ=ON -DGPUMEM_TESTS=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
# target:committed corpus (the trace corpus seeds both readers)
TARGETS="fuzz_pickle:corpus fuzz_trace:corpus fuzz_config:corpus_config fuzz_http:corpus_http fuzz_estimate_config:corpus_estimate"
cmake --build "$B" -j2 --target fuzz_pickle fuzz_trace fuzz_config fuzz_http fuzz_estimate_config
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
if [ -n "${FUZZ_RUNS:-}" ]; then
  budget=(-runs="$FUZZ_RUNS" -seed="${FUZZ_SEED:-1}"); what="$FUZZ_RUNS inputs, seed ${FUZZ_SEED:-1}"
else
  budget=(-max_total_time="$SECS"); what="${SECS}s"
fi
failed=()
for tc in $TARGETS; do
  t=${tc%%:*}; c=${tc#*:}
  mkdir -p "$WORK/$t" "$WORK/$t.art"
  cp "$SRC/tests/fuzz/$c"/* "$WORK/$t/"
  echo "== $t: $what"
  # -timeout: one input may take at most 10 s (a slow input is a bug: the
  # readers are linear); -rss_limit_mb: a bomb is a bug too
  if ! "$B/tests/fuzz/$t" "$WORK/$t" "${budget[@]}" -max_len=65536 -rss_limit_mb=1024 -timeout=10 \
      -artifact_prefix="$WORK/$t.art/" -print_final_stats=1 >"$WORK/$t.log" 2>&1; then
    failed+=("$t")
    tail -60 "$WORK/$t.log"
  else
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$WORK/$t.log" | tr '\n' ' '; echo
  fi
  for a in "$WORK/$t.art"/*; do
    [ -f "$a" ] || continue
    keep="$SRC/tests/fuzz/regressions/$t-$(basename "$a")"
    cp "$a" "$keep"
    echo "$t: input kept as ${keep#"$SRC"/} ($(wc -c <"$a") bytes); base64:"
    head -c 4096 "$a" | base64 -w 100
  done
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz FAILED: ${failed[*]} (inputs above and in tests/fuzz/regressions/)"
  exit 1
fi
echo "fuzz OK: every target ran $what without a finding"
