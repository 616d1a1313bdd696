#!/usr/bin/env python3
"""first_pass_cost.py — model the device time of a replay's device calls on an
H200: sum over calls of the per-call cost measured by bench/vmm_cost.c
(medians of its H200 run, table in bench/RESULTS.md), interpolated in log(size) between the
measured sizes (2, 16, 128, 1024 MiB; clamped outside). A map is cuMemMap +
cuMemSetAccess (the cuda backend makes both per map call); device_alloc /
device_free are cuMemAlloc / cuMemFree (what torch's cudaMalloc pays).

Input: the JSON of `gpumem replay ... --json` (needs "device_call_sizes").
Usage:
  first_pass_cost.py REPLAY.json [...]            one line per file
  gpumem replay T --policy gpumem --json | first_pass_cost.py -
Output per file: modelled ms in total and by kind.
"""
import json
import math
import sys

MIB = 1 << 20
SIZES = [2 * MIB, 16 * MIB, 128 * MIB, 1024 * MIB]
# microseconds per call at SIZES (H200, tests/gpu/vmm_cost.sh medians)
COST_US = {
    "phys_create": [10.30, 11.13, 14.81, 58.49],
    "map": [0.82 + 24.30, 0.89 + 26.02, 1.06 + 46.23, 1.42 + 82.87],
    "unmap": [16.85, 17.64, 26.40, 36.54],
    "phys_release": [12.55, 23.94, 80.70, 590.54],
    "device_alloc": [46.14, 46.30, 61.01, 183.91],
    "device_free": [37.53, 50.63, 107.23, 590.75],
}


def cost_us(kind, size):
    """Per-call cost of one `kind` call of `size` bytes."""
    c = COST_US[kind]
    if size <= SIZES[0]:
        return c[0]
    if size >= SIZES[-1]:
        return c[-1] * size / SIZES[-1] if kind == "phys_release" else c[-1]
    for i in range(len(SIZES) - 1):
        if size <= SIZES[i + 1]:
            t = (math.log(size) - math.log(SIZES[i])) / (math.log(SIZES[i + 1]) - math.log(SIZES[i]))
            return c[i] + t * (c[i + 1] - c[i])
    return c[-1]


def model(d):
    """{kind: ms} and the total, from one replay JSON object."""
    sized = d.get("device_call_sizes")
    if sized is None:
        raise SystemExit("no device_call_sizes in the replay JSON (needs a newer gpumem)")
    out = {}
    for kind, buckets in sized.items():
        us = 0.0
        for _, (n, nbytes) in buckets.items():
            if n:
                us += n * cost_us(kind, nbytes / n)  # the bucket's mean size
        out[kind] = us / 1000.0
    return out, sum(out.values())


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for path in argv[1:]:
        text = sys.stdin.read() if path == "-" else open(path).read()
        for line in text.splitlines():
            if not line.strip().startswith("{"):
                continue
            d = json.loads(line)
            by, total = model(d)
            parts = " ".join("%s %.2f" % (k, v) for k, v in by.items() if v)
            name = d.get("trace", path).rsplit("/", 1)[-1].replace(".pickle.gz", "")
            print("%s %s model_ms %.3f (%s)" % (name, d.get("policy", "?"), total, parts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
