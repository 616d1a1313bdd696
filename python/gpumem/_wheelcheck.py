"""Can this python's pip build gpumem's wheel, and if not, the command that fixes it.

One source for `pip install ./python` (setup.py stops with this line) and `gpumem doctor` (which runs
this file with the python it checks: `python _wheelcheck.py` prints the fix and exits 1, or prints
nothing and exits 0). Standard library only: it runs before gpumem is installed.

setuptools >= 70.1 has bdist_wheel itself; older ones need the `wheel` package, which a fresh venv
lacks. `pip install wheel` needs the package index (that advice fails offline); Debian's
python3-wheel-whl puts a wheel of it in /usr/share/python-wheels, which pip installs offline.
"""
import glob
import os
import sys

DEBIAN_WHEELS = "/usr/share/python-wheels"


def wheel_fix(python, wheels=DEBIAN_WHEELS):
    """The command that installs the wheel package for python, offline where it can be."""
    whl = sorted(glob.glob(os.path.join(wheels, "wheel-*.whl")))
    if whl:
        return "install it offline: %s -m pip install --no-index %s" % (python, whl[-1])
    return ("install it: apt-get install python3-wheel-whl && %s -m pip install --no-index %s/wheel-*.whl "
            "(Debian's copy, offline once installed; with the package index: %s -m pip install wheel)"
            % (python, wheels, python))


def _lacks():
    """Why pip cannot build a wheel here, or None when it can."""
    try:
        from setuptools.command.bdist_wheel import bdist_wheel  # noqa: F401, PLC0415
        return None
    except ImportError:
        pass
    try:
        import wheel.bdist_wheel  # noqa: F401, PLC0415
        return None
    except ImportError:
        pass
    try:
        import setuptools  # noqa: PLC0415
        return "setuptools %s lacks 'bdist_wheel' and the 'wheel' package is not installed" % setuptools.__version__
    except ImportError:
        return "setuptools is not installed"


def wheel_missing(python=None):
    """One line naming what pip needs to build a wheel and how to get it, or None when it is there."""
    why = _lacks()
    python = python or sys.executable
    if why and why.startswith("setuptools is not"):
        return "pip cannot build gpumem for %s: %s (apt-get install python3-setuptools)" % (python, why)
    return "pip cannot build gpumem for %s: %s; %s, then run pip again" % (python, why, wheel_fix(python)) if why else None


if __name__ == "__main__":  # gpumem doctor: why, then the fix, one line each
    why = _lacks()
    if why:
        print("%s cannot build gpumem: %s" % (sys.executable, why))
        print(wheel_fix(sys.executable) if not why.startswith("setuptools is not")
              else "install it: apt-get install python3-setuptools")
    sys.exit(1 if why else 0)
