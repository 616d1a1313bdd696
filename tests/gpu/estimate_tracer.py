#!/usr/bin/env python3
"""The tracer's estimate against the GPU (issue 44): for each model, trace one
training (or generation) step on fake/meta tensors with
gpumem.estimate.trace_step, replay it (`gpumem estimate --trace`), then run
the same code on the GPU under PyTorch's default allocator and under
expandable_segments:True and compare the peak reserved (and allocated) memory.

None of these models was used to tune the tracer (it has no fitted
constants): transformers 5 models built from configs with random weights (no
downloads), LoRA written by hand on a Llama (peft is not installed), a top-2
MoE in plain torch, a DDP rank through torch's fake process group, and a
greedy decoding loop with a KV cache.

The measurements run in two child processes, one per allocator setting
(PYTORCH_CUDA_ALLOC_CONF is read once per process), started first so that
they run while this process traces; each measures the models one after the
other, emptying the cache and cuBLAS's workspaces and resetting the peaks
between them.

usage: python3 tests/gpu/estimate_tracer.py [--only a,b] [--steps 3] [--trace-only] [--deadline 300]
  --trace-only: no GPU: trace each model (meta tensors where FakeTensorMode
  is missing) and print its replayed estimate; models whose packages are
  missing are skipped.
Writes $OUT/estimate_tracer.json when OUT is set; with TRACER_SNAPSHOT=DIR, each
measured run's allocator history too (DIR/NAME-SETTING.pickle.gz), and the trace it is
compared with (DIR/NAME-traced.pickle.gz). Exit 1 when a model fails
or is more than 5% off.
"""
import argparse
import contextlib
import gzip
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from estimate_measure import clear  # noqa: E402  (empties caches, cuBLAS workspaces, resets peaks)

TOLERANCE = 0.05
STEPS = 3
TRACE_S = 45     # the most one model's trace (fake, then meta) may take
RESERVE_S = 15   # seconds before --deadline kept for the replays and the table
SETTINGS = {"default": "", "expandable": "expandable_segments:True"}


# ---- models: train(device) -> step, the same code traced and run ----------------

def lm_batch(vocab, batch, seq, device):
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    return {"input_ids": ids, "labels": ids}


