"""publish_native — make a process that keeps PyTorch's own caching allocator
visible to `gpumem smi/top/log/exporter`.

A background thread copies ``torch.cuda.memory_stats(device)`` every
``interval`` seconds into a shared-memory segment in gpumem's format (see
src/monitor/monitor.h, layout version 2; this file must change with it).
Pure Python (mmap + struct): no library to load, nothing to build.

    import gpumem.publish_native as pn
    pub = pn.start(label="llama-finetune")   # returns a NativePublisher
    ...
    pub.stop()                                # also done at interpreter exit

Ordering: each device record is written under a seqlock (sequence made odd,
values written, sequence made even). CPython writes to the mapping in program
order; x86-64 keeps store order, so readers never accept a torn record there.
"""

import atexit
import mmap
import os
import struct
import threading
import time

MAGIC = 0x314D48534D454D47  # "GMEMSHM1"
VERSION = 2
HEADER_SIZE = 512
RECORD_SIZE = 128
DEVICES = 64
SEGMENT_SIZE = HEADER_SIZE + DEVICES * RECORD_SIZE
SOURCE_TORCH = 2

# magic, version, header_size, segment_size, record_size, ndevices, pid, uid,
# start_time, created_ns, source, reserved0, comm, label, visible, pad
_HEADER = struct.Struct("<QIIQIIiIQQII32s128s256s32s")
# the values after seq/used, in monitor.h's GM__SHM_FIELDS order (version 2:
# (current, peak) pairs; readers count operations as num_allocs + num_frees)
_FIELDS = ("update_ns", "allocated", "peak_allocated", "requested", "peak_requested",
           "active", "peak_active", "num_allocs", "num_frees", "reserved",
           "peak_reserved", "num_alloc_retries", "num_ooms")
_VALUES = struct.Struct("<%dq" % len(_FIELDS))
_SEQ = struct.Struct("<II")
assert _HEADER.size == HEADER_SIZE and 8 + _VALUES.size <= RECORD_SIZE

# torch.cuda.memory_stats() key for each published field
_TORCH_KEYS = {
    "allocated": "allocated_bytes.all.current",
    "reserved": "reserved_bytes.all.current",
    "requested": "requested_bytes.all.current",
    "active": "active_bytes.all.current",
    "peak_allocated": "allocated_bytes.all.peak",
    "peak_reserved": "reserved_bytes.all.peak",
    "peak_requested": "requested_bytes.all.peak",
    "peak_active": "active_bytes.all.peak",
    "num_ooms": "num_ooms",
    "num_alloc_retries": "num_alloc_retries",
    "num_allocs": "allocation.all.allocated",
    "num_frees": "allocation.all.freed",
}


def _prefix():
    tag = os.environ.get("GPUMEM_SHM_TAG")
    uid = os.getuid()
    return "gpumem-%s.%d." % (tag, uid) if tag else "gpumem.%d." % uid


def _start_time(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[19])  # field 22; fields[0] is field 3


def _comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


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
        self._seq = [0] * DEVICES
        self._lock = threading.Lock()
        pid = os.getpid()
        self.path = "/dev/shm/%s%d.torch" % (_prefix(), pid)
        try:
            os.unlink(self.path)  # ours by pid: whoever made it is gone
        except FileNotFoundError:
            pass
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, SEGMENT_SIZE)
            self._map = mmap.mmap(fd, SEGMENT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        comm = _comm(pid)
        label = label if label else comm
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        header = _HEADER.pack(0, VERSION, HEADER_SIZE, SEGMENT_SIZE, RECORD_SIZE, DEVICES, pid,
                              os.getuid(), _start_time(pid), time.time_ns(), SOURCE_TORCH, 0,
                              comm.encode()[:31], label.encode()[:127], visible.encode()[:255], b"")
        self._map[0:HEADER_SIZE] = header
        self._map[0:8] = struct.pack("<Q", MAGIC)  # last: readers see a whole header
        atexit.register(self.stop)

    def publish_once(self):
        """Copy the current stats of every device in use."""
        devices = self._devices if self._devices is not None else _torch_devices()
        with self._lock:
            if self._map is None:
                return
            for d in devices:
                if 0 <= d < DEVICES:
                    stats = self._stats_fn(d)
                    if stats:
                        self._write(d, stats)

    def _write(self, device, stats):
        off = HEADER_SIZE + device * RECORD_SIZE
        values = [time.time_ns()] + [int(stats.get(_TORCH_KEYS[f], 0)) for f in _FIELDS[1:]]
        seq = self._seq[device]
        _SEQ.pack_into(self._map, off, seq + 1, 1)
        _VALUES.pack_into(self._map, off + 8, *values)
        _SEQ.pack_into(self._map, off, seq + 2, 1)
        self._seq[device] = seq + 2

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
            if self._map is not None:
                self._map.close()
                self._map = None
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass


def start(label=None, interval=0.5, devices=None, stats_fn=None):
    """Start publishing torch.cuda.memory_stats() in the background."""
    return NativePublisher(label, interval, devices, stats_fn).start()
