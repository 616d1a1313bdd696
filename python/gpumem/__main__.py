"""python3 -m gpumem ARGS: the gpumem command (gpumem/_cli.py), e.g.
python3 -m gpumem run -- python3 train.py."""
import sys

from ._cli import main

sys.exit(main())
