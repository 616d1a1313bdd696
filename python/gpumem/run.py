"""gpumem run: run an unmodified PyTorch program on gpumem's allocator.

    gpumem run [--conf STR] [--native] [--label L] [--no-publish] [--] COMMAND [ARGS...]
    python3 -m gpumem run ...           (the same)

Implemented once, in C (src/cli/cmd_run.c, `gpumem run --help`): it puts this
package's _boot folder first on PYTHONPATH, so every Python process COMMAND
starts calls gpumem.torch.install() right after `import torch`, and execs
COMMAND, whose exit status and signals are its own. This module only hands
over to it, for code that called gpumem.run.main().
"""
import sys

from ._cli import main as _gpumem


def main(argv=None):
    return _gpumem(["run"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
