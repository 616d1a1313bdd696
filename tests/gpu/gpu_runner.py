"""The loop the GPU test scripts share (test_torch_dropin.py, test_graphs.py):
their command line, one test run with its status, and the summary line.

    only, jpath = parse_args(sys.argv[1:], "test_graphs.py")
    status, detail, seconds = run_one(test)       # PASS | SKIP | FAIL
    nfail = summary(results)                       # prints "== N passed, ..."
"""
import sys
import time
import traceback


def parse_args(args, prog):
    """(only: a set of test names or None, jpath: the JSON path or None) from
    [--only a,b] [--json FILE]; exits 2 with the usage on anything else."""
    args = list(args)
    only, jpath = None, None
    while args:
        a = args.pop(0)
        if a == "--only" and args:
            only = set(args.pop(0).split(","))
        elif a == "--json" and args:
            jpath = args.pop(0)
        else:
            print("usage: %s [--only a,b] [--json FILE]" % prog, file=sys.stderr)
            sys.exit(2)
    return only, jpath


def run_one(test):
    """Run one test function: ("PASS" | "SKIP" | "FAIL", detail, seconds). A
    test returns a detail string (one starting with SKIP skips) or raises."""
    t0 = time.time()
    try:
        detail = test() or ""
        status = "SKIP" if str(detail).startswith("SKIP") else "PASS"
    except Exception as e:  # noqa: BLE001 (a failing test is reported, the rest still run)
        status, detail = "FAIL", "%s: %s" % (type(e).__name__, e)
        traceback.print_exc()
    return status, str(detail), time.time() - t0


def summary(results):
    """Print the "== N passed, N failed, N skipped" line; return the failures."""
    count = {s: sum(r["status"] == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    print("== %d passed, %d failed, %d skipped" % (count["PASS"], count["FAIL"], count["SKIP"]))
    return count["FAIL"]
