"""Per-module backward scopes on the GPU (issue 13): GPT-2 small (AdamW,
bf16) and ResNet-50 (SGD, fp16 AMP; in-place ReLU and `out += identity` on
module outputs, which full backward hooks refuse) trained under
gpumem.torch.track exactly as tests/gpu/report_live.py trains them; the
history dump is read back and checked:

  - training ran (multi-grad hooks change no tensor: in-place ops still work);
  - most backward bytes carry a module path: of the bytes allocated in the
    backward phase scope, >= 50% have a module scope under it (the rest:
    the loss's backward outside the model, AccumulateGrad, autograd's own);
  - backward scopes name many modules (>= 20 distinct paths), with the
    phase scope "backward" under every one of them (the report's phase);
  - `gpumem report --json`'s scope series at depth 3 (GPT-2:
    transformer.h.N) / depth 2 (ResNet: layerN.M) name those modules.

And Python stacks (track(..., stacks=True): torch's recorder through the
shim, frames merged into the dump): a small MLP trained 2 steps; the dump's
allocations made on the Python thread (forward, optimizer) carry Python
frames after gpumem's scopes, and `gpumem report --text` lists this
script's functions.

usage: python3 tests/gpu/backward_scopes.py GPUMEM_CLI
Exits 1 when a check misses. Last run: bench/RESULTS.md, 2026-12-02 (third session): all OK.
"""
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpumem_path  # noqa: E402,F401  (the installed gpumem, with its shim, when there is one)
SCOPE_FILE = "<gpumem scope>"
PHASES = {"forward", "backward", "optimizer.step", "untracked"}


def load(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        return pickle.load(f)


def backward_bytes(snap):
    """(bytes of allocs in the backward phase, of those with a module path, {path})"""
    total = with_path = 0
    paths = set()
    for trace in snap["device_traces"]:
        for e in trace:
            if e["action"] != "alloc":
                continue
            scopes = [f["name"] for f in e.get("frames", []) if f["filename"] == SCOPE_FILE]  # innermost first
            phase = next((s for s in scopes if s in PHASES), None)
            if phase != "backward":
                continue
            total += e["size"]
            mods = [s for s in scopes if s not in PHASES]
            if mods:
                with_path += e["size"]
                paths.add(mods[0])
                # the phase scope is outside (after, innermost first) every module scope
                assert scopes.index("backward") > scopes.index(mods[-1]), scopes
    return total, with_path, paths


def stacks_child(dump):
    import gpumem.torch as gt
    gt.install()
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters())
    tr = gt.track(model, opt, stacks=True)

    def train_step():
        loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(2):
        train_step()
    torch.cuda.synchronize()
    matched, total = tr.dump(dump)
    tr.close()
    print(json.dumps({"matched": matched, "total": total}))


def check_stacks(cli):
    dump = os.path.join(os.environ.get("OUT") or tempfile.mkdtemp(), "stacks_mlp.pickle.gz")
    p = subprocess.run([sys.executable, __file__, "--stacks-child", dump], capture_output=True, text=True,
                       timeout=300)
    if p.returncode:
        print("== stacks FAILED\n%s\n%s" % (p.stdout[-2000:], p.stderr[-4000:]))
        return False
    m = json.loads(p.stdout.strip().splitlines()[-1])
    snap = load(dump)
    ordered = True
    for e in snap["device_traces"][0]:
        files = [f["filename"] for f in e.get("frames", [])]
        gm = [i for i, f in enumerate(files) if f.startswith("<gpumem ")]
        py = [i for i, f in enumerate(files) if not f.startswith("<gpumem ")]
        ordered &= not (gm and py) or max(gm) < min(py)  # gpumem's frames first (innermost)
    text = subprocess.run([cli, "report", dump, "--text", "--rows", "200"], check=True, capture_output=True,
                          text=True).stdout
    checks = [
        ("allocations given Python frames (forward, optimizer)", m["matched"] >= 10 and m["matched"] < m["total"],
         "%d of %d" % (m["matched"], m["total"])),
        ("gpumem scopes before Python frames in every stack", ordered, ""),
        ("report's frame table lists train_step", "train_step (backward_scopes.py" in text, ""),
    ]
    print("== stacks (MLP)")
    for what, ok, detail in checks:
        print("  %-48s %s  %s" % (what, "ok" if ok else "MISS", detail))
    return all(ok for _, ok, _ in checks)


def main():
    cli = sys.argv[1]
    ok_all = check_stacks(cli)
    for name, depth, prefix in (("gpt2_small_adamw_bf16", 3, "transformer.h."), ("resnet50_sgd_amp", 2, "layer")):
        dump = os.path.join(os.environ.get("OUT") or tempfile.mkdtemp(), "bw_" + name + ".pickle.gz")
        p = subprocess.run([sys.executable, os.path.join(HERE, "report_live.py"), "--child", name, dump],
                           capture_output=True, text=True, timeout=300)
        if p.returncode:
            print("== %s FAILED to train under track()\n%s\n%s" % (name, p.stdout[-2000:], p.stderr[-4000:]))
            ok_all = False
            continue
        m = json.loads(p.stdout.strip().splitlines()[-1])
        total, with_path, paths = backward_bytes(load(dump))
        rep = json.loads(subprocess.run([cli, "report", dump, "--json"], check=True, capture_output=True,
                                        text=True).stdout)
        views = {v["depth"]: [s["name"] for s in v["series"]] for v in rep["scopes"]["views"]}
        checks = [
            ("history dropped nothing", m["history"][2] == 0, m["history"]),
            ("backward bytes with a module path >= 50%", total and with_path >= total / 2,
             "%d of %d" % (with_path, total)),
            (">= 20 module paths in backward", len(paths) >= 20, sorted(paths)[:8]),
            ("report scope series at depth %d name %s*" % (depth, prefix),
             any(n.startswith(prefix) for n in views.get(depth, [])), views.get(depth)),
        ]
        print("== %s" % name)
        for what, ok, detail in checks:
            ok_all &= bool(ok)
            print("  %-48s %s  %s" % (what, "ok" if ok else "MISS", detail))
    print("ALL OK" if ok_all else "SOME CHECKS MISSED")
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--stacks-child":
        stacks_child(sys.argv[2])
    else:
        main()
