"""Where the memory went, live: categories, scopes and history under gpumem.

    import gpumem.torch as gt
    gt.install()                                  # gpumem is PyTorch's allocator
    model = Net().cuda(); opt = torch.optim.AdamW(model.parameters())
    tr = gt.track(model, opt)                     # one call; no other change to the loop
    for batch in data:
        loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
    print(tr.breakdown())                         # bytes per category now, and the peak
    tr.dump("history.pickle.gz")                  # then: gpumem report history.pickle.gz -o r.html

    with gt.scope("data"): ...                    # user scopes, nested, per thread
    @gt.scoped("eval")
    def evaluate(): ...

track() switches on gpumem's allocation history (a bounded ring, dumped on
demand and, with oom_dump=PATH, when an allocation runs out of memory) and
adds hooks that need nothing else from the training loop:

- every module's forward runs in a scope named by its path in the model
  ("transformer.h.3.attn"), all inside the phase scope "forward";
- backward (torch.autograd.backward, which Tensor.backward calls) runs in the
  phase scope "backward" (set process-wide for the call, since autograd
  allocates on its own threads); optimizer.step in "optimizer.step";
- each module's backward runs in "backward" > its path, on the thread that
  runs it: entered when the first gradient of its outputs is computed, left
  when the gradients of all its inputs are (multi-grad hooks on the tensors,
  as torch's ModTracker does; they touch no tensor, so in-place ops on
  module outputs keep working, unlike full backward hooks). A module whose
  inputs need no gradient (an embedding) stays open to the end of backward;
- anything else runs in the scope "untracked" (inputs, zero_grad, the
  loop's own work), so that no allocation inherits a phase it was not in;
- parameters, their .grad and the optimizer's state tensors are tagged with
  their category by their storage's address;
- with stacks=True, torch's own recorder runs too (through the shim) and
  dump() gives every allocation its Python frames after gpumem's scopes.

`gpumem report` attributes the dump: tags decide parameters / gradients /
optimizer state; what forward allocates and is still alive when backward
starts is activations, the rest of each phase temporaries (docs/report.md).
The phase scope names are the C library's GM_SCOPE_FORWARD / _BACKWARD /
_OPTIMIZER (src/report/report.h).
"""
import contextlib
import ctypes
import functools
import threading

from . import _lib, _torch_state
from ._lib import GpumemError

PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = "forward", "backward", "optimizer.step"
# the scope of allocations outside every other scope while tracking (inputs,
# zero_grad, user code): without it they would carry no scope, and the
# report would give them the phase of the event before them
UNTRACKED = "untracked"
# gm_category values (GM_CATEGORY_LIST in include/gpumem/gpumem.h), by name
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
HISTORY_GMT, HISTORY_TORCH = 0, 1

_bound = None
_bind_lock = threading.Lock()


def _c():
    """libgpumem_torch.so with the scope / history functions' signatures set."""
    global _bound
    with _bind_lock:
        if _bound is None:
            # _lib.load() sets every signature from the library's own table
            _bound = _lib.load()
        return _bound


def _check(status, what):
    if status != 0:
        detail = _c().gm_last_error_detail()
        raise GpumemError(status, "gpumem: %s: %s" % (what, detail.decode("utf-8", "replace") if detail else status))


def _format(path, fmt):
    if fmt is None:
        return HISTORY_GMT if str(path).endswith(".gmt") else HISTORY_TORCH
    return {"gmt": HISTORY_GMT, "torch": HISTORY_TORCH}[fmt]


# ---- scopes ------------------------------------------------------------------

def scope_push(name):
    _check(_c().gm_scope_push(str(name).encode("utf-8")), "scope_push(%r)" % name)


def scope_pop():
    _check(_c().gm_scope_pop(), "scope_pop")


def scope_depth():
    return _c().gm_scope_depth()


def current_scope():
    s = _c().gm_scope_current()
    return s.decode("utf-8", "replace") if s else None


@contextlib.contextmanager
def scope(name):
    """Allocations inside are recorded in scope `name` (nested, per thread)."""
    scope_push(name)
    try:
        yield
    finally:
        scope_pop()


