"""CPU tests of `python3 -m gpumem run` (gpumem/_cli.py execs the C gpumem,
whose cmd_run.c is the one launcher; gpumem/_boot/sitecustomize.py) and of
install()'s default settings: no torch, no GPU (a stand-in `torch` package
shows the import hook firing). The executable is found beside the library
($GPUMEM_LIB, as scripts/test.sh sets it); without one these tests skip.

Run: GPUMEM_LIB=<build>/libgpumem_torch.so python3 -m unittest discover -s python/tests"""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

PY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, PY_DIR)

from gpumem import _cli  # noqa: E402
from gpumem.torch import DEFAULT_POLICY, effective_conf  # noqa: E402

BOOT_DIR = os.path.join(PY_DIR, "gpumem", "_boot")


def _exe():
    try:
        return _cli.find_executable()
    except FileNotFoundError as e:
        return str(e)


def launch(args, env=None, **kw):
    e = dict(os.environ)
    e["PYTHONPATH"] = PY_DIR
    e.pop("GPUMEM_CONF", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpumem", "run"] + args, env=e, capture_output=True, text=True,
                          timeout=60, **kw)


class ConfTest(unittest.TestCase):
    def test_default_policy_is_gpumem(self):
        old = os.environ.pop("GPUMEM_CONF", None)
        try:
            self.assertEqual(effective_conf(), "policy:gpumem")
            self.assertEqual(effective_conf("policy:torch"), "policy:torch")
            self.assertEqual(effective_conf("expandable_segments:True"), "policy:gpumem,expandable_segments:True")
            os.environ["GPUMEM_CONF"] = "policy:torch,max_split_size_mb:64"
            self.assertEqual(effective_conf(), "policy:torch,max_split_size_mb:64")
        finally:
            os.environ.pop("GPUMEM_CONF", None)
            if old is not None:
                os.environ["GPUMEM_CONF"] = old


@unittest.skipUnless(os.path.isfile(_exe()), _exe())
class EnvTest(unittest.TestCase):
    def test_child_env(self):
        show = 'echo "$GPUMEM_RUN|$GPUMEM_CONF|$GPUMEM_PUBLISH|$GPUMEM_PUBLISH_LABEL|$PYTHONPATH"'
        r = launch(["--conf", "max_split_size_mb:64", "--label", "job", "--", "sh", "-c", show],
                   env={"PYTHONPATH": os.pathsep.join([PY_DIR, "/a", "/b"])})
        self.assertEqual(r.returncode, 0, r.stderr)
        run, conf, pub, label, path = r.stdout.strip().split("|")
        self.assertEqual((run, conf, pub, label), ("gpumem", DEFAULT_POLICY + ",max_split_size_mb:64", "1", "job"))
        self.assertEqual(os.path.realpath(path.split(os.pathsep)[0]), os.path.realpath(BOOT_DIR))
        self.assertTrue(path.endswith(":/a:/b"), path)
        r = launch(["--native", "--no-publish", "--", "sh", "-c", show])
        run, conf, pub, _, _ = r.stdout.strip().split("|")
        self.assertEqual((run, conf, pub), ("native", "", "0"))

    def test_options_after_the_command_are_the_commands(self):
        r = launch(["sh", "-c", 'echo "$0 $1"', "--conf", "y"])
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "--conf y"), r.stderr)

    def test_bad_settings_fail_before_the_command_runs(self):
        r = launch(["--conf", "max_split_sz_mb:64", "--", "sh", "-c", "echo ran"])
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("ran", r.stdout)
        self.assertIn("did you mean 'max_split_size_mb'", r.stderr)

    def test_label_is_the_run_id_unless_a_launcher_set_one(self):
        show = ["--", "sh", "-c", 'echo "${GPUMEM_RUN_ID-unset}"']
        base = {k: v for k, v in os.environ.items() if k != "GPUMEM_RUN_ID"}
        r = subprocess.run([sys.executable, "-m", "gpumem", "run", "--label", "job"] + show,
                           env=dict(base, PYTHONPATH=PY_DIR), capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout.strip(), "job", r.stderr)
        r = launch(["--label", "job"] + show, env={"GPUMEM_RUN_ID": "elastic"})
        self.assertEqual(r.stdout.strip(), "elastic", r.stderr)
        r = subprocess.run([sys.executable, "-m", "gpumem", "run"] + show,
                           env=dict(base, PYTHONPATH=PY_DIR), capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout.strip(), "unset", r.stderr)

    def test_oom_report(self):
        with tempfile.TemporaryDirectory() as d:
            r = launch(["--oom-report", "reports", "--", "sh", "-c", 'echo "$GPUMEM_OOM_REPORT"'], cwd=d)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(os.path.realpath(r.stdout.strip()), os.path.realpath(os.path.join(d, "reports")))
        for bad in (["--oom-report", "d", "--native", "--", "true"], ["--oom-report=", "--", "true"]):
            r = launch(bad)
            self.assertEqual(r.returncode, 2, (bad, r.stdout, r.stderr))
            self.assertIn("--oom-report", r.stderr)


@unittest.skipUnless(os.path.isfile(_exe()), _exe())
class LaunchTest(unittest.TestCase):
    def test_exit_status_and_signal_pass_through(self):
        self.assertEqual(launch(["--", sys.executable, "-c", "import sys; sys.exit(5)"]).returncode, 5)
        r = launch(["--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
        self.assertEqual(r.returncode, -15)

    def test_usage_and_missing_program(self):
        r = launch(["--bogus"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown option '--bogus'", r.stderr)
        self.assertEqual(launch(["--help"]).returncode, 0)
        r = launch(["--", "/nonexistent/prog"])
        self.assertEqual(r.returncode, 127)
        self.assertIn("cannot run /nonexistent/prog", r.stderr)

    def test_hook_runs_after_import_torch_and_chains_sitecustomize(self):
        d = tempfile.mkdtemp()
        os.makedirs(os.path.join(d, "torch"))
        with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
            f.write("import os\nSEEN_BEFORE = os.environ.get('GPUMEM_RUN_DONE')\n")
        other = tempfile.mkdtemp()
        with open(os.path.join(other, "sitecustomize.py"), "w") as f:
            f.write("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
        script = textwrap.dedent("""
            import os
            before = os.environ.get('GPUMEM_RUN_DONE')
            import torch
            print(before, torch.SEEN_BEFORE, os.environ.get('GPUMEM_RUN_DONE'), os.environ.get('OTHER_SITECUSTOMIZE'))
        """)
        r = launch(["--native", "--no-publish", "--", sys.executable, "-c", script],
                   env={"PYTHONPATH": os.pathsep.join([PY_DIR, d, other])})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["None", "None", "native", "ran"])
        # without gpumem run, nothing happens
        e = dict(os.environ, PYTHONPATH=os.pathsep.join([BOOT_DIR, PY_DIR, d]))
        e.pop("GPUMEM_RUN", None)
        r = subprocess.run([sys.executable, "-c", "import torch, os; print(os.environ.get('GPUMEM_RUN_DONE'))"],
                           env=e, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout.strip(), "None", r.stderr)


if __name__ == "__main__":
    unittest.main()
