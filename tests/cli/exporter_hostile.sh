#!/usr/bin/env bash
# exporter_hostile.sh — `gpumem exporter` under hostile local conditions
# (issue 15): more slow-header connections from one address than the
# per-address limit still leave scrapes from another address served; a
# request trickled byte by byte is cut at the whole-request deadline; a FIFO
# planted under a segment name does not block sampling; /metrics%00 is a
# 404; SIGTERM stops the exporter within a second.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
export GPUMEM_SHM_TAG="exph$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, need, start_exporter
need curl python3
need_exporter

# a FIFO under a name of the beacons' form: opening it for reading would block
fifo="/dev/shm/gpumem-$GPUMEM_SHM_TAG.$(id -u).00000000000000f1"
mkfifo "$fifo"
undo() { rm -f "$fifo"; stop_producers; }
trap undo EXIT

"$GPUMEM" demo --steps 2 --step-ms 0 --hold 120 --model 16MiB --label held >"$tmp/held.json" 2>/dev/null &
pids+=($!); held=$!
wait_for 30 test -s "$tmp/held.json" || { echo "FAIL: producer did not start"; exit 1; }

start_exporter --interval 0.1 --no-nvml   # exporter, url, port
scrape_has() { curl -fsS --max-time 5 "$url" | grep -q "$1"; }
wait_for 20 scrape_has "pid=\"$held\"" || { echo "FAIL: producer never scraped (FIFO blocked the sampler?)"; exit 1; }
echo "ok: a planted FIFO does not block sampling"

code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/metrics%00")
[ "$code" = 404 ] || { echo "FAIL: /metrics%00 answered $code"; exit 1; }
echo "ok: /metrics%00 is 404"

# 300 slow connections from 127.0.0.1 (limit per address: 32), each with a
# header left open; then a scrape from 127.0.0.2 (also loopback) must work
python3 - "$port" "$tmp/slow.ready" <<'PY' &
import socket, sys, time
port, ready = int(sys.argv[1]), sys.argv[2]
socks = []
for i in range(300):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    except OSError:
        s.close()
open(ready, "w").write(str(len(socks)))
time.sleep(30)
PY
slow=$!
pids+=($slow)
wait_for 30 test -s "$tmp/slow.ready" || { echo "FAIL: slow client did not start"; exit 1; }
code=$(curl -s --interface 127.0.0.2 --max-time 10 -o "$tmp/m.txt" -w '%{http_code}' "$url" || true)
[ "$code" = 200 ] && grep -q "pid=\"$held\"" "$tmp/m.txt" ||
    { echo "FAIL: with 300 slow connections open a scrape got '$code'"; exit 1; }
echo "ok: scrape served with 300 slow connections open"
kill "$slow" 2>/dev/null || true

# a whole-request deadline: a header trickled one byte every 0.3 s is never
# idle, yet the connection is closed once the request has taken longer than
# the deadline (2 s here, GM_LIMIT_HTTP_REQUEST_S = 30 s by default)
GPUMEM_EXPORTER_REQUEST_S=2 "$GPUMEM" exporter --listen 127.0.0.1:0 --interval 0.1 --no-nvml >"$tmp/exporter2.out" 2>&1 &
ex2=$!
pids+=($ex2)
wait_for 20 grep -q serving "$tmp/exporter2.out" || { echo "FAIL: second exporter did not start"; exit 1; }
url2=$(sed -n 's/.*serving \(http:[^ ]*\).*/\1/p' "$tmp/exporter2.out")
port2=${url2#http://127.0.0.1:}; port2=${port2%%/*}
python3 - "$port2" <<'PY' || { echo "FAIL: a trickled request outlived the deadline"; exit 1; }
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.settimeout(0.3)
s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
t0 = time.monotonic()
while time.monotonic() - t0 < 20:
    try:
        s.sendall(b"a")
        if s.recv(1) == b"":
            break  # closed by the server
    except socket.timeout:
        continue
    except OSError:
        break
else:
    sys.exit(1)
print("ok: trickled request cut after %.1f s" % (time.monotonic() - t0))
PY
kill -TERM "$ex2"; wait "$ex2" 2>/dev/null || true
curl -fsS --max-time 5 "$url" >/dev/null || { echo "FAIL: the first exporter stopped serving"; exit 1; }

# SIGTERM: gone within a second (polled every 50 ms)
kill -TERM "$exporter"
for i in $(seq 1 20); do kill -0 "$exporter" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$exporter" 2>/dev/null; then echo "FAIL: exporter still running 1 s after SIGTERM"; exit 1; fi
wait "$exporter" 2>/dev/null || true
echo "ok: SIGTERM served within a second"
echo PASS
