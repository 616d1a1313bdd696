#!/usr/bin/env python3
"""check_layers.py — the layer check (docs/architecture.md states the rules).

Fails (exit 1) on an #include or a call that goes up a layer:

  includes  every quoted #include in src/ (resolved as the build does: the
            file's folder, src/, src/core/, include/);
  calls     every undefined symbol of the library's object files (nm) that
            another object defines, so a call made through an inline
            function of a header counts in the file that includes it.

The layers, bottom to top (a folder may use its own files and any lower
layer; folders on one floor may not use each other):

  0 util      src/util/      errors, hashing tables, UTF-8, JSON strings, bytes
  1 backend   src/backend/   the backend table (table.c) and the backends
  2 core      src/core/      devices, front end, stats, history, config
  3 policy    src/policy/    one folder per policy
  4 trace     src/trace/     traces, replay
  5 estimate, monitor, report
  6 api       src/api/       public entry points that wire layers together
  7 torch, cli

and three narrower rules:

  - The core names no policy: the policy table (src/policy/table.c, on the
    policy floor) lends the policies to the core's registry (core/policy.c)
    when the library loads.
  - The core and the policies reach a backend only through the backend
    table (src/backend/table.c); the backends themselves are for the layers
    that make one (gm_sim_create, gm_cuda_create).
  - Inside a policy, files call downwards only, in the order POLICY_FLOORS
    lists (bottom first).
  - A symbol the library defines as gm_NAME is public: a header in
    include/gpumem/ declares it; an internal one is named gm__NAME.

usage: check_layers.py [--src DIR] [--objects DIR_OR_FILE...] [--report]
                      [--max-up N] [--max-loops N]
       check_layers.py --self-test
--report also prints the counts the issue asks for: upward dependencies,
loops (groups of files that call each other), functions over 100 and over
150 lines, and the file graph of the allocator's floors (util, backend,
core, policy: includes, calls, and calls from a header's inline code; a
header and the .c named after it one node): its edges up a floor and its
loops. --max-up and --max-loops fail the check when the file graph has
more (CTest gives the limits). Functions over 150 lines fail the check too.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

FLOORS = {"util": 0, "backend": 1, "core": 2, "policy": 3, "trace": 4,
          "estimate": 5, "monitor": 5, "report": 5, "api": 6, "torch": 7, "cli": 7}
POLICY_FLOORS = {
    "policy/torch": ["tree", "expandable", "check", "torch"],
    "policy/gpumem": ["mem/base", "mem/chunks", "place/plain", "place/va", "place/arena", "plan/park", "plan/layout_check",
                      "plan/layout", "plan/plan", "plan/plan_check", "check", "gpumem"],
}
BACKEND_TABLE = "backend/table"
MAX_FUNCTION_LINES = 150


def folder(rel):
    """'core/allocator.c' -> 'core'; None outside the layers (public headers)."""
    top = rel.split("/")[0]
    return top if top in FLOORS else None


def policy_of(rel):
    for p in POLICY_FLOORS:
        if rel.startswith(p + "/"):
            return p
    return None


def policy_rank(rel):
    p = policy_of(rel)
    if not p:
        return None
    stem = os.path.splitext(rel[len(p) + 1:])[0]
    return POLICY_FLOORS[p].index(stem) if stem in POLICY_FLOORS[p] else None


def may_use(src, dst, symbol=None, include=False):
    """None if src (a path under src/) may use dst, else why not."""
    a, b = folder(src), folder(dst)
    if a is None or b is None or src == dst:
        return None
    if a == "core" and b == "policy":
        return "the core names no policy: the policy table (src/policy/table.c) lends them (gm__policy_lend)"
    if b == "backend" and a in ("core", "policy") and not dst.startswith(BACKEND_TABLE) \
            and not dst.startswith("backend/backend.h"):
        return "the %s reaches a backend only through the backend table (%s)" % (a, BACKEND_TABLE)
    if a == b:
        p = policy_of(src)
        if p and symbol is not None and policy_of(dst) == p:
            rs, rd = policy_rank(src), policy_rank(dst)
            if rs is None or rd is None:
                return "%s: every file of the policy must be on a floor (POLICY_FLOORS)" % p
            if rd > rs:
                return "inside %s calls go down only (%s is above %s)" % (p, dst, src)
        return None
    if FLOORS[b] < FLOORS[a]:
        return None
    if FLOORS[b] == FLOORS[a]:
        return "%s and %s are on one floor: neither may use the other" % (a, b)
    return "%s is above %s" % (b, a)


# ---- includes -----------------------------------------------------------------

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def source_files(src):
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith((".c", ".h", ".cpp")):
                yield os.path.relpath(os.path.join(dirpath, f), src)


def resolve(src, rel, inc):
    for base in (os.path.dirname(rel), "", "core"):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(src, cand)):
            return cand
    return None  # a public header (include/) or a generated file


def include_edges(src):
    for rel in source_files(src):
        with open(os.path.join(src, rel), errors="replace") as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            dst = resolve(src, rel, m.group(1))
            if dst:
                yield rel, dst, m.group(1)


# ---- calls (nm over the object files) -------------------------------------------

def object_files(paths):
    for p in paths:
        if os.path.isdir(p):
            for dirpath, _, files in os.walk(p):
                for f in sorted(files):
                    if f.endswith(".o"):
                        yield os.path.join(dirpath, f)
        elif p.endswith(".o"):
            yield p


def source_of(obj):
    """.../gpumem_obj.dir/src/core/allocator.c.o -> core/allocator.c"""
    m = re.search(r"(?:^|/)src/(.+?)\.o$", obj.replace(os.sep, "/"))
    return m.group(1) if m else None


def call_edges(objs, src, defs_out=None):
    defs, undef = {}, {}
    for o in objs:
        rel = source_of(o)
        # objects of sources since moved or deleted stay in a build tree
        if not rel or not folder(rel) or not os.path.isfile(os.path.join(src, rel)):
            continue
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        u = undef.setdefault(rel, set())
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBRVW":
                defs[parts[2]] = rel
            elif len(parts) == 2 and parts[0] == "U":
                u.add(parts[1])
    if defs_out is not None:
        defs_out.update(defs)
    for rel, syms in undef.items():
        for s in sorted(syms):
            if s in defs and defs[s] != rel:
                yield rel, defs[s], s


# ---- long functions ---------------------------------------------------------------

FUNC_START = re.compile(r"^[A-Za-z_][\w \t*,]*?\b([A-Za-z_]\w*)\s*\(")


def long_functions(src):
    """(file, line, name, lines) of every function defined in a .c file: a
    line at column 0 that opens a parameter list, then its body up to the
    '}' at column 0 (the project's formatting: clang-format, K&R braces)."""
    for rel in source_files(src):
        if not rel.endswith((".c", ".cpp")):
            continue
        with open(os.path.join(src, rel), errors="replace") as f:
            lines = f.read().split("\n")
        i = 0
        while i < len(lines):
            m = FUNC_START.match(lines[i])
            if not m or lines[i].startswith(("typedef", "struct ", "enum ", "union ")) or \
                    "=" in lines[i].split("(")[0]:
                i += 1
                continue
            j = i
            while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
                j += 1
            if j >= len(lines) or "{" not in lines[j]:
                i = j + 1
                continue
            k = j
            if not lines[j].rstrip().endswith("}"):
                k = j + 1
                while k < len(lines) and not lines[k].startswith("}"):
                    k += 1
            yield rel, i + 1, m.group(1), k - i + 1
            i = k + 1


# ---- the file graph ----------------------------------------------------------------
# Files (.c and .h) as nodes; an edge for every #include, every call between
# object files, and every call an inline function or macro of a header makes
# into a .c file (nm counts that call in the file including the header; here
# it is also the header's); a header and the .c named after it are one
# node. Counted: edges that go up a floor (the layers, then POLICY_FLOORS
# inside a policy; a header not named after a .c takes the lowest floor of
# the files it declares) and loops.

CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"", re.S)


