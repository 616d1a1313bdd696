"""The `gpumem` command of a pip install, and `python3 -m gpumem`: both exec
the C executable built with the library (gpumem/bin/gpumem in the installed
package), so every subcommand, `gpumem run` included, has one implementation
and one option list (src/cli/). Outside an install (a source checkout's
python/ on PYTHONPATH), the executable beside the library gpumem._lib finds
(a CMake build folder, or $GPUMEM_LIB's folder) is used.
"""
import os
import sys

EXE = "gpumem"
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def find_executable():
    """Path of the gpumem executable, or raise FileNotFoundError saying what to do."""
    looked = [os.path.join(_PKG_DIR, "bin", EXE)]
    try:
        from . import _lib  # noqa: PLC0415
        looked.append(os.path.join(os.path.dirname(_lib.find_library()), EXE))
    except (OSError, FileNotFoundError):
        pass
    for p in looked:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError(
        "gpumem: the gpumem executable is not installed (looked in %s); install the package with "
        "'python3 -m pip install --no-build-isolation ./python', or build it with CMake" % ", ".join(looked))


def main(argv=None):
    """Replace this process with `gpumem ARGV...`; returns only on failure."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        exe = find_executable()
    except FileNotFoundError as e:
        sys.stderr.write("%s\n" % e)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(exe, [exe] + argv)
    except OSError as e:
        sys.stderr.write("gpumem: cannot run %s: %s\n" % (exe, e.strerror or e))
        return 126
    return 0  # not reached
