"""Loaded at interpreter start in processes run by `gpumem run` (this folder is
first on their PYTHONPATH). Runs the sitecustomize it shadows, if any, then,
when GPUMEM_RUN is set, waits for `import torch` to finish and calls
gpumem.torch.install() (GPUMEM_RUN=gpumem) or starts publishing torch's own
statistics (GPUMEM_RUN=native). Processes that never import torch pay one
environment lookup and one meta-path entry."""
import os
import sys


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.get("sitecustomize")
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        del sys.modules["sitecustomize"]
        import importlib  # noqa: PLC0415
        try:
            importlib.import_module("sitecustomize")
        except ImportError as e:
            if getattr(e, "name", None) != "sitecustomize":
                raise
    finally:
        sys.path[:] = saved
        if me is not None:
            sys.modules["sitecustomize"] = me


def _after_torch():
    mode = os.environ.get("GPUMEM_RUN")
    if mode == "gpumem":
        import gpumem.torch as gt  # noqa: PLC0415
        gt.install()
    elif mode == "native" and os.environ.get("GPUMEM_PUBLISH", "1") != "0":
        import gpumem.publish_native as pn  # noqa: PLC0415
        pn.start(label=os.environ.get("GPUMEM_PUBLISH_LABEL") or None)
    os.environ["GPUMEM_RUN_DONE"] = mode  # this process was set up (children set up their own)


class _TorchImportHook:
    """Meta-path finder: the first `import torch` runs _after_torch() once torch is loaded."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util  # noqa: PLC0415
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        orig = spec.loader.exec_module

        def exec_module(module):
            orig(module)
            _after_torch()

        spec.loader.exec_module = exec_module
        return spec


_chain()
if os.environ.get("GPUMEM_RUN") in ("gpumem", "native") and "torch" not in sys.modules:
    sys.meta_path.insert(0, _TorchImportHook())
