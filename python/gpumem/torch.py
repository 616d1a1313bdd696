"""PyTorch integration: run PyTorch on gpumem's allocator.

    import gpumem.torch as gt
    gt.install()                     # before the first CUDA tensor (policy:gpumem)
    ...
    print(torch.cuda.memory_allocated(), torch.cuda.max_memory_reserved())

With the C++ shim gpumem._C (built by `pip install --no-build-isolation
./python`) gpumem is torch's CUDA allocator in full: torch.cuda.memory_stats()
and friends, the profiler's memory columns, _record_memory_history/_snapshot,
set_per_process_memory_fraction and torch.OutOfMemoryError answer from
gpumem. Without the shim install() falls back to torch's
CUDAPluggableAllocator entry points, where torch's own memory API raises; the
functions here give the same answers from gpumem's statistics either way.

torch is imported lazily, so the stats functions work (device given as an
int) in processes that never import torch, e.g. the package's CPU tests.
"""
import contextlib
import ctypes
import os
import sys

from . import _lib
from ._lib import GpumemError
from ._torch_state import (  # noqa: F401 (gpumem.torch's API: shared with gpumem.track below it)
    _device, _stat, _state, _torch, is_installed, max_memory_allocated, memory_allocated, memory_stats)

OOM_PREFIX = "gpumem: CUDA out of memory"


# ---- installation ----------------------------------------------------------

DEFAULT_POLICY = "policy:gpumem"


def effective_conf(conf=None):
    """The settings install() applies: conf, else $GPUMEM_CONF, with
    policy:gpumem added when neither names a policy (policy:torch gives torch's
    own placement exactly)."""
    if conf is None:
        conf = os.environ.get("GPUMEM_CONF", "")
    conf = conf.strip()
    if "policy:" not in conf.replace(" ", ""):
        conf = DEFAULT_POLICY + ("," + conf if conf else "")
    return conf


def _shim():
    """The C++ shim module gpumem._C, or None (not built, or GPUMEM_SHIM=0)."""
    if os.environ.get("GPUMEM_SHIM", "1") == "0":
        return None
    try:
        from . import _C  # noqa: PLC0415 (needs torch imported first)
        return _C
    except ImportError as e:
        _state["shim_error"] = str(e)
        return None


def install(conf=None, backend="cuda", label=None):
    """Make gpumem PyTorch's CUDA allocator. Must run before CUDA is initialised.

    conf: PYTORCH_CUDA_ALLOC_CONF-style settings plus policy:torch|gpumem
    (None: $GPUMEM_CONF; the policy is gpumem unless one is named).
    label: the name `gpumem smi/top` show for this process (default:
    $GPUMEM_PUBLISH_LABEL, else the script's name). The process is published
    to them unless GPUMEM_PUBLISH=0.
    Returns the library path.
    """
    torch = _torch()
    if _state["installed"]:
        if conf != _state["conf"]:
            raise RuntimeError("gpumem.torch.install: already installed with conf=%r; cannot change it to %r"
                               % (_state["conf"], conf))
        return _lib.library_path()
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "gpumem.torch.install() must be called before CUDA is initialised (before the first CUDA tensor, "
            "torch.cuda.init() or anything that queries the device); call it at the top of the script.")
    if label or not os.environ.get("GPUMEM_PUBLISH_LABEL"):
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-") else ""
        if label or script:
            os.environ["GPUMEM_PUBLISH_LABEL"] = label or script
    _lib.configure(effective_conf(conf), backend)  # checks conf now: a typo fails here, not at the first tensor
    path = _lib.library_path()
    shim = _shim() if backend == "cuda" else None
    try:
        if shim is not None:
            shim.install(path)
            mode = "shim"
        else:
            alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "gpumem_alloc", "gpumem_free")
            torch.cuda.memory.change_current_allocator(alloc)
            _state["allocator"] = alloc
            mode = "pluggable"
    except RuntimeError as e:
        raise RuntimeError("gpumem.torch.install: PyTorch refused to swap its allocator (%s); install() must run "
                           "before the first CUDA allocation" % e) from e
    _state.update(installed=True, conf=conf, mode=mode)
    _patch_allocator_settings()
    if mode == "pluggable":
        _warn("gpumem: the C++ shim gpumem._C is not available (%s); gpumem runs through torch's "
              "CUDAPluggableAllocator, where torch.cuda.memory_allocated() and the rest of torch's memory API "
              "raise: use gpumem.torch.memory_allocated() etc., or reinstall with "
              "pip install --no-build-isolation ./python" % _state.get("shim_error", "GPUMEM_SHIM=0"))
        _patch_record_stream()
    return path


