#!/usr/bin/env python3
"""tradeoff.py — the gpumem policy's memory / device-call trade-off table
(bench/gpumem_policy_tradeoff.md): replays each trace 4 times in a row
through the front end (tools/gmpol/replay, sim backend, Release -O2 build)
for several gpumem_slack values, plus the torch policy for reference, and
prints a markdown table.

Usage: tradeoff.py REPLAY_BINARY TRACE.txt... [--slacks 0,0.01,0.02,0.05,inf]
       [--extra CONF] (an extra conf string appended to every gpumem run)
Trace texts come from tools/gmpol/dump_trace.py."""
import os, subprocess, sys


def run(replay, trace, policy, conf):
    cmd = [replay, trace, "--passes", "4", "--policy", policy]
    if conf:
        cmd += ["--conf", conf]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0].isdigit():
            # pass peak_req peak_res ratio ns/op p50 p99 p999 create map unmap release malloc free
            rows[int(f[0])] = dict(ratio=float(f[3]), ns=float(f[4]), create=int(f[8]), map=int(f[9]),
                                   unmap=int(f[10]), release=int(f[11]), malloc=int(f[12]),
                                   free=int(f[13]))
    return rows


def calls(r):
    return "%d/%d/%d/%d" % (r["create"] + r["malloc"], r["map"], r["unmap"], r["release"] + r["free"])


def main():
    args = sys.argv[1:]
    slacks = ["0", "0.01", "0.02", "0.05", "inf"]
    extra = ""
    if "--slacks" in args:
        i = args.index("--slacks")
        slacks = args[i + 1].split(",")
        del args[i:i + 2]
    if "--extra" in args:
        i = args.index("--extra")
        extra = args[i + 1]
        del args[i:i + 2]
    replay, traces = args[0], args[1:]
    print("| trace | setting | ratio pass 1 | ratio passes 2-4 (max) | calls pass 1 | calls pass 3 "
          "| ns/op warm (pass 2-3 mean) |")
    print("|---|---|---|---|---|---|---|")
    for t in traces:
        name = os.path.basename(t).rsplit(".", 1)[0]
        confs = [("torch", "", "torch (default)")]
        for s in slacks:
            c = "gpumem_slack:" + s + ("," + extra if extra else "")
            confs.append(("gpumem", c, "gpumem " + c))
        for policy, conf, label in confs:
            r = run(replay, t, policy, conf)
            warm = max(r[p]["ratio"] for p in (2, 3, 4))
            ns = (r[2]["ns"] + r[3]["ns"]) / 2
            print("| %s | %s | %.4f | %.4f | %s | %s | %.0f |" % (
                name, label, r[1]["ratio"], warm, calls(r[1]), calls(r[3]), ns))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
