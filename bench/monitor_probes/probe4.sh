# probe4.sh GPUMEM: two PID-1 publishers (unshare --pid), host-side smi twice: segments and rows
G=$1; export GPUMEM_SHM_TAG=probe4
unshare --pid --fork --kill-child --mount-proc $G demo --steps 2 --step-ms 0 --hold 30 --model 8MiB --label ctr-a >/dev/null 2>&1 & a=$!
sleep 1
unshare --pid --fork --kill-child --mount-proc $G demo --steps 2 --step-ms 0 --hold 30 --model 8MiB --label ctr-b >/dev/null 2>&1 & b=$!
sleep 1
echo "segments with both running: $(ls /dev/shm | grep -c probe4)"
for i in 1 2; do echo "smi $i rows: $($G smi --no-nvml --format json | python3 -c 'import json,sys; print([(p["label"],p["pid"]) for p in json.load(sys.stdin)["processes"]])')"; done
echo "segments after smi: $(ls /dev/shm | grep -c probe4)"
kill $(pgrep -P $a) $(pgrep -P $b); wait; rm -f /dev/shm/gpumem-probe4.*
