"""The GPU memory of one step of your own code, traced without a GPU.

    import torch, gpumem.estimate as ge

    def train(device):                            # your code, written against `device`
        model = MyModel().to(device)
        opt = torch.optim.AdamW(model.parameters())
        def step():
            x = torch.randn(8, 1024, device=device)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    trace = ge.trace_step(train, steps=3)         # runs train(device) once, step() 3 times
    trace.save("step.pickle.gz")                  # gpumem estimate --trace / replay / report read it
    print(trace.estimate(capacity="80GiB")["verdict"])

train(device) runs under a recorder (a TorchDispatchMode) on tensors that
have no memory: meta tensors ("meta" mode, torch 1.13 and 2.x), or
FakeTensorMode's tensors that say device "cuda" ("fake" mode, torch 2.x:
torch.autocast("cuda") and the choice of attention kernel then behave as on
the GPU). Every storage an operator creates is one allocation of its bytes
(what torch's CUDA allocator is asked for), freed when the storage dies (a
weakref finalizer on the storage on torch >= 2.1; on 1.13 on every tensor the
recorder sees holding it, and on the tensors autograd saves for backward,
through saved_tensors_hooks). The
allocations and frees, in order, become a trace in torch's memory-snapshot
format (the pickle torch.cuda.memory._dump_snapshot() writes), each with a
category tag and its module scope, so `gpumem estimate --trace`, `replay`,
`tune` and `report` replay it through the allocator models like a recorded
run. docs/estimate.md ("Your own model: the tracer") says what is modelled
and what is not.

Categories: parameters (the model's nn.Parameter storages), gradients (their
.grad, as optimizer.step sees them), optimizer state (optimizer.state after
step), activations (saved for backward, or made by forward and alive when
backward starts), temporaries (the rest); "other" for cuBLAS's workspaces and
inputs made outside every step.
"""
import contextlib
import functools
import gzip
import os
import pickle
import subprocess
import weakref

# gm_category names (GM_CATEGORY_LIST, include/gpumem/gpumem.h), as track.py spells them
from .track import CATEGORIES, PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, UNTRACKED
from .track import _tensors
from ._cuda_paths import CudaPaths, flash_backward_scratch, sdp_choice_for

PARAMETERS, GRADIENTS, OPTIMIZER, ACTIVATIONS, TEMPORARIES, OTHER = CATEGORIES
# the tag frames `gpumem report` reads (src/report/report.h, GM_TAG_*_FILE)
TAG_CATEGORY_FILE = "<gpumem category>"
TAG_SCOPE_FILE = "<gpumem scope>"
PHASE_SETUP = "setup"
# cuBLAS's workspace on Hopper under torch 2.x: one per (handle, stream), so
# one for the forward's thread and one for autograd's; the block models'
# CUBLAS_WORKSPACE (src/estimate/estimate_emit.h), seen in recorded snapshots.
# 0 leaves it out.
CUBLAS_WORKSPACE = 32 << 20
# first fake address; every allocation gets a new one (the replay never sees one reused)
_ADDR0 = 0x7F0000000000
_FLASH_BACKWARD = ("_scaled_dot_product_flash_attention_backward",)
_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm", "_int_mm", "addmv", "mv")


class TraceError(RuntimeError):
    """The step could not be traced; the message says why and what to do."""


