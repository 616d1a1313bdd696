"""The allocator's GPU suite (issue 23): real training jobs, one fresh process per run.

Jobs (40+ steps each, seeded, no downloads):
  gpt2_hf       GPT-2 small through the HF Trainer, bf16, batch 8, seq 512
  resnet50_amp  ResNet-50, fp16 autocast + GradScaler, SGD, batch 96
  llama_ckpt    Llama, 12 layers (hidden 1024), activation checkpointing, bf16, batch 8, seq 1024
  bert_varlen   BERT base masked LM, fp16 autocast, AdamW, batch 32, a new length in 32..512 every step
  gpt2_generate GPT-2 (24 layers, 1024 wide) fp16, generate() of 64 new tokens, batch 8, per step
Allocators:
  native        torch's caching allocator, default settings
  expandable    torch's, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  gpumem        gpumem.torch.install() with no settings (the default policy)
  gpumem:CONF   gpumem.torch.install(CONF), with + for the commas between settings
                (gpumem:gpumem_slack:inf+gpumem_chunks:run)
  gpumem-prof   the default with GPUMEM_PROFILE=1: the time spent inside gpumem's alloc/free
                entry points per step (two clock reads per call added), and of it the time
                waiting for a stream before a move (sync) and in other driver calls
  gpumem-prof:CONF  the same under gpumem.torch.install(CONF)

Per run (one JSON line, prefix RESULT): peak allocated / reserved over the whole run
(warm-up included), NVML's peak used memory of the device, median step time from
step 10 on (and the process's CPU time in the same steps: a step whose wall time
grows with its CPU time is host-bound), allocations per step, device calls per step after warm-up (gpumem: its num_* counters; torch:
num_device_alloc + num_device_free, and the steps whose reserved bytes changed, since
torch does not count expandable segments' maps), losses.

    python3 tests/gpu/alloc_suite.py [--steps 40] [--rounds 1] [--jobs a,b] [--allocs native,gpumem]
                                     [--cap-x 1.03] [--record DIR] [--json FILE]
    python3 tests/gpu/alloc_suite.py --child JOB ALLOC STEPS CAP_BYTES RECORD_PATH   (one run)

--record DIR: first records each job's 40-step memory history under native torch
(DIR/JOB.pickle.gz, for `gpumem replay`). --cap-x X: a second table with every run
capped at X times the job's native peak allocated (set_per_process_memory_fraction).
"""
import contextlib
import gc
import gzip
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpumem_path  # noqa: E402,F401  (the installed gpumem, with its shim, when there is one)

JOBS = ["gpt2_hf", "resnet50_amp", "llama_ckpt", "bert_varlen", "gpt2_generate"]
# issue 41: the kinds of job a user brings; HELD_OUT are never used to tune the policy
JOBS_USER = ["lora_varlen", "serve_generate", "train_eval", "compile_train", "cnn_varsize"]
# t5/detect were held out until the 2026-12-07 removal of elastic plans looked at their replays;
# moe_routing, vit_multires and sft_tokens were held out from then, and sft_tokens stopped being
# unseen when its moves were read that night (bench/RESULTS.md). whisper_varlen and accum_varbatch
# were written then and first ran unseen in the late night of 2026-12-07 (examples/jobs).
# dpo_pairs and segment_varsize were written after that run and have not run yet: the next
# unseen check.
HELD_OUT = ["t5_varlen", "detect_varsize", "moe_routing", "vit_multires", "sft_tokens",
            "whisper_varlen", "accum_varbatch", "dpo_pairs", "segment_varsize"]
CALL_KEYS = ("num_device_alloc", "num_device_free", "num_map", "num_unmap", "num_phys_create",
             "num_phys_release", "num_va_reserve", "num_va_release")


