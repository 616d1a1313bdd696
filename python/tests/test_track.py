"""CPU-only tests of gpumem.track's scopes and history over the sim backend
(no torch, no GPU): scope()/scoped() nest per thread, the history records
allocations made through the library with their scopes and tags, and the
dump reads back through `gpumem report --json` when the CLI is built; the
backward module scopes' bookkeeping (BackwardScopes) on a recording stack
and on the library's scopes from a thread standing in for autograd's.

Run: GPUMEM_LIB=<build>/libgpumem_torch.so python3 -m unittest discover -s python/tests"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

from _support import unusable  # the source tree's gpumem on sys.path
from gpumem import _lib
from gpumem import track as tk

MIB = 1 << 20

WHY = unusable(tk._c)


@unittest.skipUnless(not WHY, "libgpumem_torch.so not loadable: %s" % WHY)
class _OnTheSimLibrary(unittest.TestCase):
    """A fresh gpumem on the sim backend for each test; history and the
    global scope switched off after it."""

    def setUp(self):
        _lib.load().gpumem_torch_shutdown()
        _lib.configure("", "sim")

    def tearDown(self):
        tk._c().gm_scope_set_global(None)
        tk.history_enable(0)
        _lib.load().gpumem_torch_shutdown()


class TrackTest(_OnTheSimLibrary):
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


class BackwardScopesBookkeeping(unittest.TestCase):
    """BackwardScopes alone, on a recording push/pop (no library, no torch)."""

    def setUp(self):
        self.stack, self.calls = [], []

        def push(name):
            self.stack.append(name)
            self.calls.append("+" + name)

        def pop():
            self.assertTrue(self.stack, "pop of an empty stack")
            self.calls.append("-" + self.stack.pop())
        self.bw = tk.BackwardScopes(push, pop)

    def test_nesting_keeps_the_phase_under_the_paths(self):
        bw = self.bw
        bw.begin()
        bw.enter("model.enc.1")
        self.assertEqual(self.stack, ["backward", "model.enc.1"])
        bw.enter("model.enc.1.attn")
        self.assertEqual(self.stack, ["backward", "model.enc.1", "model.enc.1.attn"])
        self.assertTrue(bw.exit("model.enc.1.attn"))
        self.assertEqual(self.stack, ["backward", "model.enc.1"])
        self.assertTrue(bw.exit("model.enc.1"))
        self.assertEqual(self.stack, [])  # nothing open: the thread's global scope again
        self.assertEqual(self.calls, ["+backward", "+model.enc.1", "+model.enc.1.attn", "-model.enc.1.attn",
                                      "-model.enc.1", "-backward"])

    def test_out_of_order_exit_unknown_exit_and_repeats(self):
        bw = self.bw
        bw.enter("a")
        bw.enter("a.b")
        bw.enter("a.b")  # a module called twice in forward
        self.assertTrue(bw.exit("a"))  # not innermost: the scopes above it are rebuilt
        self.assertEqual(self.stack, ["backward", "a.b", "a.b"])
        self.assertFalse(bw.exit("c"))  # never entered on this thread: ignored
        self.assertEqual(self.stack, ["backward", "a.b", "a.b"])
        self.assertTrue(bw.exit("a.b"))
        self.assertEqual(bw.open_paths(), ["a.b"])
        self.assertEqual(self.stack, ["backward", "a.b"])

    def test_begin_forgets_what_the_last_call_left_open_and_reset_closes(self):
        bw = self.bw
        bw.begin()
        bw.enter("wte")  # an embedding: its inputs need no gradient, it is never exited
        bw.enter("h.0")
        bw.begin()  # the next backward call
        bw.enter("h.1")
        self.assertEqual(self.stack, ["backward", "h.1"])
        self.assertFalse(bw.exit("wte"))
        bw.enter("wte")
        bw.reset()  # the engine's end-of-backward callback
        self.assertEqual(self.stack, [])
        self.assertEqual(bw.open_paths(), [])

    def test_threads_keep_their_own_paths(self):
        bw = tk.BackwardScopes(lambda n: None, lambda: None)
        bw.enter("main.path")
        seen = {}

        def other():
            bw.enter("x")
            seen["other"] = bw.open_paths()
        t = threading.Thread(target=other)
        t.start()
        t.join()
        self.assertEqual(seen["other"], ["x"])
        self.assertEqual(bw.open_paths(), ["main.path"])

    def test_module_paths_leave_the_root_out(self):
        root, a, b = object(), object(), object()
        self.assertEqual(tk.module_paths([("", root), ("enc", a), ("enc.0", b)]), {a: "enc", b: "enc.0"})


def _fr(name, filename, line=1):
    return {"name": name, "filename": filename, "line": line}


class MergeStacks(unittest.TestCase):
    """merge_stacks: torch's Python frames onto gpumem's history (no torch)."""

    def test_aligned_from_the_end_per_address_and_device(self):
        scope = [_fr("model.fc", "<gpumem scope>", 0)]
        shared = list(scope)  # the dump shares frames lists between entries
        gm = {"device_traces": [[
            {"action": "alloc", "addr": 1, "frames": shared},        # older than torch's ring: no frames
            {"action": "free_completed", "addr": 1, "frames": []},
            {"action": "alloc", "addr": 1, "frames": shared},        # = torch's first alloc of 1
            {"action": "alloc", "addr": 2, "frames": []},
            {"action": "free_completed", "addr": 1, "frames": []},
            {"action": "alloc", "addr": 1, "frames": shared},        # = torch's second
        ], [
            {"action": "alloc", "addr": 1, "frames": []},            # device 1: its own ring
        ]]}
        py = [_fr("forward", "/m/model.py", 10)]
        opt = [_fr("step", "/py/torch/optim/adam.py", 20)]
        ts = {"device_traces": [[
            {"action": "alloc", "addr": 1, "frames": py},
            {"action": "alloc", "addr": 2, "frames": []},              # no stack recorded
            {"action": "free_requested", "addr": 1, "frames": py},
            {"action": "alloc", "addr": 1, "frames": opt},
        ], [
            {"action": "alloc", "addr": 1, "frames": opt},
        ]]}
        self.assertEqual(tk.merge_stacks(gm, ts), (3, 5))
        d0 = gm["device_traces"][0]
        self.assertEqual(d0[0]["frames"], scope)
        self.assertEqual(d0[2]["frames"], scope + py)  # gpumem's scope first (innermost), then Python
        self.assertEqual(d0[3]["frames"], [])
        self.assertEqual(d0[5]["frames"], scope + opt)
        self.assertEqual(gm["device_traces"][1][0]["frames"], opt)
        self.assertEqual(shared, scope)  # not changed in place

    def test_nothing_recorded(self):
        gm = {"device_traces": [[{"action": "alloc", "addr": 1, "frames": []}]]}
        self.assertEqual(tk.merge_stacks(gm, {"device_traces": []}), (0, 1))
        self.assertEqual(tk.merge_stacks(gm, {}), (0, 1))


class StacksInTheLibrary(_OnTheSimLibrary):
    """history_dump_with_stacks: the library's history with Python frames
    merged in, read by `gpumem report`: the frames reach its frame table and
    scope series; gpumem's own scopes still decide the phase."""

    def test_dump_with_stacks_reaches_the_report(self):
        tk.history_enable(1000)
        with tk.scope("forward"):
            act = _lib.alloc_raw(3 * MIB, 0, 0)  # in forward, no module scope: its frames name the module
        inp = _lib.alloc_raw(MIB, 0, 0)          # no scope at all: its frames give the phase
        # what torch's recorder would have taken (innermost first)
        fwd = [_fr("linear", "/py/torch/nn/functional.py", 5), _fr("forward", "/py/torch/nn/modules/linear.py", 125),
               _fr("_call_impl", "/py/torch/nn/modules/module.py", 1750), _fr("forward", "/m/model.py", 42),
               _fr("main", "train.py", 7)]
        opt = [_fr("_init_group", "/py/torch/optim/adam.py", 150), _fr("step", "/py/torch/optim/adam.py", 220)]
        ts = {"device_traces": [[{"action": "alloc", "addr": act, "frames": fwd},
                                 {"action": "alloc", "addr": inp, "frames": opt}]]}
        d = tempfile.mkdtemp()
        try:
            path = os.path.join(d, "h.pickle.gz")
            self.assertEqual(tk.history_dump_with_stacks(path, ts), (2, 2))
            with self.assertRaises(ValueError):
                tk.history_dump_with_stacks(os.path.join(d, "h.gmt"), ts)
            cli = shutil.which("gpumem") or os.path.join(os.path.dirname(_lib.library_path()), "gpumem")
            if not os.path.exists(cli):
                self.skipTest("no gpumem CLI next to %s or on PATH" % _lib.library_path())
            j = json.loads(subprocess.run([cli, "report", path, "--json"], check=True, capture_output=True,
                                          text=True).stdout)
            self.assertTrue(j["has_frames"])
            views = {v["depth"]: {s["name"]: s["at_peak"] for s in v["series"]} for v in j["scopes"]["views"]}
            self.assertEqual(views[2]["model.py:42 > linear.py (self)"], 3 * MIB)
            self.assertIn("Python forward frames", j["scopes"]["source"])
            # the optimizer frames made the unscoped one optimizer state (alive after its phase)
            self.assertEqual(j["categories"]["optimizer_state"]["allocated"], MIB)
            text = subprocess.run([cli, "report", path, "--text"], check=True, capture_output=True,
                                  text=True).stdout
            self.assertIn("_init_group (adam.py:150)", text)
        finally:
            shutil.rmtree(d)
        _lib.free_raw(act)
        _lib.free_raw(inp)