class Trace:
    """One traced run: allocation events in order, each with its category.

    events: list of (action, addr, size, category, scope, phase), action
    "alloc" or "free"; an allocation not freed lives past the trace."""

    def __init__(self, mode, device, steps, torch_version):
        self.events = []
        self.mode, self.device, self.steps, self.torch_version = mode, device, steps, torch_version
        self.notes = []          # what the tracer could not see, in words
        self.unseen_inputs = 0   # tensors first met as an operator's input (made outside the trace)

    def note(self, text):
        """Say text among the notes, once however often the tracer meets it."""
        if text not in self.notes:
            self.notes.append(text)

    # -- what the trace says by itself (no allocator): live requested bytes --
    def live_peak(self):
        """(peak live bytes as requested, {category: bytes at that peak})."""
        live, size_of, by = 0, {}, dict.fromkeys(CATEGORIES, 0)
        peak, at = 0, dict(by)
        for action, addr, size, cat, _scope, _phase in self.events:
            if action == "alloc":
                size_of[addr] = (size, cat)
                live += size
                by[cat] += size
                if live > peak:
                    peak, at = live, dict(by)
            else:
                size, cat = size_of.pop(addr)
                live -= size
                by[cat] -= size
        return peak, at

    def to_snapshot(self):
        """The trace as torch.cuda.memory._snapshot() would have it (device 0, stream 0)."""
        frames_of = {}
        out = []
        for t, (action, addr, size, cat, scope, phase) in enumerate(self.events):
            key = (cat, scope, phase)
            fr = frames_of.get(key)
            if fr is None:
                fr = [{"name": cat, "filename": TAG_CATEGORY_FILE, "line": 0}]
                if scope:
                    fr.append({"name": scope, "filename": TAG_SCOPE_FILE, "line": 0})
                if phase != PHASE_SETUP:
                    fr.append({"name": phase, "filename": TAG_SCOPE_FILE, "line": 0})
                frames_of[key] = fr
            out.append({"action": "alloc" if action == "alloc" else "free_completed", "addr": addr,
                        "size": size, "stream": 0, "time_us": t, "frames": fr})
        return {"device_traces": [out], "segments": [],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
                "gpumem_trace": {"tracer": "gpumem.estimate", "mode": self.mode, "device": self.device,
                                 "steps": self.steps, "torch": self.torch_version, "notes": list(self.notes)}}

    def save(self, path):
        """Write the trace as a memory snapshot pickle (gzip'd when path ends in .gz)."""
        path = os.fspath(path)
        if path.endswith(".gmt"):
            raise ValueError("gpumem: the tracer writes torch's snapshot format: save to a .pickle or .pickle.gz "
                             "path, then 'gpumem convert %s -o %s' if you want a .gmt" % (path + ".pickle.gz", path))
        with (gzip.open if path.endswith(".gz") else open)(path, "wb") as f:
            pickle.dump(self.to_snapshot(), f, protocol=4)
        return path

    def estimate(self, capacity=None, executable=None, path=None):
        """`gpumem estimate --trace` of this trace: a dict (its --json output).

        Replays under PyTorch's default allocator, expandable_segments:True and
        gpumem's policy; categories at the peak; with capacity ("80GiB" or
        bytes) the verdict. path: where to keep the trace (a temporary file
        otherwise)."""
        import json  # noqa: PLC0415
        import tempfile  # noqa: PLC0415
        from . import _cli  # noqa: PLC0415
        exe = executable or _cli.find_executable()
        tmp = None
        if path is None:
            fd, tmp = tempfile.mkstemp(suffix=".pickle")
            os.close(fd)
            path = tmp
        try:
            self.save(path)
            cmd = [exe, "estimate", "--trace", path, "--json"]
            if capacity is not None:
                cmd += ["--capacity", str(capacity)]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        finally:
            if tmp:
                os.unlink(tmp)
        if p.returncode:
            raise TraceError("gpumem estimate --trace failed (exit %d): %s" % (p.returncode, p.stderr.strip()))
        return json.loads(p.stdout)


class _Storage:
    """One storage: one allocation. refs: tensors seen holding it still alive."""
    __slots__ = ("addr", "size", "cat", "refs", "key", "phase", "step", "scope", "__weakref__")

    def __init__(self, addr, size, key, phase, step, scope):
        self.addr, self.size, self.key = addr, size, key
        self.phase, self.step, self.scope = phase, step, scope
        self.cat = None
        self.refs = 0


def _storage_of(t):
    """(identity, bytes) of t's storage: the StorageImpl's address while it lives."""
    try:
        s = t.untyped_storage()          # torch 2.x
    except (AttributeError, NotImplementedError):
        s = t._storage()                 # torch 1.13
    return s._cdata, s.nbytes()


