#!/usr/bin/env bash
# monitor_top.sh — `gpumem top` driven in tmux: the screen shows the
# producers, and the keys work (filter, sort, window, pause, help, quit).
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
wait_screen 5 "sort reserved"
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
echo PASS
