#!/usr/bin/env python3
"""check_doc_figures.py — every measured figure README.md and docs/*.md quote
is one bench/RESULTS.md (or bench/gpumem_policy_tradeoff.md, the measured
trade-off RESULTS points to) holds, so the docs cannot drift from the
measurements again (issue 42: "157 s" where the suite took 76-79 s).

A figure is a number with a unit of measure: "1.009x", "5.8x", "172 ms",
"157 s", "8.38 GiB", "96.04 MiB", "0.2%", or a range of them ("1.05–1.21x").
It is found when the results hold the same number, or one that rounds to it
at the figure's precision (1.0724 for "1.072"), two digits more at most;
seconds ("N s", a duration: the unit docs drift in) must be written with the
unit there too. Not figures: text in code spans and code blocks (commands,
example output), bounds and approximations ("~2 s", "<1 s", "up to"), and
the limits, constants and examples listed in NOT_MEASURED with the reason.

usage: check_doc_figures.py [--root DIR]   exit 1 and one line per figure not found
       check_doc_figures.py --self-test    a planted stale figure must fail
"""
import glob
import os
import re
import sys
from decimal import ROUND_HALF_UP, Decimal

import check_tree

SOURCES = ["bench/RESULTS.md", "bench/gpumem_policy_tradeoff.md"]
UNIT = r"(x|ms|s|GiB|MiB|%)"
NUM = r"(\d+(?:\.\d+)?)"
FIGURE = re.compile(r"(?<![\w.\-–~<>≤≥])" + NUM + r"(?:\s?[–-]\s?" + NUM + r")?\s?" + UNIT + r"(?![\w])")
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
CODE = re.compile(r"```.*?```|`[^`]{0,400}?`", re.S)

# (file, figure as written): why it is not a measurement
NOT_MEASURED = {
    ("docs/RELIABILITY.md", "10 s"): "limits (GM_LIMIT_HTTP_TIMEOUT_S) and a test's length",
    ("docs/RELIABILITY.md", "30 s"): "a limit (GM_LIMIT_HTTP_REQUEST_S)",
    ("docs/RELIABILITY.md", "5 s"): "a test's length, as its table lists them",
    ("docs/RELIABILITY.md", "7 s"): "a test's length, as its table lists them",
    ("docs/RELIABILITY.md", "20 s"): "a test's length, as its table lists them",
    ("docs/estimate.md", "250 MiB"): "torch DDP's constant (_sync_module_states' buffers)",
    ("docs/allocator.md", "0.1-1.5 s"): "the plan's stall, bench/gpumem_policy_tradeoff.md in words",
}


def strip_code(text):
    """Code spans and blocks blanked, newlines kept (line numbers stay)."""
    return CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def figures(text):
    for m in FIGURE.finditer(strip_code(text)):
        yield m, [n for n in m.groups()[:2] if n], m.group(3)


def measured(texts):
    """Every number of the results, and those written as seconds."""
    numbers, seconds = set(), set()
    for t in texts:
        numbers.update(Decimal(n) for n in NUMBER.findall(t))
        for _, nums, unit in figures(t):
            if unit == "s":
                seconds.update(Decimal(n) for n in nums)
    return numbers, seconds


def found(n, pool):
    d = Decimal(n)
    if d in pool:
        return True
    e = d.as_tuple().exponent
    q = Decimal(1).scaleb(e)
    return any(e - 2 <= v.as_tuple().exponent < e and v.quantize(q, rounding=ROUND_HALF_UP) == d for v in pool)


def check(root):
    texts = []
    for s in SOURCES:
        with open(os.path.join(root, s), encoding="utf-8") as f:
            texts.append(f.read())
    numbers, seconds = measured(texts)
    bad = []
    docs = ["README.md"] + sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    for doc in docs:
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            text = f.read()
        for m, nums, unit in figures(text):
            fig = m.group(0)
            if (doc, fig) in NOT_MEASURED:
                continue
            pool = seconds if unit == "s" else numbers
            if not all(found(n, pool) for n in nums):
                bad.append("%s:%d: '%s' is not in %s" % (doc, text.count("\n", 0, m.start()) + 1, fig,
                                                          " or ".join(SOURCES)))
    return bad


def self_test():
    import tempfile  # noqa: PLC0415
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "bench"))
        os.makedirs(os.path.join(d, "docs"))
        files = {
            "bench/RESULTS.md": "took 79 s; ratio 1.0724 and 5.8x; step 188.5 ms\n",
            "bench/gpumem_policy_tradeoff.md": "1.0016\n",
            "README.md": "It took 79 s, 1.072x, 5.8x, 189 ms, 1.0016-1.0724x; `157 s` is code.\n",
            "docs/a.md": "~3 s and <1 s are bounds.\n",
        }
        for p, t in files.items():
            with open(os.path.join(d, p), "w", encoding="utf-8") as f:
                f.write(t)
        bad = check(d)
        assert not bad, bad
        with open(os.path.join(d, "docs", "a.md"), "a", encoding="utf-8") as f:
            f.write("The suite took 157 s.\nIt holds 1.073x.\nIt took 188.5 s.\n")
        got = sorted(b.split("'")[1] for b in check(d))
        assert got == ["1.073x", "157 s", "188.5 s"], got
    print("ok: a stale figure, a figure off by a rounding and a number in the wrong unit are refused")


def main():
    return check_tree.run(
        __doc__, check, self_test,
        lambda n, root: "%d figure(s) in the docs are not measurements bench/RESULTS.md holds: record the "
        "measurement there (date, machine, commit, command), then quote it; a limit or constant goes in "
        "NOT_MEASURED in %s" % (n, os.path.relpath(__file__, root)),
        "ok: every figure README.md and docs/*.md quote is in %s" % " or ".join(SOURCES))


if __name__ == "__main__":
    sys.exit(main())
