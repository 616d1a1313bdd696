#!/usr/bin/env python3
"""check_comments.py — no comment in the library's C sources points to an
issue by its number ("issue 41", "issues 42 and 43", "#23"). An issue is
closed and renumbered in nobody's head: a comment says the reason itself,
and a measured number lives in bench/RESULTS.md, which the comment names by
its section heading.

Comments are read as C reads them (string and character literals are not
comments: "#4e79a7" in a style sheet is no issue), with a comment's line
breaks and leading '*' taken as spaces, so "issue\\n * 26" is found too.
Addresses such as github.com/o/r/issues/112 name another project's tracker
and pass.

usage: check_comments.py [--root DIR]   exit 1 and one line per reference
       check_comments.py --self-test    planted references must fail
"""
import os
import re
import sys

import check_tree

EXTENSIONS = (".c", ".h", ".cpp")
TOKENS = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
REFERENCE = re.compile(r"\b[Ii]ssues?\s+#?\d+|(?<![\w&#/])#\d+\b")
BREAK = re.compile(r"[ \t]*\n[ \t]*(?:\*(?!/)[ \t]*|//[ \t]*)?")


def references(text):
    """(line, reference) for each issue reference in text's comments."""
    for m in TOKENS.finditer(text):
        comment = m.group(0)
        if comment[0] in "\"'":
            continue
        # each line break one space, and where each line starts in the result
        pieces = BREAK.split(comment)
        starts = [0]
        for p in pieces[:-1]:
            starts.append(starts[-1] + len(p) + 1)
        first = text.count("\n", 0, m.start()) + 1
        for r in REFERENCE.finditer(" ".join(pieces)):
            yield first + sum(1 for s in starts[1:] if s <= r.start()), r.group(0)


def check(root):
    bad = []
    src = os.path.join(root, "src")
    for d, dirs, files in os.walk(src):
        dirs.sort()
        rel_dir = os.path.relpath(d, root).replace(os.sep, "/") + "/"
        for name in sorted(files):
            if not name.endswith(EXTENSIONS):
                continue
            path = rel_dir + name
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                text = f.read()
            for line, ref in references(text):
                bad.append("%s:%d: '%s'" % (path, line, " ".join(ref.split())))
    return bad


def self_test():
    import tempfile  # noqa: PLC0415
    with tempfile.TemporaryDirectory() as d:
        files = {
            "src/core/a.c": ('/* fine: the reason itself, and "#4e79a7" below is a string */\n'
                             'static const char *c = "#4e79a7 issue 7";\n'
                             "int x; /* github.com/o/r/issues/112 is another project's tracker; pool #x */\n"
                             "#define N 3 /* no reference */\n"),
            "src/policy/gpumem/plan/b.h": "/* the plan's own folder, checked too */\n",
        }
        for p, t in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, p)), exist_ok=True)
            with open(os.path.join(d, p), "w", encoding="utf-8") as f:
                f.write(t)
        bad = check(d)
        assert not bad, bad
        with open(os.path.join(d, "src/core/a.c"), "a", encoding="utf-8") as f:
            f.write("/* a quadratic scan (issue 43, item 4)\n * and the first run of issue\n * 28 */\n"
                    "int y; // see #23\n/* a blank line\n *\n * then issues 42 and 43 */\n")
        with open(os.path.join(d, "src/policy/gpumem/plan/b.h"), "a", encoding="utf-8") as f:
            f.write("/* the planner's work budget (issue 43) */\n")
        got = check(d)
        assert got == ["src/core/a.c:5: 'issue 43'", "src/core/a.c:6: 'issue 28'", "src/core/a.c:8: '#23'",
                       "src/core/a.c:11: 'issues 42'", "src/policy/gpumem/plan/b.h:2: 'issue 43'"], got
    print("ok: issue references in comments are refused, over line breaks too, in every folder of src/; "
          "strings and addresses pass")


def main():
    return check_tree.run(
        __doc__, check, self_test,
        lambda n, root: "%d issue reference(s) in comments under src/: say the reason itself, and point to "
        "bench/RESULTS.md by its section heading for a measured number" % n,
        "ok: no comment under src/ refers to an issue by number")


if __name__ == "__main__":
    sys.exit(main())