def scoped(name=None):
    """Decorator: the function runs in scope `name` (default: its qualified name)."""
    def deco(fn):
        label = name or getattr(fn, "__qualname__", fn.__name__)

        @functools.wraps(fn)
        def wrapper(*a, **k):
            with scope(label):
                return fn(*a, **k)
        return wrapper
    if callable(name):  # used as @scoped without arguments
        fn, name = name, None
        return deco(fn)
    return deco


# ---- history -----------------------------------------------------------------

def history_enable(max_entries=1_000_000):
    """Record alloc / free / segment events into a ring of max_entries (0: stop)."""
    _check(_c().gm_history_enable(int(max_entries)), "history_enable(%d)" % max_entries)


def history_counts():
    """(recorded, held, dropped) since the history was enabled."""
    v = [ctypes.c_uint64() for _ in range(3)]
    _c().gm_history_counts(*[ctypes.byref(x) for x in v])
    return tuple(x.value for x in v)


def history_dump(path, fmt=None):
    """Write the ring: .gmt, else a torch snapshot pickle (gzip'd if path ends in .gz)."""
    _check(_c().gm_history_dump(str(path).encode("utf-8"), _format(path, fmt)), "history_dump(%r)" % str(path))


def history_dump_on_oom(path, fmt=None):
    """Dump the ring to path when an allocation runs out of memory (None: stop)."""
    p = None if path is None else str(path).encode("utf-8")
    _check(_c().gm_history_dump_on_oom(p, _format(path, fmt) if path else 0), "history_dump_on_oom")


def tag(tensor_or_ptr, category):
    """Record the category of the allocation holding a tensor (its storage) or at an address."""
    cat = CATEGORIES.index(category) if isinstance(category, str) else int(category)
    ptr = tensor_or_ptr
    if not isinstance(ptr, int):
        ptr = tensor_or_ptr.untyped_storage().data_ptr()
    _check(_c().gpumem_torch_tag(ptr, cat), "tag")


# ---- module scopes in backward ----------------------------------------------------

class BackwardScopes:
    """Module scopes on the threads that run backward (no torch needed here).

    enter(path) / exit(path) come from gradient hooks on whatever thread
    autograd runs them (its own device threads, where gpumem's scopes, per
    thread, start empty). Per thread, the open module paths are kept in the
    order entered (a path may be open twice: a module called twice) and the
    thread's gpumem scopes are kept equal to [PHASE_BACKWARD, *open paths],
    so an allocation's innermost scope is the module whose backward made it
    and the phase scope under it tells the report it is backward. exit of a
    path that is not open (its enter ran on another thread, or before a
    reset) is ignored. begin() starts a backward call: every thread forgets
    what the call before it left open (a module whose inputs need no
    gradient is never exited) at its next enter / exit / reset, and reset()
    (queued to run when the call ends) closes the running thread's scopes
    at once."""

    def __init__(self, push=None, pop=None):
        self._push = push or scope_push
        self._pop = pop or scope_pop
        self._local = threading.local()
        self.generation = 0

    def begin(self):
        self.generation += 1

    def _state(self):
        st = self._local
        if getattr(st, "generation", None) != self.generation:
            self._close(st)
            st.generation = self.generation
        return st

    def _close(self, st):
        for _ in getattr(st, "pushed", ()):
            self._pop()
        st.pushed, st.open = [], []

    def _sync(self, st):
        want = [PHASE_BACKWARD] + st.open if st.open else []
        have = st.pushed
        k = 0
        while k < len(have) and k < len(want) and have[k] == want[k]:
            k += 1
        for _ in range(len(have) - k):
            self._pop()
        del have[k:]
        for name in want[k:]:
            self._push(name)
            have.append(name)

    def enter(self, path):
        st = self._state()
        st.open.append(path)
        self._sync(st)

    def exit(self, path):
        """False if path was not open on this thread (ignored)."""
        st = self._state()
        for i in range(len(st.open) - 1, -1, -1):
            if st.open[i] == path:
                del st.open[i]
                self._sync(st)
                return True
        return False

    def reset(self):
        self._close(self._state())

    def open_paths(self):
        """This thread's open module paths, outermost first."""
        return list(self._state().open)


def _graph_task_id():
    """The running backward's graph task (-1 outside backward), or -1 where
    torch lacks the query (then hooks are registered in recomputations too)."""
    import torch  # noqa: PLC0415
    f = getattr(torch._C, "_current_graph_task_id", None)
    return f() if f is not None else -1


