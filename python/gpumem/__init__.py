"""gpumem: a caching GPU memory allocator for PyTorch, with its own statistics.

    import gpumem.torch
    gpumem.torch.install("policy:gpumem")   # before the first CUDA tensor

gpumem.torch holds the PyTorch integration (install, memory_stats, ...);
gpumem._lib the ctypes binding of libgpumem_torch.so.
"""
from ._lib import GpumemError, find_library

__version__ = "0.1.0"
__all__ = ["GpumemError", "find_library", "__version__"]
