#!/usr/bin/env python3
"""plan_hostile.py — write a .gmt trace that makes the gpumem plan lay out
again and again around many live large blocks.

The shape: W large blocks allocated first and kept to the end (the
obstacles every layout goes around), then training steps of P large blocks
each, allocated in order and freed in reverse at the step's end. The steps
repeat exactly, so the plan learns them and lays two out; the last step of
every cycle of C is longer than any before (each block grows by one to three
512-byte units), so the plan drops and is made again once the steps repeat.
Each layout costs about the intervals x the obstacles; without a bound on
the planner's work the run's cost grows as (live large blocks) x (layouts).
(`--cycle 2` is the shape that made the removed elastic plans lay out at
every other step; bench/RESULTS.md, "planner work budget".)

Deterministic: the same arguments write the same bytes (the seed picks the
blocks' base sizes). The format: docs/trace-format.md.

usage: plan_hostile.py OUT.gmt [--events N] [--obstacles W] [--step P] [--cycle C] [--seed S]
"""
import argparse
import random
import struct
import zlib

MIB = 1 << 20


def varint(out, v):
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def zigzag(n):
    return (n << 1) ^ (n >> 63) if n >= 0 else ((-n) << 1) - 1


def events(nevents, nobs, step, cycle, seed):
    """(action, addr, size) tuples: 0 alloc, 2 free_completed."""
    rng = random.Random(seed)
    ev = []
    addr = 1 << 40
    def place(size):
        nonlocal addr
        a = addr
        addr += (size + MIB - 1) // MIB * MIB + MIB  # a fresh address per block
        return a
    for _ in range(nobs):  # kept to the end: the obstacles
        size = MIB + 512 * rng.randint(1, 256)
        ev.append((0, place(size), size))
    base = [MIB + 512 * rng.randint(1, 64) for _ in range(step)]
    longest, s = 0, 0
    while len(ev) + 2 * step <= nevents:
        grow = s % cycle == cycle - 1
        if grow:
            longest += 1
        length = longest if grow else 0
        blocks = []
        for k in range(step):
            size = base[k] + 512 * length * (1 + k % 3)
            a = place(size)
            blocks.append(a)
            ev.append((0, a, size))
        for a in reversed(blocks):
            ev.append((2, a, 0))
        s += 1
    return ev


def write(path, ev):
    body = bytearray()
    for v in (0, 0, 0, 0, len(ev), 0):  # no strings, frames, stacks, segments, settings
        varint(body, v)
    prev_addr = 0
    first = True
    for t, (action, a, size) in enumerate(ev):
        varint(body, action | (0x10 if first else 0))  # stream 0 given once
        varint(body, zigzag(a - prev_addr))
        varint(body, size)
        if first:
            varint(body, 0)
            first = False
        varint(body, zigzag(1))  # time_us: one microsecond apart
        prev_addr = a
    varint(body, len(ev))
    with open(path, "wb") as f:
        f.write(b"GMTRACE\0" + struct.pack("<IIQ", 1, 0, len(body)))
        f.write(zlib.compress(bytes(body), 9))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--events", type=int, default=244800)
    ap.add_argument("--obstacles", type=int, default=2000)
    ap.add_argument("--step", type=int, default=64)
    ap.add_argument("--cycle", type=int, default=6, help="steps per cycle; the last is longer than any before")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.cycle < 2:
        ap.error("--cycle must be at least 2 (a cycle needs a step that repeats)")
    ev = events(a.events, a.obstacles, a.step, a.cycle, a.seed)
    write(a.out, ev)
    print("%s: %d events, %d obstacles, steps of %d" % (a.out, len(ev), a.obstacles, a.step))


if __name__ == "__main__":
    main()
