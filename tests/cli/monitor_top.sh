#!/usr/bin/env bash
# monitor_top.sh — `gpumem top` driven in tmux: the screen shows the
# producers, and the keys work (filter, sort, window, pause, help, quit);
# at 60, 80 and 200 columns every line is cut, never wrapped, and 80 shows the
# essential columns whole; the history graph
# has no gap columns between samples; with stdout not a terminal or TERM
# unset it refuses with what to use instead (exit 2) rather than writing
# escape codes or "Error opening terminal".
set -euo pipefail
GPUMEM=${GPUMEM:-gpumem}
command -v tmux >/dev/null || { echo "skip: tmux not installed"; exit 77; }
"$GPUMEM" top --help >/dev/null
export GPUMEM_SHM_TAG="top$$"
source "$(dirname "${BASH_SOURCE[0]}")/lib/producers.sh"   # tmp, pids, stop_producers, wait_for
sock="$tmp/tmux.sock"
cleanup() { tmux -S "$sock" kill-server 2>/dev/null || true; stop_producers; }
trap cleanup EXIT
screen() { tmux -S "$sock" capture-pane -p -t top; }
screen_has() { screen | grep -qE -- "$1"; }
screen_lacks() { ! screen_has "$1"; }
# seconds, grep -E pattern: poll the screen (bounded) until it shows / no longer shows the pattern
wait_screen() { wait_for "$1" screen_has "$2" || { echo "FAIL: screen never showed /$2/"; screen; return 1; }; }
wait_not_screen() { wait_for "$1" screen_lacks "$2" || { echo "FAIL: screen still shows /$2/"; screen; return 1; }; }

"$GPUMEM" demo --step-ms 50 --model 16MiB --label alpha-trainer >/dev/null 2>&1 &
pids+=($!)
"$GPUMEM" demo --steps 1 --step-ms 0 --hold 120 --model 16MiB --label beta-holder --device 1 >/dev/null 2>&1 &
pids+=($!)

tmux -S "$sock" new-session -d -s top -x 160 -y 45 \
    "env GPUMEM_SHM_TAG=$GPUMEM_SHM_TAG $GPUMEM top --interval 0.1 --no-nvml; echo TOP-EXITED; sleep 30"
wait_screen 30 "alpha-trainer"
wait_screen 10 "beta-holder"
wait_screen 5 "sort job"
screen | grep -q "GPU 1" || { echo "FAIL: no header for GPU 1"; screen; exit 1; }
screen | grep -q "q quit" || { echo "FAIL: no help line"; exit 1; }

# filter: only beta remains
tmux -S "$sock" send-keys -t top f b e t a Enter
wait_screen 5 "filter 'beta'"
wait_not_screen 5 "alpha-trainer"
screen | grep -q "beta-holder" || { echo "FAIL: filter hid the match"; screen; exit 1; }
# clear the filter
tmux -S "$sock" send-keys -t top f Enter
wait_screen 5 "alpha-trainer"

tmux -S "$sock" send-keys -t top s
wait_screen 5 "sort reserved"
tmux -S "$sock" send-keys -t top s
wait_screen 5 "sort allocated"
tmux -S "$sock" send-keys -t top r
wait_screen 5 "sort allocated \(reversed\)"
tmux -S "$sock" send-keys -t top w
wait_screen 5 "window 300s"
wait_screen 5 "last 300s"
tmux -S "$sock" send-keys -t top d
wait_screen 5 ">GPU 1"
tmux -S "$sock" send-keys -t top p
wait_screen 5 "PAUSED"
tmux -S "$sock" send-keys -t top p h
wait_screen 5 "d next GPU"
# the history graph draws bytes for the selected device
tmux -S "$sock" send-keys -t top d
wait_screen 10 "#"
tmux -S "$sock" send-keys -t top q
wait_screen 10 "TOP-EXITED"

