"""Build and install gpumem in one step:

    python3 -m pip install --no-build-isolation ./python   (offline, against the installed torch)

builds libgpumem_torch.so and the gpumem executable with CMake from the
repository root (Release, no tests) and, when a torch built with CUDA can be
imported, the C++ shim gpumem._C against that torch (torch.utils.cpp_extension), and installs
them inside the package (gpumem/bin/gpumem, run by the `gpumem` console
script), where gpumem finds them without environment variables. Without torch,
with a CPU-only torch (or with GPUMEM_NO_SHIM=1) the package installs without the shim, its version
says so (pip prints "Successfully installed torch-gpumem-0.1.0+noshim"), and
gpumem.torch.install() falls back to torch's CUDAPluggableAllocator entry
points (torch's memory API then does not answer; `gpumem run` and
`gpumem doctor` say so). With build isolation (plain `pip install ./python`)
pip's temporary environment has no torch: use --no-build-isolation.
_build_info.txt records the torch the shim was built for and the python, for
`gpumem doctor`.
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
EXE = "gpumem"


def _version():
    """The CMake project's version (one source: CMakeLists.txt's project()), else the package's."""
    import re  # noqa: PLC0415
    for path, pat in ((os.path.join(REPO, "CMakeLists.txt"), r"project\(gpumem VERSION ([0-9.]+)"),
                      (os.path.join(HERE, "gpumem", "__init__.py"), r"__version__ = \"([0-9.]+)\"")):
        try:
            with open(path) as f:
                m = re.search(pat, f.read())
        except OSError:
            continue
        if m:
            return m.group(1)
    raise SystemExit("gpumem setup: no version found in CMakeLists.txt or gpumem/__init__.py")


VERSION = _version()


def _log(msg):
    print("gpumem setup: " + msg, file=sys.stderr, flush=True)


def _wheel_missing():
    """gpumem/_wheelcheck.py's line (shared with gpumem doctor), or None when pip can build a wheel."""
    import runpy  # noqa: PLC0415
    msg = runpy.run_path(os.path.join(HERE, "gpumem", "_wheelcheck.py"))["wheel_missing"]()
    return "gpumem setup: " + msg if msg else None


def build_library(build_temp):
    """(libgpumem_torch.so, gpumem executable) from the repository's CMake project."""
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        pre = [os.path.join(HERE, "gpumem", LIB), os.path.join(HERE, "gpumem", "bin", EXE)]
        if all(os.path.isfile(p) for p in pre):
            _log("no CMake project above %s: using the prebuilt %s" % (HERE, ", ".join(pre)))
            return pre
        raise SystemExit("gpumem setup: %s needs the gpumem source tree (CMakeLists.txt in %s) or a prebuilt "
                         "gpumem/%s and gpumem/bin/%s" % (HERE, REPO, LIB, EXE))
    cmake = shutil.which("cmake")
    if not cmake:
        raise SystemExit("gpumem setup: cmake not found on PATH; install CMake >= 3.20 (apt-get install cmake)")
    bdir = os.path.join(build_temp, "cmake")
    jobs = os.environ.get("GPUMEM_BUILD_JOBS") or str(max(1, min(8, os.cpu_count() or 1)))
    subprocess.check_call([cmake, "-S", REPO, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release", "-DGPUMEM_TESTS=OFF",
                           "-DGPUMEM_SANITIZE=OFF"], stdout=sys.stderr)
    subprocess.check_call([cmake, "--build", bdir, "--target", "gpumem_torch", "gpumem_cli", "-j", jobs],
                          stdout=sys.stderr)
    return [os.path.join(bdir, LIB), os.path.join(bdir, EXE)]


class build_py(_build_py):
    def run(self):
        super().run()
        bt = os.path.abspath(self.get_finalized_command("build_ext").build_temp or "build/temp")
        os.makedirs(bt, exist_ok=True)
        lib, exe = build_library(bt)
        pkg = os.path.join(self.build_lib, "gpumem")
        for src, dst in ((lib, os.path.join(pkg, LIB)), (exe, os.path.join(pkg, "bin", EXE))):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.abspath(src) != os.path.abspath(dst):
                shutil.copy2(src, dst)
            _log("installed: %s" % dst)
        with open(os.path.join(pkg, "_build_info.txt"), "w") as f:
            f.write("version=%s\ntorch=%s\npython=%s\n" % (VERSION, TORCH_VERSION or "none", sys.executable))


TORCH_VERSION = None  # the torch the shim is built against (shim_extension)


def shim_extension():
    """(ext_modules, cmdclass additions) for gpumem._C, or ([], {}) without torch."""
    global TORCH_VERSION
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
    if not getattr(torch.version, "cuda", None):
        _log("torch %s has no CUDA (a CPU-only build, such as Debian's python3-torch): not building the C++ "
             "shim gpumem._C, which is torch's CUDA allocator interface" % torch.__version__)
        return [], {}
    TORCH_VERSION = torch.__version__
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


if {"bdist_wheel", "dist_info", "editable_wheel"} & set(sys.argv) and _wheel_missing():
    raise SystemExit(_wheel_missing())
ext_modules, cmdclass = shim_extension()
cmdclass["build_py"] = build_py
# A build without the shim says so in its version: pip's "Successfully
# installed torch-gpumem-0.1.0+noshim" is the one line pip shows on success.
setup(version=VERSION if ext_modules else VERSION + "+noshim", ext_modules=ext_modules, cmdclass=cmdclass)
