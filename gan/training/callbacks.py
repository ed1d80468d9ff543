"""Lightning callbacks of a training run: checkpoints, pictures (samples, the G loss's autograd graph),
metrics and the progress bar.

Each counts **generator** steps (``pl_module.counters.g``), not Lightning's global step, which counts
every optimizer step of D and G alike. (The autograd audit's callback lives with the audit, in
gan/training/audit.py.)
"""

from __future__ import annotations

import logging
import re
import shlex
import signal
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch import Tensor

from gan.core.graphs import ForwardRecorder, dot_path, picture
from gan.core.snapshot import save_snapshot
from gan.errors import ConfigError, StoppedAtOnce
from gan.evaluation.metrics import ImageMetrics, MixtureMetrics, build_metrics, scalars
from gan.evaluation.pictures import DASHBOARD_LAYOUT, render_samples, write_hparams
from gan.evaluation.sampling import sample_and_score
from gan.evaluation.settings import EvalSettings
from gan.training import audit
from gan.training.loggers import summary_writer

if TYPE_CHECKING:
    from gan.training.module import GANModule

log = logging.getLogger(__name__)

# The names of GeneratorStepCheckpoint's periodic files: it prunes these and no other file.
PERIODIC = re.compile(r"step_(\d+)\.ckpt")


# The signals that stop a run at the end of its generator step, with a checkpoint, and their names in messages.
# SIGUSR1 is what a SLURM job is sent before its time limit (sbatch --signal=USR1@90; docs/usage.md).
STOPPING = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1"}