class Meter:
    """Step boundaries: wall and CPU time, allocations, device calls, reserved bytes, losses,
    and (prof: a function returning gpumem's profile counters) the ns spent inside gpumem."""

    def __init__(self, torch, stats, prof=None):
        self.torch, self.stats, self.prof = torch, stats, prof
        self.times, self.cpu, self.allocs, self.inside = [], [], [], []
        self.calls, self.reserved_changed, self.losses = [], [], []
        self.waits = []  # gpumem's stream waits before a move (num_stream_waits)
        self.t0 = None
        # SUITE_KERNELS=K: step K runs under torch's profiler, which reports the GPU's busy time in it
        # (kernels, copies, sets): equal across allocators unless their memory makes kernels slower.
        # That step is left out of the step times.
        self.kernels_at = int(os.environ.get("SUITE_KERNELS", "-1"))
        self.profiler, self.gpu_busy_ms, self.cpu_top = None, None, None
        # Python's garbage collector, timed: a step slowed by collections is slowed by the
        # objects the process makes, not by its allocator's calls
        self.gc_s, self.gc_steps, self._gc_start = 0.0, [], None
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase, info):
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self.gc_s += time.perf_counter() - self._gc_start
            self._gc_start = None

    def _calls(self):
        s = self.stats()
        return (sum(int(s.get(k, 0)) for k in CALL_KEYS), int(s.get("reserved_bytes.all.current", 0)),
                int(s.get("allocation.all.allocated", 0)), int(s.get("num_stream_waits", 0)))

    def begin(self):
        self.torch.cuda.synchronize()
        if self.kernels_at == len(self.times):
            self.profiler = self.torch.profiler.profile(
                activities=[self.torch.profiler.ProfilerActivity.CPU, self.torch.profiler.ProfilerActivity.CUDA])
            self.profiler.__enter__()
        self.c0, self.r0, self.a0, self.w0 = self._calls()
        self.gc0 = self.gc_s
        self.p0 = self.prof() if self.prof else None
        self.t0, self.cpu0 = time.perf_counter(), time.process_time()

    def end(self, loss=None):
        self.torch.cuda.synchronize()
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            ev = self.profiler.key_averages()
            self.gpu_busy_ms = 1e-3 * sum(e.self_device_time_total for e in ev)
            # the host side of the same step, by op: an allocator that slows the host shows in the
            # ops that allocate (aten::empty*), a slower host in every op alike
            top = sorted(ev, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
            self.cpu_top = {e.key: round(1e-3 * e.self_cpu_time_total, 2) for e in top}
            self.profiler, self.kernels_at = None, -1
            return
        self.times.append(time.perf_counter() - self.t0)
        self.cpu.append(time.process_time() - self.cpu0)
        self.gc_steps.append(self.gc_s - self.gc0)
        if self.prof:
            p1 = self.prof()
            self.inside.append({k: p1[k] - self.p0[k] for k in p1})
        c1, r1, a1, w1 = self._calls()
        self.waits.append(w1 - self.w0)
        self.calls.append(c1 - self.c0)
        self.allocs.append(a1 - self.a0)
        self.reserved_changed.append(int(r1 != self.r0))
        if loss is not None:
            self.losses.append(float(loss))


def lm_batches(torch, vocab, batch, lens, seed=1):
    g = torch.Generator().manual_seed(seed)
    for s in lens:
        yield torch.randint(0, vocab, (batch, s), generator=g)


def run_gpt2_hf(torch, meter, steps):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    model = GPT2LMHeadModel(GPT2Config())
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 50257, (steps * 8, 512), generator=g)]

    class CB(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            meter.begin()

        def on_step_end(self, args, state, control, **kw):
            meter.end()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                meter.losses.append(float(logs["loss"]))

    out = tempfile.mkdtemp()
    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=8, bf16=True,
                             report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0, seed=0, optim="adamw_torch")
    Trainer(model=model, args=args, train_dataset=data, callbacks=[CB()]).train()


def run_resnet50_amp(torch, meter, steps):
    import torchvision
    m = torchvision.models.resnet50(weights=None).cuda().train()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    crit = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(96, 3, 224, 224, generator=g).cuda()
        y = torch.randint(0, 1000, (96,), generator=g).cuda()
        meter.begin()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        meter.end(loss.item())