def module_paths(named_modules):
    """{module: path} for the (module path, module) pairs of named_modules(),
    the root ("") left out: the root's forward is the phase scope itself."""
    return {m: n for n, m in named_modules if n}


# ---- Python stacks: torch's recorder through the shim ----------------------------

def merge_stacks(gm_snapshot, torch_snapshot):
    """Give the allocations of gpumem's history (gm_snapshot: a history dump
    in torch's snapshot format, loaded) the Python frames torch's recorder
    took for them (torch_snapshot: torch.cuda.memory._snapshot() while
    _record_memory_history ran under gpumem: the shim keeps torch's
    TraceEntry ring with CapturedTraceback contexts, torch symbolizes them).

    Both recorders see every allocation of a device in the same order per
    address (an address is allocated again only after its free), so the
    k-th last alloc of an address in one is the k-th last in the other, even
    when the rings dropped different amounts. gpumem's scope and category
    frames stay first (innermost) and decide the phase and category; the
    Python frames follow. Frames lists are new lists (the dump shares them
    between entries). Returns (allocs given frames, allocs in gm_snapshot)."""
    matched = total = 0
    torch_traces = torch_snapshot.get("device_traces") or []
    for dev, trace in enumerate(gm_snapshot.get("device_traces") or []):
        frames_of = {}
        for e in torch_traces[dev] if dev < len(torch_traces) else ():
            if e.get("action") == "alloc":
                frames_of.setdefault(e.get("addr"), []).append(e.get("frames") or [])
        n_gm = {}
        for e in trace:
            if e.get("action") == "alloc":
                n_gm[e.get("addr")] = n_gm.get(e.get("addr"), 0) + 1
        seen = {}
        for e in trace:
            if e.get("action") != "alloc":
                continue
            total += 1
            a = e.get("addr")
            k = seen.get(a, 0)
            seen[a] = k + 1
            torch_list = frames_of.get(a, ())
            j = len(torch_list) - (n_gm[a] - k)  # the same rank from the end
            if j >= 0 and torch_list[j]:
                e["frames"] = list(e.get("frames") or []) + list(torch_list[j])
                matched += 1
    return matched, total


def _write_pickle(obj, path):
    import gzip  # noqa: PLC0415
    import pickle  # noqa: PLC0415
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wb") as f:
        pickle.dump(obj, f, protocol=4)


def history_dump_with_stacks(path, torch_snapshot):
    """gpumem's history as a torch snapshot at path (gzip'd for .gz) with the
    Python frames of torch_snapshot merged in (merge_stacks). Returns its
    (allocs given frames, allocs)."""
    import os  # noqa: PLC0415
    import pickle  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    if str(path).endswith(".gmt"):
        raise ValueError("gpumem: Python stacks are written in torch's snapshot format only: dump to a "
                         ".pickle or .pickle.gz path, not %r" % str(path))
    fd, tmp = tempfile.mkstemp(suffix=".pickle")
    os.close(fd)
    try:
        history_dump(tmp, "torch")
        with open(tmp, "rb") as f:
            snap = pickle.load(f)
    finally:
        os.unlink(tmp)
    counts = merge_stacks(snap, torch_snapshot)
    _write_pickle(snap, path)
    return counts


# ---- tracking a model ------------------------------------------------------------

def _tensors(obj, cuda_only=True):
    """Tensors (CUDA tensors, with cuda_only) inside a value: an optimizer's
    state, an operator's arguments (tensors, lists, tuples, dicts)."""
    import torch  # noqa: PLC0415
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda or not cuda_only:
            yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, cuda_only)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, cuda_only)


def _storages(tensors):
    """{storage address: bytes} of distinct storages."""
    out = {}
    for t in tensors:
        s = t.untyped_storage()
        out[s.data_ptr()] = s.nbytes()
    return out


