"""ctypes loader for libgpumem_torch.so, the library behind gpumem.torch.

Search order (first hit wins):
  1. $GPUMEM_LIB (a path to the .so, or a folder holding it)
  2. this package's folder (the build copies the .so here before `pip install`)
  3. build folders of a source checkout: <repo>/build*/ (when run from python/)
"""
import ctypes
import glob
import json
import os
import threading

LIB_NAME = "libgpumem_torch.so"

# The status codes the library returns (include/gpumem/gpumem.h's GM_STATUS
# list): names are read from the library itself (gm_status_name), so this
# file never retypes them. The two values the Python side acts on are
# checked against the library when it loads.
GM_ENOMEM = -2
GM_ENOSPACE = -14


def status_name(status):
    """'GM_ENOMEM' for -2, from the library; 'GM_UNKNOWN' if it has no name."""
    try:
        name = load().gm_status_name(int(status))
    except OSError:
        return "GM_UNKNOWN"
    name = name.decode() if name else "GM_UNKNOWN"
    return name if name.startswith("GM_") else "GM_UNKNOWN"


_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_lib = None
_lib_path = None


class GpumemError(RuntimeError):
    """A gpumem library call failed; .status is the gm_status code."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.status_name = status_name(status)


def _candidates(name, env):
    seen = []
    v = os.environ.get(env)
    if v:
        seen.append(os.path.join(v, name) if os.path.isdir(v) else v)
    seen.append(os.path.join(_PKG_DIR, name))
    repo = os.path.dirname(os.path.dirname(_PKG_DIR))  # python/gpumem -> repo root
    for d in ["build"] + sorted(os.path.basename(p) for p in glob.glob(os.path.join(repo, "build*"))):
        seen.append(os.path.join(repo, d, name))
    out = []
    for p in seen:
        if p not in out:
            out.append(p)
    return out


def _sanitized(path):
    """True for an ASan build found by the fallback search: it cannot be loaded
    into an unsanitized python (ASan must come first) and would abort it."""
    try:
        with open(path, "rb") as f:
            return b"libasan.so" in f.read()
    except OSError:
        return True


def find_library():
    """Path of libgpumem_torch.so, or raise FileNotFoundError listing where it looked."""
    cands = _candidates(LIB_NAME, "GPUMEM_LIB")
    env = os.environ.get("GPUMEM_LIB")
    if env:
        # An explicit setting must not silently fall back to another build.
        if os.path.isfile(cands[0]):
            return cands[0]
        raise FileNotFoundError("GPUMEM_LIB=%s: %s not found there" % (env, LIB_NAME))
    sanitized = []
    for p in cands:
        if os.path.isfile(p):
            if not _sanitized(p):
                return p
            sanitized.append(p)
    if sanitized:
        raise FileNotFoundError(
            "gpumem: only AddressSanitizer builds of %s were found (%s), and python cannot load them "
            "(the ASan runtime must come first). Build a plain one: cmake -S . -B build "
            "-DCMAKE_BUILD_TYPE=Release -DGPUMEM_SANITIZE=OFF && cmake --build build, or pip install "
            "--no-build-isolation ./python" % (LIB_NAME, ", ".join(sanitized)))
    raise FileNotFoundError(
        "gpumem: %s not found; build it (cmake --build build) and set GPUMEM_LIB to its path. Looked in: %s"
        % (LIB_NAME, ", ".join(cands)))


# ctypes types of the letters in the library's signature table
# (gpumem_torch_signatures; the list is GPUMEM_TORCH_CTYPES_ENTRY_POINTS in
# src/torch/gpumem_torch.h, so this file never retypes a signature).
_CTYPES = {
    "v": None, "b": ctypes.c_bool, "i": ctypes.c_int, "q": ctypes.c_int64, "Q": ctypes.c_uint64, "d": ctypes.c_double,
    "z": ctypes.c_size_t, "s": ctypes.c_char_p, "p": ctypes.c_void_p,
    "I": ctypes.POINTER(ctypes.c_int), "U": ctypes.POINTER(ctypes.c_uint64),
}


def _signatures(lib, path):
    """{name: (restype, argtypes)} from the library's own table."""
    try:
        table = lib.gpumem_torch_signatures
    except AttributeError as e:
        raise OSError("gpumem: %s lacks gpumem_torch_signatures (stale build?)" % path) from e
    table.restype = ctypes.c_char_p
    table.argtypes = []
    sigs = {}
    for line in table().decode().splitlines():
        name, _, sig = line.partition("=")
        res, _, args = sig.partition(":")
        sigs[name] = (_CTYPES[res], [_CTYPES[c] for c in args])
    return sigs


