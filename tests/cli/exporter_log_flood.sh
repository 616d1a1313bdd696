#!/usr/bin/env bash
# exporter_log_flood.sh — issue 43, item 8: libmicrohttpd writes a line for
# every connection cut (a client gone, one cut for the connection limits):
# 200 slow clients made 87,068 lines / 11 MB of the exporter's stderr in
# 40 s. 200 connections that each send half a request and reset: at most 10
# of the library's lines in a 60 s window (20 if the run straddles two),
# the rest counted in a summary line ("N more messages not shown"), which
# the exporter also writes when it stops. Bounded: the client exits within
# 60 s, the exporter is stopped with SIGTERM.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
export GPUMEM_SHM_TAG="expl$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, need, start_exporter
need python3
need_exporter

start_exporter --interval 0.2 --no-nvml   # exporter, port; its errors in $tmp/exporter.err

timeout 60 python3 - "$port" <<'PY'
import socket, struct, sys, time
port = int(sys.argv[1])
socks = []
for i in range(200):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.bind((f"127.0.0.{2 + i % 8}", 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    except OSError:
        s.close()
for s in socks:  # reset, not closed: the library reports each one
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
time.sleep(1)
PY
kill -TERM "$exporter"
for _ in $(seq 50); do kill -0 "$exporter" 2>/dev/null || break; sleep 0.1; done
shown=$(grep -c '^gpumem exporter: libmicrohttpd: ' "$tmp/exporter.err" | tr -d ' ' || true)
summaries=$(grep '^gpumem exporter: libmicrohttpd: [0-9]* more messages\? not shown' "$tmp/exporter.err" || true)
hidden=$(echo "$summaries" | sed -n 's/.*: \([0-9]*\) more.*/\1/p' | awk '{s += $1} END {print s + 0}')
lines=$(( shown - $(echo -n "$summaries" | grep -c . || true) ))
echo "library lines shown: $lines, counted and not shown: $hidden"
if [ $(( lines + hidden )) -le 10 ]; then
    echo "skip: this libmicrohttpd wrote $((lines + hidden)) messages for 200 reset connections: nothing to limit"; exit 77
fi
[ "$lines" -le 20 ] || { echo "FAIL: $lines lines of the library's messages (at most 10 per 60 s)"; head -30 "$tmp/exporter.err"; exit 1; }
[ "$hidden" -ge 1 ] || { echo "FAIL: messages beyond the limit were not counted"; cat "$tmp/exporter.err"; exit 1; }
echo PASS
