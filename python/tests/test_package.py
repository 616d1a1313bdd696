"""CPU-only tests of the gpumem Python package: the ctypes loader, stats
decoding and the torch-style API over the sim backend (no torch, no GPU).

Run: GPUMEM_LIB=<build>/libgpumem_torch.so python3 -m unittest discover -s python/tests
(library tests skip when no non-sanitizer build of libgpumem_torch.so is found)."""
import os
import sys
import unittest

from _support import unusable  # the source tree's gpumem on sys.path
from gpumem import _lib
import gpumem.torch as gt

MIB = 1 << 20

WHY = unusable()


class LoaderTest(unittest.TestCase):
    def test_explicit_path_that_does_not_exist_is_an_error(self):
        old = os.environ.get("GPUMEM_LIB")
        os.environ["GPUMEM_LIB"] = "/nonexistent/libgpumem_torch.so"
        try:
            with self.assertRaises(FileNotFoundError) as cm:
                _lib.find_library()
            self.assertIn("GPUMEM_LIB", str(cm.exception))
        finally:
            if old is None:
                del os.environ["GPUMEM_LIB"]
            else:
                os.environ["GPUMEM_LIB"] = old

    def test_decode_stats_sorts_and_ints(self):
        s = _lib.decode_stats('{"reserved_bytes.all.current": 4194304, "allocated_bytes.all.current": 1.0e6}')
        self.assertEqual(list(s), ["allocated_bytes.all.current", "reserved_bytes.all.current"])
        self.assertEqual(s["allocated_bytes.all.current"], 1000000)
        with self.assertRaises(_lib.GpumemError):
            _lib.decode_stats("[1, 2]")

    def test_status_error_carries_name(self):
        e = _lib.GpumemError(-2, "gpumem: CUDA out of memory. Tried to allocate 1 GiB")
        self.assertEqual(e.status_name, "GM_ENOMEM")
        self.assertTrue(gt.is_oom(e))