class GeneratorStepCheckpoint(L.Callback):
    """``checkpoints/step_NNNNNN.ckpt`` every ``every`` generator steps, of which the newest ``keep`` stay
    (0: all); ``last.ckpt`` then, at the end, and when a signal stops the run. At the end (a stop
    included), also ``snapshot``: ``<run>/generator.pt``, the sampling generator's weights and what
    rebuilds it, for use outside training (gan/core/snapshot.py's load_generator); rank 0 writes it.

    Written here rather than with Lightning's ModelCheckpoint, which counts Lightning's global step
    (every optimizer step, G and D alike) and, once a periodic checkpoint exists, does not write
    ``last.ckpt`` at the end of training.

    Ctrl-C (SIGINT), SIGTERM and SIGUSR1 (:data:`STOPPING`) stop the run at the end of the generator step
    they land in, and save that step: ``stop_signal`` says which afterwards. Lightning's own handling
    raises KeyboardInterrupt wherever Ctrl-C lands -- between D's update and G's, or inside an optimizer's
    step -- and saves nothing (a checkpoint taken there would not resume exactly); on SIGTERM it stops
    without a checkpoint, and exits with code 0. A second signal stops at once, without a checkpoint
    (:class:`gan.errors.StoppedAtOnce`), and ends any process Lightning started for other ranks.
    """

    def __init__(self, directory: Path, every: int, keep: int, snapshot: Path,
                 before_save: Callable[[], None] = lambda: None):
        self.directory, self.every, self.keep, self.before_save = Path(directory), every, keep, before_save
        self.snapshot = Path(snapshot)
        self.saved_step = -1
        self.stop_requested = self.interrupted = False
        self.stop_signal: int | None = None  # the first stopping signal received
        self.previous_handlers: dict[int, Any] = {}
        self.trainer: L.Trainer | None = None

    @property
    def stopped_by(self) -> str | None:
        """What stopped the run at the end of a step: a signal's name (:data:`STOPPING`), or None."""
        if not self.interrupted:
            return None
        return STOPPING[signal.Signals(self.stop_signal)] if self.stop_signal else "another rank's signal"

    @property
    def exit_code(self) -> int:
        """128 + the stopping signal's number (a rank stopped by another's: SIGTERM's)."""
        return 128 + (self.stop_signal or signal.SIGTERM)

    def save(self, trainer: L.Trainer, step: int, periodic: bool) -> None:
        self.before_save()  # e.g. the non-finite guard's verdict: it raises rather than let a bad state be saved
        # weights_only=False: the full training state (optimizers, loops), needed to resume.
        if periodic:
            trainer.save_checkpoint(self.directory / f"step_{step:06d}.ckpt", weights_only=False)
        trainer.save_checkpoint(self.directory / "last.ckpt", weights_only=False)
        self.saved_step = step
        # Only now, with both new files complete (save_checkpoint returns once they are written): a
        # failed or killed save leaves every older checkpoint in place.
        if periodic and self.keep and trainer.is_global_zero:
            self.prune(step)

    def prune(self, step: int) -> None:
        """Delete the periodic checkpoints of steps up to ``step`` except the newest ``keep``.

        Checkpoints of later steps are left alone: they come from an earlier run in this directory that
        this one resumed from one of its older checkpoints, and this run overwrites them as it gets there.
        """
        periodic = {int(m[1]): p for p in self.directory.iterdir() if (m := PERIODIC.fullmatch(p.name))}
        for old in sorted(s for s in periodic if s <= step)[:-self.keep]:
            periodic[old].unlink(missing_ok=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: GANModule) -> None:
        self.trainer = trainer
        if threading.current_thread() is threading.main_thread():  # the only thread signal handlers run in
            # Replaces Lightning's SIGTERM handler (registered just before training starts) until the end.
            self.previous_handlers = {signum: signal.signal(signum, self.request_stop) for signum in STOPPING}

    def request_stop(self, signum: int, frame: Any) -> None:
        name = STOPPING[signal.Signals(signum)]
        if self.stop_requested:
            self.stop_at_once(name, signum)
        self.stop_requested, self.stop_signal = True, signum
        log.warning(f"{name}: the run stops at the end of this generator step, with a checkpoint "
                    f"({name} again stops it at once, without)")

    def stop_at_once(self, name: str, signum: int) -> None:
        self.restore_handlers()
        launcher = self.trainer.strategy.launcher if self.trainer is not None else None
        if launcher is not None and hasattr(launcher, "kill"):  # trainer=ddp on one node: the ranks it started
            launcher.kill(signal.SIGKILL)
        last = self.directory / "last.ckpt"
        resume = (f"resume from the last checkpoint with the same overrides and {shlex.quote(f'ckpt_path={last}')}"
                  if last.is_file() else "no checkpoint had been written")
        raise StoppedAtOnce(f"stopped at once by a second {name}: {resume}", 128 + signum)

    def restore_handlers(self) -> None:
        for signum, handler in self.previous_handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
        self.previous_handlers = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: GANModule, *args: Any) -> None:
        step = pl_module.counters.g
        # Every rank stops at the same step: under DDP a one-number all-reduce per step; nothing on one device.
        stop = trainer.strategy.reduce_boolean_decision(self.stop_requested, all=False)
        if step % self.every == 0 or stop:
            self.save(trainer, step, periodic=step % self.every == 0)
        if stop:
            self.interrupted = trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, pl_module: GANModule) -> None:
        self.restore_handlers()
        step = pl_module.counters.g
        if step != self.saved_step:
            self.save(trainer, step, periodic=False)
        if trainer.is_global_zero:
            save_snapshot(self.snapshot, pl_module.snapshot())

    def on_exception(self, trainer: L.Trainer, pl_module: GANModule, exception: BaseException) -> None:
        self.restore_handlers()


