"""publish_native publishes PyTorch's own allocator statistics through the
library (gm_native_publisher_*): `gpumem smi` reads back exactly the
memory_stats values it was given, as source "torch", only for devices with
stats, in a 0600 segment that stop() removes. No torch or GPU needed: the
stats come from a fake memory_stats()."""
import json
import os
import stat
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpumem import _lib  # noqa: E402


def _gpumem_cli():
    try:
        d = os.path.dirname(_lib.find_library())
    except FileNotFoundError:
        return None
    p = os.path.join(d, "gpumem")
    return p if os.access(p, os.X_OK) else None


@unittest.skipIf(_gpumem_cli() is None, "needs a plain (non-ASan) build with the gpumem CLI next to the library")
class PublishNative(unittest.TestCase):
    def test_smi_reads_back_torch_stats(self):
        os.environ["GPUMEM_SHM_TAG"] = "pytest%d" % os.getpid()
        import gpumem.publish_native as pn
        keys = pn.keys()
        self.assertIn("allocated_bytes.all.current", keys)
        self.assertIn("num_ooms", keys)
        stats = {1: {"allocated_bytes.all.current": 3 << 20, "reserved_bytes.all.current": 8 << 20,
                     "requested_bytes.all.current": (3 << 20) - 7, "reserved_bytes.all.peak": 10 << 20,
                     "allocated_bytes.all.peak": 5 << 20, "num_ooms": 2, "num_alloc_retries": 4,
                     "allocation.all.allocated": 11, "allocation.all.freed": 9,
                     "active_bytes.all.current": 3 << 20}}
        pub = pn.NativePublisher(label='torch "native"', interval=1, devices=[0, 1],
                                 stats_fn=lambda d: stats.get(d, {}))
        try:
            pub.publish_once()
            env = dict(os.environ)
            out = subprocess.run([_gpumem_cli(), "smi", "--no-nvml", "--format", "json"], env=env,
                                 capture_output=True, text=True, check=True).stdout
            rows = [p for p in json.loads(out)["processes"] if p["pid"] == os.getpid()]
            self.assertEqual(len(rows), 1, rows)  # device 0 had no stats: not published
            r = rows[0]
            self.assertEqual((r["gpu"], r["source"], r["label"]), (1, "torch", 'torch "native"'))
            want = {"allocated": 3 << 20, "reserved": 8 << 20, "requested": (3 << 20) - 7,
                    "peak_reserved": 10 << 20, "peak_allocated": 5 << 20, "num_ooms": 2,
                    "num_alloc_retries": 4, "num_allocs": 11, "num_frees": 9, "active": 3 << 20,
                    "reserved_unallocated": 5 << 20}
            for k, v in want.items():
                self.assertEqual(r[k], v, k)
            segs = [f for f in os.listdir("/dev/shm") if f.startswith("gpumem-" + os.environ["GPUMEM_SHM_TAG"])]
            self.assertEqual(len(segs), 1, segs)
            self.assertEqual(stat.S_IMODE(os.stat("/dev/shm/" + segs[0]).st_mode), 0o600)
        finally:
            pub.stop()
        self.assertFalse(os.path.exists("/dev/shm/" + segs[0]))
        pub.stop()  # idempotent


if __name__ == "__main__":
    unittest.main()
