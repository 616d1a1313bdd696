"""Build and install gpumem in one step:

    pip install --no-build-isolation ./python      (offline, against the installed torch)

builds libgpumem_torch.so with CMake from the repository root (Release, no
tests) and, when torch can be imported, the C++ shim gpumem._C against that
torch (torch.utils.cpp_extension), and installs both inside the package, where
gpumem finds them without environment variables. Without torch (or with
GPUMEM_NO_SHIM=1) the package installs without the shim and
gpumem.torch.install() falls back to torch's CUDAPluggableAllocator entry
points (torch's memory API then does not answer; a warning says so).
With build isolation (plain `pip install ./python`) pip's temporary
environment has no torch, so the shim is skipped: use --no-build-isolation.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIB = "libgpumem_torch.so"


def _log(msg):
    print("gpumem setup: " + msg, file=sys.stderr, flush=True)


def build_library(build_temp):
    """libgpumem_torch.so from the repository's CMake project; its path."""
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        pre = os.path.join(HERE, "gpumem", LIB)
        if os.path.isfile(pre):
            _log("no CMake project above %s: using the prebuilt %s" % (HERE, pre))
            return pre
        raise SystemExit("gpumem setup: %s needs the gpumem source tree (CMakeLists.txt in %s) or a prebuilt "
                         "gpumem/%s" % (HERE, REPO, LIB))
    cmake = shutil.which("cmake")
    if not cmake:
        raise SystemExit("gpumem setup: cmake not found on PATH; install CMake >= 3.20 (apt-get install cmake)")
    bdir = os.path.join(build_temp, "cmake")
    jobs = os.environ.get("GPUMEM_BUILD_JOBS") or str(max(1, min(8, os.cpu_count() or 1)))
    subprocess.check_call([cmake, "-S", REPO, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release", "-DGPUMEM_TESTS=OFF",
                           "-DGPUMEM_SANITIZE=OFF"], stdout=sys.stderr)
    subprocess.check_call([cmake, "--build", bdir, "--target", "gpumem_torch", "-j", jobs], stdout=sys.stderr)
    return os.path.join(bdir, LIB)


class build_py(_build_py):
    def run(self):
        super().run()
        bt = os.path.abspath(self.get_finalized_command("build_ext").build_temp or "build/temp")
        os.makedirs(bt, exist_ok=True)
        lib = build_library(bt)
        dst = os.path.join(self.build_lib, "gpumem", LIB)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.abspath(lib) != os.path.abspath(dst):
            shutil.copy2(lib, dst)
        _log("library: %s" % dst)


def shim_extension():
    """(ext_modules, cmdclass additions) for gpumem._C, or ([], {}) without torch."""
    if os.environ.get("GPUMEM_NO_SHIM", "") not in ("", "0"):
        _log("GPUMEM_NO_SHIM set: not building the C++ shim")
        return [], {}
    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension as ce
    except Exception as e:  # noqa: BLE001 (any failure to import torch means: no shim)
        _log("torch not importable (%s): not building the C++ shim gpumem._C; torch's memory API will not "
             "answer under gpumem. Use pip install --no-build-isolation ./python with torch installed." % e)
        return [], {}
    try:
        inc = ce.include_paths(device_type="cuda")
    except TypeError:
        inc = ce.include_paths(cuda=True)
    cuda_home = ce.CUDA_HOME or "/usr/local/cuda"
    inc = list(inc) + [os.path.join(cuda_home, "include"), os.path.join(REPO, "include"),
                       os.path.join(REPO, "src", "torch")]  # gpumem_torch.h: the entry points the shim resolves
    site = os.path.dirname(os.path.dirname(torch.__file__))
    inc += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))  # CUDA headers of pip-installed torch
    inc += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")))
    ext = ce.CppExtension(
        "gpumem._C", [os.path.relpath(os.path.join(HERE, "csrc", "gpumem_shim.cpp"), HERE)],
        include_dirs=[p for p in inc if os.path.isdir(p)],
        library_dirs=ce.library_paths(),
        libraries=["c10_cuda", "torch_cuda", "dl"],
        extra_compile_args=["-O2"],  # the -std flag is torch's (cpp_extension)
    )
    return [ext], {"build_ext": ce.BuildExtension.with_options(use_ninja=False)}


ext_modules, cmdclass = shim_extension()
cmdclass["build_py"] = build_py
setup(ext_modules=ext_modules, cmdclass=cmdclass)