class Tracker:
    """What track() returns: hooks on one model (and optimizer), history on."""

    def __init__(self, model, optimizer=None, history=1_000_000, module_scopes=True, oom_dump=None,
                 backward_scopes=True, stacks=False):
        if not _torch_state.is_installed():
            raise RuntimeError("gpumem.torch.track needs gpumem as PyTorch's allocator: call gpumem.torch.install() "
                               "at the top of the script, before the first CUDA tensor")
        self.model, self.optimizer = model, None
        self._handles, self._tagged, self._local = [], {}, threading.local()
        self._orig_backward = None
        self._bw_task = None
        if history:
            history_enable(history)
        if stacks and not history:
            raise ValueError("gpumem.torch.track: stacks=True merges Python stacks into the history: "
                             "it needs history > 0")
        self._stacks = bool(stacks)
        if self._stacks:
            # torch's recorder, answered by the shim (python/csrc/gpumem_shim.cpp):
            # a Python stack per allocation, merged into the dump (merge_stacks)
            import torch  # noqa: PLC0415
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                     max_entries=history)
        _check(_c().gm_scope_set_global(UNTRACKED.encode()), "scope_set_global")
        if oom_dump:
            history_dump_on_oom(oom_dump)
        self._bw = BackwardScopes() if module_scopes and backward_scopes else None
        self._handles.append(model.register_forward_pre_hook(self._root_pre))
        self._handles.append(model.register_forward_hook(self._root_post))
        if module_scopes:
            for m, path in module_paths(model.named_modules()).items():
                self._handles.append(m.register_forward_pre_hook(functools.partial(self._pre, path)))
                self._handles.append(m.register_forward_hook(functools.partial(self._post, path)))
        self._patch_backward()
        if optimizer is not None:
            self.track_optimizer(optimizer)
        self.tag_parameters()

    # forward: the phase scope around the root module, a scope per submodule
    def _root_pre(self, module, args):
        self._local.base = scope_depth()
        scope_push(PHASE_FORWARD)
        self.tag_parameters()

    def _root_post(self, module, args, out):
        base = getattr(self._local, "base", 0)
        while scope_depth() > base:  # also closes scopes an exception left open
            scope_pop()

    def _pre(self, path, module, args):
        scope_push(path)
        if self._bw is not None:
            # left when the gradients of all inputs needing one are computed
            self._grad_hook(args, functools.partial(self._bw_exit, path), "all")

    def _post(self, path, module, args, out):
        if scope_depth():
            scope_pop()
        if self._bw is not None:
            # entered when the first gradient of an output is computed
            self._grad_hook(out, functools.partial(self._bw_enter, path), "any")

    @staticmethod
    def _grad_hook(obj, fn, mode):
        """A multi-grad hook (torch.autograd.graph.register_multi_grad_hook)
        on the tensors in obj that need a gradient, outside backward (not on
        a recomputation inside it) and when autograd records at all."""
        import torch  # noqa: PLC0415
        if not torch.is_grad_enabled() or _graph_task_id() != -1:
            return
        from torch.utils._pytree import tree_flatten  # noqa: PLC0415
        ts = [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if ts:
            try:
                torch.autograd.graph.register_multi_grad_hook(ts, fn, mode=mode)
            except TypeError:  # torch before mode=: "all" only (entered a little later)
                torch.autograd.graph.register_multi_grad_hook(ts, fn)

    def _bw_enter(self, path, *grads):
        if not self._handles:  # a hook of a forward before close()
            return
        task = _graph_task_id()
        if task != self._bw_task:
            # the end of this backward (or autograd.grad) closes what stays
            # open there (modules whose inputs need no gradient)
            import torch  # noqa: PLC0415
            self._bw_task = task
            torch.autograd.Variable._execution_engine.queue_callback(self._bw.reset)
        self._bw.enter(path)

    def _bw_exit(self, path, *grads):
        if self._handles:
            self._bw.exit(path)

    # backward runs on autograd's threads: a process-wide scope for the call
    def _patch_backward(self):
        import torch  # noqa: PLC0415
        orig = torch.autograd.backward

        @functools.wraps(orig)
        def backward(*a, **k):
            if self._bw is not None:
                self._bw.begin()
            _check(_c().gm_scope_set_global(PHASE_BACKWARD.encode()), "scope_set_global")
            try:
                with scope(PHASE_BACKWARD):  # the calling thread's own allocations
                    try:
                        return orig(*a, **k)
                    finally:
                        if self._bw is not None:
                            self._bw.reset()  # module scopes above ours on this thread
            finally:
                _c().gm_scope_set_global(UNTRACKED.encode() if self._handles else None)
        self._orig_backward = orig
        torch.autograd.backward = backward

    def track_optimizer(self, optimizer):
        self.optimizer = optimizer
        self._handles.append(optimizer.register_step_pre_hook(self._opt_pre))
        self._handles.append(optimizer.register_step_post_hook(self._opt_post))

    def _opt_pre(self, opt, args, kwargs):
        self.tag_gradients()
        scope_push(PHASE_OPTIMIZER)

    def _opt_post(self, opt, args, kwargs):
        if current_scope() == PHASE_OPTIMIZER:
            scope_pop()
        self.tag_optimizer_state()

    # tags: by storage address. A tag names the allocation live at that
    # address, and a freed gradient's address is reused by the next step's:
    # gradients and state are tagged every step, parameters when they move.
    def _tag_all(self, tensors, category):
        for ptr in _storages(tensors):
            _check(_c().gpumem_torch_tag(ptr, CATEGORIES.index(category)), "tag")

    def tag_parameters(self):
        ptrs = _storages([p for p in self.model.parameters() if p.is_cuda])
        if set(ptrs) != self._tagged.get("parameters"):
            for ptr in ptrs:
                _check(_c().gpumem_torch_tag(ptr, CATEGORIES.index("parameters")), "tag")
            self._tagged["parameters"] = set(ptrs)

    def tag_gradients(self):
        self._tag_all([p.grad for p in self.model.parameters() if p.grad is not None and p.grad.is_cuda],
                      "gradients")

    def tag_optimizer_state(self):
        if self.optimizer is not None:
            self._tag_all(list(_tensors(list(self.optimizer.state.values()))), "optimizer_state")

    # what is live now, by category, from the tensors themselves
    def breakdown(self, device=None):
        """Bytes per category now (parameters, gradients, optimizer_state from their
        storages), gpumem's allocated bytes now and at the peak, and the rest."""
        gt = _torch_state
        params = _storages([p for p in self.model.parameters() if p.is_cuda])
        grads = _storages([p.grad for p in self.model.parameters() if p.grad is not None and p.grad.is_cuda])
        state = _storages(_tensors(list(self.optimizer.state.values()))) if self.optimizer is not None else {}
        out = {"parameters": sum(params.values()), "gradients": sum(grads.values()),
               "optimizer_state": sum(state.values())}
        out["allocated"] = gt.memory_allocated(device)
        out["max_allocated"] = gt.max_memory_allocated(device)
        out["rest"] = out["allocated"] - out["parameters"] - out["gradients"] - out["optimizer_state"]
        return out

    def dump(self, path, fmt=None):
        """The history as a torch snapshot (or .gmt) for `gpumem report`; with
        stacks=True a torch snapshot whose allocations carry their Python
        frames too. Returns (allocations given Python frames, allocations)
        with stacks, else None."""
        self.tag_gradients()
        self.tag_optimizer_state()
        if not self._stacks:
            history_dump(path, fmt)
            return None
        if fmt == "gmt":
            raise ValueError("gpumem: track(stacks=True) dumps torch snapshots only (fmt='torch')")
        import torch  # noqa: PLC0415
        return history_dump_with_stacks(path, torch.cuda.memory._snapshot())

    def close(self, stop_history=True):
        """Remove the hooks (and stop recording; what was recorded can still be dumped)."""
        import torch  # noqa: PLC0415
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._orig_backward is not None:
            torch.autograd.backward = self._orig_backward
            self._orig_backward = None
        _c().gm_scope_set_global(None)
        if stop_history:
            history_enable(0)
            if self._stacks:
                torch.cuda.memory._record_memory_history(enabled=None)
                self._stacks = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def track(model, optimizer=None, history=1_000_000, module_scopes=True, oom_dump=None, backward_scopes=True,
          stacks=False):
    """Tag model's parameters, gradients and optimizer's state, open scopes for
    every module forward (and, with backward_scopes, its backward) and for
    backward / optimizer.step, and record gpumem's allocation history in a
    ring of `history` entries. stacks=True also runs torch's own recorder
    (torch.cuda.memory._record_memory_history, Python stacks; it costs what
    it costs under PyTorch's allocator) and dump() merges each allocation's
    Python frames into the snapshot. Returns a Tracker (breakdown(),
    dump(path), close())."""
    return Tracker(model, optimizer, history=history, module_scopes=module_scopes, oom_dump=oom_dump,
                   backward_scopes=backward_scopes, stacks=stacks)
