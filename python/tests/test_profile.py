"""CPU tests of libgpumem_torch.so's GPUMEM_PROFILE counters and backend call
counts (src/torch/gpumem_torch.c), over the sim backend: no torch, no GPU.
tests/gpu/final_run.sh reads the same counters around GPT-2 training steps.

Run: GPUMEM_LIB=<build>/libgpumem_torch.so python3 -m unittest discover -s python/tests"""
import ctypes
import os
import sys
import unittest

from _support import unusable  # the source tree's gpumem on sys.path
from gpumem import _lib

MIB = 1 << 20
FIELDS = ("alloc_calls", "alloc_ns", "alloc_max_ns", "alloc_slow", "free_calls", "free_ns", "free_max_ns", "free_slow")
BCALLS = ("MALLOC", "FREE", "MEM_INFO", "VA_RESERVE", "VA_RELEASE", "PHYS_CREATE", "PHYS_RELEASE", "MAP", "UNMAP",
          "EVENT_RECORD", "EVENT_QUERY", "EVENT_SYNC", "EVENT_DESTROY", "HOST_ALLOC")

WHY = unusable()
LIB = None if WHY else _lib.load()  # signatures from the library's own table (gpumem_torch_signatures)


def profile():
    buf = (ctypes.c_uint64 * len(FIELDS))()
    n = LIB.gpumem_torch_profile(buf, len(FIELDS))
    assert n == len(FIELDS), n
    return dict(zip(FIELDS, buf))


def backend_calls(dev=0, fn="gpumem_torch_backend_calls"):
    buf = (ctypes.c_uint64 * 32)()
    n = getattr(LIB, fn)(dev, buf, 32)
    if n < 0:
        raise _lib.GpumemError(n, _lib.last_error())
    return dict(zip(BCALLS, buf[:n]))


@unittest.skipUnless(LIB is not None, "libgpumem_torch.so not usable: %s" % WHY)
class ProfileTest(unittest.TestCase):
    def setUp(self):
        LIB.gpumem_torch_shutdown()
        self.was = LIB.gpumem_torch_profile_enable(0)
        LIB.gpumem_torch_profile_reset()
        _lib.configure("", "sim")

    def tearDown(self):
        LIB.gpumem_torch_shutdown()
        LIB.gpumem_torch_profile_enable(self.was)
        LIB.gpumem_torch_profile_reset()

    def test_off_counts_nothing(self):
        p = _lib.alloc_raw(MIB, 0, 0)
        _lib.free_raw(p)
        self.assertEqual(set(profile().values()), {0})

    def test_on_counts_calls_and_time(self):
        self.assertEqual(LIB.gpumem_torch_profile_enable(1), 0)
        ptrs = [_lib.alloc_raw((i + 1) * MIB, 0, 0) for i in range(5)]
        for p in ptrs[:3]:
            _lib.free_raw(p)
        s = profile()
        self.assertEqual(s["alloc_calls"], 5)
        self.assertEqual(s["free_calls"], 3)
        self.assertGreater(s["alloc_ns"], 0)
        self.assertGreater(s["free_ns"], 0)
        self.assertGreaterEqual(s["alloc_ns"], s["alloc_max_ns"])
        self.assertGreater(s["alloc_max_ns"], 0)
        self.assertLessEqual(s["alloc_slow"], s["alloc_calls"])
        # off again: the counters keep what they had
        LIB.gpumem_torch_profile_enable(0)
        for p in ptrs[3:]:
            _lib.free_raw(p)
        self.assertEqual(profile()["free_calls"], 3)
        LIB.gpumem_torch_profile_reset()
        self.assertEqual(set(profile().values()), {0})

    def test_failed_calls_are_counted_too(self):
        LIB.gpumem_torch_profile_enable(1)
        with self.assertRaises(_lib.GpumemError):
            _lib.free_raw(0x1234)  # never allocated
        self.assertEqual(profile()["free_calls"], 1)

    def test_backend_calls_follow_device_allocations(self):
        before = backend_calls(0)
        self.assertEqual(set(before), set(BCALLS))
        p = _lib.alloc_raw(64 * MIB, 0, 0)
        mid = backend_calls(0)
        grew = sum(mid.values()) - sum(before.values())
        self.assertGreater(grew, 0, "a first 64 MiB allocation must reach the device: %s -> %s" % (before, mid))
        _lib.free_raw(p)
        p = _lib.alloc_raw(64 * MIB, 0, 0)  # served from the cache: no new device memory
        after = backend_calls(0)
        for k in ("MALLOC", "PHYS_CREATE", "MAP"):
            self.assertEqual(after[k], mid[k], k)
        _lib.free_raw(p)

    def test_backend_time_is_counted_per_kind(self):
        ptrs = [_lib.alloc_raw((i + 1) * MIB, 0, 0) for i in range(5)]
        for p in ptrs:
            _lib.free_raw(p)
        calls, ns = backend_calls(0), backend_calls(0, "gpumem_torch_backend_ns")
        self.assertEqual(set(ns), set(calls))
        self.assertGreater(sum(calls.values()), 0)
        self.assertGreater(sum(ns.values()), 0)
        for k, n in calls.items():  # time only where calls were made: the kinds line up
            if n == 0:
                self.assertEqual(ns[k], 0, k)
        self.assertLess(LIB.gpumem_torch_backend_ns(99, (ctypes.c_uint64 * 4)(), 4), 0)
        self.assertIn("backend_ns: device 99 out of range", _lib.last_error())

    def test_backend_calls_reject_bad_arguments(self):
        buf = (ctypes.c_uint64 * 4)()
        self.assertLess(LIB.gpumem_torch_backend_calls(99, buf, 4), 0)
        self.assertIn("out of range", _lib.last_error())
        self.assertLess(LIB.gpumem_torch_backend_calls(0, None, 4), 0)
        self.assertLess(LIB.gpumem_torch_profile(None, 4), 0)
        # a short buffer gets only what fits; the return value says how many exist
        small = (ctypes.c_uint64 * 2)()
        self.assertEqual(LIB.gpumem_torch_profile(small, 2), len(FIELDS))


@unittest.skipUnless(LIB is not None, "libgpumem_torch.so not usable: %s" % WHY)
class ProfileEnvTest(unittest.TestCase):
    def test_env_turns_it_on_at_load(self):
        # a fresh process: the library reads GPUMEM_PROFILE when it is loaded
        import subprocess  # noqa: PLC0415
        code = ("import ctypes, sys; sys.path.insert(0, %r); from gpumem import _lib; lib = _lib.load(); "
                "lib.gpumem_torch_profile_enable.argtypes = [ctypes.c_int]; "
                "print(lib.gpumem_torch_profile_enable(1))") % os.path.join(os.path.dirname(__file__), "..")
        env = dict(os.environ, GPUMEM_LIB=_lib.library_path())
        for val, want in (("1", "1"), ("0", "0"), ("", "0")):
            env["GPUMEM_PROFILE"] = val
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(out.stdout.strip(), want, "GPUMEM_PROFILE=%r: %s" % (val, out.stderr))


if __name__ == "__main__":
    unittest.main()