def _storages_preserved():
    """True when t.untyped_storage() is one Python object for the storage's
    life (torch >= 2.1), false on torch 1.13 (a new wrapper each call)."""
    import torch  # noqa: PLC0415
    t = torch.empty(1, device="meta")
    try:
        return t.untyped_storage() is t.untyped_storage()
    except AttributeError:
        return False


class _Recorder:
    """The state of one trace: live storages, the tensors that hold them,
    the current phase / scope, and the events."""

    def __init__(self, trace, device_type, workspace):
        self.trace = trace
        self.device_type = device_type
        self.workspace = workspace
        self.live = {}         # storage identity -> _Storage
        self.dead = {}         # storage identity -> (_Storage, index of its free event), until reused
        self.held = {}         # id(tensor) -> _Storage (one finalizer per tensor object)
        # torch >= 2.1 keeps one Python object per storage for the storage's life, so a
        # finalizer on it fires when the storage dies; before, every tensor holding it is
        # watched instead (torch's swap_tensors would refuse such tensors: _Hooks.keep_tied
        # converts parameters without it)
        self.storage_refs = _storages_preserved()
        self.records = []      # every _Storage, in allocation order (categories decided at the end)
        self.next_addr = _ADDR0
        self.phase, self.step = PHASE_SETUP, 0
        self.scopes = []       # module paths, innermost last
        self.workspaces = set()  # phases that have their cuBLAS workspace
        self.closed = False
        self.draws = {}        # id(tensor) -> the value the trace takes for a random draw (_Draws)

    # -- allocations ------------------------------------------------------
    def _alloc(self, size, key):
        rec = _Storage(self.next_addr, size, key, self.phase, self.step, self.scopes[-1] if self.scopes else "")
        self.next_addr += (size + 511) // 512 * 512 + 512
        self.records.append(rec)
        self.trace.events.append(["alloc", rec.addr, size, rec, rec.scope, self.phase])
        if key is not None:
            self.live[key] = rec
            self.dead.pop(key, None)
        return rec

    def _free(self, rec):
        if self.live.get(rec.key) is rec:
            del self.live[rec.key]
        if not self.closed:
            if rec.key is not None:
                self.dead[rec.key] = (rec, len(self.trace.events))
            self.trace.events.append(["free", rec.addr, rec.size, rec, rec.scope, self.phase])

    def _revive(self, key):
        """A storage met again after every tensor we saw holding it died: a
        tensor made without an operator held it (nn.Parameter(t) wraps t's
        storage in a new tensor in C++). Its free never happened: drop it."""
        rec, i = self.dead.pop(key)
        self.trace.events[i] = None
        self.live[key] = rec
        return rec

    def _drop(self, oid):
        rec = self.held.pop(oid, None)   # (a resize_ may have moved the tensor to a new _Storage)
        if rec is None:
            return
        rec.refs -= 1
        if rec.refs == 0:
            self._free(rec)

    def _hold(self, t, rec):
        if self.storage_refs:
            if not rec.refs:   # one finalizer on the storage itself, the first time it is seen
                rec.refs = 1
                weakref.finalize(t.untyped_storage(), self._storage_died, rec.key)
            return
        if id(t) in self.held:
            return
        self.held[id(t)] = rec
        rec.refs += 1
        weakref.finalize(t, self._drop, id(t))

    def _storage_died(self, key):
        rec = self.live.get(key)
        if rec is not None:
            rec.refs = 0
            self._free(rec)

    def on_device(self, t):
        return t.device.type == self.device_type

    def see(self, t, new):
        """t came out of an operator (new=True) or went into one: the storage it
        holds is allocated now unless already live. Returns its _Storage."""
        if not self.on_device(t):
            return None
        key, nbytes = _storage_of(t)
        rec = self.live.get(key)
        if rec is not None and nbytes > rec.size:      # resize_: a new block, then the old one goes
            old = rec
            rec = self._alloc(nbytes, key)
            rec.refs, old.refs = old.refs, 0     # (a storage's finalizer finds it by key)
            for oid, r in list(self.held.items()):
                if r is old:
                    self.held[oid] = rec
            self._free(old)
        if rec is None and key in self.dead and not new:
            rec = self._revive(key)
        if rec is None:
            if not nbytes:
                return None
            rec = self._alloc(nbytes, key)
            if not new:
                self.trace.unseen_inputs += 1
                rec.cat = OTHER
        self._hold(t, rec)
        return rec

    def matmul(self):
        """cuBLAS allocates its workspace on a thread's first matmul."""
        ph = PHASE_BACKWARD if self.phase == PHASE_BACKWARD else "forward-thread"
        if self.workspace and ph not in self.workspaces:
            self.workspaces.add(ph)
            rec = self._alloc(self.workspace, None)
            rec.cat = OTHER
            rec.refs = 1          # torch keeps it for the process's life

    def scratch(self, sizes):
        """Allocations an operator's device code makes and frees before it returns."""
        recs = [self._alloc(n, None) for n in sizes if n]
        for r in recs:
            r.cat = TEMPORARIES
        for r in reversed(recs):
            self._free(r)

    def category(self, rec, cat, over=False):
        if rec is not None and (rec.cat is None or over):
            rec.cat = cat


