"""CPU tests of the `gpumem run` launcher (python/gpumem/run.py and
gpumem/_boot/sitecustomize.py) and of install()'s default settings: no
torch, no GPU (a stand-in `torch` package shows the import hook firing).

Run: python3 -m unittest discover -s python/tests"""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

PY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, PY_DIR)

from gpumem import run as gr  # noqa: E402
from gpumem.torch import effective_conf  # noqa: E402


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


class ParseTest(unittest.TestCase):
    def test_options_and_command(self):
        o, cmd = gr.parse(["--conf", "policy:torch", "--label=x", "--native", "--", "python", "-c", "1"])
        self.assertEqual((o["conf"], o["label"], o["native"], cmd), ("policy:torch", "x", True, ["python", "-c", "1"]))
        o, cmd = gr.parse(["python", "--conf", "y"])  # options after the command are the command's
        self.assertEqual((o["conf"], cmd), (None, ["python", "--conf", "y"]))

    def test_usage_errors(self):
        for bad in ([], ["--conf"], ["--bogus", "x"], ["--"]):
            with self.assertRaises(gr.UsageError):
                gr.parse(bad)

    def test_child_env(self):
        o, cmd = gr.parse(["--conf", "max_split_size_mb:64", "--label", "job", "--", "train.py"])
        env = gr.child_env(o, cmd, base={"PYTHONPATH": "/a:/b"})
        self.assertEqual(env["GPUMEM_CONF"], "policy:gpumem,max_split_size_mb:64")
        self.assertEqual(env["GPUMEM_RUN"], "gpumem")
        self.assertEqual(env["PYTHONPATH"].split(os.pathsep)[0], gr.BOOT_DIR)
        self.assertTrue(env["PYTHONPATH"].endswith("/a:/b"))
        self.assertEqual((env["GPUMEM_PUBLISH"], env["GPUMEM_PUBLISH_LABEL"]), ("1", "job"))
        o, cmd = gr.parse(["--native", "--no-publish", "--", "train.py"])
        env = gr.child_env(o, cmd, base={})
        self.assertEqual((env["GPUMEM_RUN"], env["GPUMEM_PUBLISH"]), ("native", "0"))
        self.assertNotIn("GPUMEM_CONF", env)

    def test_label_is_the_run_id_unless_a_launcher_set_one(self):
        o, cmd = gr.parse(["--label", "job", "--", "train.py"])
        self.assertEqual(gr.child_env(o, cmd, base={})["GPUMEM_RUN_ID"], "job")
        self.assertEqual(gr.child_env(o, cmd, base={"GPUMEM_RUN_ID": "elastic"})["GPUMEM_RUN_ID"], "elastic")
        o, cmd = gr.parse(["--", "train.py"])
        self.assertNotIn("GPUMEM_RUN_ID", gr.child_env(o, cmd, base={}))

    def test_oom_report(self):
        o, cmd = gr.parse(["--oom-report", "reports", "--", "train.py"])
        env = gr.child_env(o, cmd, base={})
        self.assertEqual(env["GPUMEM_OOM_REPORT"], os.path.abspath("reports"))
        for bad in (["--oom-report", "d", "--native", "--", "x"], ["--oom-report=", "--", "x"]):
            with self.assertRaises(gr.UsageError):
                gr.parse(bad)


class LaunchTest(unittest.TestCase):
    def test_exit_status_and_signal_pass_through(self):
        self.assertEqual(launch(["--", sys.executable, "-c", "import sys; sys.exit(5)"]).returncode, 5)
        r = launch(["--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
        self.assertEqual(r.returncode, -15)

    def test_usage_and_missing_program(self):
        r = launch(["--bogus"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown option --bogus", r.stderr)
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
        e = dict(os.environ, PYTHONPATH=os.pathsep.join([gr.BOOT_DIR, PY_DIR, d]))
        e.pop("GPUMEM_RUN", None)
        r = subprocess.run([sys.executable, "-c", "import torch, os; print(os.environ.get('GPUMEM_RUN_DONE'))"],
                           env=e, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout.strip(), "None", r.stderr)


if __name__ == "__main__":
    unittest.main()
