#!/usr/bin/env bash
# exporter_slow_clients.sh — issue 26, defect 6: slow clients must not lock
# scrapers out of `gpumem exporter`. Two rounds, each from loopback only,
# bounded in count (at most 320 sockets) and time (the helper exits by
# itself within 60 s):
#   1. 32 slow connections (a header left open) from 127.0.0.1, the
#      per-address limit, then 20 scrapes from 127.0.0.1;
#   2. 288 slow connections spread over 127.0.0.2-.10 (beyond the total
#      limit of 256), then 20 scrapes from 127.0.0.1.
# Every scrape must be answered (before the fix: round 1 starved the
# scraper; round 2 let 2 of 20 through). Also: no libmicrohttpd warning at
# start (issue 24: MHD_OPTION_EXTERNAL_LOGGER must come first).
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
export GPUMEM_SHM_TAG="exps$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, cleanup on exit, wait_for, need, start_exporter
need python3
need_exporter

start_exporter --interval 0.1 --no-nvml   # port; its errors in $tmp/exporter.err
if [ -s "$tmp/exporter.err" ]; then echo "FAIL: the exporter warns at start:"; cat "$tmp/exporter.err"; exit 1; fi
echo "ok: no warning at start"

timeout 120 python3 - "$port" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
deadline = time.monotonic() + 60

def slow(sources):
    socks = []
    for ip in sources:
        s = socket.socket()
        s.settimeout(2)
        try:
            s.bind((ip, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        except OSError:
            s.close()
    return socks

def scrape():
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"HTTP/1.1 200") and b"gpumem_producers" in data
    except OSError:
        return False

failed = False
for name, sources in (("32 slow from 127.0.0.1", ["127.0.0.1"] * 32),
                      ("288 slow from 127.0.0.2-.10", ["127.0.0.%d" % (2 + i % 9) for i in range(288)])):
    socks = slow(sources)
    ok = sum(scrape() for _ in range(20))
    print("%s (%d open): %d of 20 scrapes answered" % (name, len(socks), ok))
    failed |= ok != 20
    for s in socks:
        s.close()
sys.exit(1 if failed else 0)
PY
echo PASS