@unittest.skipUnless(not WHY, "libgpumem_torch.so not loadable: %s" % WHY)
class SimBackendTest(unittest.TestCase):
    def setUp(self):
        _lib.load().gpumem_torch_shutdown()

    def tearDown(self):
        _lib.load().gpumem_torch_shutdown()

    def test_bad_conf_is_rejected_at_configure(self):
        with self.assertRaises(_lib.GpumemError) as cm:
            _lib.configure("max_split_size_mb:banana", "sim")
        self.assertEqual(cm.exception.status_name, "GM_ECONFIG")
        self.assertIn("max_split_size_mb", str(cm.exception))

    def test_stats_follow_allocations(self):
        _lib.configure("", "sim")
        self.assertEqual(gt.memory_allocated(0), 0)
        p = _lib.alloc_raw(3 * MIB, 0, 0)
        self.assertNotEqual(p, 0)
        self.assertGreaterEqual(gt.memory_allocated(0), 3 * MIB)
        self.assertGreaterEqual(gt.memory_reserved(0), gt.memory_allocated(0))
        s = gt.memory_stats(0)
        self.assertEqual(s["requested_bytes.all.current"], 3 * MIB)
        self.assertEqual(s["allocation.all.current"], 1)
        _lib.free_raw(p)
        self.assertEqual(gt.memory_allocated(0), 0)
        self.assertGreaterEqual(gt.max_memory_allocated(0), 3 * MIB)
        gt.reset_peak_memory_stats(0)
        self.assertEqual(gt.max_memory_allocated(0), 0)
        gt.empty_cache()
        self.assertEqual(gt.memory_reserved(0), 0)
        self.assertEqual(gt.check(0), "")

    def test_step_marks(self):
        _lib.configure("policy:gpumem,gpumem_plan:on", "sim")
        gt.step_mark()  # before any allocation: nothing to learn, no error

        class Optimizer:  # torch.optim.Optimizer's hook interface, enough for mark_steps
            def __init__(self):
                self.hooks = []

            def register_step_post_hook(self, hook):
                self.hooks.append(hook)
                return hook

            def step(self):
                for h in self.hooks:
                    h(self, (), {})

        opt = Optimizer()
        self.assertIs(gt.mark_steps(opt, 0), opt.hooks[0])
        for _ in range(6):  # identical marked steps: a plan is made and serves them
            ps = [_lib.alloc_raw(sz * MIB, 0, 0) for sz in (3, 5, 2, 7, 4, 6, 9, 3)]
            for p in ps:
                _lib.free_raw(p)
            opt.step()
            self.assertEqual(gt.check(0), "")
        self.assertEqual(gt.memory_allocated(0), 0)
        with self.assertRaises(_lib.GpumemError) as cm:
            gt.step_mark(5)  # the sim backend has one device
        self.assertEqual(cm.exception.status_name, "GM_EDEVICE")

    def test_errors_are_explained(self):
        _lib.configure("", "sim")
        p = _lib.alloc_raw(MIB, 0, 0)
        _lib.free_raw(p)
        with self.assertRaises(_lib.GpumemError) as cm:
            _lib.free_raw(p)
        self.assertIn(cm.exception.status_name, ("GM_EDOUBLEFREE", "GM_EFOREIGN"))
        with self.assertRaises(_lib.GpumemError) as cm:
            _lib.alloc_raw(1 << 50, 0, 0)
        self.assertEqual(cm.exception.status_name, "GM_ENOMEM")
        self.assertTrue(gt.is_oom(cm.exception), str(cm.exception))
        with self.assertRaises(_lib.GpumemError) as cm:
            _lib.configure("", "sim")  # the allocator exists now
        self.assertEqual(cm.exception.status_name, "GM_ESTATE")

    def test_private_pools(self):
        """Issue 28: the pool entry points the shim calls (graphs, MemPool)."""
        import ctypes
        lib = _lib.load()
        for policy in ("policy:torch", "policy:gpumem"):
            lib.gpumem_torch_shutdown()
            _lib.configure(policy, "sim")
            own = _lib.alloc_raw(MIB, 0, 0)
            _lib.free_raw(_lib.alloc_raw(9 * MIB, 0, 0))  # cached by the device's own pools
            _lib.check(lib.gpumem_torch_pool_begin(0, 1, 2), "pool_begin")
            out = ctypes.c_uint64(0)
            _lib.check(lib.gpumem_torch_alloc_pool(3 * MIB, 0, 0, 1, 2, ctypes.byref(out)), "alloc_pool")
            self.assertNotEqual(out.value, 0)
            # torch.cuda.empty_cache() during a capture: nothing freed, no error (as torch)
            _lib.check(lib.gpumem_torch_empty_cache(-1), "empty_cache")
            _lib.check(lib.gpumem_torch_pool_end(0, 1, 2), "pool_end")
            # the device calls made during the capture, by whose pools (tests/gpu/test_graphs.py)
            buf = (ctypes.c_uint64 * 32)()
            names = [lib.gm_bcall_name(k).decode() for k in range(lib.gpumem_torch_capture_calls(0, 0, buf, 32))]
            by_own = dict(zip(names, list(buf)))
            self.assertEqual(lib.gpumem_torch_capture_calls(0, 1, buf, 32), len(names))
            pools = dict(zip(names, list(buf)))
            self.assertGreater(pools["MALLOC"] + pools["PHYS_CREATE"], 0, pools)  # the pool's first segment
            for k in ("FREE", "UNMAP", "PHYS_RELEASE", "VA_RELEASE", "EVENT_SYNC", "EVENT_QUERY"):
                self.assertEqual(by_own[k] + pools[k], 0, (k, by_own, pools))
            self.assertLess(lib.gpumem_torch_capture_calls(0, 2, buf, 32), 0)
            self.assertIn("who 2", _lib.last_error())
            n = ctypes.c_int(0)
            _lib.check(lib.gpumem_torch_pool_use_count(0, 1, 2, ctypes.byref(n)), "pool_use_count")
            self.assertEqual(n.value, 1)
            self.assertGreaterEqual(gt.memory_allocated(0), 4 * MIB)  # the device's stats count the pool
            _lib.free_raw(out.value)
            _lib.check(lib.gpumem_torch_pool_release(0, 1, 2), "pool_release")
            with self.assertRaises(_lib.GpumemError) as cm:  # gone with its last use and block
                _lib.check(lib.gpumem_torch_pool_release(0, 1, 2), "pool_release")
            self.assertEqual(cm.exception.status_name, "GM_EINVAL")
            self.assertIn("no private pool (1, 2)", str(cm.exception))
            _lib.free_raw(own)
            self.assertEqual(gt.check(0), "")

    def test_sleep_and_wake(self):
        """Issue 46: a tagged pool's memory goes back at sleep and returns at wake, at its addresses."""
        import ctypes
        lib = _lib.load()
        _lib.configure("policy:gpumem", "sim")
        _lib.check(lib.gpumem_torch_pool_retain(0, 3, 0), "pool_retain")
        gt.tag_pool((3, 0), "weights", 0)
        out = ctypes.c_uint64(0)
        _lib.check(lib.gpumem_torch_alloc_pool(30 * MIB, 0, 0, 3, 0, ctypes.byref(out)), "alloc_pool")
        free0, _ = gt.mem_get_info(0)
        released = gt.sleep("weights", offload=True)
        self.assertGreaterEqual(released, 30 * MIB)
        self.assertEqual(gt.mem_get_info(0)[0], free0 + released)
        self.assertEqual(gt.sleep("weights"), 0)  # asleep already: nothing more
        with self.assertRaises(_lib.GpumemError) as cm:
            _lib.check(lib.gpumem_torch_alloc_pool(MIB, 0, 0, 3, 0, ctypes.byref(ctypes.c_uint64(0))), "alloc")
        self.assertEqual(cm.exception.status_name, "GM_ESTATE")
        with self.assertRaises(_lib.GpumemError) as cm:
            gt.wake("weight")
        self.assertEqual(cm.exception.status_name, "GM_EINVAL")
        self.assertIn("no private pool is tagged 'weight'", str(cm.exception))
        gt.wake("weights")
        self.assertEqual(gt.mem_get_info(0)[0], free0)
        # a call that succeeds leaves no detail of the failure before it, as the other pool calls
        class PoolOptions(ctypes.Structure):  # gm_pool_options (gpumem.h)
            _fields_ = [("size", ctypes.c_uint32), ("use_on_oom", ctypes.c_bool), ("no_split", ctypes.c_bool),
                        ("seg_alloc", ctypes.c_void_p), ("seg_free", ctypes.c_void_p), ("seg_ctx", ctypes.c_void_p)]
        opts = PoolOptions(size=ctypes.sizeof(PoolOptions), use_on_oom=True)
        set_options = lib.gpumem_torch_pool_set_options
        set_options.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(PoolOptions)]
        for ok in (lambda: set_options(0, 3, 0, ctypes.byref(opts)), lambda: gt.tag_pool((3, 0), "weights", 0)):
            with self.assertRaises(_lib.GpumemError):
                gt.wake("weight")
            self.assertEqual(ok() or 0, 0)
            self.assertEqual(_lib.last_error(), "")
        self.assertEqual(gt.check(0), "")
        _lib.free_raw(out.value)
        _lib.check(lib.gpumem_torch_pool_release(0, 3, 0), "pool_release")

    def test_allocator_settings(self):
        """Issue 46: torch.cuda.memory._set_allocator_settings reaches gpumem's settings."""
        _lib.configure("policy:torch", "sim")
        gt.set_allocator_settings("max_split_size_mb:64")  # before the allocator exists: any key
        p = _lib.alloc_raw(MIB, 0, 0)
        gt.set_allocator_settings("roundup_power2_divisions:4,expandable_segments:True")
        for bad, key in (("max_split_size_mb:128", "max_split_size_mb"), ("policy:gpumem", "policy"),
                         ("no_such_key:1", "no_such_key")):
            with self.assertRaises(_lib.GpumemError) as cm:
                gt.set_allocator_settings(bad)
            self.assertEqual(cm.exception.status_name, "GM_ECONFIG")
            self.assertIn(key, str(cm.exception))
        _lib.free_raw(p)
        self.assertEqual(gt.check(0), "")

    def test_set_allocator_settings_is_routed(self):
        """install() makes torch.cuda.memory._set_allocator_settings gpumem's (torch never tells a
        pluggable allocator): a stand-in torch module shows the replacement and its refusal."""
        import types
        calls = []
        fake = types.ModuleType("torch")
        fake.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(_set_allocator_settings=calls.append))
        old_mod, old_orig = sys.modules.get("torch"), gt._state.get("orig_set_allocator_settings")
        sys.modules["torch"] = fake
        gt._state["orig_set_allocator_settings"] = None
        try:
            _lib.configure("policy:gpumem", "sim")
            gt._patch_allocator_settings()
            self.assertIs(fake.cuda.memory._set_allocator_settings, gt.set_allocator_settings)
            _lib.free_raw(_lib.alloc_raw(MIB, 0, 0))
            fake.cuda.memory._set_allocator_settings("per_process_memory_fraction:0.5")
            with self.assertRaises(_lib.GpumemError) as cm:
                fake.cuda.memory._set_allocator_settings("expandable_segments:True")
            self.assertIn("policy:torch", str(cm.exception))  # a key of the other policy: named, refused
            self.assertEqual(calls, [])  # torch's own setter is not called
        finally:
            if old_mod is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = old_mod
            gt._state["orig_set_allocator_settings"] = old_orig

    def test_summary_and_usage_line(self):
        _lib.configure("policy:gpumem", "sim")
        p = _lib.alloc_raw(5 * MIB, 0, 0)
        self.assertGreater(len(gt.memory_summary(0)), 100)
        line = gt.memory_usage_line("step 1", 0)
        self.assertIn("step 1", line)
        self.assertIn("allocated 5.00 MiB", line)
        free, total = gt.mem_get_info(0)
        self.assertGreater(total, 0)
        self.assertLessEqual(free, total)
        _lib.free_raw(p)


if __name__ == "__main__":
    unittest.main()
