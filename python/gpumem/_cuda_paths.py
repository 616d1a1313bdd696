"""torch's CUDA code paths while gpumem.estimate traces a step on tensors
that are not CUDA's (meta tensors, or FakeTensors): where torch picks a kernel,
a fusion or a conversion by the tensor's device, the tracer makes it pick
what it would pick on the GPU, so the trace allocates what the GPU run does.

CudaPaths is a part of estimate.py's _Hooks: each method patches one place
in torch for the time of the trace and appends what undoes it to self.undo;
self.torch is torch, self.rec the recorder (its on_device() and the trace's
notes). flash_backward_scratch and sdp_choice_for are what the recorder's
dispatch mode asks of the same kernels.
"""
import functools
import sys


def flash_backward_scratch(q, k, v):
    """What flash attention's backward allocates inside its CUDA code after
    dq, dk, dv (FlashAttention-2's mha_bwd, vendored in torch): softmax_d
    (b, h, s rounded to 128) and dq_accum (b, s rounded, h, head_dim rounded
    to 32) in fp32, and with grouped-query attention dk, dv expanded to every
    query head; q, k, v are (b, h, s, d) as sdpa passes them."""
    b, h, s, d = q.shape
    s_r, d_r = -(-s // 128) * 128, (-(-d // 32) * 32 if d <= 192 else 256)
    out = [b * h * s_r * 4, b * s_r * h * d_r * 4]
    if k.shape[1] != h:
        out += [b * k.shape[2] * h * d * k.element_size(), b * v.shape[2] * h * v.shape[3] * v.element_size()]
    return out


def sdp_choice_for(device):
    """What torch's CUDA sdpa picks on an sm80+ GPU (flash for 16-bit inputs
    without a mask and head_dim <= 256, memory-efficient otherwise), instead of
    the math path the meta device would take; None if this torch has no sdpa."""
    import torch  # noqa: PLC0415
    try:
        B = torch._C._SDPBackend
        flash, eff, math = int(B.flash_attention), int(B.efficient_attention), int(B.math)
    except AttributeError:
        return None

    def choice(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *a, **kw):
        d = q.shape[-1]
        if q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and d <= 256 and d % 8 == 0 \
                and k.shape[-1] == d and v.shape[-1] == d:
            return flash
        if d % 8 == 0 and v.shape[-1] % 8 == 0:
            return eff
        return math
    return choice


class CudaPaths:
    """The patches, each undone when the trace ends (self.undo)."""

    def as_on_cuda(self):
        """Code paths torch picks by device, set to CUDA's: F.dropout fuses
        into native_dropout (a 1-byte mask) only for CUDA tensors, and meta
        tensors would get the unfused one (a mask of the input's dtype)."""
        torch, rec = self.torch, self.rec
        F = torch.nn.functional
        dropout = F.dropout

        @functools.wraps(dropout)
        def fused(input, p=0.5, training=True, inplace=False):
            if training and 0 < p < 1 and not inplace and rec.on_device(input):
                return torch.native_dropout(input, p, True)[0]
            return dropout(input, p, training, inplace)
        F.dropout = fused
        self.undo.append(lambda: setattr(F, "dropout", dropout))

    def sdpa_as_on_cuda(self, choice):
        """torch 2.x picks sdpa's kernel through a per-device stub that meta
        tensors do not have (no operator a dispatch mode sees), so on meta
        F.scaled_dot_product_attention takes the math path, which keeps the
        b x h x s x s attention weights for backward: on the traced device it
        calls the kernel choice() says CUDA picks (flash or memory-efficient)
        instead; if this torch cannot run it on meta, the math path and a note."""
        torch, rec = self.torch, self.rec
        F = torch.nn.functional
        sdpa = getattr(F, "scaled_dot_product_attention", None)
        if sdpa is None or choice is None:
            return
        B = torch._C._SDPBackend
        flash, eff = int(B.flash_attention), int(B.efficient_attention)
        aten = torch.ops.aten

        @functools.wraps(sdpa)
        def fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
            c = choice(query, key, value, attn_mask, dropout_p, is_causal) if rec.on_device(query) else None
            try:
                if c == flash:
                    return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                                    scale=scale)[0]
                if c == eff:
                    if kw.get("enable_gqa") and key.shape[-3] != query.shape[-3]:
                        n = query.shape[-3] // key.shape[-3]
                        key, value = key.repeat_interleave(n, -3), value.repeat_interleave(n, -3)
                    if attn_mask is not None and attn_mask.dtype == torch.bool:
                        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(~attn_mask,
                                                                                              float("-inf"))
                    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
                    return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, grad,
                                                                        dropout_p, is_causal, scale=scale)[0]
            except (NotImplementedError, RuntimeError) as e:
                note = "meta tensors: sdpa's fused kernel failed here (%s); its math path instead" % (
                    str(e).splitlines()[0][:120] if str(e) else type(e).__name__)
                rec.trace.note(note)
            if scale is not None:
                kw["scale"] = scale
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, **kw)
        F.scaled_dot_product_attention = fused
        self.undo.append(lambda: setattr(F, "scaled_dot_product_attention", sdpa))

    def foreach_as_on_cuda(self):
        """torch 2.x optimizers run their foreach kernels (one temporary per
        step for every parameter at once) when every parameter is a plain CUDA
        tensor: a meta tensor or a FakeTensor would get the per-parameter loop.
        Every optimizer module's _default_to_fused_or_foreach answers as for
        CUDA tensors while tracing."""
        import sys  # noqa: PLC0415

        def as_cuda(params, differentiable, use_fused=False):
            return (use_fused and not differentiable, not use_fused and not differentiable)
        for name, mod in list(sys.modules.items()):
            orig = getattr(mod, "_default_to_fused_or_foreach", None) if name.startswith("torch.optim") else None
            if orig is not None:
                setattr(mod, "_default_to_fused_or_foreach", as_cuda)
                self.undo.append(functools.partial(setattr, mod, "_default_to_fused_or_foreach", orig))

    def keep_tied(self):
        """Module._apply (.to(), .cuda(), .half()) while tracing: every
        Parameter becomes a new Parameter of fn(p) (what torch does with
        overwrite_module_params_on_conversion), its .grad and the buffers fn of
        theirs, one copy per tensor object, so a weight two modules share
        (GPT-2's tied head) stays one tensor, as on CUDA (where torch keeps the
        Parameter object and sets .data). torch's own _apply would untie it
        going to "meta", and on torch 2.x swaps FakeTensor parameters in place
        (torch.utils.swap_tensors), which fails on any tensor that has a weakref
        (FakeTensorMode's own memo, a user's) or another reference: it is not
        called at all."""
        torch = self.torch
        nn = torch.nn
        apply = nn.Module._apply
        state = {"shared": None, "memo": None}

        def _apply(module, fn, recurse=True):
            top = state["shared"] is None
            if top:   # tensors held in two places: one copy, kept until the call ends
                seen, shared = set(), set()
                for m in module.modules():
                    for t in list(m._parameters.values()) + list(m._buffers.values()):
                        if t is not None:
                            (shared if id(t) in seen else seen).add(id(t))
                state["shared"], state["memo"] = shared, {}
            shared, memo = state["shared"], state["memo"]

            def once(t, make):
                if id(t) not in shared:
                    return make(t)      # the old one goes as soon as nothing holds it, as on CUDA
                if id(t) not in memo:
                    memo[id(t)] = (t, make(t))
                return memo[id(t)][1]

            def param(p):
                with torch.no_grad():
                    new = nn.Parameter(fn(p), p.requires_grad)
                    if p.grad is not None:
                        new.grad = fn(p.grad).requires_grad_(p.grad.requires_grad)
                return new
            try:
                if recurse:
                    for child in module.children():
                        child._apply(fn)
                for key in list(module._parameters):
                    if module._parameters[key] is not None:
                        module._parameters[key] = once(module._parameters[key], param)
                for key in list(module._buffers):
                    if module._buffers[key] is not None:
                        module._buffers[key] = once(module._buffers[key], fn)
            finally:
                if top:
                    state["shared"] = state["memo"] = None
            return module
        nn.Module._apply = _apply
        self.undo.append(lambda: setattr(nn.Module, "_apply", apply))

    def ddp_under_fake_group(self):
        """Under torch's fake process group (fake_process_group), DDP's checks
        that compare this rank with the others read values the other ranks
        never sent: its parameter-shape check at construction
        (_verify_param_shape_across_processes) is skipped, and its bucket
        rebuild at the second forward (the same parameters reordered into
        buckets of the same sizes; it reads the broadcast order back on the
        host) does not happen."""
        torch = self.torch
        try:
            import torch.distributed as dist  # noqa: PLC0415
            if not (dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake"):
                return
            import torch.nn.parallel.distributed as ddp  # noqa: PLC0415
        except (ImportError, RuntimeError):
            return
        if hasattr(ddp, "_verify_param_shape_across_processes"):
            verify = ddp._verify_param_shape_across_processes
            ddp._verify_param_shape_across_processes = lambda *a, **k: None
            self.undo.append(functools.partial(setattr, ddp, "_verify_param_shape_across_processes", verify))
        DDP = torch.nn.parallel.DistributedDataParallel
        pre = getattr(DDP, "_pre_forward", None)
        if pre is None:
            return

        class NoRebuild:
            def __init__(self, reducer):
                self.reducer = reducer

            def _rebuild_buckets(self):
                return False

            def __getattr__(self, name):
                return getattr(self.reducer, name)

        @functools.wraps(pre)
        def pre_forward(net, *a, **k):
            reducer = getattr(net, "reducer", None)
            if reducer is None:
                return pre(net, *a, **k)
            net.reducer = NoRebuild(reducer)
            try:
                return pre(net, *a, **k)
            finally:
                net.reducer = reducer
        DDP._pre_forward = pre_forward
        self.undo.append(functools.partial(setattr, DDP, "_pre_forward", pre))
        self.rec.trace.notes.append("fake process group: DDP's cross-rank parameter check is skipped and its "
                                    "buckets are not rebuilt after the first step")

    def meshes_outside_modes(self):
        """A DeviceMesh (fully_shard and DTensor make one when none is given)
        finds this rank's place with nonzero() on a host tensor of ranks, a
        value that fake and meta tensors do not have. Under a process group,
        init_device_mesh runs outside the trace's modes, wherever a module
        (torch's, or the script's) holds it by name: the mesh keeps real host
        tensors, which hold no device memory. Not yet run on a GPU
        (bench/RESULTS.md, 2026-12-07 late night)."""
        try:
            import torch.distributed as dist  # noqa: PLC0415
            if not (dist.is_available() and dist.is_initialized()):
                return
            import torch.distributed.device_mesh as dm  # noqa: PLC0415
            import torch.distributed.fsdp  # noqa: F401,PLC0415  (its modules name init_device_mesh)
            from torch.utils._python_dispatch import _disable_current_modes  # noqa: PLC0415
        except (ImportError, RuntimeError, AttributeError):
            return
        made = getattr(dm, "init_device_mesh", None)
        if made is None:
            return

        @functools.wraps(made)
        def outside(*a, **k):
            with _disable_current_modes():
                return made(*a, **k)
        for mod in list(sys.modules.values()):  # torch's and the script's own `from ... import`
            # the module's own names only: a lazy module's __getattr__ may import, or raise
            if getattr(mod, "__dict__", {}).get("init_device_mesh") is made:
                mod.init_device_mesh = outside
                self.undo.append(functools.partial(setattr, mod, "init_device_mesh", made))