def _nonzero(rec, fraction, t):
    """torch.nonzero has as many rows as t has nonzero elements, which tensors
    without values do not know: the caller's assumption says how many."""
    import torch  # noqa: PLC0415
    if fraction is None:
        raise TraceError("gpumem: the traced step calls a data-dependent operator (torch.nonzero, torch.where(cond), "
                         "boolean indexing: MoE routing, masks) whose output size depends on values that meta and fake "
                         "tensors do not have; pass trace_step(..., nonzero=FRACTION), the share of the elements that "
                         "are nonzero (balanced top-k routing over E experts: 1/E)")
    rows = int(round(t.numel() * float(fraction)))
    out = torch.empty((rows, t.dim()), dtype=torch.long, device=t.device)
    rec.see(out, True)
    return out


_GENERATION = os.sep + os.path.join("transformers", "generation") + os.sep


def _reader():
    """(file, line, function) of the code that reads a tensor's value: the
    innermost frame outside this module and torch's dispatch machinery."""
    import sys  # noqa: PLC0415
    import torch  # noqa: PLC0415
    plumbing = tuple(os.path.join(os.path.dirname(torch.__file__), p) for p in (
        "_compile.py", "_dynamo", "_ops.py", "_tensor.py", "overrides.py", "utils" + os.sep + "_python_dispatch.py",
        "_subclasses", "utils" + os.sep + "_contextlib.py"))
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename == __file__ or f.f_code.co_filename.startswith(plumbing)):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno, f.f_code.co_name) if f is not None else ("?", 0, "?")


def _in_library(path):
    """Code the user installed rather than wrote: torch itself, or a package
    under site-packages / dist-packages (transformers' mask checks, DDP's)."""
    import torch  # noqa: PLC0415
    parts = path.split(os.sep)
    return path.startswith(os.path.dirname(torch.__file__) + os.sep) or \
        "site-packages" in parts or "dist-packages" in parts


def _item(value, t, rec=None):
    """Tensor.item() / bool(t) reads a value the tracer does not have: the
    caller's item=; without one, a read inside installed library code (a
    check the user cannot take out: transformers' "is the padding mask all
    ones", shapes compared across ranks) reads as True (a bool) or 1 (a
    number), and the trace notes where; a read in the user's own code, or in
    transformers' generation loop (it stops on values), stops the trace."""
    if value is None and rec is not None:
        where = _reader()
        if _in_library(where[0]) and _GENERATION not in where[0]:
            value = True if _is_bool(t) else 1
            note = "a tensor's value read inside %s:%d (%s) was taken as %r; pass item= to choose" % (
                _short(where[0]), where[1], where[2], value)
            rec.trace.note(note)
    if value is None:
        raise TraceError("gpumem: the traced step reads a tensor's value (.item(), bool(t), a Python if on a "
                         "tensor: a loss printed, a stopping check) that meta and fake tensors do not have; pass "
                         "trace_step(..., item=VALUE), the value every such read returns, or keep the read out of "
                         "the traced step (model.generate() stops on values: trace a decoding loop of your own)")
    return bool(value) if _is_bool(t) else float(value) if t.is_floating_point() else int(value)


