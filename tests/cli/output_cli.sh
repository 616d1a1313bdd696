#!/usr/bin/env bash
# output_cli.sh — issue 26, defects 10 and 11 (and 9 from the shell): every
# command fails on a full disk; --json is valid JSON whatever bytes the
# trace's names and path hold; report/convert/log write no file through a
# symlink and never over their input, replace a file only when the write
# succeeded, and say what they wrote; a snapshot recorded without history
# is refused with how to record one; endless garbage on stdin is refused at
# its first byte.
set -u
: "${GPUMEM:?}"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
SRC=${GPUMEM_SOURCE:-.}/examples/mlp_adam_fp32.pickle.gz
[ -f "$SRC" ] || fail "$SRC absent"

# a trace whose path and frame names are not UTF-8 (lone surrogates pickle as
# ED B3 BF; \xff in the file name)
BAD="$T/tr"$'\xff'"ace.pickle"
python3 - "$BAD" <<'PY' || fail "python"
import pickle, sys
fr = [{"name": "fn\udcff\x01<", "filename": "f\udce9.py", "line": 1}]
ev = [{"action": "alloc", "addr": 2 << 20, "size": 512, "stream": 0, "time_us": 1, "frames": fr},
      {"action": "free_completed", "addr": 2 << 20, "size": 512, "stream": 0, "time_us": 2, "frames": fr}]
pickle.dump({"device_traces": [ev], "segments": []}, open(sys.argv[1], "wb"), protocol=4)
PY

# ---- write errors: > /dev/full is an error for every command
for c in "replay --json $SRC" "tune $SRC" "report --json $SRC" "report $SRC" "config --list" "--version"; do
    $GPUMEM $c >/dev/full 2>"$T/err" && fail "'$c > /dev/full' exited 0"
    grep -q "standard output" "$T/err" || fail "'$c': $(cat "$T/err")"
done
"$GPUMEM" convert "$SRC" -o /dev/full 2>"$T/err" && fail "convert -o /dev/full exited 0"

# ---- JSON: valid, with U+FFFD for the bytes that are not UTF-8
for c in "replay --json" "tune --json" "report --json"; do
    $GPUMEM $c "$BAD" >"$T/out.json" 2>"$T/err" || fail "$c: $(cat "$T/err")"
    python3 -m json.tool "$T/out.json" >/dev/null || fail "$c: invalid JSON: $(head -c 300 "$T/out.json")"
done
grep -q 'ufffd' "$T/out.json" || fail "no \\ufffd in report --json"
"$GPUMEM" report "$BAD" --perfetto "$T/p.json" 2>/dev/null || fail "perfetto"
python3 -m json.tool "$T/p.json" >/dev/null || fail "perfetto: invalid JSON"

# ---- outputs: links, inputs, replacing, saying what was written
ln -s "$T/victim" "$T/link.html"
"$GPUMEM" report "$SRC" -o "$T/link.html" 2>"$T/err" && fail "report wrote through a symlink"
[ -e "$T/victim" ] && fail "the symlink's target was created"
grep -q "symbolic link" "$T/err" || fail "message: $(cat "$T/err")"
"$GPUMEM" convert "$SRC" -o "$T/link.html" 2>/dev/null && fail "convert wrote through a symlink"
"$GPUMEM" log --count 1 --no-nvml -o "$T/link.html" 2>/dev/null && fail "log wrote through a symlink"
[ -e "$T/victim" ] && fail "the symlink's target was created"
"$GPUMEM" convert "$SRC" -o "$T/x.gmt" 2>"$T/err" || fail "convert"
grep -q "wrote $T/x.gmt" "$T/err" || fail "convert does not say what it wrote: $(cat "$T/err")"
cp "$T/x.gmt" "$T/x.orig"
cp "$T/x.gmt" "$T/xg.html" # -o takes .html or .txt; the input is read by its content
"$GPUMEM" report "$T/xg.html" -o "$T/xg.html" 2>"$T/err" && fail "report wrote over its input"
cmp -s "$T/xg.html" "$T/x.orig" || fail "the input changed"
grep -q "is the input" "$T/err" || fail "message: $(cat "$T/err")"
ln "$T/x.gmt" "$T/hard.gmt"
"$GPUMEM" convert "$T/x.gmt" -o "$T/hard.gmt" 2>/dev/null && fail "convert wrote over its input (hard link)"
"$GPUMEM" report "$SRC" -o "$T/r.html" 2>"$T/err" || fail "report -o"
grep -q "wrote $T/r.html" "$T/err" || fail "report -o says nothing: $(cat "$T/err")"
"$GPUMEM" report "$SRC" -o "$T/r.html" 2>"$T/err" || fail "report -o again"
grep -q "replacing" "$T/err" || fail "a replaced file is not said: $(cat "$T/err")"
ls -a "$T" | grep -q '^\.r\.html\.' && fail "a temporary file was left"
"$GPUMEM" log --count 1 --no-nvml -o "$T/m.jsonl" 2>"$T/err" || fail "log -o"
grep -q "wrote $T/m.jsonl" "$T/err" || fail "log says nothing: $(cat "$T/err")"

# ---- a snapshot without history: refused with how to record one
python3 -c 'import pickle,sys; pickle.dump({"device_traces": [[]], "segments": [{"device": 0, "address": 2097152, "total_size": 2097152, "allocated_size": 0, "requested_size": 0, "stream": 0, "blocks": [], "segment_type": "large"}]}, open(sys.argv[1], "wb"))' "$T/nohist.pickle"
for c in replay tune report; do
    "$GPUMEM" $c "$T/nohist.pickle" >/dev/null 2>"$T/err" && fail "$c ranked/replayed a snapshot without history"
    grep -q "_record_memory_history" "$T/err" || fail "$c: $(cat "$T/err")"
done

# ---- endless input is refused at its first byte, not buffered
yes | "$GPUMEM" replay - 2>"$T/err" && fail "yes | replay - accepted"
grep -q "at byte 0" "$T/err" || fail "yes: $(cat "$T/err")"
"$GPUMEM" replay /dev/zero 2>"$T/err" && fail "/dev/zero accepted"
grep -q "at byte 0" "$T/err" || fail "/dev/zero: $(cat "$T/err")"
echo ok
