"""gpumem: a caching GPU memory allocator for PyTorch, with its own statistics.

    import gpumem.torch
    gpumem.torch.install()        # before the first CUDA tensor (policy:gpumem)

or, with no code change: gpumem run -- python3 train.py ARGS

gpumem.torch holds the PyTorch integration (install, memory_stats, ...);
gpumem._C the C++ shim that makes gpumem torch's CUDA allocator in full;
gpumem._lib the ctypes binding of libgpumem_torch.so; gpumem._cli the `gpumem`
command (it execs the C executable, gpumem/bin/gpumem).
"""
from ._lib import GpumemError, find_library

__version__ = "0.1.0"
__all__ = ["GpumemError", "find_library", "__version__"]
