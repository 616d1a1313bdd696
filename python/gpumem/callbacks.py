"""Per-step GPU memory where training already reports: one line to
enable, for TensorBoard, W&B, PyTorch Lightning, the Hugging Face Trainer and
a plain loop.

    trainer = transformers.Trainer(..., callbacks=[gpumem.callbacks.HFTrainerCallback()])
    trainer = lightning.Trainer(..., callbacks=[gpumem.callbacks.LightningCallback()])
    gpumem.callbacks.log_step(writer, step)     # in a plain loop, after optimizer.step():
                                                # a SummaryWriter, wandb (offline too),
                                                # a Lightning logger, print, or None (the dict)

Each step's numbers (the allocator's statistics; torch's own where gpumem is
not the allocator), under "gpumem/":

    allocated_bytes, reserved_bytes    now, at the step's end (the next one's start)
    cache_bytes                        reserved - allocated: cache and fragmentation
    peak_allocated_bytes               the highest allocated bytes so far
    step_peak_allocated_bytes          the highest allocated bytes of this step, with
                                       reset_peak=True (`gpumem exporter` shows it always:
                                       gpumem_process_step_peak_allocated_bytes)
    baseline_growth_bytes              allocated at this step's end minus at the first
                                       step's: growth from step to step is a leak;
                                       growth of cache_bytes is not
    num_alloc_retries, num_ooms        counters
    category/<name>_bytes              live bytes by category with a gpumem.track
                                       Tracker (parameters, gradients, optimizer_state, rest)

Where gpumem is torch's allocator, each step is also marked (gm_step_mark), so
`gpumem exporter` publishes the step record (gpumem_process_step_*) that
deploy/prometheus/gpumem-rules.yml alerts on; pass mark=False if the loop
already calls gpumem.torch.mark_steps(optimizer). Under `gpumem run --native`
the step record is published too (no step peak, no block walk there).

No framework is imported here unless it is already installed: each class
falls back to a plain object with the framework's method names.
"""
import sys

from . import _lib, _torch_state

PREFIX = "gpumem/"

_KEYS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


def _default_stats(device):
    """gpumem's statistics when it is torch's allocator, else torch's own (CUDA
    present), else none."""
    if _torch_state.is_installed():
        return _torch_state.memory_stats(device)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.memory_stats(device)
    return {}


def _default_mark():
    """gm_step_mark on every device where gpumem is torch's allocator; under
    `gpumem run --native` (torch's own allocator published), the step record
    through the native publisher."""
    if _torch_state.is_installed():
        _lib.check(_lib.load().gpumem_torch_step_mark(-1), "step_mark")
        return
    native = sys.modules.get("gpumem.publish_native")
    pub = native.current() if native is not None else None
    if pub is not None:
        pub.step_mark()


def _default_reset_peak(device):
    if _torch_state.is_installed():
        _lib.check(_lib.load().gpumem_torch_reset_peak(_torch_state._device(device)), "reset_peak_memory_stats")
    else:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats(device)


class StepLogger:
    """The per-step numbers of one device. step() marks the step (mark=True)
    and returns the dict; the callbacks and log_step() call it.

    tracker: a gpumem.track.Tracker, for bytes by category.
    reset_peak: reset the allocator's peak after each step, so
        peak_allocated_bytes is this step's (changes what
        torch.cuda.max_memory_allocated() answers; off by default).
    stats, mark: stand-ins for the statistics (device -> dict with
        torch.cuda.memory_stats keys) and the step mark (tests, other allocators)."""

    def __init__(self, device=None, tracker=None, mark=True, reset_peak=False, prefix=PREFIX, stats=None,
                 mark_fn=None, reset_peak_fn=None):
        self.device = device
        self.tracker = tracker
        self.mark = mark
        self.reset_peak = reset_peak
        self.prefix = prefix
        self._stats = stats or _default_stats
        self._mark = mark_fn or _default_mark
        self._reset = reset_peak_fn or _default_reset_peak
        self.baseline = None
        self.steps = 0

    def step(self):
        if self.mark:
            self._mark()
        s = self._stats(self.device) or {}
        self.steps += 1
        out = {}
        for name, key in _KEYS.items():
            if key in s:
                out[name] = int(s[key])
        if "allocated_bytes" in out and "reserved_bytes" in out:
            out["cache_bytes"] = out["reserved_bytes"] - out["allocated_bytes"]
        if "allocated_bytes" in out:
            if self.baseline is None:
                self.baseline = out["allocated_bytes"]
            out["baseline_growth_bytes"] = out["allocated_bytes"] - self.baseline
        if self.reset_peak and "peak_allocated_bytes" in out:
            out["step_peak_allocated_bytes"] = out["peak_allocated_bytes"]
            self._reset(self.device)
        if self.tracker is not None:
            for cat, n in self.tracker.breakdown(self.device).items():
                if cat not in ("allocated", "max_allocated"):
                    out["category/%s_bytes" % cat] = int(n)
        return {self.prefix + k: v for k, v in out.items()}