def train_steps(torch, meter, opt, batches, loss_of, amp=None):
    """One measured training step per batch (already on the GPU): loss_of(batch) under autocast
    (amp: its dtype, None for none), backward, optimizer step, gradients set to None."""
    for batch in batches:
        meter.begin()
        with torch.autocast("cuda", dtype=amp) if amp is not None else contextlib.nullcontext():
            loss = loss_of(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        meter.end(loss.item())


def train_lm(torch, meter, model, amp, batches, params=None, fwd=None):
    model.cuda().train()
    opt = torch.optim.AdamW(params if params is not None else model.parameters(), lr=1e-4)
    fwd = model if fwd is None else fwd  # not `or`: a compiled module has no truth value (len)
    train_steps(torch, meter, opt, (ids.cuda() for ids in batches),
                lambda ids: fwd(input_ids=ids, labels=ids).loss, amp)


def run_llama_ckpt(torch, meter, steps):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                      num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg)
    model.gradient_checkpointing_enable()
    train_lm(torch, meter, model, torch.bfloat16, lm_batches(torch, 32000, 8, [1024] * steps))


def run_bert_varlen(torch, meter, steps):
    from transformers import BertConfig, BertForMaskedLM
    g = torch.Generator().manual_seed(2)
    lens = [int(x) for x in torch.randint(32, 513, (steps,), generator=g)]
    train_lm(torch, meter, BertForMaskedLM(BertConfig()), torch.float16, lm_batches(torch, 30522, 32, lens))


def run_gpt2_generate(torch, meter, steps):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16)
    m = GPT2LMHeadModel(cfg).cuda().eval().half()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.randint(0, cfg.vocab_size, (8, 64), generator=g).cuda()
            meter.begin()
            out = m.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=0)
            meter.end(float(out[:, -1].float().mean()))


# ---- issue 41: jobs a user brings (not tuned for) ---------------------------------------------
# lora_varlen, serve_generate, train_eval, compile_train, cnn_varsize are the kinds;
# t5_varlen and detect_varsize are held out: recorded and measured, never used to tune the policy.

def _lora(torch, model, rank=16, alpha=32, targets=("q_proj", "v_proj")):
    """Plain-torch LoRA (peft is not installed on the GPU machine): frozen base weights, an A/B
    pair in fp32 beside each targeted Linear."""
    nn = torch.nn

    class LoRALinear(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            self.a = nn.Parameter(torch.randn(rank, base.in_features, device=base.weight.device) * 0.01)
            self.b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
            self.scale = alpha / rank

        def forward(self, x):
            return self.base(x) + (x @ self.a.t().to(x.dtype) @ self.b.t().to(x.dtype)) * self.scale

    for p in model.parameters():
        p.requires_grad_(False)
    for name, mod in list(model.named_modules()):
        for t in targets:
            child = getattr(mod, t, None)
            if isinstance(child, nn.Linear):
                setattr(mod, t, LoRALinear(child))
    return [p for p in model.parameters() if p.requires_grad]


def run_lora_varlen(torch, meter, steps):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                      num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).cuda()
    params = _lora(torch, model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    g = torch.Generator().manual_seed(3)
    lens = [int(x) for x in torch.randint(128, 2049, (steps,), generator=g)]
    train_lm(torch, meter, model, torch.bfloat16, lm_batches(torch, 32000, 4, lens, seed=3), params=params)


def run_serve_generate(torch, meter, steps):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16)
    m = GPT2LMHeadModel(cfg).cuda().eval().to(torch.bfloat16)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for _ in range(steps):
            b = int(torch.randint(1, 17, (1,), generator=g))
            p = int(torch.randint(16, 513, (1,), generator=g))
            ids = torch.randint(0, cfg.vocab_size, (b, p), generator=g).cuda()
            meter.begin()
            out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                             do_sample=False, pad_token_id=0)
            meter.end(float(out.shape[1]))


def run_train_eval(torch, meter, steps):
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(5)
    for i in range(steps):
        evaluating = i % 5 == 4  # an evaluation pass every 5 steps, larger batch, no grad
        ids = torch.randint(0, 50257, (32 if evaluating else 8, 512), generator=g).cuda()
        meter.begin()
        if evaluating:
            model.eval()
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            model.train()
        else:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        meter.end(loss.item())


