"""gpumem.callbacks (issue 45) without the frameworks: fakes stand in for a
TensorBoard SummaryWriter, wandb, a Lightning logger and Trainer, and the
Hugging Face Trainer's callback calls. The numbers come from fake statistics,
then from the library on the sim backend, whose step marks reach
`gpumem smi --format json` as the step record.

Run: GPUMEM_LIB=<build>/libgpumem_torch.so python3 -m unittest discover -s python/tests"""
import json
import os
import shutil
import subprocess
import unittest

from _support import unusable  # the source tree's gpumem on sys.path
from gpumem import _lib
from gpumem import callbacks as cb

MIB = 1 << 20


def fake_stats(seq):
    """Statistics that change at each call: (allocated, reserved) pairs."""
    it = iter(seq)

    def stats(device):
        a, r = next(it)
        return {"allocated_bytes.all.current": a, "reserved_bytes.all.current": r,
                "allocated_bytes.all.peak": 2 * a, "num_alloc_retries": 1, "num_ooms": 0}
    return stats


class Writer:  # torch.utils.tensorboard.SummaryWriter's add_scalar
    def __init__(self):
        self.calls = []

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, value, step))


class Wandb:  # wandb.log / Run.log
    def __init__(self):
        self.calls = []

    def log(self, d, step=None):
        self.calls.append((dict(d), step))


class LightningLogger:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((dict(metrics), step))


class StepLoggerTest(unittest.TestCase):
    def test_numbers_leak_and_cache(self):
        marks = []
        lg = cb.StepLogger(stats=fake_stats([(100, 150), (100, 400), (130, 400)]), mark_fn=lambda: marks.append(1))
        m1, m2, m3 = lg.step(), lg.step(), lg.step()
        self.assertEqual(len(marks), 3)
        self.assertEqual(m1["gpumem/allocated_bytes"], 100)
        self.assertEqual(m1["gpumem/cache_bytes"], 50)
        self.assertEqual(m1["gpumem/baseline_growth_bytes"], 0)
        # the cache grew, the baseline did not: no leak
        self.assertEqual(m2["gpumem/cache_bytes"], 300)
        self.assertEqual(m2["gpumem/baseline_growth_bytes"], 0)
        # the baseline grew: a leak
        self.assertEqual(m3["gpumem/baseline_growth_bytes"], 30)
        self.assertEqual(m3["gpumem/num_alloc_retries"], 1)
        self.assertNotIn("gpumem/step_peak_allocated_bytes", m3)

    def test_no_mark_and_reset_peak(self):
        marks, resets = [], []
        lg = cb.StepLogger(stats=fake_stats([(10, 20)]), mark=False, mark_fn=lambda: marks.append(1),
                           reset_peak=True, reset_peak_fn=resets.append)
        m = lg.step()
        self.assertEqual(marks, [])
        self.assertEqual(resets, [None])
        self.assertEqual(m["gpumem/step_peak_allocated_bytes"], 20)

    def test_categories_from_a_tracker(self):
        class Tracker:
            def breakdown(self, device=None):
                return {"parameters": 8, "gradients": 8, "optimizer_state": 16, "allocated": 40,
                        "max_allocated": 90, "rest": 8}
        m = cb.StepLogger(stats=fake_stats([(40, 64)]), mark=False, tracker=Tracker()).step()
        self.assertEqual(m["gpumem/category/optimizer_state_bytes"], 16)
        self.assertEqual(m["gpumem/category/rest_bytes"], 8)
        self.assertNotIn("gpumem/category/allocated_bytes", m)

    def test_no_statistics_no_numbers(self):
        # no gpumem allocator and no CUDA: an empty dict, nothing logged, no error
        w = Writer()
        m = cb.log_step(w, 1, logger=cb.StepLogger(stats=lambda d: {}, mark=False))
        self.assertEqual(m, {})
        self.assertEqual(w.calls, [])