def log_step(writer=None, step=None, logger=None, **kw):
    """Log this step's numbers to `writer` and return them (a dict).

    writer: a TensorBoard SummaryWriter (add_scalar), wandb or a W&B run (log),
    a Lightning logger (log_metrics), any callable (print: one line), or None.
    step: the global step (default: this logger's count of steps).
    logger: a StepLogger to keep between calls; by default one per writer."""
    if logger is None:
        logger = _loggers.setdefault(id(writer), StepLogger(**kw))
    metrics = logger.step()
    n = logger.steps if step is None else step
    emit(writer, metrics, n)
    return metrics


_loggers = {}


def emit(writer, metrics, step):
    """Send metrics to whatever `writer` is (see log_step)."""
    if writer is None or not metrics:
        return
    if hasattr(writer, "add_scalar"):  # torch.utils.tensorboard.SummaryWriter, tensorboardX
        for k, v in metrics.items():
            writer.add_scalar(k, v, step)
    elif hasattr(writer, "log_metrics"):  # a Lightning logger
        writer.log_metrics(metrics, step=step)
    elif hasattr(writer, "log"):  # wandb, a wandb Run (offline mode too)
        writer.log(metrics, step=step)
    elif callable(writer):  # print, logging.info, ...
        writer("step %d: %s" % (step, " ".join("%s=%d" % (k[len(PREFIX):] if k.startswith(PREFIX) else k, v)
                                              for k, v in sorted(metrics.items()))))
    else:
        raise TypeError("gpumem.callbacks: cannot log to %r (wants add_scalar, log_metrics, log, or a callable)"
                        % type(writer).__name__)


def _base(module, name):
    """module.name if the framework is installed, else object: the callbacks
    work (and import) without it."""
    try:
        mod = __import__(module, fromlist=[name])
        return getattr(mod, name)
    except Exception:  # noqa: BLE001 (not installed, or broken: the plain base will do)
        return object


class HFTrainerCallback(_base("transformers", "TrainerCallback")):
    """transformers.Trainer callback: marks each optimizer step and adds the
    numbers to every log the Trainer writes (its report_to: TensorBoard, W&B,
    ...). The Trainer calls its reporting callbacks in order, reporters first:
    use gpumem.callbacks.attach(trainer) (or writer=) for them to see the
    numbers; callbacks after this one see them in any case."""

    def __init__(self, writer=None, **kw):
        self.logger = StepLogger(**kw)
        self.writer = writer
        self.latest = {}

    def on_step_end(self, args, state, control, **kwargs):
        self.latest = self.logger.step()
        emit(self.writer, self.latest, getattr(state, "global_step", self.logger.steps))
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None:
            logs.update(self.latest)
        return control


def attach(trainer, **kw):
    """Put an HFTrainerCallback first in a transformers.Trainer, so its
    numbers are in the logs the reporting integrations write."""
    cb = HFTrainerCallback(**kw)
    trainer.callback_handler.callbacks.insert(0, cb)
    return cb


def _lightning_base():
    for module in ("lightning.pytorch", "pytorch_lightning"):
        base = _base(module, "Callback")
        if base is not object:
            return base
    return object


class LightningCallback(_lightning_base()):
    """Lightning callback: marks each training batch's end as a step (once
    per optimizer step under gradient accumulation) and logs the numbers to
    every logger of the Trainer."""

    def __init__(self, **kw):
        self.logger = StepLogger(**kw)
        self.latest = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        accumulate = getattr(trainer, "accumulate_grad_batches", 1) or 1
        if (batch_idx + 1) % accumulate:
            return
        self.latest = self.logger.step()
        loggers = getattr(trainer, "loggers", None) or ([trainer.logger] if getattr(trainer, "logger", None) else [])
        for lg in loggers:
            emit(lg, self.latest, trainer.global_step)
