# probe3.sh GPUMEM: start a demo that trains without pause, truncate every segment file of its pid, report its fate
G=$1; export GPUMEM_SHM_TAG=probe3
$G demo --step-ms 0 --model 16MiB --duration 4 >/dev/null 2>&1 & p=$!
sleep 1
for f in /dev/shm/gpumem-probe3.*; do
  pid=$(python3 -c "import struct,sys;print(struct.unpack_from('<i',open(sys.argv[1],'rb').read(36),32)[0])" "$f" 2>/dev/null)
  [ "$pid" = "$p" ] && truncate -s 0 "$f" && echo "truncated $f"
done
for fd in /proc/$p/fd/*; do case "$(readlink $fd)" in /memfd:gpumem*) truncate -s 0 "$fd" 2>&1 | sed 's/^/memfd: /';; esac; done
wait $p; echo "exit status $?"
