#!/usr/bin/env bash
# no_leftovers.sh — the monitor tests that start exporters through
# tests/cli/lib/producers.sh stop every process they start: after each has
# exited, no process carries its GPUMEM_SHM_TAG (NAME$$, $$ the test's shell).
# monitor_planted.sh started its exporters inside $(...), where pids+= was
# lost, so both ran on after every run of the test.
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
dir=$(dirname "${BASH_SOURCE[0]}")

# left PID: the processes whose environment holds GPUMEM_SHM_TAG=<letters>PID
left() {
    local f
    for f in /proc/[0-9]*/environ; do
        { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qx "GPUMEM_SHM_TAG=[a-z]*$1" && { f=${f#/proc/}; echo "${f%/environ}"; }
    done
    return 0
}
bad=0
for t in monitor_planted monitor_exporter monitor_job; do
    bash "$dir/$t.sh" >"/tmp/no_leftovers.$$.log" 2>&1 &
    p=$!
    rc=0; wait "$p" || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 77 ] || { echo "FAIL: $t.sh exited $rc:"; cat "/tmp/no_leftovers.$$.log"; bad=1; }
    mapfile -t stray < <(left "$p")
    if [ "${#stray[@]}" -gt 0 ]; then
        echo "FAIL: $t.sh left running:"; ps -o pid,args -p "$(IFS=,; echo "${stray[*]}")" || true
        kill "${stray[@]}" 2>/dev/null || true; bad=1
    else
        echo "ok: $t.sh left nothing running"
    fi
done
rm -f "/tmp/no_leftovers.$$.log"
exit "$bad"
