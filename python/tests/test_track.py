"""CPU-only tests of gpumem.track's scopes and history over the sim backend
(no torch, no GPU): scope()/scoped() nest per thread, the history records
allocations made through the library with their scopes and tags, and the
dump reads back through `gpumem report --json` when the CLI is built.

Run: GPUMEM_LIB=<build>/libgpumem_torch.so python3 -m unittest discover -s python/tests"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpumem import _lib  # noqa: E402
from gpumem import track as tk  # noqa: E402

MIB = 1 << 20


def _loadable():
    try:
        _lib.load()
        tk._c()
        return True, ""
    except (OSError, FileNotFoundError) as e:
        return False, str(e)


@unittest.skipUnless(_loadable()[0], "libgpumem_torch.so not loadable: %s" % _loadable()[1])
class TrackTest(unittest.TestCase):
    def setUp(self):
        _lib.load().gpumem_torch_shutdown()
        _lib.configure("", "sim")

    def tearDown(self):
        tk.history_enable(0)
        _lib.load().gpumem_torch_shutdown()

    def test_scopes_nest_per_thread(self):
        self.assertIsNone(tk.current_scope())
        seen = {}

        def other():
            seen["other"] = (tk.scope_depth(), tk.current_scope())

        with tk.scope("outer"):
            with tk.scope("inner"):
                self.assertEqual((tk.scope_depth(), tk.current_scope()), (2, "inner"))
                t = threading.Thread(target=other)
                t.start()
                t.join()
            self.assertEqual(tk.current_scope(), "outer")
        self.assertEqual(seen["other"], (0, None))
        self.assertEqual(tk.scope_depth(), 0)

        @tk.scoped("work")
        def f():
            return tk.current_scope()

        @tk.scoped
        def g():
            return tk.current_scope()
        self.assertEqual(f(), "work")
        self.assertTrue(g().endswith("g"))
        with self.assertRaises(_lib.GpumemError):
            tk.scope_pop()  # nothing open

    def test_history_dump_has_scopes_and_tags(self):
        tk.history_enable(1000)
        with tk.scope("forward"), tk.scope("model.fc"):
            act = _lib.alloc_raw(3 * MIB, 0, 0)
            tmp = _lib.alloc_raw(MIB, 0, 0)
            _lib.free_raw(tmp)
        w = _lib.alloc_raw(2 * MIB, 0, 0)
        tk.tag(w, "parameters")
        with tk.scope("backward"):
            _lib.free_raw(act)
        recorded, held, dropped = tk.history_counts()
        self.assertEqual((recorded, held, dropped), (held, held, 0))
        self.assertGreaterEqual(held, 6)
        d = tempfile.mkdtemp()
        try:
            path = os.path.join(d, "h.pickle.gz")
            tk.history_dump(path)
            self.assertGreater(os.path.getsize(path), 0)
            cli = shutil.which("gpumem") or os.path.join(os.path.dirname(_lib.library_path()), "gpumem")
            if not os.path.exists(cli):
                self.skipTest("no gpumem CLI next to %s or on PATH" % _lib.library_path())
            j = json.loads(subprocess.run([cli, "report", path, "--json"], check=True, capture_output=True,
                                          text=True).stdout)
            cats = j["categories"]
            self.assertEqual(cats["parameters"]["peak_by"]["tagged"], 2 * MIB)
            self.assertEqual(cats["activations"]["allocated"], 3 * MIB)
            self.assertEqual(cats["temporaries"]["allocated"], MIB)
            with self.assertRaises(_lib.GpumemError):
                tk.history_dump(os.path.join(d, "no", "such", "dir.pickle"))
        finally:
            shutil.rmtree(d)
        _lib.free_raw(w)


if __name__ == "__main__":
    unittest.main()