class SinksTest(unittest.TestCase):
    def lg(self):
        return cb.StepLogger(stats=fake_stats([(100, 150)] * 4), mark=False)

    def test_tensorboard(self):
        w = Writer()
        cb.log_step(w, 7, logger=self.lg())
        self.assertIn(("gpumem/allocated_bytes", 100, 7), w.calls)
        self.assertIn(("gpumem/cache_bytes", 50, 7), w.calls)

    def test_wandb_and_lightning_logger(self):
        w, l = Wandb(), LightningLogger()
        cb.log_step(w, 3, logger=self.lg())
        cb.log_step(l, 4, logger=self.lg())
        self.assertEqual(w.calls[0][1], 3)
        self.assertEqual(w.calls[0][0]["gpumem/reserved_bytes"], 150)
        self.assertEqual(l.calls[0][1], 4)

    def test_plain_loop_print_and_step_count(self):
        lines = []
        lg = self.lg()
        cb.log_step(lines.append, logger=lg)
        cb.log_step(lines.append, logger=lg)
        self.assertTrue(lines[1].startswith("step 2: "), lines)
        self.assertIn("allocated_bytes=100", lines[1])

    def test_unknown_writer_says_what_it_wants(self):
        with self.assertRaisesRegex(TypeError, "add_scalar, log_metrics, log, or a callable"):
            cb.log_step(object(), 1, logger=self.lg())


class FrameworkCallbacksTest(unittest.TestCase):
    def test_hf_trainer(self):
        class State:
            global_step = 5
        h = cb.HFTrainerCallback(stats=fake_stats([(100, 150)]), mark=False, writer=Writer())
        ctl = object()
        self.assertIs(h.on_step_end(None, State(), ctl), ctl)
        logs = {"loss": 1.0}
        h.on_log(None, State(), ctl, logs=logs)
        self.assertEqual(logs["gpumem/allocated_bytes"], 100)
        self.assertEqual(logs["loss"], 1.0)
        self.assertEqual(h.writer.calls[0][2], 5)

    def test_hf_attach_goes_first(self):
        class Handler:
            callbacks = ["TensorBoardCallback", "WandbCallback"]

        class Trainer:
            callback_handler = Handler()
        c = cb.attach(Trainer(), mark=False, stats=fake_stats([]))
        self.assertIs(Trainer.callback_handler.callbacks[0], c)

    def test_lightning_with_accumulation(self):
        class Trainer:
            accumulate_grad_batches = 2
            global_step = 0
            loggers = [LightningLogger(), LightningLogger()]
        t = Trainer()
        l = cb.LightningCallback(stats=fake_stats([(100, 150), (120, 150)]), mark=False)
        for i in range(4):
            t.global_step = i // 2
            l.on_train_batch_end(t, None, None, None, i)
        for lg in t.loggers:
            self.assertEqual([s for _, s in lg.calls], [0, 1])
            self.assertEqual(lg.calls[1][0]["gpumem/baseline_growth_bytes"], 20)

    def test_plain_bases_without_the_frameworks(self):
        import importlib.util
        if importlib.util.find_spec("transformers") is None:
            self.assertIs(cb.HFTrainerCallback.__bases__[0], object)
        if importlib.util.find_spec("lightning") is None and importlib.util.find_spec("pytorch_lightning") is None:
            self.assertIs(cb.LightningCallback.__bases__[0], object)


WHY = unusable(lambda: _lib.load().gpumem_torch_step_mark)