def header_calls(text):
    """Names a header calls: in a function body (brace depth >= 1 outside
    a struct) or in a macro's replacement text."""
    text = COMMENT.sub(" ", text)
    out, depth, kinds = set(), 0, []
    lines = text.split("\n")
    for line in lines:
        if line.lstrip().startswith("#"):
            m = re.match(r"\s*#\s*define\s+\w+(\([^)]*\))?(.*)", line)
            if m:
                out.update(CALL.findall(m.group(2)))
            continue
        pos = 0
        for m in re.finditer(r"[{}]|\b[A-Za-z_]\w*\s*\(", line):
            tok = m.group(0)
            if tok == "{":
                before = line[:m.start()].rstrip()
                kinds.append("body" if depth == 0 and (before.endswith(")") or not before) and
                             not re.search(r"\b(struct|union|enum)\b", line[:m.start()]) else
                             (kinds[-1] if kinds else "data"))
                depth += 1
            elif tok == "}":
                depth = max(0, depth - 1)
                if kinds:
                    kinds.pop()
            elif depth and kinds and kinds[-1] == "body":
                out.add(CALL.match(tok).group(1))
    return out


def file_floor(rel, decl_of, included_by):
    """(layer, rank inside a policy) of a file. A header takes the floor of
    the .c named after it, else the lowest of the .c files it declares, else
    the lowest of the files including it. The policy floor's files outside
    a policy's folder (the policy table) are above the policies."""
    layer = FLOORS[folder(rel)]
    p = policy_of(rel)
    if not p:
        return (layer, 1000 if folder(rel) == "policy" else 0)
    stem = os.path.splitext(rel[len(p) + 1:])[0]
    if stem in POLICY_FLOORS[p]:
        return (layer, POLICY_FLOORS[p].index(stem))
    ranks = [policy_rank(c) for c in decl_of.get(rel, ()) if policy_rank(c) is not None and policy_of(c) == p]
    if not ranks:
        ranks = [file_floor(f, decl_of, included_by)[1] for f in included_by.get(rel, ()) if policy_of(f) == p]
    return (layer, min(ranks) if ranks else 0)


