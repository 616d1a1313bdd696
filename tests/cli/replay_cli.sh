#!/usr/bin/env bash
# replay_cli.sh — 'gpumem replay': JSON output parses and holds the required
# fields; a bad --conf exits 2 naming the key; a malformed or missing trace
# gives a clear error (exit 1); a small capacity predicts an OOM with the
# event index; unknown-address frees are counted, not fatal.
set -u
: "${GPUMEM:?}"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# a tiny snapshot written by Python's pickle (no torch needed)
python3 - "$T" <<'PY' || exit 77
import gzip, pickle, sys
ev = lambda a, addr, size: {"action": a, "addr": addr, "size": size, "stream": 0, "time_us": 1}
tr = [ev("segment_alloc", 1 << 30, 2 << 20), ev("alloc", 1 << 30, 1000), ev("alloc", (1 << 30) + 1024, 3000),
      ev("free_requested", 1 << 30, 1000), ev("free_completed", 1 << 30, 1000),
      ev("free_completed", 12345, 77),  # unknown address
      ev("alloc", 5 << 30, 64 << 20)]
snap = {"segments": [], "device_traces": [tr], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}
gzip.open(sys.argv[1] + "/s.pickle.gz", "wb").write(pickle.dumps(snap, protocol=4))
open(sys.argv[1] + "/s.pickle", "wb").write(pickle.dumps(snap, protocol=2))
PY
out=$("$GPUMEM" replay "$T/s.pickle.gz" --json) || fail "replay exit $?"
echo "$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
for k in ("peak_requested", "peak_allocated", "peak_reserved"): assert isinstance(j[k], int), k
assert j["oom"] is False and isinstance(j["device_calls"], dict)
assert j["peak_requested"] == 3000 + (64 << 20), j["peak_requested"]
assert j["unknown_frees"] == 1, j
' || fail "json check: $out"
"$GPUMEM" replay "$T/s.pickle" --policy gpumem --json | python3 -c 'import json,sys; assert json.load(sys.stdin)["policy"]=="gpumem"' || fail "plain pickle / gpumem policy"
# device_call_sizes: per-size counts add up to the device_calls totals
for pol in torch gpumem; do
"$GPUMEM" replay "$T/s.pickle.gz" --policy $pol --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
c, s = j["device_calls"], j["device_call_sizes"]
for k in ("device_alloc", "device_free", "phys_create", "phys_release", "map", "unmap"):
    assert sum(n for n, _ in s[k].values()) == c[k], (k, s[k], c[k])
    for b, (n, nbytes) in s[k].items():
        assert n * (1 << int(b)) <= nbytes < n * (2 << int(b)), (k, b, n, nbytes)
assert c["device_alloc"] + c["phys_create"] > 0, c
' || fail "device_call_sizes ($pol)"
done
# the cost model reads them: cudaMallocs of 2 MiB (46.1 us) and 64 MiB (56.1 us) on an H200
"$GPUMEM" replay "$T/s.pickle.gz" --json | python3 "$(dirname "$0")/../../tools/first_pass_cost.py" - |
    grep -q "model_ms 0\.102 " || fail "first_pass_cost.py"

"$GPUMEM" replay "$T/s.pickle.gz" --conf "max_split_size_mb:64,bogus_key:1" 2>"$T/err" && fail "bad conf accepted"
[ $? -eq 2 ] || fail "bad conf exit code"
grep -q bogus_key "$T/err" || fail "bad conf message does not name the key: $(cat "$T/err")"
head -c 40 "$T/s.pickle" >"$T/trunc.pickle"
"$GPUMEM" replay "$T/trunc.pickle" 2>"$T/err"; rc=$?
[ $rc -eq 1 ] || fail "truncated trace exit $rc"
grep -q "byte" "$T/err" || fail "truncated trace message: $(cat "$T/err")"
"$GPUMEM" replay "$T/missing.gz" 2>/dev/null && fail "missing file accepted"
out=$("$GPUMEM" replay "$T/s.pickle.gz" --capacity 32MiB --json) || fail "oom replay exit"
echo "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["oom"] is True and j["oom_event"]==6, j' || fail "oom: $out"
"$GPUMEM" replay "$T/s.pickle.gz" --capacity 32MiB | grep -q "OOM *YES" || fail "text OOM line"
# a graphed program (issue 28): the pool's memory, freed inside the capture,
# is not reused by the allocation after it, as on the device; without the
# segment's pool id the replay would reuse it
python3 - "$T" <<'PY' || exit 77
import pickle, sys
ev = lambda a, addr, size: {"action": a, "addr": addr, "size": size, "stream": 0, "time_us": 1}
P, O = 3 << 30, 5 << 30
tr = [ev("segment_alloc", P, 20 << 20), ev("alloc", P, 8 << 20), ev("free_requested", P, 8 << 20),
      ev("free_completed", P, 8 << 20), ev("segment_alloc", O, 20 << 20), ev("alloc", O, 8 << 20)]
seg = lambda addr, pool: {"device": 0, "address": addr, "total_size": 20 << 20, "allocated_size": 0,
                          "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": pool,
                          "is_expandable": False, "blocks": []}
for name, pool in (("g", (1, 4)), ("n", (0, 0))):
    snap = {"segments": [seg(P, pool), seg(O, (0, 0))], "device_traces": [tr]}
    open(sys.argv[1] + "/%s.pickle" % name, "wb").write(pickle.dumps(snap, protocol=4))
PY
for pol in torch gpumem; do
  g=$("$GPUMEM" replay "$T/g.pickle" --policy $pol --json) || fail "graphed replay exit ($pol)"
  n=$("$GPUMEM" replay "$T/n.pickle" --policy $pol --json) || fail "plain replay exit ($pol)"
  python3 -c '
import json, sys
g, n = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert g["private_pools"] == 1 and "private_pools" not in n, (g, n)
assert g["peak_reserved"] > n["peak_reserved"] and g["peak_reserved"] >= 16 << 20, (g["peak_reserved"], n["peak_reserved"])
' "$g" "$n" || fail "graphed replay ($pol): $g"
done
"$GPUMEM" replay "$T/g.pickle" | grep -q "private pools   1" || fail "text private pools line"
echo ok
