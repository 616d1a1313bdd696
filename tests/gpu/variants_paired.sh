#!/usr/bin/env bash
# One device call: compare builds of the library that differ only in C flags
# by the paired warm speedup against torch's native allocator (the bench's
# --pair: gpumem's default policy and native alternating in one process), so
# that a hot-path change is judged by the number issue 4 asks for, with the
# host's slow spells hitting both sides of each ratio.
#
#   VARIANTS='base=;spin=-DGM_LOCK_KIND=2' ROUNDS=2 OUT=... \
#     bash tests/gpu/variants_paired.sh TRACES_DIR
#
# A variant whose flags are @DIR is built from the source tree in DIR
# instead (another commit, against this one, in the same run):
#   git archive OLD | tar -x -C ab_old    # here: an untracked folder travels
#   VARIANTS='old=@ab_old;new=' ... bash tests/gpu/variants_paired.sh ...
#
# Each variant gets its own build (library + replay bench); the traces are
# converted once. Rounds visit the traces in turn and, per trace, every
# variant in a rotated order. Prints one line per (variant, trace, round) and
# a table of medians; reports only, never fails on the numbers.
# PAIR_ARGS=--loop: the passes replay each trace's steady loop (a training
# loop's warm steps, bench/steady_loop.h) instead of the whole run.
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
TRACES=${1:-$SRC/../shared/traces}
VARIANTS=${VARIANTS:-base=}
ROUNDS=${ROUNDS:-2}
PAIRS=${PAIRS:-21}
WORK=$SRC/build-variants
mkdir -p "$OUT" "$WORK/events"
cd "$SRC"
exec > >(tee "$OUT/variants.txt") 2>&1
date -u; git log --oneline -1; lscpu | grep -E 'Model name|^CPU\(s\)'

IFS=';' read -ra VS <<<"$VARIANTS"
names=()
for v in "${VS[@]}"; do
  name=${v%%=*} flags=${v#*=} tree=.
  [ "${flags#@}" != "$flags" ] && tree=${flags#@} flags=
  b=$WORK/$name
  mkdir -p "$b"
  { cmake -S "$tree" -B "$b" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_SANITIZE=OFF "-DCMAKE_C_FLAGS=$flags" &&
    cmake --build "$b" -j"$(nproc)" --target gpumem; } >"$b/cmake.log" 2>&1 ||
    { echo "variant $name: build FAILED"; tail -20 "$b/cmake.log"; continue; }
  bash "$tree/tests/gpu/build_ext.sh" "$b" | grep gpu_replay_bench
  [ -x "$b/gpu_replay_bench" ] && names+=("$name")
done
for t in "$TRACES"/*.pickle.gz; do
  python3 bench/trace_to_events.py "$t" "$WORK/events/$(basename "$t" .pickle.gz).bin" >/dev/null || exit 1
done
cpus=($(python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(c[len(c) // 2])'))

: >"$WORK/pairs.txt"
n=${#names[@]}
for r in $(seq 1 "$ROUNDS"); do
  for ev in "$WORK"/events/*.bin; do
    for k in $(seq 0 $((n - 1))); do
      name=${names[$(((k + r) % n))]}
      # the median ratio, then each side's median ns per operation (which side moved between runs)
      read -r med ns <<<"$(timeout 120 "$WORK/$name/gpu_replay_bench" --pair "$PAIRS" ${PAIR_ARGS:-} --timeout 110 --pin "${cpus[0]}" "$ev" 2>/dev/null |
        python3 -c '
import json, statistics, sys
rows = [json.loads(l[5:]) for l in sys.stdin if l.startswith("PAIR {")]
m = lambda k: statistics.median(r[k] for r in rows)
print("%.3f native %.1f ns, gpumem %.1f ns" % (m("speedup"), m("native_ns"), m("gpumem_ns")) if rows else "nan -")')"
      echo "$name $(basename "$ev" .bin) $r $med" >>"$WORK/pairs.txt"
      echo "$name $(basename "$ev" .bin) $r $med ($ns)"
    done
  done
done

python3 - "$WORK/pairs.txt" <<'EOF'
import collections, sys
cells = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, trace, _, med = line.split()
    cells[(name, trace)].append(float(med))
names = sorted({n for n, _ in cells}, key=lambda n: [k[0] for k in cells].index(n))
traces = sorted({t for _, t in cells})
print("\npaired warm speedup vs native (median of each run's rounds; runs listed):")
print("| variant | " + " | ".join(traces) + " |")
print("|---" * (len(traces) + 1) + "|")
for n in names:
    print("| %s | " % n + " | ".join(" / ".join("%.2f" % v for v in cells[(n, t)]) for t in traces) + " |")
EOF