def file_graph(src, calls, defs):
    """(edges, floors): every include, call, and call from a header's inline
    code, between files of the allocator's floors (util, backend, core,
    policy: what a size from gm_malloc to the device crosses)."""
    def inside(f):
        return folder(f) and FLOORS[folder(f)] <= FLOORS["policy"]
    edges = set()
    included_by = collections.defaultdict(set)
    for a, b, _ in include_edges(src):
        if inside(a) and inside(b):
            edges.add((a, b))
            included_by[b].add(a)
    for a, b, _ in calls:
        if inside(a) and inside(b):
            edges.add((a, b))
    decl_of = collections.defaultdict(set)
    for rel in source_files(src):
        if not rel.endswith(".h") or not inside(rel):
            continue
        with open(os.path.join(src, rel), errors="replace") as f:
            text = f.read()
        called = header_calls(text)
        for name in set(CALL.findall(COMMENT.sub(" ", text))):
            if name in defs:
                if name in called:
                    edges.add((rel, defs[name]))
                decl_of[rel].add(defs[name])
    # a header and the .c named after it are one node: its interface, whose
    # inline code may call its own file
    def node(f):
        c = f[:-2] + ".c"
        return c if f.endswith(".h") and os.path.isfile(os.path.join(src, c)) else f
    edges = {(node(a), node(b)) for a, b in edges if node(a) != node(b)}
    files = {x for e in edges for x in e}
    floors = {f: file_floor(f, decl_of, included_by) for f in files}
    return edges, floors


# ---- loops ------------------------------------------------------------------------

def loops(edges):
    """Groups of two or more files that call each other (strongly connected)."""
    g = collections.defaultdict(set)
    for a, b in edges:
        if a != b:
            g[a].add(b)
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(g):
        if v not in index:
            visit(v)
    return out


def public_names(src):
    """Every gm_ name the public headers (include/gpumem/*.h) mention."""
    inc = os.path.join(src, "..", "include", "gpumem")
    names = set()
    if os.path.isdir(inc):
        for h in os.listdir(inc):
            if h.endswith(".h"):
                with open(os.path.join(inc, h)) as f:
                    names.update(re.findall(r"\bgm_\w+", f.read()))
    return names


def check(src, objs, report, max_up=None, max_loops=None):
    bad = []
    upward = set()
    for a, b, inc in include_edges(src):
        why = may_use(a, b, include=True)
        if why:
            bad.append("%s: #include \"%s\": %s" % (a, inc, why))
            upward.add((a, b))
    defs = {}
    calls = list(call_edges(objs, src, defs))
    for a, b, s in calls:
        why = may_use(a, b, symbol=s)
        if why:
            bad.append("%s: calls %s (%s): %s" % (a, s, b, why))
            upward.add((a, b))
    funcs = list(long_functions(src))
    public = public_names(src)
    for s in sorted(defs):
        if re.match(r"gm_[^_]", s) and s not in public:
            bad.append("%s: defines %s, which no header in include/gpumem/ declares: "
                       "an internal symbol is named gm__%s" % (defs[s], s, s[3:]))
    for rel, line, name, n in funcs:
        if n > MAX_FUNCTION_LINES:
            bad.append("%s:%d: %s has %d lines (at most %d)" % (rel, line, name, n, MAX_FUNCTION_LINES))
    if objs and (report or max_up is not None or max_loops is not None):
        edges, floors = file_graph(src, calls, defs)
        up = sorted((a, b) for a, b in edges if floors[b] > floors[a])
        fgroups = loops(edges)
        if report:
            print("file graph of util, backend, core, policy (includes, calls, calls from headers' inline code):"
                  " %d files, %d edges" %
                  (len(floors), len(edges)))
            print("file graph edges up a floor: %d" % len(up))
            for a, b in up:
                print("  up: %s -> %s" % (a, b))
            print("file graph loops: %d" % len(fgroups))
            for grp in fgroups:
                print("  loop: " + " ".join(grp))
        if max_up is not None and len(up) > max_up:
            bad.append("the file graph has %d edges up a floor (at most %d; --report lists them)" % (len(up), max_up))
        if max_loops is not None and len(fgroups) > max_loops:
            bad.append("the file graph has %d loops (at most %d; --report lists them)" % (len(fgroups), max_loops))
    for b in bad:
        print("layer check: " + b)
    if report:
        groups = loops((a, b) for a, b, _ in calls)
        print("upward dependencies (file pairs): %d" % len(upward))
        print("loops (groups of files calling each other): %d" % len(groups))
        for grp in groups:
            print("  loop: " + " ".join(grp))
        for limit in (100, 150):
            over = sorted((n, "%s:%d %s" % (r, l, f)) for r, l, f, n in funcs if n > limit)
            print("functions over %d lines: %d" % (limit, len(over)))
            for n, where in reversed(over):
                print("  %4d %s" % (n, where))
    if not objs:
        print("layer check: no object files given (--objects): calls not checked", file=sys.stderr)
    print("layer check: %s (%d includes and %d calls between files looked at)" %
          ("FAILED" if bad else "ok", sum(1 for _ in include_edges(src)), len(calls)))
    return 1 if bad else 0