@unittest.skipUnless(not WHY, "libgpumem_torch.so not loadable: %s" % WHY)
class OnTheSimLibraryTest(unittest.TestCase):
    """The numbers and the step mark through the library (sim backend): a
    leak of 1 MiB a step shows in baseline_growth_bytes, and the marks reach
    `gpumem smi` as the published step record."""

    def setUp(self):
        self.env = {k: os.environ.get(k) for k in ("GPUMEM_PUBLISH", "GPUMEM_SHM_TAG", "GPUMEM_PUBLISH_LABEL")}
        os.environ.update(GPUMEM_PUBLISH="1", GPUMEM_SHM_TAG="cb%d" % os.getpid(), GPUMEM_PUBLISH_LABEL="cbtest")
        _lib.load().gpumem_torch_shutdown()
        _lib.configure("", "sim")

    def tearDown(self):
        _lib.load().gpumem_torch_shutdown()
        for k, v in self.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def test_leak_through_the_library(self):
        lib = _lib.load()
        lg = cb.StepLogger(stats=lambda d: _lib.stats(0), mark_fn=lambda: _lib.check(lib.gpumem_torch_step_mark(-1), "mark"))
        kept = []
        out = []
        for _ in range(3):
            tmp = _lib.alloc_raw(16 * MIB)       # the step's activations
            kept.append(_lib.alloc_raw(MIB))     # kept across steps: the leak
            _lib.free_raw(tmp)
            out.append(lg.step())
        self.assertEqual([m["gpumem/baseline_growth_bytes"] for m in out], [0, MIB, 2 * MIB])
        self.assertGreaterEqual(out[-1]["gpumem/cache_bytes"], 16 * MIB - MIB)
        cli = shutil.which("gpumem") or os.path.join(os.path.dirname(_lib.library_path()), "gpumem")
        if not os.path.exists(cli):
            self.skipTest("no gpumem CLI next to %s or on PATH" % _lib.library_path())
        smi = json.loads(subprocess.run([cli, "smi", "--format", "json", "--no-nvml"], check=True,
                                        capture_output=True, text=True).stdout)
        (row,) = [p for p in smi["processes"] if p["pid"] == os.getpid()]
        self.assertEqual(row["step"]["step"], 3)
        self.assertEqual(row["step"]["step_start_allocated"], 3 * MIB)
        self.assertGreaterEqual(row["step"]["step_peak_allocated"], 16 * MIB)
        for p in kept:
            _lib.free_raw(p)


@unittest.skipUnless(not WHY, "libgpumem_torch.so not loadable: %s" % WHY)
class NativeStepsTest(unittest.TestCase):
    """Under `gpumem run --native` (torch's own allocator, published by
    gpumem.publish_native) the callbacks' marks publish the step record too."""

    def test_native_step_record(self):
        from gpumem import publish_native as pn
        old = os.environ.get("GPUMEM_SHM_TAG")
        os.environ["GPUMEM_SHM_TAG"] = "cbn%d" % os.getpid()
        stats = {"allocated_bytes.all.current": 5 * MIB, "reserved_bytes.all.current": 8 * MIB}
        pub = pn.start(label="native-steps", interval=60, devices=[0], stats_fn=lambda d: stats)
        try:
            lg = cb.StepLogger(stats=lambda d: stats)  # the default mark: the native publisher's
            lg.step()
            stats["allocated_bytes.all.current"] = 6 * MIB
            lg.step()
            cli = shutil.which("gpumem") or os.path.join(os.path.dirname(_lib.library_path()), "gpumem")
            if not os.path.exists(cli):
                self.skipTest("no gpumem CLI next to %s or on PATH" % _lib.library_path())
            smi = json.loads(subprocess.run([cli, "smi", "--format", "json", "--no-nvml"], check=True,
                                            capture_output=True, text=True).stdout)
            (row,) = [p for p in smi["processes"] if p["pid"] == os.getpid() and p["label"] == "native-steps"]
            self.assertEqual(row["source"], "torch")
            self.assertEqual(row["step"]["step"], 2)
            self.assertEqual(row["step"]["step_start_allocated"], 6 * MIB)
            self.assertEqual(row["step"]["step_start_reserved"], 8 * MIB)
            self.assertIsNone(row["step"]["step_peak_allocated"])  # not known for torch's allocator
            self.assertIsNone(row["step"]["categories"])
        finally:
            pub.stop()
            if old is None:
                os.environ.pop("GPUMEM_SHM_TAG", None)
            else:
                os.environ["GPUMEM_SHM_TAG"] = old


if __name__ == "__main__":
    unittest.main()
