# probe5.sh GPUMEM: root plants the predictable names of the next 3000 pids for user nobody; nobody runs demo
G=$1; export GPUMEM_SHM_TAG=probe5
next=$(( $(sh -c 'echo $$') + 1 ))
for i in $(seq $next $((next + 3000))); do : > /dev/shm/gpumem-probe5.65534.$i; done
setpriv --reuid=65534 --regid=65534 --clear-groups env GPUMEM_SHM_TAG=probe5 $G demo --steps 2 --step-ms 0 --hold 0 --model 8MiB 2>&1 | head -2
echo "exit status ${PIPESTATUS[0]}"
rm -f /dev/shm/gpumem-probe5.65534.*