def loop(model, make_batch, precision="bf16-autocast", optimizer="adamw", params=None):
    """The usual step: forward (under autocast when named), loss, backward,
    optimizer.step(), zero_grad(set_to_none=True)."""
    params = [p for p in (params or model.parameters()) if p.requires_grad]
    opt = (torch.optim.AdamW(params, lr=1e-4) if optimizer == "adamw"
           else torch.optim.SGD(params, lr=1e-3, momentum=0.9))
    # without CUDA (--trace-only on a CPU build) autocast("cuda") cannot start; on meta tensors it does nothing
    autocast = precision == "bf16-autocast" and torch.cuda.is_available()

    def step():
        batch = make_batch()
        with torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            out = model(**batch)
            loss = out.loss if hasattr(out, "loss") else out
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def hf(cfg_name, cls_name, batch, seq=None, image=None, precision="bf16-autocast", optimizer="adamw",
       labels="lm", lora=False, **cfg_kw):
    def train(device):
        import transformers as T
        cfg = getattr(T, cfg_name)(**cfg_kw)
        model = getattr(T, cls_name)(cfg)
        if lora:
            add_lora(model)
        if precision == "bf16":
            model.to(device=device, dtype=torch.bfloat16)
        else:
            model.to(device)
        model.train()

        def make_batch():
            if image:
                return {"pixel_values": torch.randn(batch, 3, image, image, device=device),
                        "labels": torch.randint(0, cfg.num_labels, (batch,), device=device)}
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
            if labels == "cls":
                return {"input_ids": ids, "labels": torch.randint(0, cfg.num_labels, (batch,), device=device)}
            if labels == "seq2seq":
                return {"input_ids": ids, "labels": torch.randint(0, cfg.vocab_size, (batch, seq // 2), device=device)}
            return {"input_ids": ids, "labels": ids}
        return loop(model, make_batch, precision, optimizer)
    return train


class LoRALinear(nn.Module):
    """peft's LoRA layer as it computes: base(x) + dropout(x) A^T B^T * alpha / r."""

    def __init__(self, base, r=16, alpha=32):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale


def add_lora(model, targets=("q_proj", "v_proj")):
    for p in model.parameters():
        p.requires_grad_(False)
    for name, mod in list(model.named_modules()):
        for t in targets:
            child = getattr(mod, t, None)
            if isinstance(child, nn.Linear):
                setattr(mod, t, LoRALinear(child))


def attention(q, k, v):
    """Causal sdpa; written out where torch has none (1.13: --trace-only here)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    att = att.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return att.softmax(-1) @ v


class MoEBlock(nn.Module):
    """Pre-norm layer: causal sdpa attention, then top-2 of E SwiGLU experts;
    each expert's tokens gathered with torch.where on the routing (Mixtral's way)."""

    def __init__(self, d, heads, experts, ffn, k=2):
        super().__init__()
        self.heads, self.k = heads, k
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, experts, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(d, 2 * ffn, bias=False) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(ffn, d, bias=False) for _ in range(experts))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, -1))
        x = x + self.o(attention(q, k, v).transpose(1, 2).reshape(b, s, d))
        h = self.ln2(x).reshape(-1, d)
        w, chosen = self.gate(h).softmax(-1).topk(self.k, dim=-1)
        out = torch.zeros_like(h)
        for e in range(len(self.w1)):
            tok, slot = torch.where(chosen == e)
            a, g = self.w1[e](h[tok]).chunk(2, -1)
            out.index_add_(0, tok, self.w2[e](F.silu(a) * g) * w[tok, slot, None])
        return x + out.view(b, s, d)


class MoELM(nn.Module):
    def __init__(self, vocab=32000, d=768, heads=12, layers=4, experts=8, ffn=1024):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(MoEBlock(d, heads, experts, ffn) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids, labels):
        x = self.emb(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.ln(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def moe(batch, seq, experts=8):
    def train(device):
        model = MoELM(experts=experts).to(device)
        return loop(model, lambda: lm_batch(32000, batch, seq, device))
    return train


def ddp_gpt2(batch, seq):
    def train(device):
        import transformers as T
        from torch.nn.parallel import DistributedDataParallel as DDP
        cfg = T.GPT2Config()
        model = T.GPT2LMHeadModel(cfg).to(device)
        net = DDP(model)

        def noop(state, bucket):  # the fake group cannot all-reduce; the bucket is kept as it is
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        net.register_comm_hook(None, noop)
        return loop(net, lambda: lm_batch(cfg.vocab_size, batch, seq, device), params=list(model.parameters()))
    return train


def fsdp_gpt2(batch, seq):
    """FSDP2 (fully_shard per block, then the root) as rank 0 of the fake group: the
    optimizer steps the rank's shards; the fake all-gathers return unsent buffers of
    the right size. fully_shard makes its default mesh inside the traced step, as
    most scripts let it (the 2026-12-07 late-night run stopped there, at nonzero()
    on a fake host tensor: the tracer now makes meshes outside its modes)."""
    def train(device):
        import transformers as T
        from torch.distributed.fsdp import fully_shard
        cfg = T.GPT2Config()
        model = T.GPT2LMHeadModel(cfg).to(device)
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        return loop(model, lambda: lm_batch(cfg.vocab_size, batch, seq, device))
    return train


def decode(batch, prompt, new):
    """Generation as a user's own loop writes it (greedy, KV cache), new tokens
    after a prompt; model.generate() decides when to stop from tensor values,
    which the tracer does not have."""
    def train(device):
        import transformers as T
        cfg = T.GPT2Config()
        model = T.GPT2LMHeadModel(cfg).to(device=device, dtype=torch.bfloat16).eval()

        def step():
            with torch.no_grad():
                out = model(torch.randint(0, cfg.vocab_size, (batch, prompt), device=device), use_cache=True)
                for _ in range(new):
                    tok = out.logits[:, -1:].argmax(-1)
                    out = model(tok, past_key_values=out.past_key_values, use_cache=True)
        return step
    return train


LLAMA = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
SMALL = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
CASES = [
    # name, train, trace_step options
    ("gpt2-bf16ac", hf("GPT2Config", "GPT2LMHeadModel", 8, 512), {}),
    ("gpt2-fp32-sgd", hf("GPT2Config", "GPT2LMHeadModel", 4, 512, precision="fp32", optimizer="sgd"), {}),
    ("llama-bf16", hf("LlamaConfig", "LlamaForCausalLM", 4, 1024, precision="bf16", **LLAMA), {}),
    ("mistral-bf16ac", hf("MistralConfig", "MistralForCausalLM", 4, 1024, **SMALL), {}),
    ("qwen2-bf16ac", hf("Qwen2Config", "Qwen2ForCausalLM", 4, 1024, **SMALL), {}),
    ("bert-mlm-bf16ac", hf("BertConfig", "BertForMaskedLM", 16, 256), {}),
    ("bert-cls-fp32", hf("BertConfig", "BertForSequenceClassification", 16, 256, precision="fp32", labels="cls"), {}),
    ("vit-bf16ac", hf("ViTConfig", "ViTForImageClassification", 32, image=224, num_labels=1000), {}),
    ("opt-350m-bf16ac", hf("OPTConfig", "OPTForCausalLM", 4, 512, hidden_size=1024, num_hidden_layers=24,
                           ffn_dim=4096, num_attention_heads=16, word_embed_proj_dim=512), {}),
    ("pythia-160m-bf16ac", hf("GPTNeoXConfig", "GPTNeoXForCausalLM", 8, 512, hidden_size=768, num_hidden_layers=12,
                              num_attention_heads=12, intermediate_size=3072, vocab_size=50304), {}),
    # T5 shifts the labels right itself: its config must name the start and pad tokens (t5-small's: 0, 0)
    ("t5-small-fp32", hf("T5Config", "T5ForConditionalGeneration", 8, 512, precision="fp32", labels="seq2seq",
                         decoder_start_token_id=0, pad_token_id=0), {}),
    ("llama-lora-bf16ac", hf("LlamaConfig", "LlamaForCausalLM", 4, 1024, lora=True, **LLAMA), {}),
    ("moe-top2-bf16ac", moe(8, 512), {"nonzero": 1 / 8}),
    ("gpt2-ddp-rank0-of-8", ddp_gpt2(8, 512), {"world_size": 8}),
    ("gpt2-fsdp-rank0-of-8", fsdp_gpt2(8, 512), {"world_size": 8}),
    ("gpt2-decode-bf16", decode(8, 256, 64), {"steps": 1}),
]


# ---- measuring on the GPU (child processes) --------------------------------------

# TRACER_SNAPSHOT=DIR: the GPU's own allocator history of each measured run
# (DIR/NAME-SETTING.pickle.gz) and the trace it is compared with (DIR/NAME-traced.pickle.gz)
SNAPSHOT_DIR = os.environ.get("TRACER_SNAPSHOT")

def measure(name, train, opts, steps, snapshot=None):
    """Peak reserved and allocated over the steps; with `snapshot` (a path),
    the run's allocator history is written there too, for replaying what the
    GPU did against what was traced."""
    from gpumem import estimate as ge
    ctx = ge.fake_process_group(opts["world_size"]) if opts.get("world_size") else contextlib.nullcontext()
    with ctx:
        clear()
        if snapshot:
            torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        step = train(torch.device("cuda"))
        for _ in range(opts.get("steps", steps)):
            step()
        torch.cuda.synchronize()
        r = {"reserved": torch.cuda.max_memory_reserved(), "allocated": torch.cuda.max_memory_allocated()}
        if snapshot:
            with gzip.open(snapshot, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
            torch.cuda.memory._record_memory_history(enabled=None)
        del step
    clear()
    return r


def child(setting, names, steps):
    torch.manual_seed(0)
    for name, train, opts in CASES:
        if name not in names:
            continue
        try:
            r = measure(name, train, opts, steps,
                        SNAPSHOT_DIR and os.path.join(SNAPSHOT_DIR, "%s-%s.pickle.gz" % (name, setting)))
        except Exception as e:  # noqa: BLE001 -- one model's failure is a row of the table
            r = {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")}
            traceback.print_exc(file=sys.stderr)
            try:
                clear()
            except Exception:  # noqa: BLE001 -- no CUDA at all: every row says so
                pass
        print(json.dumps({"name": name, "setting": setting, **r}), flush=True)


# ---- tracing (this process) ------------------------------------------------------

class TraceTimeout(Exception):
    """A trace that passed its share of --deadline."""


@contextlib.contextmanager
def time_limit(seconds):
    """Raise TraceTimeout in this (the main) thread after `seconds`."""
    def ring(signum, frame):
        raise TraceTimeout("passed its %.0f s" % seconds)
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.1))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def trace(name, train, opts, steps, budget):
    """Trace in fake mode (torch 2.x), falling back to meta tensors when fake
    mode fails; each try gets its share of `budget` seconds. The row says
    which mode ran, and why fake did not."""
    from gpumem import estimate as ge
    kw = {k: v for k, v in opts.items() if k in ("nonzero", "item")}
    n = opts.get("steps", steps)
    t0 = time.time()
    modes = ["fake", "meta"] if int(torch.__version__.split(".")[0]) >= 2 else ["meta"]
    tried = []
    for mode in modes:
        ctx = ge.fake_process_group(opts["world_size"]) if opts.get("world_size") else contextlib.nullcontext()
        left = budget - (time.time() - t0)
        try:
            with time_limit(left * (0.6 if mode == "fake" and len(modes) > 1 else 1.0)), ctx:
                tr = ge.trace_step(train, steps=n, mode=mode, **kw)
            break
        except ImportError:
            raise
        except Exception as e:  # noqa: BLE001 -- the next mode, or the row's error
            why = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:160] if str(e) else "")
            tried.append("%s failed (%s)" % (mode, why))
            if not isinstance(e, TraceTimeout):
                traceback.print_exc(file=sys.stderr)
            if mode == modes[-1]:
                raise RuntimeError("; ".join(tried)) from None
    est = tr.estimate()
    if SNAPSHOT_DIR:  # beside the GPU's own histories, to compare event by event
        tr.save(os.path.join(SNAPSHOT_DIR, "%s-traced.pickle.gz" % name))
    return {"mode": tr.mode, "note": "; ".join(tried), "trace_s": round(time.time() - t0, 1), "events": est["events"],
            "reserved_default": est["peak_reserved"]["torch"],
            "reserved_expandable": est["peak_reserved"]["expandable_segments"],
            "allocated": est["peak_allocated"], "at_peak": est["at_peak"], "trace_notes": tr.notes,
            "largest_at_peak": largest_at_peak(tr)}


def largest_at_peak(tr, n=8):
    """The n largest allocations live at the trace's peak of requested bytes:
    [MiB, category, module scope, phase], for finding what a row over- or
    under-counts."""
    live, peak, at = {}, 0, []
    total = 0
    for action, addr, size, cat, scope, phase in tr.events:
        if action == "alloc":
            live[addr] = (size, cat, scope, phase)
            total += size
            if total > peak:
                peak, at = total, list(live.values())
        else:
            total -= live.pop(addr)[0]
    return [[round(s / 2**20, 1), c, sc, ph] for s, c, sc, ph in sorted(at, key=lambda e: -e[0])[:n]]


def err(est, meas):
    return (est - meas) / meas if meas else float("nan")


def mib(n):
    return "%.1f" % (n / 2**20) if isinstance(n, int) else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--trace-only", action="store_true")
    ap.add_argument("--deadline", type=float, default=300.0,
                    help="seconds by which the table is out (default 300): each trace gets at most %d s and none "
                         "starts later than %d s before it; a measuring child still running then is killed"
                         % (TRACE_S, RESERVE_S))
    ap.add_argument("--child", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    a = ap.parse_args()
    names = [c[0] for c in CASES]
    if a.only:
        unknown = set(a.only.split(",")) - set(names)
        if unknown:
            ap.error("unknown model(s) %s; the models: %s" % (", ".join(sorted(unknown)), ", ".join(names)))
        names = a.only.split(",")
    if a.child:
        return child(a.child, names, a.steps)
    t0 = time.time()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"),
          flush=True)
    kids = {}
    if not a.trace_only:
        for s, conf in SETTINGS.items():
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
            kids[s] = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", s, "--only",
                                        ",".join(names), "--steps", str(a.steps)], stdout=subprocess.PIPE,
                                       env=env, universal_newlines=True)
    rows = {}
    try:  # imported before the first trace's clock starts
        import transformers  # noqa: F401
    except ImportError:
        pass
    try:
        for name, train, opts in CASES:
            if name not in names:
                continue
            budget = min(TRACE_S, a.deadline - RESERVE_S - (time.time() - t0))
            if budget < 3:
                rows[name] = {"error": "not traced: --deadline %.0f s reached" % a.deadline}
            else:
                try:
                    rows[name] = trace(name, train, opts, a.steps, budget)
                except ImportError as e:
                    rows[name] = {"skipped": str(e)}
                except Exception as e:  # noqa: BLE001 -- one model's failure is a row of the table
                    rows[name] = {"error": "%s: %s" % (type(e).__name__, str(e)[:400] if str(e) else "")}
            print("traced %-20s %s" % (name, json.dumps(rows[name])[:300]), flush=True)
    finally:  # the table comes out whatever happened above
        collect(kids, rows, a.deadline, t0)
        failed = table(rows, names, a.trace_only)
        print("total %.0f s" % (time.time() - t0))
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "estimate_tracer.json"), "w") as f:
                json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
    return 1 if failed else 0


def collect(kids, rows, deadline, t0):
    """The measuring children's rows, each child killed at --deadline (the rows
    it printed before stay)."""
    for s, p in kids.items():
        try:  # a child that hangs (a collective that never returns) must not hold the device call
            out, _ = p.communicate(timeout=max(1.0, deadline - 5 - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            print("measuring under %s passed --deadline %.0f s: killed; models after the last measured are "
                  "FAIL" % (s, deadline), flush=True)
        for line in out.splitlines():
            if not line.startswith('{"name"'):
                continue
            m = json.loads(line)
            rows.setdefault(m["name"], {})[s] = m


def table(rows, names, trace_only):
    """Print the table; returns the models that failed or are off by more than TOLERANCE."""
    print("\n%-20s %-5s %9s %9s %7s %9s %9s %7s %9s %9s %7s" % (
        "model", "mode", "est res", "measured", "err", "est exp", "meas exp", "err", "est alloc", "meas all", "err"))
    print("%-20s %-5s %9s %9s %7s %9s %9s %7s %9s %9s %7s" % ("", "", "MiB", "MiB", "", "MiB", "MiB", "", "MiB", "MiB", ""))
    worst, failed = (0.0, None), []
    for name in names:
        r = rows.get(name, {})
        if "skipped" in r or "error" in r:
            print("%-20s %s" % (name, ("skipped: " + r["skipped"]) if "skipped" in r else "TRACE FAILED: " + r["error"]))
            for s in ("default", "expandable"):   # what the GPU measured all the same
                if "reserved" in r.get(s, {}):
                    print("    measured %s: reserved %s MiB, allocated %s MiB" % (
                        s, mib(r[s]["reserved"]), mib(r[s]["allocated"])))
            if "error" in r:
                failed.append(name)
            continue
        cells, ok = [], True
        for key, s, field in (("reserved_default", "default", "reserved"),
                              ("reserved_expandable", "expandable", "reserved"),
                              ("allocated", "default", "allocated")):
            m = r.get(s, {})
            if trace_only:
                cells += [mib(r[key]), "-", "-"]
            elif field in m:
                e = err(r[key], m[field])
                cells += [mib(r[key]), mib(m[field]), "%+.1f%%" % (100 * e)]
                if field == "reserved":
                    if abs(e) > abs(worst[0]):
                        worst = (e, "%s (%s)" % (name, s))
                    ok = ok and abs(e) <= TOLERANCE
            else:
                cells += [mib(r[key]), "FAIL", ""]
                ok = False
                if m.get("error", "no result") not in r.setdefault("measure_errors", []):
                    r["measure_errors"].append(m.get("error", "no result"))
        print("%-20s %-5s %9s %9s %7s %9s %9s %7s %9s %9s %7s" % tuple([name, r["mode"]] + cells))
        for e in r.get("measure_errors", []):
            print("    measure failed: %s" % e)
        if r.get("note"):
            print("    %s" % r["note"])
        for n in r.get("trace_notes", []):   # what the trace took or could not see (never a silent number)
            print("    trace: %s" % n)
        if not ok and not trace_only:
            failed.append(name)
    if not trace_only:
        print("\nworst error of peak reserved: %s; %d of %d models within %.0f%%" % (
            "%+.1f%% (%s)" % (100 * worst[0], worst[1]) if worst[1] else "none measured",
            len([n for n in names if n not in failed and "skipped" not in rows.get(n, {})]),
            len(names), 100 * TOLERANCE))
    return failed


if __name__ == "__main__":
    sys.exit(main())