def _host_item(rec, t):
    """A host tensor's value FakeTensorMode does not have (an optimizer's step
    count): 1 (True for a bool), which no bias correction divides by zero; the
    trace notes where, as a value taken is a step that may not be the GPU's."""
    import torch  # noqa: PLC0415
    value = _item(1, t)
    where = _reader()
    if where[0].startswith(os.path.join(os.path.dirname(torch.__file__), "optim") + os.sep):
        return value      # a step count: it scales the update, never decides what is allocated
    note = "a host tensor's value read at %s:%d (%s) was taken as %r" % (_short(where[0]), where[1], where[2], value)
    rec.trace.note(note)
    return value


def _is_bool(t):
    import torch  # noqa: PLC0415
    return t.dtype == torch.bool


def _short(path):
    """A library file's path from its package on (transformers/masking_utils.py)."""
    parts = path.split(os.sep)
    for root in ("site-packages", "dist-packages"):
        if root in parts:
            return os.sep.join(parts[len(parts) - parts[::-1].index(root):])
    import torch  # noqa: PLC0415
    base = os.path.dirname(os.path.dirname(torch.__file__)) + os.sep
    return path[len(base):] if path.startswith(base) else path


# A random draw's value decides whether a layer runs (LayerDrop: transformers'
# `if torch.rand([]) < self.layerdrop: continue`, on the host, which
# FakeTensorMode cannot read): the tracer takes each draw at the top of its
# range, so `draw < p` is False and `draw > p` True for p < 1: every layer
# such a check gates runs, the step at its largest (with layerdrop 0, the
# step itself). Draws are followed through views and copies to comparisons
# with a number, and read from there.
_DRAWS = {"rand": 1.0, "rand_like": 1.0, "uniform_": None, "uniform": None}
_DRAW_VIEWS = ("select", "squeeze", "unsqueeze", "view", "reshape", "alias", "detach", "clone", "_to_copy",
               "lift_fresh", "lift_fresh_copy", "expand", "flatten", "t")
_DRAW_COMPARE = {"lt": float.__lt__, "le": float.__le__, "gt": float.__gt__, "ge": float.__ge__}


def _draw_of(rec, name, args, kwargs, out):
    """The value the trace takes for out (a draw, or a comparison of one with
    a number), or None."""
    if name in _DRAWS:
        top = _DRAWS[name]
        if top is None:   # uniform_(self, from=0, to=1)
            top = float(args[2] if len(args) > 2 else kwargs.get("to", 1.0))
        return top - top * 2.0 ** -24 if top > 0 else top
    if not args or id(args[0]) not in rec.draws:
        return None
    value = rec.draws[id(args[0])]
    if name in _DRAW_VIEWS:
        return value
    if name in _DRAW_COMPARE and len(args) > 1 and isinstance(args[1], (int, float)) and \
            not isinstance(value, bool):
        return _DRAW_COMPARE[name](float(value), float(args[1]))
    return None


def _remember_draw(rec, t, value):
    import torch  # noqa: PLC0415
    if isinstance(t, torch.Tensor) and t.numel() <= 64 and id(t) not in rec.draws:
        rec.draws[id(t)] = value
        weakref.finalize(t, rec.draws.pop, id(t), None)


def _read_draw(rec, t):
    """A draw's value (or its comparison's), with a note once per place."""
    value = rec.draws[id(t)]
    where = _reader()
    note = ("a random draw read at %s:%d (%s) was taken at the top of its range (%r): a layer it drops at "
            "random runs" % (_short(where[0]), where[1], where[2], value))
    rec.trace.note(note)
    return value if _is_bool(t) else float(value) if t.is_floating_point() else int(value)


