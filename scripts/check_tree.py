"""check_tree.py — the command line the tree checks share (check_doc_figures.py,
check_comments.py): --root DIR (default: this checkout), --self-test; each
finding printed on a line of its own, then what to do, exit 1; else one ok line."""
import argparse
import os


def run(doc, check, self_test, advice, ok):
    """check(root) -> findings; advice(n, root) -> what to do about n of them."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--self-test", action="store_true")
    o = ap.parse_args()
    if o.self_test:
        self_test()
        return 0
    bad = check(o.root)
    for b in bad:
        print(b)
    if bad:
        print(advice(len(bad), o.root))
        return 1
    print(ok)
    return 0