def self_test():
    """A planted upward include and a planted upward call must each fail
    the check; the same tree without them must pass."""
    tmp = tempfile.mkdtemp(prefix="check_layers.")
    try:
        src = os.path.join(tmp, "src")
        for d in ("core", "estimate", "monitor"):
            os.makedirs(os.path.join(src, d))

        def write(rel, text):
            with open(os.path.join(src, rel), "w") as f:
                f.write(text)

        def build(rel):
            o = os.path.join(src, rel + ".o")
            subprocess.run(["cc", "-c", "-o", o, os.path.join(src, rel)], check=True)
            return o

        write("estimate/explain.h", "int explain(int x);\n")
        write("estimate/explain.c", '#include "explain.h"\nint explain(int x) { return x + 1; }\n')
        write("core/alloc.c", "int core_alloc(int x) { return x; }\n")
        objs = [build("estimate/explain.c"), build("core/alloc.c")]
        results = {"clean": check(src, objs, False)}
        write("core/alloc.c", '#include "estimate/explain.h"\nint core_alloc(int x) { return x; }\n')
        results["upward include"] = check(src, objs, False)
        write("core/alloc.c", "int explain(int x);\nint core_alloc(int x) { return explain(x); }\n")
        objs[1] = build("core/alloc.c")
        results["upward call"] = check(src, objs, False)
        write("core/alloc.c", "int core_alloc(int x) { return x; }\n")
        objs[1] = build("core/alloc.c")
        write("monitor/m.c", '#include "../estimate/explain.h"\nint m(void) { return 0; }\n')
        results["peer include"] = check(src, objs, False)
        os.remove(os.path.join(src, "monitor/m.c"))
        write("core/loop.c", "int core_alloc(int x);\nint core_loop(int x) { return x ? core_alloc(x - 1) : 0; }\n")
        write("core/alloc.c", "int core_loop(int x);\nint core_alloc(int x) { return core_loop(x); }\n")
        objs[1] = build("core/alloc.c")
        objs.append(build("core/loop.c"))
        results["loop"] = check(src, objs, False, max_up=0, max_loops=0)
        results["loop allowed"] = check(src, objs, False, max_up=0, max_loops=1)
        write("core/alloc.c", "int core_loop(int x);\nint gm_alloc(int x) { return core_loop(x); }\n")
        objs[1] = build("core/alloc.c")
        results["internal gm_"] = check(src, objs, False, max_up=0, max_loops=1)
    finally:
        shutil.rmtree(tmp)
    want = {"clean": 0, "upward include": 1, "upward call": 1, "peer include": 1, "loop": 1, "loop allowed": 0,
            "internal gm_": 1}
    for k, v in want.items():
        print("self-test %-15s exit %d (want %d)%s" % (k, results[k], v, "" if results[k] == v else "  WRONG"))
    return 0 if results == want else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    ap.add_argument("--objects", nargs="*", default=[])
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--max-up", type=int, default=None,
                    help="fail when the file graph has more edges up a floor (needs --objects)")
    ap.add_argument("--max-loops", type=int, default=None,
                    help="fail when the file graph has more loops (needs --objects)")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    return check(os.path.normpath(args.src), list(object_files(args.objects)), args.report,
                 args.max_up, args.max_loops)


if __name__ == "__main__":
    sys.exit(main())
