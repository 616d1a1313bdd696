"""Turn a PyTorch memory snapshot (.pickle.gz) into the flat event file that
bench/gpu_replay_bench.cpp replays, so the timed loop never parses anything.

Format (little endian): 8 bytes magic b"GMEV0001", u64 events, u64 slots,
then per event u32 op (0 alloc, 1 free), u32 slot, u64 size (alloc only).
Slots are reused after free, so `slots` is the peak number of live blocks.
Replays `alloc` and `free_completed` of the device with the most events (the
allocator's input, DESIGN.md); frees of blocks allocated before the trace
began are dropped. Streams are not kept: the bench replays on one stream.

    python3 trace_to_events.py TRACE.pickle.gz OUT.bin
"""
import gzip
import pickle
import struct
import sys


def convert(src, dst):
    with gzip.open(src, "rb") as f:
        snap = pickle.load(f)
    traces = snap["device_traces"] if isinstance(snap, dict) else snap
    trace = max(traces, key=len)
    live, free_slots, out = {}, [], []
    nslots = allocs = 0
    for e in trace:
        act = e.get("action")
        if act == "alloc":
            slot = free_slots.pop() if free_slots else nslots
            if slot == nslots:
                nslots += 1
            live[e["addr"]] = slot
            out.append(struct.pack("<IIQ", 0, slot, int(e["size"])))
            allocs += 1
        elif act == "free_completed":
            slot = live.pop(e["addr"], None)
            if slot is None:
                continue
            free_slots.append(slot)
            out.append(struct.pack("<IIQ", 1, slot, 0))
    with open(dst, "wb") as f:
        f.write(b"GMEV0001")
        f.write(struct.pack("<QQ", len(out), nslots))
        f.write(b"".join(out))
    return len(out), nslots, allocs


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: trace_to_events.py TRACE.pickle.gz OUT.bin")
    n, s, a = convert(sys.argv[1], sys.argv[2])
    print("%s: %d events (%d allocs), %d slots" % (sys.argv[2], n, a, s))
