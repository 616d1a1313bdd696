#!/usr/bin/env bash
# One device call: why gpumem's warm pass is sometimes ~65 and sometimes ~110
# ns/op on the H200 hosts (never on the build machine). Builds the library and
# the replay bench, then replays each trace with several allocator instances
# (--reps) and several untimed passes per instance (--bulk), with the replay
# thread's hardware counters (--perf), on the cuda backend and on the sim
# backend (same allocator code, no driver, no device addresses). A slow mode
# that stays for an instance's lifetime points at its state (addresses,
# layout); one that comes and goes points at the host. Equal instructions with
# more cycles point at memory, not at code paths.
#   OUT=... bash tests/gpu/warm_modes.sh TRACES_DIR
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpumem-out}
TRACES=${1:-$SRC/../shared/traces}
BUILD=$SRC/build-warm-modes
mkdir -p "$OUT" "$BUILD/events"
cd "$SRC"
exec > >(tee "$OUT/warm_modes.txt") 2>&1
{
  date -u; git log --oneline -1
  lscpu | grep -E 'Model name|^CPU\(s\)|NUMA|Thread|Socket|MHz|L[123]'
  echo "perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid)"
  echo "THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
  command -v numactl >/dev/null && numactl -H | head -4
}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_SANITIZE=OFF >"$BUILD/cmake.log" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" --target gpumem >>"$BUILD/cmake.log" 2>&1 || { tail -20 "$BUILD/cmake.log"; exit 1; }
bash tests/gpu/build_ext.sh "$BUILD" | grep gpu_replay_bench
for t in "$TRACES"/*.pickle.gz; do
  python3 bench/trace_to_events.py "$t" "$BUILD/events/$(basename "$t" .pickle.gz).bin" >/dev/null || exit 1
done
B=$BUILD/gpu_replay_bench
run() { # label, bench args...
  local label=$1; shift
  echo "== $label: $*"
  timeout 200 "$B" --timeout 190 "$@" "$BUILD"/events/*.bin 2>"$BUILD/$label.err" | grep BULK >"$BUILD/$label.bulk"
  tail -3 "$BUILD/$label.err" | grep -v '^PROGRESS'
  python3 - "$label" "$BUILD/$label.bulk" <<'EOF'
import json, sys, collections
label, path = sys.argv[1], sys.argv[2]
rows = collections.defaultdict(list)
for line in open(path):
    r = json.loads(line[5:])
    rows[(r["trace"].replace(".bin", ""), r["allocator"])].append(r)
for (trace, alloc), rs in rows.items():
    print(f"{label:10} {trace:24} {alloc:14} ns/op: " + " ".join(f"{r['ns_mean_untimed']:.0f}" for r in rs))
    if "cycles" in rs[0]:
        for r in rs:
            print(f"{'':51} ns {r['ns_mean_untimed']:6.1f} cpu {r['cpu']:2}  instr {r['instructions']:>11}  "
                  f"cyc {r['cycles']:>11}  ipc {r['instructions'] / max(1, r['cycles']):.2f}  "
                  f"llc-miss {r.get('cache_misses', 0):>9}  dtlb {r.get('dtlb_misses', 0):>8}  "
                  f"pf {r.get('page_faults', 0)}")
EOF
}
run cuda --backend cuda --alloc gpumem-gpumem --reps 5 --bulk 4 --perf
run sim --backend sim --alloc gpumem-gpumem --reps 5 --bulk 4 --perf
run native --backend cuda --alloc torch-native,gpumem-gpumem --reps 3 --bulk 3 --perf
tar -czf "$OUT/warm_modes_raw.tgz" -C "$BUILD" $(cd "$BUILD" && ls *.bulk *.err)