# narrow and wide terminals: each screen line is one line of top's (cut, not
# wrapped): the process rows start with a GPU index, never with a fragment
for cols in 60 80 200; do
    tmux -S "$sock" new-session -d -s "w$cols" -x "$cols" -y 30 \
        "env GPUMEM_SHM_TAG=$GPUMEM_SHM_TAG $GPUMEM top --interval 0.1 --no-nvml; sleep 30"
    wait_for 20 sh -c "tmux -S '$sock' capture-pane -p -t w$cols | grep -q alpha-trainer" ||
        { echo "FAIL: $cols columns: no producer row"; tmux -S "$sock" capture-pane -p -t "w$cols"; exit 1; }
    shot=$(tmux -S "$sock" capture-pane -p -J -t "w$cols")
    long=$(echo "$shot" | awk -v c="$cols" 'length($0) > c' | wc -l)
    [ "$long" = 0 ] || { echo "FAIL: $cols columns: $long lines wrapped"; echo "$shot"; exit 1; }
    echo "$shot" | grep -E "alpha-trainer" | grep -qE "^[0-9]+ +[0-9]+ " ||
        { echo "FAIL: $cols columns: the process row does not start with GPU and PID"; echo "$shot"; exit 1; }
    # the graph: between its first and last drawn column, no blank column
    graph=$(echo "$shot" | awk '/allocated, .:. reserved/ { on = 1; next } on && /q quit/ { on = 0 } on')
    echo "$graph" | python3 -c '
import sys
rows = [l[11:] for l in sys.stdin.read().splitlines() if len(l) > 11]
width = max((len(r) for r in rows), default=0)
cols = [any(c < len(r) and r[c] not in " " for r in rows) for c in range(width)]
drawn = [i for i, x in enumerate(cols) if x]
gaps = [i for i in range(drawn[0], drawn[-1] + 1) if not cols[i]] if drawn else []
assert not gaps, "blank graph columns between samples: %s" % gaps[:10]
' || { echo "FAIL: $cols columns: gaps in the history graph"; echo "$shot"; exit 1; }
    # 80 columns (issue 42: the table was cut after "Allocated"): the essential columns, whole
    if [ "$cols" = 80 ]; then
        echo "$shot" | grep -E "^GPU +PID +PROCESS +Allocated +Reserved .*OOMs *$" >/dev/null ||
            { echo "FAIL: 80 columns: the table lacks its essential columns"; echo "$shot"; exit 1; }
        echo "$shot" | grep -E "alpha-trainer" | grep -qE " [0-9]+$" ||
            { echo "FAIL: 80 columns: the process row is cut before its OOMs"; echo "$shot"; exit 1; }
    fi
    tmux -S "$sock" send-keys -t "w$cols" q
done

# not a terminal, or no TERM: refuse and say what to use (no escape codes)
out=$(env GPUMEM_SHM_TAG=$GPUMEM_SHM_TAG "$GPUMEM" top --no-nvml </dev/null 2>&1 | cat) || true
echo "$out" | grep -q "gpumem smi" || { echo "FAIL: top into a pipe: $out"; exit 1; }
if printf '%s' "$out" | grep -q $'\e'; then echo "FAIL: escape codes into a pipe"; exit 1; fi
tmux -S "$sock" new-session -d -s noterm -x 100 -y 20 \
    "env -u TERM GPUMEM_SHM_TAG=$GPUMEM_SHM_TAG $GPUMEM top --no-nvml; echo EXIT=\$?; sleep 30"
wait_for 10 sh -c "tmux -S '$sock' capture-pane -p -t noterm | grep -q 'EXIT=2'" ||
    { echo "FAIL: TERM unset"; tmux -S "$sock" capture-pane -p -t noterm; exit 1; }
tmux -S "$sock" capture-pane -p -t noterm | grep -q "TERM is not set" || { echo "FAIL: TERM unset: no reason"; exit 1; }
echo PASS
