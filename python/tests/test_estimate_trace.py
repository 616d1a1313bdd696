"""The tracer of gpumem.estimate (a step of the user's own code on meta
tensors) and `gpumem estimate --trace`, on the CPU.

Needs torch for the traced models (Debian's python3-torch 1.13 is enough:
meta tensors, TorchDispatchMode, saved_tensors_hooks); without it those are
skipped and the trace-format and CLI tests still run on a trace built by
hand. The estimate tests need the gpumem executable (a build folder's, as
the other tests find the library).

Run: GPUMEM_LIB=<build>/libgpumem_torch.so python3 -m pytest -q python/tests/test_estimate_trace.py"""
import gzip
import math
import os
import pickle
import subprocess
import tempfile
import unittest
import weakref

from _trace_support import EXE, NO_EXE, NO_TORCH, F, estimate, lm_train, nn, torch
from gpumem import estimate as ge

MIB, KIB = 1 << 20, 1 << 10


def hand_trace(events):
    """A Trace from (action, name, size, category): what the tracer makes, without torch."""
    tr = ge.Trace("meta", "meta", 1, "none")
    addr = {}
    for i, (action, name, size, cat) in enumerate(events):
        if action == "alloc":
            addr[name] = 0x10000000 + i * (64 << 20)
        tr.events.append((action, addr[name], size, cat, "", "forward"))
    return tr


class HandTraceTest(unittest.TestCase):
    """No torch needed: the format the tracer writes and what estimate makes of it."""

    EVENTS = [("alloc", "w", 4 * MIB, ge.PARAMETERS), ("alloc", "x", 256 * KIB, ge.OTHER),
              ("alloc", "h", 256 * KIB, ge.ACTIVATIONS), ("alloc", "t", 256 * KIB, ge.TEMPORARIES),
              ("free", "t", 256 * KIB, ge.TEMPORARIES), ("alloc", "g", 4 * MIB, ge.GRADIENTS),
              ("free", "h", 256 * KIB, ge.ACTIVATIONS)]

    def test_snapshot_format(self):
        snap = hand_trace(self.EVENTS).to_snapshot()
        ev = snap["device_traces"][0]
        self.assertEqual([e["action"] for e in ev], ["alloc"] * 4 + ["free_completed", "alloc", "free_completed"])
        self.assertEqual(snap["segments"], [])
        for e in ev:
            self.assertEqual(e["stream"], 0)
            self.assertEqual(e["frames"][0]["filename"], ge.TAG_CATEGORY_FILE)
            self.assertIn(e["frames"][0]["name"], ge.CATEGORIES)
            self.assertEqual(e["frames"][-1], {"name": "forward", "filename": ge.TAG_SCOPE_FILE, "line": 0})
        self.assertEqual(hand_trace(self.EVENTS).live_peak(),
                         (8 * MIB + 512 * KIB, {ge.PARAMETERS: 4 * MIB, ge.GRADIENTS: 4 * MIB, ge.OPTIMIZER: 0,
                                                ge.ACTIVATIONS: 256 * KIB, ge.TEMPORARIES: 0, ge.OTHER: 256 * KIB}))

    def test_save_is_a_snapshot_pickle(self):
        with tempfile.TemporaryDirectory() as d:
            for name, opener in (("t.pickle", open), ("t.pickle.gz", gzip.open)):
                path = hand_trace(self.EVENTS).save(os.path.join(d, name))
                with opener(path, "rb") as f:
                    self.assertEqual(pickle.load(f)["device_traces"][0][0]["size"], 4 * MIB)
            with self.assertRaisesRegex(ValueError, "gpumem convert"):
                hand_trace(self.EVENTS).save(os.path.join(d, "t.gmt"))

    @unittest.skipIf(NO_EXE, NO_EXE)
    def test_estimate_of_a_hand_trace(self):
        r = estimate(hand_trace(self.EVENTS), "--capacity", "2GiB")
        self.assertEqual(r["peak_allocated"], 8 * MIB + 512 * KIB)
        # torch's pools: 4 MiB blocks get a 20 MiB segment each (sizes under 10 MiB), the three
        # 256 KiB ones one 2 MiB small-pool segment; the second 4 MiB fits the first 20 MiB segment
        self.assertEqual(r["peak_reserved"]["torch"], 22 * MIB)
        self.assertEqual(r["at_peak"], {ge.PARAMETERS: 4 * MIB, ge.GRADIENTS: 4 * MIB, ge.OPTIMIZER: 0,
                                        ge.ACTIVATIONS: 256 * KIB, ge.TEMPORARIES: 0, ge.OTHER: 256 * KIB})
        self.assertTrue(r["categories_tagged"])
        self.assertIs(r["fits"], True)
        self.assertEqual(r["margin"], 0.1)
        self.assertIn("fits 2.00 GiB", r["verdict"])
        self.assertIs(estimate(hand_trace(self.EVENTS), "--capacity", "800MiB")["fits"], False)

    @unittest.skipIf(NO_EXE, NO_EXE)
    def test_bad_input(self):
        def run(*a):
            return subprocess.run([EXE, "estimate"] + list(a), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True)
        p = run("--trace", "x.pickle", "--model", "gpt2")
        self.assertEqual(p.returncode, 2)
        self.assertIn("without --model", p.stderr)
        p = run("--trace", "/nonexistent/t.pickle")
        self.assertEqual(p.returncode, 1)
        self.assertIn("/nonexistent/t.pickle", p.stderr)
        self.assertEqual(p.stdout, "")