def _warn(msg):
    import warnings  # noqa: PLC0415
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _patch_allocator_settings():
    """torch.cuda.memory._set_allocator_settings(str) reaches gpumem's settings.

    torch applies it to its own allocator's config object only (a pluggable
    allocator is never told), so under gpumem it would do nothing: it is
    replaced by set_allocator_settings, which applies what gpumem supports
    and raises for the rest."""
    memory = _torch().cuda.memory
    if _state.get("orig_set_allocator_settings") is None and hasattr(memory, "_set_allocator_settings"):
        _state["orig_set_allocator_settings"] = memory._set_allocator_settings
        memory._set_allocator_settings = set_allocator_settings


def set_allocator_settings(conf):
    """Change gpumem's settings while the process runs (what torch.cuda.memory._set_allocator_settings
    does once gpumem is installed). conf is PYTORCH_CUDA_ALLOC_CONF syntax on top of the settings in
    effect: keys read on every allocation change at once (roundup_power2_divisions,
    garbage_collection_threshold, max_non_split_rounding_mb, expandable_segments, the memory
    fraction, the pinned_* keys); keys the allocator was built with (policy, max_split_size_mb,
    gpumem_*) and unknown keys raise GpumemError naming them, and nothing of conf applies."""
    _lib.check(_lib.load().gpumem_torch_set_settings(_lib._enc(str(conf))), "_set_allocator_settings")


def _patch_record_stream():
    torch = _torch()
    if _state["orig_record_stream"] is not None:
        return
    orig = torch.Tensor.record_stream

    def record_stream_gpumem(self, stream):
        if self.is_cuda:
            record_stream(self, stream)
        return orig(self, stream)  # a no-op for a pluggable allocator

    _state["orig_record_stream"] = orig
    torch.Tensor.record_stream = record_stream_gpumem


def status():
    """What is active: installed, mode (shim | pluggable), conf, library, whether an OOM raises
    torch.OutOfMemoryError by itself (the shim) and how record_stream reaches gpumem."""
    shim = _state["mode"] == "shim"
    return {
        "installed": _state["installed"], "mode": _state["mode"], "conf": _state["conf"],
        "library": _lib.library_path() if _state["installed"] else None,
        "native_oom": shim,
        "record_stream": "shim" if shim else "python patch",
    }


def native_oom():
    """True when an OOM raises torch.OutOfMemoryError directly (the shim); without it, wrap the
    code in oom_guard()."""
    return _state["mode"] == "shim"


# ---- OOM -------------------------------------------------------------------

_oom_class = None


def OutOfMemoryError():  # noqa: N802 (a class factory: torch is imported lazily)
    """gpumem's OOM exception class, a subclass of torch.OutOfMemoryError."""
    global _oom_class
    if _oom_class is None:
        torch = _torch()
        _oom_class = type("GpumemOutOfMemoryError", (torch.OutOfMemoryError,),
                          {"__doc__": "gpumem could not allocate device memory; the message explains why."})
    return _oom_class


def is_oom(exc):
    return OOM_PREFIX in str(exc)


@contextlib.contextmanager
def oom_guard():
    """Turn gpumem's OOM RuntimeError into torch.OutOfMemoryError (a subclass).

    Only needed without the shim (gpumem._C), where torch's pluggable entry
    points raise RuntimeError; with it, OOM already raises torch.OutOfMemoryError.
    """
    torch = _torch()
    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:
        if is_oom(e):
            raise OutOfMemoryError()(str(e)) from e
        raise


# ---- the torch.cuda memory API ---------------------------------------------

def memory_stats_as_nested_dict(device=None):
    out = {}
    for k, v in memory_stats(device).items():
        d = out
        parts = k.split(".")
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return out


def memory_reserved(device=None):
    return _stat("reserved_bytes.all.current", device)


def max_memory_reserved(device=None):
    return _stat("reserved_bytes.all.peak", device)


def reset_peak_memory_stats(device=None):
    _lib.check(_lib.load().gpumem_torch_reset_peak(_device(device)), "reset_peak_memory_stats")


def reset_accumulated_memory_stats(device=None):
    _lib.check(_lib.load().gpumem_torch_reset_accumulated(_device(device)), "reset_accumulated_memory_stats")


def reset_max_memory_allocated(device=None):
    reset_peak_memory_stats(device)


def memory_summary(device=None, abbreviated=False):
    return _lib.summary(_device(device), abbreviated)


def empty_cache():
    """Release every cached, unused block on every device."""
    _lib.check(_lib.load().gpumem_torch_empty_cache(-1), "empty_cache")


def step_mark(device=-1):
    """One step of the training loop ended (gm_step_mark). With
    gpumem_plan:on the marks are the step boundaries: once two marked steps
    made the same allocations, the next ones are served from a plan.
    device -1 (default): every device."""
    _lib.check(_lib.load().gpumem_torch_step_mark(-1 if device == -1 else _device(device)), "step_mark")


def mark_steps(optimizer, device=-1):
    """Call step_mark() after every optimizer.step() (a step post hook);
    returns the hook's handle (handle.remove() stops it)."""
    return optimizer.register_step_post_hook(lambda opt, args, kwargs: step_mark(device))


