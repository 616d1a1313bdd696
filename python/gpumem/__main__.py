"""python -m gpumem run ... (see gpumem/run.py)."""
import sys

from .run import main


def _dispatch(argv):
    if argv and argv[0] == "run":
        return main(argv[1:])
    sys.stderr.write("usage: python -m gpumem run [--conf STR] [--native] [--label L] [--] COMMAND [ARGS...]\n")
    return 0 if argv and argv[0] in ("-h", "--help") else 2


sys.exit(_dispatch(sys.argv[1:]))