class SampleLogger(L.Callback):
    """Every ``every`` G steps and at the end: the fixed noise batch's samples to ``samples/`` and TensorBoard
    (where the run has a TensorBoard logger: gan/training/loggers.py).

    Also lays out TensorBoard's dashboard and hyperparameter table once, at the start, and draws the
    autograd graph of the first step's G loss (``autograd/g_loss`` at step 0; where Graphviz's ``dot``
    is installed). Points data (``real_points`` given) is drawn as scatter plots over the real points
    and the mixture ``means``.
    """

    GRAPH_TAG = "autograd/g_loss"

    def __init__(self, every: int, directory: Path, real_points: Tensor | None = None,
                 means: Tensor | None = None):
        self.every, self.directory = every, Path(directory)
        self.real_points, self.means = real_points, means
        self.tag = "samples/grid" if real_points is None else "samples/scatter"
        self.last_step = -1
        self.recorder: ForwardRecorder | None = None  # watches G and D during a fresh run's first step

    def on_fit_start(self, trainer: L.Trainer, pl_module: GANModule) -> None:
        writer = summary_writer(trainer)
        if writer is not None:
            writer.add_custom_scalars(DASHBOARD_LAYOUT)
            write_hparams(writer, pl_module.cfg)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: GANModule, *args: Any) -> None:
        # Step 0 only: a resumed run's event files have the picture already.
        if pl_module.counters.g != 0 or summary_writer(trainer) is None:
            return
        if dot_path() is None:
            log.debug("no autograd graph in TensorBoard: Graphviz's dot is not installed (apt-get install graphviz)")
            return
        self.recorder = ForwardRecorder(G=pl_module.G, D=pl_module.D)

    def on_before_backward(self, trainer: L.Trainer, pl_module: GANModule, loss: Tensor) -> None:
        # The graph is read now, before the backward frees what its operations hold.
        if self.recorder is None or pl_module.timer.network != "G":  # the G update, as the step says
            return
        with self.recorder:
            graph = self.recorder.graph("G loss", loss, "the G update: through D(fake), with D frozen")
        self.recorder = None
        summary_writer(trainer).add_image(
            self.GRAPH_TAG, picture([graph], "The autograd graph of the G loss, first training step"), 0,
            dataformats="HWC")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: GANModule, *args: Any) -> None:
        if pl_module.counters.g % self.every == 0:
            self.log_samples(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: GANModule) -> None:
        if pl_module.counters.g != self.last_step:
            self.log_samples(trainer, pl_module)

    def log_samples(self, trainer: L.Trainer, pl_module: GANModule) -> None:
        step = pl_module.counters.g
        self.last_step = step
        if not trainer.is_global_zero:
            return  # drawn once, by rank 0: under DDP every rank holds the same G and EMA weights
        samples = pl_module.generate(pl_module.sample_noise, pl_module.sample_labels)
        # The whole fixed batch: a conditional grid shows every row the module drew labels for.
        render_samples(samples, self.directory / f"step_{step:06d}.png",
                       summary_writer(trainer), self.tag, step,
                       num_classes=pl_module.num_classes, real_points=self.real_points, means=self.means,
                       title=f"generator step {step}", per_class=len(samples), limit=len(samples))


def own_rng(device: torch.device) -> AbstractContextManager[Any]:
    """A forked RNG (CPU, and the device's): measuring during training leaves the run's streams alone."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


class MetricsLogger(L.Callback):
    """Every ``every`` generator steps: the metrics of fresh samples, to every logger as ``metrics/*``.

    Measured on rank 0 only; the noise is the same at every evaluation (seeded with the run's seed),
    so the curve follows the generator, not the draw.
    """

    def __init__(self, every: int, settings: EvalSettings, seed: int):
        if every < 1:
            raise ConfigError(f"eval.every={every}: a number of generator steps, or 0 for no metrics")
        self.every, self.settings, self.seed = every, settings, seed
        self.metrics: MixtureMetrics | ImageMetrics | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: GANModule) -> None:
        # Built once the module sits on its device; a first run on image data trains the classifier here.
        if trainer.is_global_zero:
            with own_rng(pl_module.device):  # e.g. building a cached classifier initialises weights
                self.metrics = build_metrics(pl_module.cfg["data"], trainer.datamodule.dataset,
                                             self.settings, pl_module.device)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: GANModule, *args: Any) -> None:
        step = pl_module.counters.g
        if step % self.every or not trainer.is_global_zero:
            return
        with own_rng(pl_module.device):
            _, values = sample_and_score(pl_module, self.metrics, self.settings, self.seed)
        logged = scalars(values)
        if pl_module.audit:
            audit.check_plain_numbers(logged)
        pl_module.last_metrics = logged  # the numbers gan.train returns (gan/api.py)
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=step)


class GeneratorStepProgressBar(TQDMProgressBar):
    """Counts generator steps out of ``trainer.max_steps`` (the data stream is endless, so
    Lightning alone would show no total)."""

    def __init__(self, g_steps: int):
        super().__init__()
        self.g_steps = g_steps

    @property
    def total_train_batches(self) -> int:
        return self.g_steps

    def get_metrics(self, trainer: L.Trainer, pl_module: GANModule) -> dict[str, Any]:
        return {**super().get_metrics(trainer, pl_module), **{k: f"{v:.3g}" for k, v in pl_module.last_losses.items()}}

    def on_train_start(self, *args: Any) -> None:
        super().on_train_start(*args)
        self.label()  # a resumed run restarts mid-epoch, where Lightning skips on_train_epoch_start

    def on_train_epoch_start(self, *args: Any) -> None:
        super().on_train_epoch_start(*args)
        self.label()

    def label(self) -> None:
        self.train_progress_bar.total = self.g_steps
        self.train_progress_bar.set_description("generator steps")  # epochs mean nothing on an endless stream