def run_compile_train(torch, meter, steps):
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config())
    train_lm(torch, meter, model, torch.bfloat16, lm_batches(torch, 50257, 8, [512] * steps, seed=6),
             fwd=torch.compile(model.cuda()))


def image_batches(torch, seed, steps, mult, lo, hi):
    """(images, labels) on the GPU, batch 32 of 1000 classes, a new square side every step:
    mult x an integer in [lo, hi)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        side = mult * int(torch.randint(lo, hi, (1,), generator=g))
        yield (torch.randn(32, 3, side, side, generator=g).cuda(),
               torch.randint(0, 1000, (32,), generator=g).cuda())


def run_cnn_varsize(torch, meter, steps):
    import torchvision
    m = torchvision.models.resnet50(weights=None).cuda().train()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    crit = torch.nn.CrossEntropyLoss()
    batches = image_batches(torch, 7, steps, 32, 6, 16)  # 192..480
    train_steps(torch, meter, opt, batches, lambda b: crit(m(b[0]), b[1]), torch.bfloat16)


def run_t5_varlen(torch, meter, steps):  # held out
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12,
                   vocab_size=32128, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(8)

    def batches():
        for _ in range(steps):
            s = int(torch.randint(64, 513, (1,), generator=g))
            t = int(torch.randint(16, 129, (1,), generator=g))
            yield (torch.randint(1, 32128, (16, s), generator=g).cuda(),
                   torch.randint(1, 32128, (16, t), generator=g).cuda())
    train_steps(torch, meter, opt, batches(), lambda b: model(input_ids=b[0], labels=b[1]).loss, torch.bfloat16)


def run_detect_varsize(torch, meter, steps):  # held out
    import torchvision
    m = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                             num_classes=91).cuda().train()
    opt = torch.optim.SGD(m.parameters(), lr=0.005, momentum=0.9)
    g = torch.Generator().manual_seed(9)

    def batches():
        for _ in range(steps):
            imgs, targets = [], []
            for _ in range(4):
                h, w = (int(v) for v in torch.randint(320, 801, (2,), generator=g))
                imgs.append(torch.rand(3, h, w, generator=g).cuda())
                n = int(torch.randint(1, 9, (1,), generator=g))
                xy = torch.rand(n, 2, generator=g) * torch.tensor([w * 0.6, h * 0.6])
                wh = 16 + torch.rand(n, 2, generator=g) * torch.tensor([w * 0.3, h * 0.3])
                targets.append({"boxes": torch.cat([xy, xy + wh], 1).cuda(),
                                "labels": torch.randint(1, 91, (n,), generator=g).cuda()})
            yield imgs, targets
    train_steps(torch, meter, opt, batches(), lambda b: sum(m(*b).values()))


# ---- held out since 2026-12-07: written before any of them ran, never used to tune the policy ----

def run_moe_routing(torch, meter, steps):  # held out
    """A small Mixtral: top-2 routing sends a different number of tokens to each expert every step,
    so the shapes inside a step change even though the batch does not."""
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                        num_attention_heads=16, num_key_value_heads=8, num_local_experts=8,
                        num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=2048)
    train_lm(torch, meter, MixtralForCausalLM(cfg), torch.bfloat16,
             lm_batches(torch, 32000, 8, [1024] * steps, seed=10))


def run_vit_multires(torch, meter, steps):  # held out
    """ViT-B/16 trained at a new resolution (160-384) every step, position embeddings interpolated."""
    from transformers import ViTConfig, ViTForImageClassification
    m = ViTForImageClassification(ViTConfig(image_size=224, num_labels=1000)).cuda().train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    train_steps(torch, meter, opt, image_batches(torch, 11, steps, 16, 10, 25),
                lambda b: m(pixel_values=b[0], labels=b[1], interpolate_pos_encoding=True).loss,
                torch.bfloat16)


def run_sft_tokens(torch, meter, steps):  # held out
    """Full fine-tune of a 0.5B Llama with a token budget per step: long sequences come in small
    batches, short ones in large batches (16,384 tokens a step)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(12)

    def batches():
        for _ in range(steps):
            s = int(torch.randint(64, 2049, (1,), generator=g))
            yield torch.randint(0, 32000, (max(1, 16384 // s), s), generator=g).cuda()
    train_steps(torch, meter, opt, batches(), lambda ids: model(input_ids=ids, labels=ids).loss,
                torch.bfloat16)


# ---- written 2026-12-07 (night), first run unseen in its late night ----

def run_whisper_varlen(torch, meter, steps):  # held out
    """A Whisper-base-sized encoder-decoder: 30 s of log-mel features (fixed by the encoder), a
    new transcript length (16-224 tokens) every step, bf16 autocast, AdamW, batch 16."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    cfg = WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                        num_mel_bins=80, vocab_size=51865, max_target_positions=448)
    model = WhisperForConditionalGeneration(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(13)

    def batches():
        for _ in range(steps):
            t = int(torch.randint(16, 225, (1,), generator=g))
            yield (torch.randn(16, 80, 3000, generator=g).cuda(),
                   torch.randint(0, 51865, (16, t), generator=g).cuda())
    train_steps(torch, meter, opt, batches(), lambda b: model(input_features=b[0], labels=b[1]).loss,
                torch.bfloat16)


def run_accum_varbatch(torch, meter, steps):  # held out
    """GPT-2 medium, gradient accumulation: 4 micro-batches a step, each a new length (64-1024)
    with 8,192 tokens, bf16 autocast, AdamW stepped once per 4."""
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16)).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(14)
    for _ in range(steps):
        meter.begin()
        for _ in range(4):
            s = int(torch.randint(64, 1025, (1,), generator=g))
            ids = torch.randint(0, 50257, (max(1, 8192 // s), s), generator=g).cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss / 4
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        meter.end(loss.item())


# ---- written 2026-12-07 (late night), not run yet: the next unseen check ----

def run_dpo_pairs(torch, meter, steps):  # held out
    """Preference tuning (DPO) of GPT-2 medium against a frozen copy: every step a no-grad
    reference pass and a trained pass over a chosen and a rejected answer of new lengths
    (64-768 each, batch 8), bf16 autocast, AdamW."""
    import copy
    from transformers import GPT2Config, GPT2LMHeadModel
    policy = GPT2LMHeadModel(GPT2Config(n_embd=1024, n_layer=24, n_head=16)).cuda().train()
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    g = torch.Generator().manual_seed(15)

    def logp(model, ids):
        logits = model(input_ids=ids).logits[:, :-1].float()
        return torch.gather(logits.log_softmax(-1), 2, ids[:, 1:, None]).squeeze(2).sum(1)
    for _ in range(steps):
        a, b = (int(torch.randint(64, 769, (1,), generator=g)) for _ in range(2))
        chosen = torch.randint(0, 50257, (8, a), generator=g).cuda()
        rejected = torch.randint(0, 50257, (8, b), generator=g).cuda()
        meter.begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with torch.no_grad():
                ref_margin = logp(ref, chosen) - logp(ref, rejected)
            margin = logp(policy, chosen) - logp(policy, rejected)
            loss = -torch.nn.functional.logsigmoid(0.1 * (margin - ref_margin)).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        meter.end(loss.item())


def run_segment_varsize(torch, meter, steps):  # held out
    """Semantic segmentation (torchvision FCN, ResNet-50) on batches of 8 images of a new
    size every step (256-640 a side, not square), per-pixel labels, bf16 autocast, SGD."""
    import torchvision
    m = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None,
                                                     num_classes=21).cuda().train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(16)

    def batches():
        for _ in range(steps):
            h, w = (32 * int(v) for v in torch.randint(8, 21, (2,), generator=g))
            yield (torch.randn(8, 3, h, w, generator=g).cuda(),
                   torch.randint(0, 21, (8, h, w), generator=g).cuda())
    train_steps(torch, meter, opt, batches(),
                lambda b: torch.nn.functional.cross_entropy(m(b[0])["out"], b[1]), torch.bfloat16)


def child(job, alloc, steps, cap, record):
    gt = None
    if alloc == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    profiled = alloc.split(":")[0] == "gpumem-prof"
    if profiled:
        os.environ["GPUMEM_PROFILE"] = "1"
    if alloc.startswith("gpumem"):
        import gpumem.torch as gt
        conf = alloc.split(":", 1)[1].replace("+", ",") if ":" in alloc else None  # --allocs splits at commas
        gt.install(conf) if conf else gt.install()
    import torch
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(False)
    total = torch.cuda.mem_get_info()[1]
    if cap:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    if record:
        # frames of each allocation (context "alloc"): the report attributes memory by them
        torch.cuda.memory._record_memory_history(enabled="all", context=os.environ.get("SUITE_CONTEXT", "alloc"),
                                                 stacks="python", max_entries=5_000_000)
    stats = (lambda: gt.memory_stats(0)) if gt else (lambda: torch.cuda.memory_stats(0))
    meter = Meter(torch, stats, profile_ns() if profiled else None)
    nvml_peak = [0]
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        orig_end = meter.end

        def end(loss=None):
            orig_end(loss)
            nvml_peak[0] = max(nvml_peak[0], pynvml.nvmlDeviceGetMemoryInfo(h).used)
        meter.end = end
    except Exception:  # noqa: BLE001  (NVML is optional: the peak is then 0)
        pass
    res = {"job": job, "alloc": alloc, "cap": cap, "steps": steps}
    try:
        globals()["run_" + job](torch, meter, steps)
        res["ok"] = True
    except torch.OutOfMemoryError as e:
        res.update(ok=False, oom_step=len(meter.times), error=str(e)[:200])
    s = stats()
    res["peak_allocated"] = int(s.get("allocated_bytes.all.peak", 0))
    res["peak_reserved"] = int(s.get("reserved_bytes.all.peak", 0))
    res["ratio"] = res["peak_reserved"] / max(1, res["peak_allocated"])
    res["nvml_peak"] = nvml_peak[0]
    first = int(os.environ.get("SUITE_FROM", "10"))  # --from
    late = meter.times[first:] or meter.times
    res["median_ms"] = 1e3 * statistics.median(late) if late else None
    res["median_cpu_ms"] = 1e3 * statistics.median(meter.cpu[first:] or meter.cpu) if meter.cpu else None
    res["allocs_per_step"] = statistics.median(meter.allocs[first:] or meter.allocs) if meter.allocs else None
    if meter.inside:
        for key in ("inside", "sync", "driver"):
            res[key + "_ms"] = 1e-6 * statistics.median(p[key] for p in (meter.inside[first:] or meter.inside))
    res["calls_per_step"] = statistics.mean(meter.calls[first:]) if meter.calls[first:] else None
    # the median too: a one-time give-back (the end of gpumem's warm-up) moves the mean alone
    res["calls_median"] = statistics.median(meter.calls[first:]) if meter.calls[first:] else None
    res["calls_first10"] = sum(meter.calls[:first])
    res["reserved_changed_steps"] = sum(meter.reserved_changed[first:])
    res["losses"] = meter.losses[:3] + meter.losses[-3:]
    res["nsteps"] = len(meter.times)
    # per step, for reading which steps call the device (a new longest length) and what they cost
    res["step_ms"] = [round(1e3 * t, 2) for t in meter.times]
    res["step_cpu_ms"] = [round(1e3 * t, 2) for t in meter.cpu]
    res["gpu_busy_ms"] = meter.gpu_busy_ms
    res["cpu_top_ms"] = meter.cpu_top
    res["step_calls"] = list(meter.calls)
    res["step_waits"] = list(meter.waits)
    res["waits_per_step"] = statistics.mean(meter.waits[first:]) if meter.waits[first:] else None
    res["step_gc_ms"] = [round(1e3 * t, 2) for t in meter.gc_steps]
    for key in ("inside", "sync", "driver"):
        res[f"step_{key}_ms"] = [round(1e-6 * p[key], 2) for p in meter.inside]
    if record:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with gzip.open(record, "wb", compresslevel=9) as f:
            pickle.dump(snap, f)
        if os.path.getsize(record) > 15 << 20:  # too large to ship: keep the events, drop their frames
            for trace in snap.get("device_traces", []):
                for ev in trace:
                    ev["frames"] = []
            for seg in snap.get("segments", []):
                for blk in seg.get("blocks", []):
                    blk["frames"] = []
            with gzip.open(record, "wb", compresslevel=9) as f:
                pickle.dump(snap, f)
    print("RESULT " + json.dumps(res), flush=True)


def profile_ns():
    """A function returning the ns spent so far (GPUMEM_PROFILE=1, read by ab_step_time.py's
    Profiler): inside gpumem's alloc and free entry points, and of that, waiting for a stream
    before a move (sync) and in the driver's other calls (driver: create, map, unmap, ...)."""
    from ab_step_time import Profiler
    prof = Profiler()

    def read():
        p, _ = prof.read()
        ns = prof.read_ns()
        sync = ns.get("EVENT_SYNC", 0)
        return {"inside": p.get("alloc_ns", 0) + p.get("free_ns", 0), "sync": sync,
                "driver": sum(ns.values()) - sync}
    return read


def spawn(job, alloc, steps, cap=0, record="", timeout=300):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", job, alloc, str(steps), str(cap), record]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["wall_s"] = round(time.time() - t0, 1)
            return r
    return {"job": job, "alloc": alloc, "cap": cap, "ok": False,
            "error": (p.stderr or p.stdout)[-400:].replace("\n", " | ")}


def fmt(x, digits=1):
    return "-" if x is None else round(x, digits)


def table(rows, title):
    print("\n" + title)
    print("| job | alloc | ok | reserved/allocated | peak alloc GiB | NVML peak GiB | median ms | CPU ms | allocs/step "
          "| inside gpumem ms | calls/step mean (median) | reserved changed (steps>=10) | first loss / last loss |")
    print("|---" * 13 + "|")
    for r in rows:
        gib = 2.0 ** 30
        if not r.get("ok") and "peak_allocated" not in r:
            print(f"| {r['job']} | {r['alloc']} | FAIL | {r.get('error', '')[:120]} ||||||||||")
            continue
        ok = "yes" if r.get("ok") else f"OOM@{r.get('oom_step')}"
        losses = r.get("losses") or [float("nan")]
        ms = r.get("median_ms")
        cps = r.get("calls_per_step")
        print(f"| {r['job']} | {r['alloc']} | {ok} | {r['ratio']:.3f} | {r['peak_allocated'] / gib:.2f} | "
              f"{r['nvml_peak'] / gib:.2f} | {ms if ms is None else round(ms, 1)} | {fmt(r.get('median_cpu_ms'))} | "
              f"{r.get('allocs_per_step')} | {fmt(r.get('inside_ms'), 2)} | "
              f"{cps if cps is None else round(cps, 1)} ({r.get('calls_median')}) | {r.get('reserved_changed_steps')} | "
              f"{losses[0]:.4f} / {losses[-1]:.4f} |")


def call_steps(rows):
    """Where gpumem's step time goes: the same seed gives every allocator the same shapes in the same step,
    so steps pair up. Per job, the summed step times (from step 1) of the steps in which gpumem made a
    device call and of those in which it made none, beside the other allocators' in the same steps, and
    the time a call added against native (bench/RESULTS.md, 2026-12-07 afternoon)."""
    by = {}
    for r in rows:
        if r.get("ok") and r.get("step_calls"):
            by.setdefault(r["job"], {}).setdefault(r["alloc"], r)  # the first round of each
    print("\nsteps with and without gpumem's device calls (ms summed from step 1; calls in those steps)")
    print("| job | steps with calls | calls | ms, each allocator | steps without | ms, each allocator | us a call adds vs native |")
    print("|---" * 7 + "|")
    for job, runs in by.items():
        g = runs.get("gpumem")
        if not g:
            continue
        n = len(g["step_ms"])
        others = {a: r for a, r in runs.items() if len(r.get("step_ms", [])) == n}
        with_ = [i for i in range(1, n) if g["step_calls"][i] > 0]
        without = [i for i in range(1, n) if g["step_calls"][i] == 0]
        calls = sum(g["step_calls"][i] for i in with_)
        def ms(idx):
            return ", ".join(f"{a} {sum(r['step_ms'][i] for i in idx):.0f}" for a, r in others.items())
        added = "-"
        if "native" in others and calls:
            extra = sum(g["step_ms"][i] - others["native"]["step_ms"][i] for i in with_)
            added = f"{1000 * extra / calls:.0f}"
        print(f"| {job} | {len(with_)} | {calls} | {ms(with_)} | {len(without)} | {ms(without)} | {added} |")


def main():
    import argparse
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        job, alloc, steps, cap, record = sys.argv[2:7]
        return child(job, alloc, int(steps), int(cap), record)
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--from", dest="first", type=int, default=10, help="medians and calls from this step on")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--allocs", default="native,expandable,gpumem")
    ap.add_argument("--cap-x", type=float, default=0)
    ap.add_argument("--record", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--budget", type=float, default=540, help="seconds; later runs are skipped")
    a = ap.parse_args()
    os.environ["SUITE_FROM"] = str(a.first)  # read by the children
    jobs, allocs = a.jobs.split(","), a.allocs.split(",")
    t0 = time.time()
    results = []
    if a.record:
        os.makedirs(a.record, exist_ok=True)
        for job in jobs:
            # generate's history grows ~0.5 MiB a step: 8 steps keep its trace small enough to ship
            steps = min(a.steps, 8) if job == "gpt2_generate" else min(a.steps, 20) if job == "serve_generate" else a.steps
            r = spawn(job, "native", steps, record=os.path.join(a.record, job + ".pickle.gz"))
            r["recorded"] = True
            results.append(r)
            print(f"[{time.time() - t0:.0f} s] recorded {job}: {r.get('ok')}", flush=True)
    for rnd in range(a.rounds):
        for job in jobs:
            for k in range(len(allocs)):
                alloc = allocs[(k + rnd) % len(allocs)]  # rotated: none always first
                if time.time() - t0 > a.budget:
                    print(f"budget: skipped {job} {alloc} round {rnd}", flush=True)
                    continue
                r = spawn(job, alloc, a.steps)
                r["round"] = rnd
                results.append(r)
                print(f"[{time.time() - t0:.0f} s] {job} {alloc} r{rnd}: ratio "
                      f"{r.get('ratio', 0):.3f} ms {r.get('median_ms')} cpu {r.get('median_cpu_ms')} "
                      f"inside {r.get('inside_ms')} (sync {r.get('sync_ms')}, driver {r.get('driver_ms')}) "
                      f"allocs {r.get('allocs_per_step')} gpu_busy {r.get('gpu_busy_ms')} "
                      f"calls {r.get('calls_per_step')} stream waits {r.get('waits_per_step')}",
                      flush=True)
                if r.get("cpu_top_ms"):
                    print("    host ms by op, profiled step: " + json.dumps(r["cpu_top_ms"]), flush=True)
    capped = []
    if a.cap_x:
        peaks = {r["job"]: r["peak_allocated"] for r in results if r["alloc"] == "native" and r.get("ok")}
        for job in jobs:
            for alloc in allocs:
                if job not in peaks or time.time() - t0 > a.budget:
                    continue
                r = spawn(job, alloc, a.steps, cap=int(a.cap_x * peaks[job]))
                capped.append(r)
                print(f"[{time.time() - t0:.0f} s] capped {job} {alloc}: ok {r.get('ok')}", flush=True)
    rows = [r for r in results if not r.get("recorded")]
    by = {}
    for r in rows:  # median over rounds per (job, alloc)
        by.setdefault((r["job"], r["alloc"]), []).append(r)
    merged = []
    for (job, alloc), rs in by.items():
        m = dict(rs[0])
        for key in ("median_ms", "median_cpu_ms", "inside_ms", "sync_ms", "driver_ms"):
            xs = [x[key] for x in rs if x.get(key)]
            if xs:
                m[key] = statistics.median(xs)
        merged.append(m)
    table(merged, f"uncapped, {a.rounds} round(s), {a.steps} steps")
    call_steps(rows)
    if capped:
        table(capped, f"capped at {a.cap_x}x native's peak allocated")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "capped": capped}, f, indent=1)


if __name__ == "__main__":
    main()