class BackwardScopesInTheLibrary(_OnTheSimLibrary):
    """BackwardScopes on gpumem's scopes, on a thread of its own with the
    global scope "backward" (as autograd's thread under track()): the
    history dump gives each allocation its module, the report's scope series
    and its backward phase."""

    def test_autograd_thread_scopes_reach_the_report(self):
        tk.history_enable(1000)
        tk._check(tk._c().gm_scope_set_global(b"backward"), "set_global")
        bw = tk.BackwardScopes()
        ptrs, seen, errors = [], {}, []

        def autograd_thread():
            try:
                bw.begin()
                ptrs.append(_lib.alloc_raw(1 * MIB, 0, 0))  # no module yet: [backward]
                bw.enter("model.enc.0")
                bw.enter("model.enc.0.attn")
                seen["inner"] = (tk.scope_depth(), tk.current_scope())
                _lib.free_raw(_lib.alloc_raw(1 * MIB, 0, 0))  # a temporary of attn's backward
                ptrs.append(_lib.alloc_raw(4 * MIB, 0, 0))  # model.enc.0.attn
                bw.exit("model.enc.0.attn")
                ptrs.append(_lib.alloc_raw(2 * MIB, 0, 0))  # model.enc.0
                bw.exit("model.enc.0")
                seen["after"] = tk.scope_depth()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        t = threading.Thread(target=autograd_thread)
        t.start()
        t.join()
        self.assertEqual(errors, [])
        self.assertEqual(seen["inner"], (3, "model.enc.0.attn"))
        self.assertEqual(seen["after"], 0)
        d = tempfile.mkdtemp()
        try:
            path = os.path.join(d, "h.gmt")
            tk.history_dump(path)
            cli = shutil.which("gpumem") or os.path.join(os.path.dirname(_lib.library_path()), "gpumem")
            if not os.path.exists(cli):
                self.skipTest("no gpumem CLI next to %s or on PATH" % _lib.library_path())
            j = json.loads(subprocess.run([cli, "report", path, "--json"], check=True, capture_output=True,
                                          text=True).stdout)
            views = {v["depth"]: {s["name"]: s["at_peak"] for s in v["series"]} for v in j["scopes"]["views"]}
            self.assertEqual(sorted(views), [1, 2, 3, 4])
            self.assertEqual(views[4], {"model.enc.0.attn": 4 * MIB, "model.enc.0": 2 * MIB, "[backward]": MIB})
            self.assertEqual(views[2], {"model.enc": 6 * MIB, "[backward]": MIB})
            self.assertEqual(j["peak_requested"], 7 * MIB)
            self.assertTrue(j["scopes"]["source"].startswith("gpumem scopes"), j["scopes"]["source"])
            # in the backward phase (the phase scope under the module paths):
            # the freed one a temporary, the rest alive after it
            self.assertEqual(j["categories"]["temporaries"]["allocated"], MIB)
            self.assertEqual(j["categories"]["gradients"]["allocated"] + j["categories"]["other"]["allocated"],
                             7 * MIB)
        finally:
            shutil.rmtree(d)
        for p in ptrs:
            _lib.free_raw(p)


if __name__ == "__main__":
    unittest.main()
