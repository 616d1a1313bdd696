"""Which gpumem package the GPU scripts import.

The installed one (`pip install --no-build-isolation ./python`: it carries the
C++ shim gpumem._C, and torch's memory API answers through it) when there is
one; else the source tree's python/, whose gpumem finds libgpumem_torch.so
through GPUMEM_LIB or a build folder and runs without the shim.

    import gpumem_path  # noqa: F401  (before importing gpumem)
"""
import importlib.util
import os
import sys

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
try:
    INSTALLED = importlib.util.find_spec("gpumem") is not None
except (ImportError, ValueError):
    INSTALLED = False
if not INSTALLED and _SRC not in sys.path:
    sys.path.insert(0, _SRC)
