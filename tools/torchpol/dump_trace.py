#!/usr/bin/env python3
"""dump_trace.py - dev tool for the torch policy: write a PyTorch memory
snapshot's device trace as text lines the replay driver (replay_torch.c)
reads: "a ADDR SIZE STREAM" (alloc), "f ADDR STREAM" (free_completed),
"s ADDR SIZE STREAM" (segment_alloc), "S ADDR SIZE STREAM" (segment_free),
"m"/"u" for segment_map/unmap. Other actions are skipped.
Usage: dump_trace.py TRACE.pickle.gz OUT.txt"""
import gzip, pickle, sys

def main():
    src, dst = sys.argv[1], sys.argv[2]
    d = pickle.load(gzip.open(src))
    code = {"alloc": "a", "free_completed": "f", "segment_alloc": "s",
            "segment_free": "S", "segment_map": "m", "segment_unmap": "u"}
    with open(dst, "w") as out:
        for dev, trace in enumerate(d["device_traces"]):
            for e in trace:
                c = code.get(e["action"])
                if c is None:
                    continue
                if c == "f":
                    out.write("f %d %d\n" % (e["addr"], e["stream"]))
                else:
                    out.write("%s %d %d %d\n" % (c, e["addr"], e["size"], e["stream"]))

if __name__ == "__main__":
    main()