def _scalar_tensor(x):
    import torch  # noqa: PLC0415
    return torch.tensor(x, dtype=torch.float64 if isinstance(x, float) else torch.bool if isinstance(x, bool)
                        else torch.int64)


def _conv_backward(grad_out, inp, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                   groups, mask):
    """aten::convolution_backward on meta tensors, which torch 1.13 has no kernel for
    (it falls to the `overrideable` variant and raises): gradients shaped as CUDA's
    kernel makes them, the input's, the weight's and the bias's (the output channels)."""
    import torch  # noqa: PLC0415
    out_ch = weight.shape[1] * groups if transposed else weight.shape[0]
    like = [(inp.shape, inp), (weight.shape, weight), ((out_ch,), weight)]
    return tuple(torch.empty(shape, dtype=t.dtype, device=t.device) if m else None
                 for m, (shape, t) in zip(mask, like))


def _make_mode(rec, sdp_choice, nonzero, item):
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            if name == "_fused_sdp_choice" and sdp_choice is not None:
                return sdp_choice(*args, **kwargs)
            if name == "nonzero" and rec.on_device(args[0]):
                return _nonzero(rec, nonzero, args[0])
            if name == "_local_scalar_dense":
                if id(args[0]) in rec.draws:
                    return _read_draw(rec, args[0])
                if rec.on_device(args[0]):
                    return _item(item, args[0], rec)
                try:
                    return func(*args, **kwargs)
                except Exception:  # noqa: BLE001 -- a host tensor FakeTensorMode cannot read
                    # (an optimizer's step count): 1, which no bias correction divides by zero
                    return _host_item(rec, args[0])
            for t in _tensors(args, cuda_only=False):
                rec.see(t, False)
            if name in _MATMULS:
                rec.matmul()
            try:
                out = func(*args, **kwargs)
            except NotImplementedError:
                if name != "convolution_backward":
                    raise
                out = _conv_backward(*args)
            if name == "detach" and isinstance(out, (int, float, bool)):
                # the detach of a Python number's wrapped tensor (x * 0.5 saves it for
                # backward) comes back to a mode as the number; autograd wants a tensor
                return _scalar_tensor(out)
            for t in _tensors(out, cuda_only=False):
                rec.see(t, True)
            draw = _draw_of(rec, name, args, kwargs, out)
            if draw is not None:
                _remember_draw(rec, out, draw)
            if name in _FLASH_BACKWARD and rec.on_device(args[1]):
                rec.scratch(flash_backward_scratch(*args[1:4]))
            return out
    return _Mode()