# ---- models in plain torch ------------------------------------------------------

if torch is not None:
    class MLP(nn.Module):
        def __init__(self, d=256, h=1024):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, d))

        def forward(self, x):
            return self.net(x)

    class Block(nn.Module):
        """A pre-norm transformer layer: attention (softmax of q k^T) and an MLP."""

        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, s, d)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class TinyGPT(nn.Module):
        def __init__(self, vocab=512, d=128, heads=4, layers=2, seq=64):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.wte.weight  # tied, as GPT-2: one tensor after .to(device) too

        def forward(self, idx, labels):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.ln(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))

    class LoRALinear(nn.Module):
        """W x + (alpha / r) B A x, W frozen: what peft's LoRA layer computes."""

        def __init__(self, base, r=8, alpha=16):
            super().__init__()
            self.base = base
            base.weight.requires_grad_(False)
            if base.bias is not None:
                base.bias.requires_grad_(False)
            self.A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
            self.B = nn.Parameter(torch.zeros(base.out_features, r))
            self.scale = alpha / r

        def forward(self, x):
            return self.base(x) + (x @ self.A.t() @ self.B.t()) * self.scale

    class MoE(nn.Module):
        """Top-k routing over E expert MLPs, tokens gathered per expert (torch.where on the
        routing mask, as Mixtral's block does; F.one_hot reads the values, which meta
        tensors of torch 1.13 do not have)."""

        def __init__(self, d=128, h=256, experts=4, k=2):
            super().__init__()
            self.k = k
            self.gate = nn.Linear(d, experts, bias=False)
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, h), nn.SiLU(), nn.Linear(h, d))
                                         for _ in range(experts))

        def forward(self, x):
            b, s, d = x.shape
            x = x.reshape(-1, d)
            weights, chosen = self.gate(x).softmax(-1).topk(self.k, dim=-1)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                tok, slot = torch.where(chosen == e)        # tokens x k mask
                y = expert(x[tok]) * weights[tok, slot, None]
                out.index_add_(0, tok, y)
            return out.view(b, s, d)


def mlp_train(batch=32, optimizer=None, make=None, width=256):
    """train(device) for make() (an MLP by default) on (batch, width) inputs."""
    def train(device):
        model = (make or MLP)().to(device)
        opt = (optimizer or torch.optim.AdamW)(model.parameters(), lr=1e-3)

        def step():
            x = torch.randn(batch, width, device=device)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    return train


def gpt_train(batch=4, seq=64, layers=2):
    return lm_train(lambda device: TinyGPT(layers=layers, seq=seq).to(device), 512, batch, seq)


