#!/usr/bin/env python3
"""Per precision and optimizer: what the first optimizer step adds (the state
it keeps, measured as the later steps' peak minus the first step's) against
`gpumem estimate`, from the H200 measurements in bench/estimate_measured.json,
with the estimator's parameters and optimizer state per precision.

usage: python3 bench/estimate_states.py [--gpumem build/gpumem]
"""
import argparse, json, os, subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--gpumem", default=os.path.join(os.path.dirname(HERE), "build", "gpumem"))
o = ap.parse_args()
print("%-16s %-14s %-12s %14s %14s %7s %12s %12s" % ("config", "precision", "optimizer", "measured", "estimated",
                                                       "error", "parameters", "opt. state"))
for c in json.load(open(os.path.join(HERE, "estimate_measured.json")))["configs"]:
    # text models without accumulation (whose later steps add no other state)
    if c["model"] not in ("gpt2", "gpt2-medium", "bert-base-uncased") or c.get("oom") or "accum" in c["name"]:
        continue
    a = [o.gpumem, "estimate", "--model", c["model"], "--batch", str(c["batch"]), "--seq", str(c["seq"]),
         "--precision", c["precision"], "--optimizer", c["optimizer"], "--json"]
    a += ["--checkpointing"] if "ckpt" in c["name"] else []
    a += ["--attention", "eager"] if "eager" in c["name"] else []
    j = json.loads(subprocess.run(a, capture_output=True, text=True, check=True).stdout)
    first = max(v["peak"] for v in j["phases"]["first_step"].values())
    later = max(v["peak"] for v in j["phases"]["later_steps"].values())
    meas = c["steps_peak_allocated"][1] - c["steps_peak_allocated"][0]
    cats = j["phases"]["later_steps"]["forward"]["by_category"]
    print("%-16s %-14s %-12s %10.1f MiB %10.1f MiB %+6.1f%% %8.1f MiB %8.1f MiB" % (
        c["name"], c["precision"], c["optimizer"], meas / 2**20, (later - first) / 2**20,
        100.0 * (later - first - meas) / meas, cats["parameters"] / 2**20, cats["optimizer_state"] / 2**20))