def load():
    """The loaded library (ctypes.CDLL) with signatures set; loads it once."""
    global _lib, _lib_path
    with _lock:
        if _lib is None:
            path = find_library()
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                raise OSError("gpumem: could not load %s: %s" % (path, e)) from e
            for name, (res, args) in _signatures(lib, path).items():
                try:
                    f = getattr(lib, name)
                except AttributeError as e:
                    raise OSError("gpumem: %s lacks %s (stale build?)" % (path, name)) from e
                f.restype = res
                f.argtypes = args
            for want, value in (("GM_ENOMEM", GM_ENOMEM), ("GM_ENOSPACE", GM_ENOSPACE)):
                if lib.gm_status_name(value) != want.encode():
                    raise OSError("gpumem: %s numbers %s differently than this package (stale build?)"
                                  % (path, want))
            _lib, _lib_path = lib, path
        return _lib


def library_path():
    load()
    return _lib_path


def last_error():
    msg = load().gpumem_torch_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status, what):
    """Raise GpumemError for a failed status, with the library's message."""
    if status != 0:
        msg = last_error() or "gpumem: %s failed: %s" % (what, status_name(status))
        raise GpumemError(status, msg)
    return status


def _enc(s):
    return None if s is None else s.encode("utf-8")


def configure(conf=None, backend="cuda"):
    check(load().gpumem_torch_configure(_enc(conf), _enc(backend)), "configure")


def _text(fn, *args, initial=1 << 16, what="call"):
    """Call fn(*args, buf, len), growing buf while it reports GM_ENOSPACE."""
    size = initial
    while True:
        buf = ctypes.create_string_buffer(size)
        st = fn(*args, buf, size)
        if st == GM_ENOSPACE and size < (1 << 26):
            size *= 4
            continue
        check(st, what)
        return buf.value.decode("utf-8", "replace")


def stats(device):
    """The allocator's stats for device as a dict with torch.cuda.memory_stats() keys."""
    text = _text(load().gpumem_torch_stats_json, device, what="stats")
    return decode_stats(text)


def decode_stats(text):
    """Parse the library's stats JSON (a flat object of ints), sorted like torch."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise GpumemError(-10, "gpumem: stats JSON is not an object: %r" % text[:200])
    return dict(sorted((k, int(v)) for k, v in d.items()))


def summary(device, abbreviated=False):
    return _text(load().gpumem_torch_summary, device, 1 if abbreviated else 0, what="memory_summary")


def check_invariants(device=-1):
    """'' if every internal invariant holds, else the broken one."""
    buf = ctypes.create_string_buffer(4096)
    st = load().gpumem_torch_check(device, buf, len(buf))
    if st == 0:
        return ""
    return buf.value.decode("utf-8", "replace") or status_name(st)


def alloc_raw(size, device=0, stream=0):
    out = ctypes.c_uint64(0)
    check(load().gpumem_torch_alloc_raw(size, device, stream, ctypes.byref(out)), "alloc")
    return out.value


def free_raw(ptr):
    check(load().gpumem_torch_free_raw(ptr), "free")


def record_stream_raw(ptr, stream):
    check(load().gpumem_torch_record_stream(ptr, stream), "record_stream")


def mem_get_info(device):
    f, t = ctypes.c_uint64(0), ctypes.c_uint64(0)
    check(load().gpumem_torch_mem_get_info(device, ctypes.byref(f), ctypes.byref(t)), "mem_get_info")
    return f.value, t.value
