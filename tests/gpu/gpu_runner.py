"""The loop the GPU test scripts share (test_torch_dropin.py, test_graphs.py,
test_interop.py): their command line, the allocator line they start with, the
loop over their tests with one printed line each, the summary line and the
JSON file.

    only, jpath = parse_args(sys.argv[1:], "test_graphs.py")
    mode = allocator_mode(installed)               # prints "torch V, GPU G, allocator: M"
    return run_tests(TESTS, only, jpath, lambda results: {"mode": mode, "results": results}, width=26)
and inside it
    status, detail, seconds = run_one(test)       # PASS | SKIP | FAIL
    nfail = summary(results)                       # prints "== N passed, ..."
"""
import json
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


def allocator_mode(installed):
    """Print the run's first line, "torch V, GPU G, allocator: M", and return M: "native", or
    "gpumem CONF (MODE)" when gpumem is torch's allocator in this process (installed)."""
    import torch
    mode = "native"
    if installed:
        import gpumem.torch as gt
        mode = "gpumem %s (%s)" % (gt.status()["conf"] or "default", gt.status()["mode"])
    print("torch %s, GPU %s, allocator: %s" % (torch.__version__, torch.cuda.get_device_name(0), mode), flush=True)
    return mode


def run_tests(tests, only, jpath, doc, width, cut=300, before=None, fields=None):
    """Run each test function test_NAME of tests that only names (all when only is None):
    before() first, then the test (run_one); its result {"test": NAME, "status", "detail",
    "seconds"} plus the keys of fields(NAME), and one printed line (NAME width wide, the detail
    cut at cut characters). Then the summary and, with jpath, the JSON doc(results) written
    there. Returns the exit status: 1 if any test failed, else 0."""
    results = []
    for t in tests:
        name = t.__name__[5:]
        if only and name not in only:
            continue
        if before:
            before()
        status, detail, dt = run_one(t)
        result = {"test": name, "status": status, "detail": detail, "seconds": round(dt, 1)}
        if fields:
            result.update(fields(name))
        results.append(result)
        print("%-4s %-*s %5.1fs  %s" % (status, width, name, dt, detail[:cut]), flush=True)
    nfail = summary(results)
    if jpath:
        with open(jpath, "w") as f:
            json.dump(doc(results), f, indent=1)
    return 1 if nfail else 0