def mem_get_info(device=None):
    """(free, total) bytes of the device, like torch.cuda.mem_get_info."""
    return _lib.mem_get_info(_device(device))


def set_per_process_memory_fraction(fraction, device=None):
    _lib.check(_lib.load().gpumem_torch_set_memory_fraction(float(fraction), _device(device)),
               "set_per_process_memory_fraction")


def record_stream(tensor, stream):
    """Keep tensor's memory from reuse until the work queued on stream now is done."""
    ptr = tensor.untyped_storage().data_ptr()
    if ptr:
        _lib.record_stream_raw(ptr, int(stream.cuda_stream))


# ---- sleep and wake (vLLM's sleep mode, RL weight swaps) --------------------

_sleep_pools = {}  # (tag, device) -> the torch.cuda.MemPool sleep_pool made


def tag_pool(pool, tag, device=None):
    """Name a private pool (a torch.cuda.MemPool, or a pool id pair) so that sleep(tag) and
    wake(tag) act on it; tag "" removes the name."""
    ids = pool.id if hasattr(pool, "id") else tuple(pool)
    _lib.check(_lib.load().gpumem_torch_pool_set_tag(_device(device), int(ids[0]), int(ids[1]), _lib._enc(tag)),
               "tag_pool")


def sleep_pool(tag, device=None):
    """The torch.cuda.MemPool gpumem sleeps under `tag` on device (made on first use). Allocate what
    should sleep in it: `with torch.cuda.use_mem_pool(gt.sleep_pool("weights")): model = ...`, or
    use sleepable(tag)."""
    torch = _torch()
    dev = _device(device)
    pool = _sleep_pools.get((tag, dev))
    if pool is None:
        with torch.cuda.device(dev):
            pool = torch.cuda.MemPool()
        tag_pool(pool, tag, dev)
        _sleep_pools[(tag, dev)] = pool
    return pool


@contextlib.contextmanager
def sleepable(tag, device=None):
    """Allocations made inside go to sleep_pool(tag): what sleep(tag) releases and wake(tag) maps
    back at the same addresses."""
    torch = _torch()
    dev = _device(device)
    with torch.cuda.use_mem_pool(sleep_pool(tag, dev), device=dev):
        yield


def _synchronize():
    torch = sys.modules.get("torch")  # no torch (the package's CPU tests): nothing to wait for
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def sleep(tag=None, offload=False, device=-1):
    """Give back the device memory of the pools tagged `tag` (None: every tagged pool, and the idle
    cache of everything else), keeping every address: tensors in them stay valid Python objects but
    must not be used until wake(). offload=True copies their contents to host memory first and
    restores them at wake (vLLM's sleep level 1: weights); without it the contents are lost (level
    2: a KV cache). Allocating in a sleeping pool raises; the rest of the program allocates as
    usual. Returns the bytes given back. device -1: every device."""
    _synchronize()
    released = ctypes.c_uint64(0)
    dev = -1 if device == -1 else _device(device)
    _lib.check(_lib.load().gpumem_torch_sleep(dev, _lib._enc(tag), 1 if offload else 0, ctypes.byref(released)),
               "sleep")
    return released.value


def wake(tag=None, device=-1):
    """Map fresh device memory behind the sleeping pools tagged `tag` (None: every one), at the
    addresses they had, and restore what sleep(offload=True) saved."""
    dev = -1 if device == -1 else _device(device)
    _lib.check(_lib.load().gpumem_torch_wake(dev, _lib._enc(tag)), "wake")
    _synchronize()


def check(device=-1):
    """'' if gpumem's internal invariants hold, else the broken one (debugging)."""
    return _lib.check_invariants(device)


def _fmt(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return ("%.0f %s" if unit == "B" else "%.2f %s") % (n, unit)
        n /= 1024.0
    return str(n)


def memory_usage_line(tag="", device=None):
    dev = _device(device)
    s = memory_stats(dev)
    line = "[gpumem%s] dev %d: allocated %s (peak %s), reserved %s (peak %s)" % (
        " " + tag if tag else "", dev, _fmt(s.get("allocated_bytes.all.current", 0)),
        _fmt(s.get("allocated_bytes.all.peak", 0)), _fmt(s.get("reserved_bytes.all.current", 0)),
        _fmt(s.get("reserved_bytes.all.peak", 0)))
    try:
        free, total = mem_get_info(dev)
        line += ", device free %s of %s" % (_fmt(free), _fmt(total))
    except GpumemError:
        pass
    return line


def print_memory_usage(tag="", device=None, file=None):
    """Print one line of memory use, for training loops: print_memory_usage(f"step {i}")."""
    print(memory_usage_line(tag, device), file=file if file is not None else sys.stdout, flush=True)
from .track import Tracker, scope, scoped, track  # noqa: E402,F401 (re-exported; they live in track.py)
