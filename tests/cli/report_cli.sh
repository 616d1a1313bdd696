#!/usr/bin/env bash
# report_cli.sh — 'gpumem report': for every examples/ trace (always here)
# and the real ../shared traces (skipped, saying so, when absent): the HTML
# is self-contained (uPlot inlined, nothing fetched), holds the timeline
# chart, the peak table, the segment map and the frame table, stays under
# 5 MB, and its peak equals 'gpumem replay --json's peak_requested; the
# timeline's category series and its scope series at every depth of the
# "stack by" control sum to the same bytes at every point; --text
# prints the same tables; --perfetto writes Chrome trace JSON with counter
# tracks and slices; a .gmt trace reports the same peak; bad usage exits 2
# naming the problem, an unreadable trace or unwritable output exits 1.
set -u
: "${GPUMEM:?}"
SRC=${GPUMEM_SOURCE:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

check_html() { # TRACE HTML
    local trace=$1 html=$2 want got size
    want=$("$GPUMEM" replay "$trace" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_requested"])') ||
        fail "replay $trace"
    got=$(sed -n 's/.*<meta name=gpumem-peak-requested content="\([0-9]*\)">.*/\1/p' "$html")
    [ "$got" = "$want" ] || fail "$trace: report peak '$got' != replay peak_requested '$want'"
    grep -q "id=peak-requested data-bytes=$want>" "$html" || fail "$trace: summary peak"
    for needle in 'id=timeline' 'id=peak-table' 'id=frag' 'id=segmap' 'id=frames' 'new uPlot(' \
                  'uPlot.paths' '.uplot, .uplot' '<td><span class=sw'; do
        grep -qF "$needle" "$html" || fail "$trace: HTML lacks '$needle'"
    done
    # nothing loaded from elsewhere: no src=/href= attributes, no fetches
    grep -Eq '<(script|link|img|iframe)[^>]* (src|href)=' "$html" && fail "$trace: HTML loads an external resource"
    size=$(stat -c %s "$html")
    [ "$size" -lt 5000000 ] || fail "$trace: HTML is $size bytes"
    # the peak table's total row is the peak
    python3 - "$html" "$want" <<'PY' || fail "$trace: peak table"
import re, sys
h, want = open(sys.argv[1]).read(), int(sys.argv[2])
tab = h[h.index("<table id=peak-table"):]
tab = tab[:tab.index("</table>")]
vals = [int(v) for v in re.findall(r"<td data-v=(\d+)>", tab)]
cats = vals[0:12:2]  # live at peak per category (each row: at peak, allocated)
assert len(re.findall(r"<tr><td><span class=sw", tab)) == 6, tab[:300]
assert sum(cats) == want, (cats, want)
assert vals[12] == want, vals
PY
    # the timeline's data: the category series and, for every depth of the
    # "stack by scope" control, the scope series (deltas) sum to the same
    # live bytes at every point, and the peak is one of the points
    python3 - "$html" "$want" <<'PY' || fail "$trace: timeline data"
import json, re, sys
h, want = open(sys.argv[1]).read(), int(sys.argv[2])
D = json.loads(re.search(r"<script>const D=(\{.*?\});</script>", h, re.S).group(1))
n = len(D["t"])
tot = [sum(c[i] for c in D["c"]) for i in range(n)]
assert max(tot) == want, (max(tot), want)
S = D["scopes"]
assert S["points"] == n and S["views"], S.keys()
opts = re.findall(r"<option value=(\d+)>scope, depth (\d+) ", h)
assert [int(d) for _, d in opts] == [v["depth"] for v in S["views"]] == list(range(1, len(S["views"]) + 1)), opts
assert "<select id=stackby><option value=cat selected>category</option>" in h
for v in S["views"]:
    assert 1 <= len(v["series"]) <= 11, len(v["series"])  # the default top 10 and "other scopes"
    vals = []
    for s in v["series"]:
        acc, x = 0, []
        for d in s["deltas"]:
            acc += d
            x.append(acc)
        assert max(x) <= s["max"], (s["name"], max(x), s["max"])  # its own maximum may fall between points
        vals.append(x)
    assert [sum(x[i] for x in vals) for i in range(n)] == tot, v["depth"]
    assert sum(s["at_peak"] for s in v["series"]) == want
PY
}

n=0
for trace in "$SRC"/examples/*.pickle.gz; do
    "$GPUMEM" report "$trace" -o "$T/r.html" || fail "report $trace exit $?"
    check_html "$trace" "$T/r.html"
    n=$((n + 1))
done
[ "$n" -ge 3 ] || fail "only $n example traces"

ex=$SRC/examples/mlp_adam_fp32.pickle.gz
# --text: the same tables; mlp_adam_fp32 (Adam, fp32): state = 2 x parameters, gradients = parameters
"$GPUMEM" report "$ex" --text >"$T/t.txt" || fail "--text exit"
# a trace without Python frames (issue 42: 58-94% of the peak was "other"): the steps in live
# memory decide activations, gradients and temporaries ("inferred"), and the report says so,
# with the call that records frames. examples/gpt2_small_train_bf16: 6 steps of GPT-2, AdamW.
"$GPUMEM" report "$GPUMEM_SOURCE/examples/gpt2_small_train_bf16.pickle.gz" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
c, p = j["categories"], j["peak_requested"]
assert j["has_frames"] is False and j["steps_inferred"] == 6, (j["has_frames"], j.get("steps_inferred"))
assert c["other"]["peak"] < p / 100, c["other"]                       # was 79.7%
assert c["activations"]["peak"] > p / 2, c["activations"]              # the peak is activations
assert c["activations"]["peak_by"]["inferred"] == c["activations"]["peak"]
params, g = c["parameters"]["allocated"], c["gradients"]              # 153 tensors, 539.7 MiB
assert g["count"] % 6 == 0 and 0.8 * params < g["allocated"] / 6 <= params, (g, params)  # per step, one per trainable parameter
assert "_record_memory_history(" in j["record_frames"] and "inferred" in j["note"], j
' || fail "frameless trace: categories not inferred"
"$GPUMEM" report "$GPUMEM_SOURCE/examples/gpt2_small_train_bf16.pickle.gz" | grep -qF 'record frames: call torch.cuda.memory._record_memory_history(' ||
    fail "frameless trace: the text report does not say how to record frames"
# -o: the format follows the extension (.txt: the text tables, as --text prints them)
"$GPUMEM" report "$ex" -o "$T/o.txt" 2>"$T/err" || fail "-o FILE.txt exit: $(cat "$T/err")"
cmp -s "$T/o.txt" "$T/t.txt" || fail "-o FILE.txt is not the text report: $(head -c 200 "$T/o.txt")"
"$GPUMEM" report "$ex" -o "$T/o.pdf" 2>"$T/err"; [ $? -eq 2 ] || fail "-o FILE.pdf accepted"
grep -q "FILE.html (the HTML page) or FILE.txt" "$T/err" || fail "-o FILE.pdf message: $(cat "$T/err")"
[ -e "$T/o.pdf" ] && fail "-o FILE.pdf wrote a file"
for needle in "At the peak of live requested bytes" "How the bytes at the peak were attributed" \
              "Frames and scopes by memory live at the peak" "optimizer_state" "_init_group (adam.py"; do
    grep -qF "$needle" "$T/t.txt" || fail "--text lacks '$needle'"
done
python3 - "$T/t.txt" <<'PY' || fail "--text arithmetic: $(cat "$T/t.txt")"
import re, sys
t = open(sys.argv[1]).read()
def peak(cat):
    v, u = re.search(r"^  %s +([\d.]+) (\w+)" % cat, t, re.M).groups()
    return float(v) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[u]
p, g, o = peak("parameters"), peak("gradients"), peak("optimizer_state")
assert p > 0 and abs(o - 2 * p) <= 0.01 * p and abs(g - p) <= 0.01 * p, (p, g, o)
PY

# --json: the same peak as replay, categories summing to it
want=$("$GPUMEM" replay "$ex" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_requested"])')
"$GPUMEM" report "$ex" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["peak_requested"] == j["replay"]["peak_requested"] == int(sys.argv[1]), j
assert sum(c["peak"] for c in j["categories"].values()) == j["peak_requested"]
assert sum(j["methods"].values()) == j["peak_requested"]
' "$want" || fail "--json"
"$GPUMEM" report "$ex" --json --text 2>/dev/null; [ $? -eq 2 ] || fail "--json --text accepted"
# --json's scope series: values (not deltas) at the timeline's points; the
# series at the peak point sum to the peak; --scopes 2 keeps 2 + "other scopes"
"$GPUMEM" report "$ex" --json --scopes 2 | python3 -c '
import json, sys
j = json.load(sys.stdin)
tl, S, want = j["timeline"], j["scopes"], j["peak_requested"]
assert S["encoding"] == "values" and S["points"] == len(tl["t"]) == len(tl["event"]), S["encoding"]
assert tl["event"][tl["peak_point"]] == j["peak_event"], tl["peak_point"]
assert S["source"].startswith("Python forward frames"), S["source"]
for v in S["views"]:
    assert sum(s["values"][tl["peak_point"]] for s in v["series"]) == want, v["depth"]
    assert sum(s["at_peak"] for s in v["series"]) == want
    assert len(v["series"]) <= 3 and (v["scopes"] <= 3 or v["series"][-1]["name"] == "other scopes"), v
d1 = {s["name"]: s["at_peak"] for s in S["views"][0]["series"]}
assert d1["[optimizer step]"] >= j["categories"]["optimizer_state"]["peak"] > 0, d1  # state and its temporaries
' || fail "--json scopes"
"$GPUMEM" report "$ex" --json --scopes 0 2>"$T/err"; [ $? -eq 2 ] || fail "--scopes 0 accepted"
grep -q -- "--scopes" "$T/err" || fail "bad --scopes message: $(cat "$T/err")"

# --perfetto: Chrome trace JSON with counters per category and phase slices
"$GPUMEM" report "$ex" --perfetto "$T/p.json" -o "$T/r2.html" || fail "--perfetto exit"
python3 - "$T/p.json" <<'PY' || fail "perfetto JSON"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
counters = [e for e in ev if e["ph"] == "C" and e["name"] == "live bytes by category"]
assert counters and set(counters[0]["args"]) == {"parameters", "gradients", "optimizer_state", "activations",
                                                 "temporaries", "other"}, counters[:1]
assert any(e["ph"] == "C" and "fragmentation" in e["args"] for e in ev)
names = {e["name"] for e in ev if e["ph"] == "X"}
assert {"forward", "backward", "optimizer step"} <= names, names
assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")
PY
[ -s "$T/r2.html" ] || fail "-o with --perfetto wrote no HTML"

# a .gmt trace reports the same peak
"$GPUMEM" convert "$ex" -o "$T/x.gmt" >/dev/null 2>&1 ||
    fail "convert to gmt"
"$GPUMEM" report "$T/x.gmt" -o "$T/g.html" || fail "report .gmt"
check_html "$T/x.gmt" "$T/g.html"

# usage and errors
"$GPUMEM" report "$ex" --bogus 2>"$T/err"; rc=$?
[ $rc -eq 2 ] || fail "unknown option exit $rc"
grep -q "see 'gpumem report --help'" "$T/err" || fail "unknown option message: $(cat "$T/err")"
"$GPUMEM" report "$ex" --points 2 2>"$T/err"; [ $? -eq 2 ] || fail "bad --points accepted"
grep -q -- "--points" "$T/err" || fail "bad --points message"
"$GPUMEM" report 2>/dev/null; [ $? -eq 2 ] || fail "no trace: not a usage error"
"$GPUMEM" report "$T/missing.pickle.gz" 2>"$T/err"; [ $? -eq 1 ] || fail "missing trace exit"
"$GPUMEM" report "$ex" -o "$T/no/such/dir/r.html" 2>"$T/err"; [ $? -eq 1 ] || fail "unwritable output exit"
grep -q "cannot write" "$T/err" || fail "unwritable output message: $(cat "$T/err")"
"$GPUMEM" report "$ex" --conf "bogus_key:1" 2>"$T/err"; [ $? -eq 2 ] || fail "bad --conf exit"
"$GPUMEM" report --help | grep -q -- "--perfetto" || fail "--help"

# a segment_alloc the sim cannot place (not 2 MiB-aligned; replay skips it
# as a bad event) is left out of the timeline's replay, not an error
python3 - "$T/seg.pickle" <<'PY' || fail "writing seg.pickle"
import pickle, sys
ev = [{"action": "segment_alloc", "addr": 0x1000, "size": 1 << 20, "stream": 0, "time_us": 1, "frames": []},
      {"action": "alloc", "addr": 0x1000, "size": 100, "stream": 0, "time_us": 2, "frames": []}]
pickle.dump({"segments": [], "device_traces": [ev]}, open(sys.argv[1], "wb"))
PY
"$GPUMEM" report "$T/seg.pickle" -o "$T/seg.html" 2>"$T/err" || fail "unaligned segment: $(cat "$T/err")"
grep -q 'content="100"' "$T/seg.html" || fail "unaligned segment: peak"

# a snapshot like the shim's under policy:gpumem: segment_map/segment_unmap
# in the trace, one expandable segment per mapped run; report and replay
# read it and take the allocations' peak
python3 - "$T/map.pickle" <<'PY' || fail "writing map.pickle"
import pickle, sys
M = 1 << 20
def ev(a, addr, size, t): return {"action": a, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []}
base = 0x7f0000000000
ev_ = [ev("segment_map", base, 4 * M, 1), ev("alloc", base, 3 * M, 2), ev("segment_map", base + 4 * M, 2 * M, 3),
       ev("alloc", base + 3 * M, 2 * M, 4), ev("free_requested", base, 3 * M, 5), ev("free_completed", base, 3 * M, 6),
       ev("segment_unmap", base, 2 * M, 7)]
seg = {"device": 0, "address": base + 2 * M, "total_size": 4 * M, "allocated_size": 2 * M, "active_size": 2 * M,
       "requested_size": 2 * M, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
       "is_expandable": True, "frames": [],
       "blocks": [{"size": M, "requested_size": 0, "state": "inactive"},
                  {"size": 2 * M, "requested_size": 2 * M, "state": "active_allocated", "frames": []},
                  {"size": M, "requested_size": 0, "state": "inactive"}]}
pickle.dump({"segments": [seg], "device_traces": [ev_]}, open(sys.argv[1], "wb"))
PY
"$GPUMEM" report "$T/map.pickle" -o "$T/map.html" 2>"$T/err" || fail "segment_map snapshot: $(cat "$T/err")"
check_html "$T/map.pickle" "$T/map.html"
grep -q "content=\"$((5 << 20))\"" "$T/map.html" || fail "segment_map snapshot: peak"

# the real traces
SH=${GPUMEM_SHARED:-$SRC/../shared}
if [ -d "$SH/traces" ]; then
    for trace in "$SH"/traces/*.pickle.gz; do
        "$GPUMEM" report "$trace" -o "$T/s.html" || fail "report $trace"
        check_html "$trace" "$T/s.html"
    done
else
    echo "SKIP real traces: $SH/traces is absent (the examples/ traces above ran)"
fi
echo ok
