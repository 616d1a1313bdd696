"""gpumem run: run an unmodified PyTorch program on gpumem's allocator.

    python -m gpumem run [--conf STR] [--native] [--label L] [--no-publish] [--oom-report DIR] [--] COMMAND [ARGS...]
    gpumem run ...                      (the C CLI hands over to this)

Every Python process the command starts (torchrun's workers included: they
inherit the environment) imports gpumem's sitecustomize (gpumem/_boot, put
first on PYTHONPATH), which calls gpumem.torch.install() right after `import
torch` finishes, before any CUDA use. The settings come from --conf, else
GPUMEM_CONF (PYTORCH_CUDA_ALLOC_CONF syntax plus policy:torch|gpumem; the
policy is gpumem unless one is named). --native keeps PyTorch's own
allocator and only publishes its statistics, so `gpumem smi/top` see the
process either way (--no-publish: don't). The launcher replaces itself with
COMMAND (exec), so the exit status and signals are COMMAND's own.
A python started with -I or -E ignores PYTHONPATH and so runs without gpumem.
"""
import os
import sys

USAGE = ("usage: python -m gpumem run [--conf STR] [--native] [--label L] [--no-publish] [--oom-report DIR] [--] "
         "COMMAND [ARGS...]\n"
         "  --conf STR     allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax, plus policy:torch|gpumem);\n"
         "                 default: $GPUMEM_CONF, policy:gpumem\n"
         "  --native       keep PyTorch's allocator; only publish its statistics to gpumem smi/top\n"
         "  --label L      the name gpumem smi/top show for the process (default: the command name), and\n"
         "                 the run id that groups its processes as one job (unless torchrun or SLURM set one)\n"
         "  --no-publish   do not publish statistics for gpumem smi/top\n"
         "  --oom-report DIR  on out of memory, leave a report (verdict: capacity, fragmentation or memory\n"
         "                 outside the allocator) and a snapshot in DIR, then raise as usual\n")

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class UsageError(Exception):
    pass


def parse(argv):
    """(options dict, command list) from the arguments after `run`."""
    opts = {"conf": None, "native": False, "label": None, "publish": True, "oom_report": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-"):
            break
        name, eq, val = a.partition("=")
        if name in ("--conf", "--label", "--oom-report"):
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError("gpumem run: %s needs a value" % name)
                i += 1
                val = argv[i]
            opts[name[2:].replace("-", "_")] = val
        elif a == "--native":
            opts["native"] = True
        elif a == "--no-publish":
            opts["publish"] = False
        elif a in ("-h", "--help"):
            raise UsageError("")
        else:
            raise UsageError("gpumem run: unknown option %s; see 'gpumem run --help'" % a)
        i += 1
    cmd = argv[i:]
    if not cmd:
        raise UsageError("gpumem run: no command given; see 'gpumem run --help'")
    if opts["oom_report"] is not None and opts["native"]:
        raise UsageError("gpumem run: --oom-report needs gpumem's allocator; drop --native")
    if opts["oom_report"] is not None and not opts["oom_report"]:
        raise UsageError("gpumem run: --oom-report needs a directory")
    return opts, cmd


def child_env(opts, cmd, base=None):
    """The environment COMMAND runs with."""
    env = dict(os.environ if base is None else base)
    if opts["conf"] is not None and not opts["native"]:
        from .torch import effective_conf  # noqa: PLC0415
        env["GPUMEM_CONF"] = effective_conf(opts["conf"])
    env["GPUMEM_RUN"] = "native" if opts["native"] else "gpumem"
    path = [BOOT_DIR, PKG_PARENT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))  # keep order, drop repeats
    if opts["label"]:  # the run id too, unless a launcher gave one (torchrun, SLURM)
        env.setdefault("GPUMEM_RUN_ID", opts["label"])
    if opts["oom_report"] is not None:  # absolute: the command may change directory
        env["GPUMEM_OOM_REPORT"] = os.path.abspath(opts["oom_report"])
    if opts["publish"]:
        env.setdefault("GPUMEM_PUBLISH", "1")
        env["GPUMEM_PUBLISH_LABEL"] = opts["label"] or env.get("GPUMEM_PUBLISH_LABEL") or os.path.basename(cmd[0])
    else:
        env["GPUMEM_PUBLISH"] = "0"
    return env


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, cmd = parse(argv)
    except UsageError as e:
        msg = str(e)
        sys.stderr.write((msg + "\n") if msg else USAGE)
        return 2 if msg else 0
    if opts["conf"] is not None and not opts["native"]:
        from . import _lib  # noqa: PLC0415
        from .torch import effective_conf  # noqa: PLC0415
        try:  # a typo fails here, not in every child process
            _lib.configure(effective_conf(opts["conf"]), "sim")
            _lib.load().gpumem_torch_shutdown()
        except (OSError, FileNotFoundError):
            pass  # library missing: the child says so when it installs
        except _lib.GpumemError as e:
            sys.stderr.write("gpumem run: --conf %s: %s\n" % (opts["conf"], e))
            return 2
    env = child_env(opts, cmd)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        sys.stderr.write("gpumem run: cannot run %s: %s\n" % (cmd[0], e.strerror or e))
        return 127 if isinstance(e, FileNotFoundError) else 126
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