class _Hooks(CudaPaths):
    """Phases and module scopes: global module hooks, torch.autograd.backward,
    and optimizer.step of every optimizer made while tracing; and torch's
    CUDA code paths on tensors that are not CUDA's (CudaPaths)."""

    def __init__(self, rec):
        import torch  # noqa: PLC0415
        self.torch, self.rec = torch, rec
        self.paths = {}          # module -> its path below the root it was first called from
        self.modules = weakref.WeakSet()
        self.optimizers = []
        self.undo = []

    def __enter__(self):
        torch, rec = self.torch, self.rec
        mm = torch.nn.modules.module
        self.undo.append(mm.register_module_forward_pre_hook(self._pre).remove)
        self.undo.append(mm.register_module_forward_hook(self._post).remove)
        orig_backward = torch.autograd.backward

        @functools.wraps(orig_backward)
        def backward(*a, **k):
            self.backward_starts()
            prev, rec.phase = rec.phase, PHASE_BACKWARD
            try:
                return orig_backward(*a, **k)
            finally:
                rec.phase = prev
        torch.autograd.backward = backward
        self.undo.append(lambda: setattr(torch.autograd, "backward", orig_backward))
        orig_init = torch.optim.Optimizer.__init__

        @functools.wraps(orig_init)
        def init(opt, *a, **k):
            orig_init(opt, *a, **k)
            self._wrap_optimizer(opt)
        torch.optim.Optimizer.__init__ = init
        self.undo.append(lambda: setattr(torch.optim.Optimizer, "__init__", orig_init))
        return self

    def __exit__(self, *exc):
        while self.undo:
            self.undo.pop()()

    def _pre(self, module, args):
        rec = self.rec
        if module not in self.modules:
            self.modules.add(module)
            if not rec.scopes:   # a root: name every module below it
                for name, m in module.named_modules():
                    self.paths.setdefault(m, name)
        path = self.paths.get(module, type(module).__name__)
        rec.scopes.append(path)
        if len(rec.scopes) == 1 and rec.phase == "step":
            rec.phase = PHASE_FORWARD
        for p in module.parameters(recurse=False):
            rec.category(rec.see(p, False), PARAMETERS, over=True)

    def _post(self, module, args, out):
        rec = self.rec
        if rec.scopes:
            rec.scopes.pop()
        if not rec.scopes and rec.phase == PHASE_FORWARD:
            rec.phase = "step"

    def gradients_after_step(self):
        """The .grad a step leaves (no optimizer, or accumulation): gradients."""
        rec = self.rec
        for m in list(self.modules):
            for p in m.parameters(recurse=False):
                if p.grad is not None:
                    rec.category(rec.see(p.grad, False), GRADIENTS, over=True)

    def backward_starts(self):
        """What forward made and is alive now is held for backward: activations."""
        for r in self.rec.live.values():
            if r.phase == PHASE_FORWARD and r.cat is None:
                r.cat = ACTIVATIONS

    def _no_gradient(self, params):
        """Parameters an optimizer steps that backward gave no gradient: the
        traced step did not run their modules (a value read that skipped
        them, or modules the model does not call). The optimizer keeps no
        state for them either, so the trace says which, once."""
        ids = {id(p) for p in params}
        where = sorted({path or type(m).__name__ for m, path in self.paths.items()
                        if any(id(p) in ids for p in m.parameters(recurse=False))})
        note = ("%d of the optimizer's parameters (%.1f MiB) had no gradient at optimizer.step: the traced step "
                "did not run %s%s; if the GPU's step does, this estimate is short of it" % (
                    len(params), sum(p.numel() * p.element_size() for p in params) / 2**20,
                    ", ".join(where[:4]) or "their modules", " and %d more modules" % (len(where) - 4)
                    if len(where) > 4 else ""))
        self.rec.trace.note(note)

    def _wrap_optimizer(self, opt):
        rec, step = self.rec, opt.step
        self.optimizers.append(opt)

        @functools.wraps(step)
        def wrapped(*a, **k):
            missing = []
            for g in opt.param_groups:
                for p in g["params"]:
                    rec.category(rec.see(p, False), PARAMETERS, over=True)
                    if p.grad is not None:
                        rec.category(rec.see(p.grad, False), GRADIENTS, over=True)
                    elif p.requires_grad:
                        missing.append(p)
            if missing:
                self._no_gradient(missing)
            prev, rec.phase = rec.phase, PHASE_OPTIMIZER
            try:
                return step(*a, **k)
            finally:
                rec.phase = prev
                for t in _tensors(list(opt.state.values()), cuda_only=False):
                    rec.category(rec.see(t, False), OPTIMIZER, over=True)
        opt.step = wrapped


def _torch_major():
    import torch  # noqa: PLC0415
    return int(torch.__version__.split(".")[0])


