#!/usr/bin/env bash
# convert_cli.sh — 'gpumem convert' writes a .gmt that replays to the same
# numbers as the snapshot it came from; garbage input is refused clearly.
set -u
: "${GPUMEM:?}"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
SRC=${GPUMEM_SHARED:-/nonexistent}/traces/resnet50_sgd_amp.pickle.gz
if [ ! -f "$SRC" ]; then echo "skip: $SRC absent"; exit 77; fi
"$GPUMEM" convert "$SRC" -o "$T/r.gmt" || fail "convert exit $?"
[ "$(head -c 7 "$T/r.gmt")" = GMTRACE ] || fail "no magic"
a=$("$GPUMEM" replay "$SRC" --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["peak_reserved"], j["peak_requested"], j["events"])')
b=$("$GPUMEM" replay "$T/r.gmt" --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["peak_reserved"], j["peak_requested"], j["events"])')
[ "$a" = "$b" ] || fail "gmt replays differently: '$a' vs '$b'"
"$GPUMEM" convert "$T/r.gmt" -o "$T/r2.gmt" || fail "gmt -> gmt"
cmp -s "$T/r.gmt" "$T/r2.gmt" || fail "gmt -> gmt not identical"
printf 'GMTRACE\0garbage' >"$T/bad.gmt"
"$GPUMEM" convert "$T/bad.gmt" -o "$T/x.gmt" 2>"$T/err" && fail "garbage accepted"
grep -q "gmt" "$T/err" || fail "message: $(cat "$T/err")"
"$GPUMEM" convert "$SRC" 2>/dev/null; [ $? -eq 2 ] || fail "missing -o not a usage error"
echo ok
