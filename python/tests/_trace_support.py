"""What the tracer's CPU tests share (test_estimate_trace.py,
test_estimate_blocks.py): torch when it is installed (Debian's python3-torch
1.13 is enough), the gpumem executable for `gpumem estimate`, the estimate of
a trace through it, and a language model's training step."""
import json
import os
import subprocess
import tempfile

from _support import unusable  # the source tree's gpumem on sys.path
from gpumem import _cli

__all__ = ["EXE", "NO_EXE", "NO_TORCH", "F", "estimate", "lm_train", "nn", "torch"]

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    NO_TORCH = ""
except ImportError as e:  # CI without python3-torch: the format and CLI tests still run
    torch = nn = F = None
    NO_TORCH = "torch is not installed (%s): the traced-model tests need it (apt-get install python3-torch)" % e


def _exe():
    try:
        return _cli.find_executable()
    except FileNotFoundError:
        return None


EXE = _exe()
NO_EXE = "" if EXE else "the gpumem executable is not built (%s)" % unusable()


def estimate(trace, *args):
    with tempfile.TemporaryDirectory() as d:
        path = trace.save(os.path.join(d, "t.pickle.gz"))
        p = subprocess.run([EXE, "estimate", "--trace", path, "--json"] + list(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def lm_train(make, vocab, batch, seq):
    """train(device) for a language model make(device): AdamW, the labels are the inputs."""
    def train(device):
        model = make(device)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            idx = torch.randint(0, vocab, (batch, seq), device=device)
            model(idx, idx).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    return train