@contextlib.contextmanager
def fake_process_group(world_size, rank=0):
    """torch.distributed as rank `rank` of `world_size` through torch's fake
    process group (torch 2.x: collectives return at once, nothing is sent), for
    tracing a DDP / FSDP rank. torch 1.13 has no fake group: TraceError."""
    import torch.distributed as dist  # noqa: PLC0415
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: PLC0415
    except ImportError as e:
        raise TraceError("gpumem: this torch (%s) has no fake process group "
                         "(torch.testing._internal.distributed.fake_pg, torch 2.x): a data-parallel rank "
                         "cannot be traced with it" % __import__("torch").__version__) from e
    if dist.is_initialized():
        raise TraceError("gpumem: torch.distributed is already initialized; trace the rank in a process "
                         "that has not called init_process_group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def trace_step(train, steps=3, mode="auto", device="cuda", workspace=CUBLAS_WORKSPACE, nonzero=None, item=None):
    """Trace `train(device)` (setup: build the model, the optimizer; returns
    step, a callable with no arguments) and `steps` calls of step(), without a
    GPU. Returns a Trace.

    mode: "meta" (tensors on the meta device; torch 1.13 and 2.x; train gets
    device "meta"), "fake" (torch 2.x FakeTensorMode; train gets `device`, so
    torch.autocast("cuda") and sdpa's kernel choice act as on the GPU), or
    "auto" (fake where this torch has it, meta otherwise).
    workspace: bytes of cuBLAS's workspace per thread (0: none).
    nonzero: the share of a tensor's elements torch.nonzero / torch.where(cond)
    / boolean indexing find (their output size depends on values the tracer
    does not have): 1/E for an expert's mask under balanced top-k routing over
    E experts. None: such an operator stops the trace with a TraceError.
    item: what .item() / bool(tensor) of a device tensor returns; None: a
    TraceError."""
    import torch  # noqa: PLC0415
    if not callable(train):
        raise TypeError("gpumem.estimate.trace_step: train must be a function train(device) -> step, got %r"
                        % type(train).__name__)
    if int(steps) < 1:
        raise ValueError("gpumem.estimate.trace_step: steps must be at least 1, got %r" % steps)
    if mode == "auto":
        mode = "fake" if _torch_major() >= 2 else "meta"
    if mode not in ("meta", "fake"):
        raise ValueError("gpumem.estimate.trace_step: mode must be 'meta', 'fake' or 'auto', got %r" % (mode,))
    if mode == "fake" and _torch_major() < 2:
        raise TraceError("gpumem: mode='fake' needs torch 2.x (FakeTensorMode with autograd); this is torch %s: "
                         "use mode='meta'" % torch.__version__)
    dev = torch.device("meta") if mode == "meta" else torch.device(device)
    trace = Trace(mode, str(dev), int(steps), torch.__version__)
    rec = _Recorder(trace, dev.type, workspace)
    if mode == "meta":
        trace.notes.append("meta tensors: torch.autocast does not act on them (use mode='fake' on torch 2.x)")
    with contextlib.ExitStack() as stack:
        if mode == "fake":
            from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        hooks = stack.enter_context(_Hooks(rec))
        hooks.keep_tied()
        if mode == "meta":
            hooks.as_on_cuda()
            hooks.sdpa_as_on_cuda(sdp_choice_for(dev))
        hooks.foreach_as_on_cuda()
        hooks.ddp_under_fake_group()
        hooks.meshes_outside_modes()
        stack.enter_context(_make_mode(rec, sdp_choice_for(dev), nonzero, item))

        def pack(t):
            rec.category(rec.see(t, False), ACTIVATIONS)
            return t
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        step = train(dev)
        if not callable(step):
            raise TypeError("gpumem.estimate.trace_step: train(device) must return the step function, got %r"
                            % type(step).__name__)
        for i in range(int(steps)):
            rec.phase, rec.step = "step", i + 1
            step()
            hooks.gradients_after_step()
        rec.closed = True       # what is alive now outlives the trace
        del step
    for r in rec.records:      # undecided: temporaries
        if r.cat is None:
            r.cat = TEMPORARIES
    for e in trace.events:
        if e is None:
            continue
        e[3] = e[3].cat
        if e[5] == "step":     # outside every module and phase: the loop's own work
            e[5] = UNTRACKED
    trace.events = [tuple(e) for e in trace.events if e is not None]
    if trace.unseen_inputs:
        trace.notes.append("%d tensors were first met as an operator's input (made outside train(device)); "
                           "counted from then on, as 'other'" % trace.unseen_inputs)
    return trace
