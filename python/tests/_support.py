"""What the package's CPU tests share: the source tree's gpumem on sys.path
(the tests run against it, not an installed copy), and whether
libgpumem_torch.so can be used here, for their skip decorators."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpumem import _lib  # noqa: E402


def unusable(check=None):
    """'' when libgpumem_torch.so loads (and check(), if given, runs), else why not."""
    try:
        _lib.load()
        if check is not None:
            check()
        return ""
    except (OSError, FileNotFoundError) as e:
        return str(e)
