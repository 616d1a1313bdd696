"""CPU test of OOM forensics through libgpumem_torch.so over the sim backend
(no torch, no GPU): with GPUMEM_OOM_REPORT=DIR (what `gpumem run --oom-report
DIR` sets), an allocation that runs out of memory leaves a report with a
verdict and a torch snapshot pickle in DIR, and still fails with the
allocator's own out-of-memory message. tests/gpu/oom_forensics.sh checks the
three verdicts on the H200 with torch.

Run: GPUMEM_LIB=<build>/libgpumem_torch.so python3 -m unittest discover -s python/tests"""
import glob
import os
import shutil
import sys
import tempfile
import unittest

from _support import unusable  # the source tree's gpumem on sys.path
from gpumem import _lib

GIB = 1 << 30

WHY = unusable()


@unittest.skipUnless(not WHY, "libgpumem_torch.so not usable: %s" % WHY)
class OomReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.reports = os.path.join(self.dir, "oom")
        os.environ["GPUMEM_OOM_REPORT"] = self.reports
        _lib.load().gpumem_torch_shutdown()
        _lib.configure("policy:torch", "sim")

    def tearDown(self):
        _lib.load().gpumem_torch_shutdown()
        _lib.load().gm_history_enable(0)  # the report's setup turned history on: off for the next test
        del os.environ["GPUMEM_OOM_REPORT"]
        shutil.rmtree(self.dir)

    def test_capacity_report_and_the_usual_error(self):
        keep = _lib.alloc_raw(100 * GIB)  # the sim device has 141 GiB
        with self.assertRaises(_lib.GpumemError) as cm:
            _lib.alloc_raw(60 * GIB)
        self.assertIn("out of memory", str(cm.exception).lower())
        self.assertIn("Tried to allocate 60.00 GiB", str(cm.exception))
        (txt,) = glob.glob(os.path.join(self.reports, "gpumem-oom-%d-*.txt" % os.getpid()))
        with open(txt) as f:
            text = f.read()
        self.assertIn("verdict: out of capacity\n", text)
        self.assertIn("request: 60.00 GiB on device 0", text)
        self.assertIn("Tried to allocate 60.00 GiB", text)  # the allocator's explanation, kept
        pickle = txt[:-4] + ".pickle"
        self.assertTrue(os.path.getsize(pickle) > 0)
        self.assertIn("snapshot: " + pickle, text)
        _lib.free_raw(keep)


if __name__ == "__main__":
    unittest.main()
