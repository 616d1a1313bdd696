"""publish_native — make a process that keeps PyTorch's own caching allocator
visible to `gpumem smi/top/log/exporter`.

A background thread copies ``torch.cuda.memory_stats(device)`` every
``interval`` seconds into gpumem's shared-memory segment through the library
(gm_native_publisher_*): the segment layout and the list of statistics live
in one place, src/monitor/monitor.h, and the keys read from memory_stats come
from the library (gm_native_publisher_key), never retyped here.

    import gpumem.publish_native as pn
    pub = pn.start(label="llama-finetune")   # returns a NativePublisher
    ...
    pub.stop()                                # also done at interpreter exit
"""
import atexit
import ctypes
import threading

from gpumem import _lib



def _api():
    """The library with the native-publisher signatures set."""
    lib = _lib.load()
    if not getattr(lib, "_gm_native_sigs", False):
        lib.gm_native_publisher_open.restype = ctypes.c_int
        lib.gm_native_publisher_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.gm_native_publisher_key.restype = ctypes.c_char_p
        lib.gm_native_publisher_key.argtypes = [ctypes.c_int]
        lib.gm_native_publisher_update.restype = ctypes.c_int
        lib.gm_native_publisher_update.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                   ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
        lib.gm_native_publisher_step.restype = ctypes.c_int
        lib.gm_native_publisher_step.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                                 ctypes.c_int64]
        lib.gm_native_publisher_close.restype = None
        lib.gm_native_publisher_close.argtypes = [ctypes.c_void_p]
        lib._gm_native_sigs = True
    return lib


def keys():
    """The torch.cuda.memory_stats() keys published, in the library's order."""
    lib, out, i = _api(), [], 0
    while True:
        k = lib.gm_native_publisher_key(i)
        if not k:
            return out
        out.append(k.decode())
        i += 1


def _torch_devices():
    import torch
    if not torch.cuda.is_available():
        return []
    return list(range(torch.cuda.device_count()))


def _torch_stats(device):
    import torch
    return torch.cuda.memory_stats(device)


class NativePublisher:
    """Publishes per-device allocator stats from ``stats_fn(device)`` (a dict
    with torch.cuda.memory_stats() keys; empty = device not in use)."""

    def __init__(self, label=None, interval=0.5, devices=None, stats_fn=None):
        if interval <= 0:
            raise ValueError("interval must be positive, not %r" % (interval,))
        self.interval = interval
        self._devices = devices
        self._stats_fn = stats_fn or _torch_stats
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self._lib = _api()
        self._keys = keys()
        self._values = (ctypes.c_int64 * len(self._keys))()
        # records per segment (GM_MAX_DEVICES, from the library); devices beyond are not published
        self._devices_max = self._lib.gpumem_torch_max_devices()
        handle = ctypes.c_void_p()
        _lib.check(self._lib.gm_native_publisher_open(label.encode() if label else None, ctypes.byref(handle)),
                   "publishing torch's statistics")
        self._handle = handle
        atexit.register(self.stop)

    def _each_device(self, publish):
        """publish(device, stats) for every device in use, under the lock,
        while the segment is open."""
        devices = self._devices if self._devices is not None else _torch_devices()
        with self._lock:
            if self._handle is None:
                return
            for d in devices:
                if 0 <= d < self._devices_max:
                    stats = self._stats_fn(d)
                    if stats:
                        publish(d, stats)

    def publish_once(self):
        """Copy the current stats of every device in use."""
        def publish(d, stats):
            for i, k in enumerate(self._keys):
                self._values[i] = int(stats.get(k, 0))
            _lib.check(self._lib.gm_native_publisher_update(self._handle, d, self._values, len(self._keys)),
                       "publish")
        self._each_device(publish)

    def step_mark(self):
        """A training step ended: the step record of every device in use (its
        start's allocated and reserved bytes), as gm_step_mark publishes it
        for gpumem's allocator; the step's peak is not known here (-1)."""
        def publish(d, stats):
            _lib.check(self._lib.gm_native_publisher_step(
                self._handle, d, int(stats.get("allocated_bytes.all.current", 0)),
                int(stats.get("reserved_bytes.all.current", 0)), -1), "publish a step")
        self._each_device(publish)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.publish_once()
            except Exception:  # a monitor must never take the training down
                pass
            self._stop.wait(self.interval)

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpumem-publish", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        """Stop the thread and remove the segment (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self._handle is not None:
                self._lib.gm_native_publisher_close(self._handle)
                self._handle = None


_current = []  # the publisher start() made last: gpumem.callbacks marks steps on it


def current():
    """The running publisher start() made, or None."""
    return _current[-1] if _current and _current[-1]._handle is not None else None


def start(label=None, interval=0.5, devices=None, stats_fn=None):
    """Start publishing torch.cuda.memory_stats() in the background."""
    p = NativePublisher(label, interval, devices, stats_fn).start()
    _current.append(p)
    return p
