#!/usr/bin/env python3
"""dump_trace.py — throwaway helper for the gpumem policy work: turn a PyTorch
memory snapshot (pickle, gzip) into the plain-text event list that
tools/gmpol/replay.c reads, until `gpumem replay` exists.

Output lines:  a ADDR SIZE STREAM   (alloc, size = requested bytes)
               f ADDR               (free_completed)
Usage: dump_trace.py SNAPSHOT.pickle.gz OUT.txt [device]"""
import gzip, pickle, sys

def main():
    src, dst = sys.argv[1], sys.argv[2]
    dev = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rb") as f:
        snap = pickle.load(f)
    n = 0
    with open(dst, "w") as out:
        for e in snap["device_traces"][dev]:
            act = e["action"]
            if act == "alloc":
                out.write("a %d %d %d\n" % (e["addr"], e["size"], e["stream"]))
                n += 1
            elif act == "free_completed":
                out.write("f %d\n" % e["addr"])
                n += 1
    print("%s: %d events" % (dst, n))

if __name__ == "__main__":
    main()
