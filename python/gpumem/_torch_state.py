"""What gpumem.torch and gpumem.track share, below both: whether gpumem is
PyTorch's allocator (install() in torch.py sets it), device indexes, and
reading gpumem's statistics. torch.py re-exports these as its API and
imports track.py; track.py imports only this module, so the two never import
each other."""
import sys

from . import _lib
from ._lib import GpumemError

_state = {"installed": False, "conf": None, "mode": None, "orig_record_stream": None}


def _torch():
    import torch  # noqa: PLC0415 (lazy on purpose)
    return torch


def _device(device):
    """Device index from None (current device), an int, a str or a torch.device."""
    if device is None:
        if "torch" in sys.modules:
            return _torch().cuda.current_device()
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = _torch().device(device)
    idx = getattr(device, "index", None)
    if idx is None:
        return _torch().cuda.current_device()
    return int(idx)


def is_installed():
    return _state["installed"]


def memory_stats(device=None):
    """Like torch.cuda.memory_stats: a dict with the same keys."""
    return _lib.stats(_device(device))


def _stat(key, device):
    s = memory_stats(device)
    if key not in s:
        raise GpumemError(-10, "gpumem: stats lack %r (keys: %s...)" % (key, ", ".join(list(s)[:8])))
    return s[key]


def memory_allocated(device=None):
    return _stat("allocated_bytes.all.current", device)


def max_memory_allocated(device=None):
    return _stat("allocated_bytes.all.peak", device)
