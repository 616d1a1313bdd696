"""find_library names an AddressSanitizer build it skips and says how to get a
plain one, instead of "not found" for a file that exists (no GPU, no torch)."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpumem import _lib  # noqa: E402


class FindLibrary(unittest.TestCase):
    def test_sanitized_build_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, _lib.LIB_NAME)
            with open(fake, "wb") as f:
                f.write(b"\x7fELF ... libasan.so.8 ...")
            saved_cands, saved_env = _lib._candidates, os.environ.pop("GPUMEM_LIB", None)
            _lib._candidates = lambda name, env: [fake]
            try:
                with self.assertRaises(FileNotFoundError) as cm:
                    _lib.find_library()
            finally:
                _lib._candidates = saved_cands
                if saved_env is not None:
                    os.environ["GPUMEM_LIB"] = saved_env
            msg = str(cm.exception)
            self.assertIn(fake, msg)
            self.assertIn("AddressSanitizer", msg)
            self.assertIn("GPUMEM_SANITIZE=OFF", msg)


if __name__ == "__main__":
    unittest.main()
