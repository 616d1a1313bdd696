# tests/cli/lib/producers.sh — sourced (never run) by the monitor CLI tests
# that start producers (`gpumem demo`) in the background: their temporary
# folder, the list of their pids, the cleanup that stops them and sweeps the
# segments they leave, and a bounded poll. It lives below tests/cli/ so that
# CTest's glob of tests/cli/*.sh does not run it as a test of its own.
#
# Use, after `export GPUMEM_SHM_TAG=...` (each test its own namespace):
#     source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"
# It sets tmp and pids and traps EXIT with stop_producers; add each
# background pid with `pids+=($!)`. A test with more to undo traps its own
# function, which calls stop_producers last. For the exporter's tests: need,
# need_exporter (skips), have_exporter and start_exporter (below).

tmp=$(mktemp -d)
pids=()

# TERM lets producers unpublish; KILL what is left; sweep our stale segments
# (any view scans and removes the segments of dead producers).
stop_producers() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true
    done
    "$GPUMEM" smi --no-nvml --format csv >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap stop_producers EXIT

# wait_for SECONDS COMMAND...: poll every 0.1 s until the command succeeds
# (its output discarded); 1 when it never did, so tests never hang.
wait_for() {
    local n=$(( $1 * 10 )); shift
    for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    return 1
}

# segment_of PID: the /dev/shm beacon name(s) of this test's segments whose
# header names PID (names are random since issue 26, defect 5).
segment_of() {
    python3 - "$1" "gpumem-$GPUMEM_SHM_TAG." <<'PY'
import os, struct, sys
pid, prefix = int(sys.argv[1]), sys.argv[2]
for n in sorted(os.listdir("/dev/shm")):
    if n.startswith(prefix):
        try:
            with open("/dev/shm/" + n, "rb") as f:
                h = f.read(36)
        except OSError:
            continue
        if len(h) == 36 and struct.unpack_from("<i", h, 32)[0] == pid:
            print(n)
PY
}

# need CMD...: skip the test (exit 77, CTest's skip code) unless every CMD is installed.
need() {
    local t
    for t in "$@"; do command -v "$t" >/dev/null || { echo "skip: $t not installed"; exit 77; }; done
}

# have_exporter: false when gpumem was built without libmicrohttpd (the
# exporter then says so whatever the arguments, starts nothing and exits 1:
# its words are read whole, not through a pipe that pipefail would fail).
# need_exporter: skip the test then.
have_exporter() {
    local said
    said=$("$GPUMEM" exporter --listen nowhere 2>&1 || true)
    case $said in *"built without"*) return 1 ;; esac
}
need_exporter() {
    have_exporter || { echo "skip: built without libmicrohttpd"; exit 77; }
}

# start_exporter ARGS...: `gpumem exporter --listen 127.0.0.1:0 ARGS` in the
# background (in pids), its output in $tmp/exporter.out and its errors in
# $tmp/exporter.err (exporter2.*, ... for a test's second, ...); once it
# serves, sets exporter (its pid), url (its /metrics) and port. Fails the
# test, showing both files, when it does not serve within 20 s. Call it
# as it is, not in $(...): a subshell's pids are lost, and its exporter
# would outlive the test.
nexporters=0
start_exporter() {
    local f=$tmp/exporter
    nexporters=$((nexporters + 1))
    [ "$nexporters" = 1 ] || f=$tmp/exporter$nexporters
    "$GPUMEM" exporter --listen 127.0.0.1:0 "$@" >"$f.out" 2>"$f.err" &
    exporter=$!
    pids+=("$exporter")
    wait_for 20 grep -q serving "$f.out" || { echo "FAIL: exporter did not start"; cat "$f.out" "$f.err"; exit 1; }
    url=$(sed -n 's/.*serving \(http:[^ ]*\).*/\1/p' "$f.out")
    port=${url#http://127.0.0.1:}; port=${port%%/*}
}