def param_bytes(params):
    return sum(p.numel() * p.element_size() for p in params)


def peak_cats(trace):
    return trace.live_peak()[1]


def max_live(trace, cat):
    """The most bytes of one category live at any point."""
    live, size, best = 0, {}, 0
    for action, addr, n, c, _s, _p in trace.events:
        if c != cat:
            continue
        if action == "alloc":
            size[addr] = n
            live += n
        else:
            live -= size.pop(addr)
        best = max(best, live)
    return best


@unittest.skipIf(NO_TORCH, NO_TORCH)
class TracerTest(unittest.TestCase):
    def check_format(self, trace):
        """Every free follows its alloc, addresses are never reused, categories are known."""
        live, seen = set(), set()
        for action, addr, size, cat, scope, phase in trace.events:
            self.assertIn(cat, ge.CATEGORIES)
            self.assertGreater(size, 0)
            if action == "alloc":
                self.assertNotIn(addr, seen)
                seen.add(addr)
                live.add(addr)
            else:
                self.assertEqual(action, "free")
                self.assertIn(addr, live)
                live.remove(addr)
        snap = trace.to_snapshot()
        self.assertEqual(len(snap["device_traces"][0]), len(trace.events))

    def test_mlp_categories(self):
        tr = ge.trace_step(mlp_train(), steps=3, mode="meta", workspace=0)
        self.check_format(tr)
        P = param_bytes(MLP().parameters())
        self.assertEqual(max_live(tr, ge.PARAMETERS), P)
        self.assertEqual(max_live(tr, ge.GRADIENTS), P)
        self.assertEqual(max_live(tr, ge.OPTIMIZER), 2 * P)   # AdamW: exp_avg, exp_avg_sq
        self.assertEqual(max_live(tr, ge.OTHER), 0)
        # the input batch is saved for the first Linear's backward; the hidden
        # ReLU output for the second; the output for square's backward
        self.assertEqual(max_live(tr, ge.ACTIVATIONS), 32 * 4 * (256 + 1024 + 256))
        phases = {e[5] for e in tr.events}
        self.assertLessEqual({"setup", "forward", "backward", "optimizer.step"}, phases)
        self.assertEqual(tr.unseen_inputs, 0)

    def test_gradients_without_an_optimizer(self):
        def train(device):
            model = MLP().to(device)
            return lambda: model(torch.randn(8, 256, device=device)).sum().backward()
        tr = ge.trace_step(train, steps=2, mode="meta", workspace=0)
        self.assertEqual(max_live(tr, ge.GRADIENTS), param_bytes(MLP().parameters()))

    def test_sgd_has_no_state(self):
        tr = ge.trace_step(mlp_train(optimizer=torch.optim.SGD), steps=2, mode="meta", workspace=0)
        self.assertEqual(max_live(tr, ge.OPTIMIZER), 0)
        self.assertEqual(max_live(tr, ge.GRADIENTS), param_bytes(MLP().parameters()))

    @unittest.skipIf(NO_EXE, NO_EXE)
    def test_replay_peak_is_the_hand_sum(self):
        """Inference through one Linear: W, x, y, relu(y) live together, plus
        cuBLAS's workspace; the replay's peak allocated is their sum, and its
        peak reserved torch's segments for them (20 MiB for the 4 MiB weight,
        one 2 MiB small-pool segment for the three 256 KiB tensors, the 32 MiB
        workspace's own)."""
        def train(device):
            lin = nn.Linear(1024, 1024, bias=False).to(device)

            def step():
                with torch.no_grad():
                    x = torch.randn(64, 1024, device=device)
                    y = lin(x)
                    z = torch.relu(y)
                    del x, y, z
            return step
        tr = ge.trace_step(train, steps=1, mode="meta")
        self.check_format(tr)
        r = estimate(tr)
        self.assertEqual(r["peak_allocated"], 4 * MIB + 3 * 256 * KIB + ge.CUBLAS_WORKSPACE)
        self.assertEqual(r["peak_reserved"]["torch"], 20 * MIB + 2 * MIB + ge.CUBLAS_WORKSPACE)
        self.assertEqual(r["at_peak"][ge.PARAMETERS], 4 * MIB)
        self.assertEqual(r["at_peak"][ge.OTHER], ge.CUBLAS_WORKSPACE)
        self.assertEqual(r["at_peak"][ge.TEMPORARIES], 3 * 256 * KIB)

    @unittest.skipIf(NO_EXE, NO_EXE)
    def test_transformer(self):
        tr = ge.trace_step(gpt_train(), steps=2, mode="meta")
        self.check_format(tr)
        P = param_bytes(TinyGPT().parameters())        # the tied weight once
        self.assertEqual(max_live(tr, ge.PARAMETERS), P)
        self.assertEqual(max_live(tr, ge.OPTIMIZER), 2 * P)
        self.assertEqual(max_live(tr, ge.OTHER), 2 * ge.CUBLAS_WORKSPACE)  # forward's and backward's
        r = estimate(tr)
        self.assertEqual(sum(r["at_peak"].values()), r["peak_requested"])
        self.assertGreaterEqual(r["peak_reserved"]["torch"], r["peak_allocated"])
        self.assertGreaterEqual(r["peak_allocated"], r["peak_requested"])
        # module scopes name the layers, as gpumem.torch.track's do
        self.assertIn("blocks.1", {e[4] for e in tr.events})
        # the bytes saved for backward are affine in the batch (the causal masks and positions
        # are not per sample): each 4 more samples add the same bytes
        a4, a8, a12 = (max_live(ge.trace_step(gpt_train(batch=b), steps=1, mode="meta"), ge.ACTIVATIONS)
                       for b in (4, 8, 12))
        self.assertEqual(a8 - a4, a12 - a8)
        self.assertGreater(a8 - a4, a4 // 2)

    def test_lora(self):
        """Frozen base weights are parameters with no gradient or state; only A and B train."""
        def train(device):
            model = nn.Sequential(LoRALinear(nn.Linear(512, 512)), nn.ReLU(), LoRALinear(nn.Linear(512, 512)))
            model.to(device)
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

            def step():
                model(torch.randn(16, 512, device=device)).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            return step
        tr = ge.trace_step(train, steps=2, mode="meta", workspace=0)
        self.check_format(tr)
        lora = 2 * (8 * 512 + 512 * 8) * 4
        base = 2 * (512 * 512 + 512) * 4
        self.assertEqual(max_live(tr, ge.PARAMETERS), base + lora)
        self.assertEqual(max_live(tr, ge.GRADIENTS), lora)
        self.assertEqual(max_live(tr, ge.OPTIMIZER), 2 * lora)

    def test_moe_needs_a_routing_assumption(self):
        def train(device):
            model = MoE().to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def step():
                model(torch.randn(4, 32, 128, device=device)).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            return step
        with self.assertRaisesRegex(ge.TraceError, "nonzero="):
            ge.trace_step(train, steps=1, mode="meta")
        # balanced routing: each expert's mask (tokens x k) has tokens * k / E ones, 1/E of it
        tr = ge.trace_step(train, steps=2, mode="meta", workspace=0, nonzero=1 / 4)
        self.check_format(tr)
        P = param_bytes(MoE().parameters())
        self.assertEqual(max_live(tr, ge.PARAMETERS), P)
        self.assertEqual(max_live(tr, ge.OPTIMIZER), 2 * P)
        # each expert sees tokens * k / E = 128 * 2 / 4 = 64 tokens: its first Linear's output
        # (64 x 256 fp32) is made once per expert in forward
        h = [e for e in tr.events if e[0] == "alloc" and e[4] == "experts.0.0" and e[5] == "forward"]
        self.assertIn(64 * 256 * 4, [e[2] for e in h])

    def test_as_on_cuda(self):
        """Meta tensors take other code paths than CUDA's; the tracer takes CUDA's: a tied
        weight stays one tensor through .to() (Module._apply), dropout keeps a 1-byte mask
        (native_dropout)."""
        def train(device):
            model = nn.Sequential(nn.Embedding(1000, 64), nn.Dropout(0.1), nn.Linear(64, 1000, bias=False))
            model[2].weight = model[0].weight
            model.to(device)
            self.assertIs(model[2].weight, model[0].weight)

            def step():
                model(torch.randint(0, 1000, (8, 32), device=device)).sum().backward()
            return step
        tr = ge.trace_step(train, steps=1, mode="meta", workspace=0)
        self.assertEqual(max_live(tr, ge.PARAMETERS), 1000 * 64 * 4)
        sizes = [e[2] for e in tr.events if e[0] == "alloc" and e[4] == "1"]
        self.assertEqual(sorted(sizes), [8 * 32 * 64, 8 * 32 * 64 * 4])  # the bool mask, the output

    def test_resize_moves_the_storage(self):
        """resize_ past a storage's size is a new block, then the old one goes; the new
        one goes when its tensor dies."""
        def train(device):
            def step():
                x = torch.empty(100, device=device)
                x.resize_(1000)
                del x
            return step
        tr = ge.trace_step(train, steps=1, mode="meta", workspace=0)
        self.check_format(tr)
        self.assertEqual([(e[0], e[2]) for e in tr.events], [("alloc", 400), ("alloc", 4000), ("free", 400),
                                                              ("free", 4000)])

    def test_item_needs_a_value(self):
        def train(device):
            lin = nn.Linear(8, 8).to(device)

            def step():
                if lin(torch.randn(2, 8, device=device)).sum() > 0:
                    pass
            return step
        with self.assertRaisesRegex(ge.TraceError, "item=VALUE"):
            ge.trace_step(train, steps=1, mode="meta")
        self.assertGreater(len(ge.trace_step(train, steps=1, mode="meta", item=0).events), 0)

    def test_to_makes_one_copy_per_parameter(self):
        """.to() while tracing replaces each Parameter by a new one without torch's
        Module._apply (on torch 2.x that swaps FakeTensor parameters in place,
        torch.utils.swap_tensors, which refuses a tensor that has a weakref): a
        weakref'd parameter converts, a tied weight stays one tensor, and a parameter
        converted to another dtype on the device is held once: the old copy goes
        as the new one comes, not after the whole model is converted."""
        calls = []
        orig = nn.Module._apply

        def counting(module, fn, *a, **k):
            calls.append(module)
            return orig(module, fn, *a, **k)

        def train(device):
            model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).to(device)
            model.add_module("head", nn.Linear(256, 256, bias=False))
            model.head.to(device)
            held = weakref.ref(model[0].weight)   # FakeTensorMode's memo holds such refs
            model.to(torch.float16)
            self.assertIsNotNone(held)
            self.assertEqual({p.dtype for p in model.parameters()}, {torch.float16})

            def step():
                with torch.no_grad():
                    model(torch.randn(8, 256, device=device, dtype=torch.float16))
            return step
        nn.Module._apply = counting
        try:
            tr = ge.trace_step(train, steps=1, mode="meta", workspace=0)
        finally:
            nn.Module._apply = orig
        self.assertEqual(calls, [])
        self.check_format(tr)
        w = 1024 * 256
        p32 = (2 * w + 1024 + 256 + 256 * 256) * 4
        self.assertEqual(max_live(tr, ge.PARAMETERS), p32 // 2)
        # during .to(float16): at most every fp32 parameter and the largest fp16 one
        live, size, setup = 0, {}, 0
        for action, addr, n, _c, _s, phase in tr.events:
            live += n if action == "alloc" else -n
            if action == "alloc":
                size[addr] = n
            if phase == "setup":
                setup = max(setup, live)
        self.assertLessEqual(setup, p32 + w * 2)

    def test_tied_weight_converts_once(self):
        def train(device):
            model = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 1000, bias=False))
            model[1].weight = model[0].weight
            model.to(device)
            model.to(torch.float16)
            self.assertIs(model[1].weight, model[0].weight)
            self.assertEqual(model[0].weight.dtype, torch.float16)
            return lambda: None
        tr = ge.trace_step(train, steps=1, mode="meta", workspace=0)
        self.check_format(tr)
        allocs = [e[2] for e in tr.events if e[0] == "alloc"]
        self.assertEqual(sorted(allocs), [1000 * 64 * 2, 1000 * 64 * 4])   # fp32 once, fp16 once

    def test_item_inside_a_library_reads_a_default(self):
        """A value read inside installed code (transformers' padding-mask check, a
        site-packages file here) reads as True / 1 with a note; the user's own read
        and one in transformers' generation loop still stop the trace."""
        with tempfile.TemporaryDirectory() as d:
            def load(rel, name):
                path = os.path.join(d, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write("def all_ones(mask):\n    return bool(mask.all())\n"
                            "def count(t):\n    return (t > 0).sum().item()\n")
                import importlib.util  # noqa: PLC0415
                spec = importlib.util.spec_from_file_location(name, path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                return mod
            lib = load(os.path.join("site-packages", "gm_lib", "masks.py"), "gm_lib_masks")
            gen = load(os.path.join("site-packages", "transformers", "generation", "utils.py"), "gm_lib_gen")

            def train(fn):
                def make(device):
                    lin = nn.Linear(8, 8).to(device)

                    def step():
                        y = lin(torch.randn(2, 8, device=device))
                        if fn(torch.ones(2, 8, dtype=torch.bool, device=device)):
                            y = y * 2
                        self.assertEqual(lib.count(y), 1)
                    return step
                return make
            tr = ge.trace_step(train(lib.all_ones), steps=2, mode="meta")
            notes = [n for n in tr.notes if "masks.py" in n]
            self.assertEqual(len(notes), 2, tr.notes)     # once per place, not per read
            self.assertIn(os.path.join("gm_lib", "masks.py") + ":2 (all_ones) was taken as True", notes[0])
            self.assertIn(":4 (count) was taken as 1", notes[1])
            with self.assertRaisesRegex(ge.TraceError, "item=VALUE"):
                ge.trace_step(train(gen.all_ones), steps=1, mode="meta")
            with self.assertRaisesRegex(ge.TraceError, "item=VALUE"):
                ge.trace_step(train(lambda m: bool(m.all())), steps=1, mode="meta")

    @unittest.skipIf(torch is not None and int(torch.__version__.split(".")[0]) < 2,
                     "FakeTensorMode with autograd needs torch 2.x")
    def test_fake_and_meta_agree(self):
        """A model built under fake mode (its parameters FakeTensors, one with a weakref)
        moves with .to(device, dtype), and fake and meta tensors trace the same peak."""
        def train(device):
            model = MLP()
            held = weakref.ref(model.net[0].weight)
            model.to(device=device, dtype=torch.float16)
            self.assertIsNotNone(held)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def step():
                model(torch.randn(32, 256, device=device, dtype=torch.float16)).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            return step
        meta = ge.trace_step(train, steps=2, mode="meta", workspace=0)
        fake = ge.trace_step(train, steps=2, mode="fake", workspace=0)
        P = param_bytes(MLP().parameters()) // 2
        for tr in (meta, fake):
            self.assertEqual(max_live(tr, ge.PARAMETERS), P)
            self.assertEqual(max_live(tr, ge.OPTIMIZER), 2 * P)
        self.assertLess(abs(fake.live_peak()[0] / meta.live_peak()[0] - 1), 0.02)

    @unittest.skipUnless(torch is not None and hasattr(F, "scaled_dot_product_attention"), "torch has no sdpa")
    def test_meta_sdpa_takes_the_fused_kernel(self):
        """On meta tensors torch picks sdpa's math path (its per-device choice has no
        meta entry), which keeps the b x h x s x s weights; the tracer takes the kernel
        CUDA would (flash for bf16 without a mask): no tensor of that size."""
        b, h, s, d = 2, 4, 256, 64

        def train(device):
            qkv = nn.Linear(h * d, 3 * h * d).to(device=device, dtype=torch.bfloat16)

            def step():
                x = torch.randn(b, s, h * d, device=device, dtype=torch.bfloat16)
                q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in qkv(x).chunk(3, -1))
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            return step
        tr = ge.trace_step(train, steps=1, mode="meta", workspace=0)
        self.assertEqual([n for n in tr.notes if "sdpa" in n], [])
        self.assertLess(max(e[2] for e in tr.events), b * h * s * s * 2)

    def test_layerdrop_runs_every_layer(self):
        """OPT's decoder (transformers' modeling_opt) draws a number per layer and
        skips the layer when it is below config.layerdrop: `if torch.rand([]) <
        self.layerdrop: continue`. Under FakeTensorMode that host draw has no value;
        read as True it skipped all 24 layers of opt-350m silently (-60.7%). A draw
        is taken at the top of its range, so every layer runs, on the host (real on
        meta mode: a seeded draw skips some layers) and on the device inside
        installed code (read as True: every layer skipped), with a note."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "site-packages", "gm_lib", "layerdrop.py")
            os.makedirs(os.path.dirname(path))
            with open(path, "w") as f:
                f.write("import torch\n"
                        "def dropped(p, device):\n"
                        "    return torch.rand([], device=device) < p\n")
            import importlib.util  # noqa: PLC0415
            spec = importlib.util.spec_from_file_location("gm_lib_layerdrop", path)
            lib = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(lib)

            class Decoder(nn.Module):
                def __init__(self, on_device, layers=8, d=64, layerdrop=0.5):
                    super().__init__()
                    self.on_device, self.layerdrop = on_device, layerdrop
                    self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))

                def forward(self, x):
                    for layer in self.layers:
                        if self.training and lib.dropped(self.layerdrop, x.device if self.on_device else "cpu"):
                            continue
                        x = layer(x)
                    return x

            for on_device in (False, True):
                torch.manual_seed(0)
                train = mlp_train(16, make=lambda: Decoder(on_device), width=64)   # noqa: B023
                tr = ge.trace_step(train, steps=2, mode="meta", workspace=0)
                P = param_bytes(Decoder(False).parameters())
                self.assertEqual(max_live(tr, ge.GRADIENTS), P, on_device)
                self.assertEqual(max_live(tr, ge.OPTIMIZER), 2 * P, on_device)
                notes = [n for n in tr.notes if "random draw" in n]
                self.assertEqual(len(notes), 1, tr.notes)
                self.assertIn("(forward) was taken at the top of its range", notes[0])   # the `if` reads it
                self.assertIn("(False)", notes[0])
                self.assertEqual([n for n in tr.notes if "no gradient" in n], [])

    def test_a_module_the_step_skips_is_said(self):
        """Parameters the optimizer steps but backward never reached: the step did
        not run their module, and the trace says which, not a silent number."""
        class Skips(nn.Module):
            def __init__(self):
                super().__init__()
                self.used, self.unused = nn.Linear(32, 32), nn.Linear(32, 32)

            def forward(self, x):
                return self.used(x)

        tr = ge.trace_step(mlp_train(4, make=Skips, width=32), steps=2, mode="meta", workspace=0)
        notes = [n for n in tr.notes if "no gradient" in n]
        self.assertEqual(len(notes), 1, tr.notes)
        self.assertIn("2 of the optimizer's parameters", notes[0])
        self.assertIn("did not run unused;", notes[0])
        self.assertEqual([n for n in ge.trace_step(mlp_train(), steps=1, mode="meta").notes if "gradient" in n], [])

    def test_host_value_fake_mode_cannot_read_is_said(self):
        """A host tensor FakeTensorMode cannot read reads as 1 / True, with a note
        naming where (an optimizer's step count inside torch.optim without one)."""
        class Unreadable(Exception):
            pass

        class Op:   # aten._local_scalar_dense as FakeTensorMode answers it for a host tensor
            overloadpacket = type("_local_scalar_dense", (), {})

            def __call__(self, *a, **k):
                raise Unreadable("data-dependent")
        tr = ge.Trace("fake", "cuda", 1, torch.__version__)
        rec = ge._Recorder(tr, "cuda", 0)
        mode = ge._make_mode(rec, None, None, None)
        for _ in range(2):
            self.assertIs(mode.__torch_dispatch__(Op(), (), (torch.zeros((), dtype=torch.bool),)), True)
        self.assertEqual(len(tr.notes), 1, tr.notes)    # once per place
        self.assertIn("a host tensor's value read at %s:" % __file__, tr.notes[0])
        self.assertIn("(test_host_value_fake_mode_cannot_read_is_said) was taken as True", tr.notes[0])

    def test_bad_arguments(self):
        with self.assertRaisesRegex(TypeError, "train must be a function"):
            ge.trace_step(None)
        with self.assertRaisesRegex(TypeError, "must return the step function"):
            ge.trace_step(lambda device: None, mode="meta")
        with self.assertRaisesRegex(ValueError, "mode must be"):
            ge.trace_step(mlp_train(), mode="gpu")
        with self.assertRaisesRegex(ValueError, "steps must be at least 1"):
            ge.trace_step(mlp_train(), steps=0)
        if int(torch.__version__.split(".")[0]) < 2:
            with self.assertRaisesRegex(ge.TraceError, "needs torch 2"):
                ge.trace_step(mlp_train(), mode="fake")
            with self.assertRaisesRegex(ge.TraceError, "no fake process group"):
                with ge.fake_process_group(2):
                    pass


@unittest.skipIf(NO_TORCH, "needs torch")
class MeshTest(unittest.TestCase):
    def test_meshes_are_made_outside_the_trace_modes(self):
        """Under a process group, init_device_mesh runs with the trace's modes off
        (a DeviceMesh reads its rank tensor with nonzero(), which fake tensors cannot
        answer), wherever a module holds it by name; the undo puts every one back.
        torch 1.13 has no DeviceMesh: the process group, the mesh module and the
        mode switch are stand-ins."""
        import contextlib
        import sys
        import types
        from unittest import mock

        from gpumem._cuda_paths import CudaPaths
        modes_on, made_with = [True], []

        @contextlib.contextmanager
        def modes_off():
            modes_on[0] = False
            try:
                yield
            finally:
                modes_on[0] = True

        def init_device_mesh(device_type, shape):
            made_with.append(modes_on[0])
            return ("mesh", device_type, shape)
        dm = types.ModuleType("torch.distributed.device_mesh")
        script = types.ModuleType("a_users_script")  # from torch.distributed.device_mesh import init_device_mesh
        dm.init_device_mesh = script.init_device_mesh = init_device_mesh
        hooks = types.SimpleNamespace(undo=[])
        stand_ins = {dm.__name__: dm, script.__name__: script,
                     "torch.distributed.fsdp": types.ModuleType("torch.distributed.fsdp")}
        with mock.patch.dict(sys.modules, stand_ins), \
                mock.patch.object(torch.distributed, "is_available", lambda: True), \
                mock.patch.object(torch.distributed, "is_initialized", lambda: True), \
                mock.patch.object(torch.utils._python_dispatch, "_disable_current_modes", modes_off, create=True):
            CudaPaths.meshes_outside_modes(hooks)
            self.assertEqual(script.init_device_mesh("cuda", (8,)), ("mesh", "cuda", (8,)))
            self.assertEqual(dm.init_device_mesh("cuda", (2,)), ("mesh", "cuda", (2,)))
            self.assertEqual(made_with, [False, False])
            self.assertEqual(len(hooks.undo), 2)
            for undo in hooks.undo:
                undo()
            self.assertIs(script.init_device_mesh, init_device_mesh)
            self.assertIs(dm.init_device_mesh, init_device_mesh)
        hooks.undo.clear()  # without a process group: nothing is touched
        CudaPaths.meshes_outside_modes(hooks)
        self.assertEqual(hooks.undo, [])


if __name__ == "__main__":
    unittest.main()
