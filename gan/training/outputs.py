"""What a training run writes while it trains, each a small object the loop (gan/training/loop.py) calls
where it is due: checkpoints and the stop signals, pictures (samples, the G loss's autograd graph),
in-training metrics and the progress bar. Each counts generator steps (``module.counters.g``)."""

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

import torch
from lightning.fabric.loggers import Logger
from torch import Tensor
from tqdm import tqdm

from gan.config.eval_settings import EvalSettings
from gan.core.audit import check_plain_numbers
from gan.errors import StoppedAtOnce
from gan.evaluation.graphs import ForwardRecorder, dot_path, picture
from gan.evaluation.metrics import ImageMetrics, MixtureMetrics, build_metrics, scalars
from gan.evaluation.pictures import DASHBOARD_LAYOUT, render_samples, write_hparams
from gan.evaluation.sampling import sample_and_score

if TYPE_CHECKING:
    from gan.data.loader import GANData
    from gan.run.module import GANModule

log = logging.getLogger(__name__)

# The names of the periodic checkpoint files: Checkpoints prunes these and no other file.
PERIODIC = re.compile(r"step_(\d+)\.ckpt")

# The signals that stop a run at the end of its generator step, with a checkpoint, and their names in messages.
# SIGUSR1 is what a SLURM job is sent before its time limit (sbatch --signal=USR1@90; docs/usage.md).
STOPPING = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1"}


class Checkpoints:
    """``checkpoints/step_NNNNNN.ckpt`` every ``every`` generator steps, of which the newest ``keep`` stay
    (0: all); ``last.ckpt`` then, at the end, and when a signal stops the run. ``write(path)`` writes the
    training state to a file (the loop's, through gan/files.py's atomic writing).

    Ctrl-C (SIGINT), SIGTERM and SIGUSR1 (:data:`STOPPING`) stop the run at the end of the generator step
    they land in, and save that step: a checkpoint taken between D's update and G's would not resume
    exactly. A second signal stops at once, without a checkpoint (:class:`gan.errors.StoppedAtOnce`), and
    ``kill_ranks`` ends any process the run started for other ranks.
    """

    def __init__(self, directory: Path, every: int, keep: int, write: Callable[[Path], None], is_global_zero: bool,
                 kill_ranks: Callable[[], None] = lambda: None):
        self.directory, self.every, self.keep, self.write = Path(directory), every, keep, write
        self.is_global_zero, self.kill_ranks = is_global_zero, kill_ranks
        self.saved_step = -1
        self.stop_requested = self.interrupted = False
        self.stop_signal: int | None = None  # the first stopping signal received
        self.previous_handlers: dict[int, Any] = {}

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

    def save(self, step: int, periodic: bool) -> None:
        directory = self.directory
        if periodic:
            self.write(directory / f"step_{step:06d}.ckpt")
        self.write(directory / "last.ckpt")
        self.saved_step = step
        # Only now, with both new files complete: a failed or killed save leaves every older checkpoint in place.
        if periodic and self.keep and self.is_global_zero:
            self.prune(step)

    def prune(self, step: int) -> None:
        """Delete the periodic checkpoints of steps up to ``step`` except the newest ``keep``.

        Checkpoints of later steps are left alone: they come from an earlier run in this directory that
        this one resumed from one of its older checkpoints, and this run overwrites them as it gets there.
        """
        periodic = {int(m[1]): p for p in self.directory.iterdir() if (m := PERIODIC.fullmatch(p.name))}
        for old in sorted(s for s in periodic if s <= step)[:-self.keep]:
            periodic[old].unlink(missing_ok=True)

    def at_start(self) -> None:
        """The stopping signals caught from the first step on."""
        if threading.current_thread() is threading.main_thread():  # the only thread signal handlers run in
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
        self.kill_ranks()
        last = self.directory / "last.ckpt"
        resume = (f"resume from the last checkpoint with the same overrides and {shlex.quote(f'ckpt_path={last}')}"
                  if last.is_file() else "no checkpoint had been written")
        raise StoppedAtOnce(f"stopped at once by a second {name}: {resume}", 128 + signum)

    def restore_handlers(self) -> None:
        for signum, handler in self.previous_handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
        self.previous_handlers = {}

    def after_step(self, step: int, stop: bool) -> bool:
        """Save what is due at generator step ``step``; ``stop``: the ranks agreed to stop here. True: stop."""
        if step % self.every == 0 or stop:
            self.save(step, periodic=step % self.every == 0)
        self.interrupted = stop
        return stop

    def at_end(self, step: int) -> None:
        if step != self.saved_step:
            self.save(step, periodic=False)


class Samples:
    """Every ``every`` G steps and at the end: the fixed noise batch's samples to ``samples/`` and TensorBoard
    (``writer``: the run's SummaryWriter, None without one or on ranks > 0, which draw nothing).

    Also lays out TensorBoard's dashboard and hyperparameter table once, at the start, and draws the
    autograd graph of the first step's G loss (``autograd/g_loss`` at step 0; where Graphviz's ``dot``
    is installed). Points data (``real_points`` given) is drawn as scatter plots over the real points
    and the mixture ``means``.
    """

    GRAPH_TAG = "autograd/g_loss"

    def __init__(self, every: int, directory: Path, writer: Any, is_global_zero: bool,
                 real_points: Tensor | None = None, means: Tensor | None = None):
        self.every, self.directory, self.writer, self.is_global_zero = every, Path(directory), writer, is_global_zero
        self.real_points, self.means = real_points, means
        self.tag = "samples/grid" if real_points is None else "samples/scatter"
        self.last_step = -1
        self.recorder: ForwardRecorder | None = None  # watches G and D during a fresh run's first step

    def at_start(self, module: GANModule) -> None:
        if self.writer is None:
            return
        self.writer.add_custom_scalars(DASHBOARD_LAYOUT)
        write_hparams(self.writer, module.cfg)
        if module.counters.g != 0:  # a resumed run's event files have the picture already
            return
        if dot_path() is None:
            log.debug("no autograd graph in TensorBoard: Graphviz's dot is not installed (apt-get install graphviz)")
            return
        self.recorder = ForwardRecorder(G=module.G, D=module.D)

    def before_backward(self, loss: Tensor, network: str | None) -> None:
        # The graph is read now, before the backward frees what its operations hold.
        if self.recorder is None or network != "G":  # the G update, as the step says
            return
        with self.recorder:
            graph = self.recorder.graph("G loss", loss, "the G update: through D(fake), with D frozen")
        self.recorder = None
        self.writer.add_image(self.GRAPH_TAG, picture([graph], "The autograd graph of the G loss, first training step"),
                              0, dataformats="HWC")

    def after_step(self, module: GANModule) -> None:
        if module.counters.g % self.every == 0:
            self.draw(module)

    def at_end(self, module: GANModule) -> None:
        if module.counters.g != self.last_step:
            self.draw(module)

    def draw(self, module: GANModule) -> None:
        step = module.counters.g
        self.last_step = step
        if not self.is_global_zero:
            return  # drawn once, by rank 0: under DDP every rank holds the same G and EMA weights
        samples = module.generate(module.sample_noise, module.sample_labels)
        # The whole fixed batch: a conditional grid shows every row the module drew labels for.
        render_samples(samples, self.directory / f"step_{step:06d}.png", self.writer, self.tag, step,
                       num_classes=len(module.condition.seen), real_points=self.real_points, means=self.means,
                       title=f"generator step {step}", per_class=len(samples), limit=len(samples))


def own_rng(device: torch.device) -> AbstractContextManager[Any]:
    """A forked RNG (CPU, and the device's): measuring during training leaves the run's streams alone."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


class Metrics:
    """Every ``every`` generator steps: the metrics of fresh samples, to every logger as ``metrics/*``.

    Measured on rank 0 only (``loggers`` is empty elsewhere); the noise is the same at every evaluation
    (seeded with the run's seed), so the curve follows the generator, not the draw.
    """

    def __init__(self, every: int, settings: EvalSettings, seed: int, loggers: list[Logger]):
        self.every, self.settings, self.seed, self.loggers = every, settings, seed, loggers
        self.metrics: MixtureMetrics | ImageMetrics | None = None
        self.last: dict[str, float] = {}  # the last evaluation's metrics/*, as logged (the numbers gan.train returns)

    def at_start(self, module: GANModule, data: GANData) -> None:
        # Built once the module sits on its device; a first run on image data trains the classifier here.
        with own_rng(module.device):  # e.g. building a cached classifier initialises weights
            self.metrics = build_metrics(data.cfg, data.population(), self.settings, module.device)

    def after_step(self, module: GANModule) -> None:
        step = module.counters.g
        if step % self.every:
            return
        with own_rng(module.device):
            _, values = sample_and_score(module, self.metrics, self.settings, self.seed)
        logged = scalars(values)
        if module.audit:
            check_plain_numbers(logged)
        self.last = logged
        for logger in self.loggers:
            logger.log_metrics(logged, step=step)


class Progress:
    """A bar of generator steps out of ``trainer.max_steps``, with the last logged losses."""

    def __init__(self, total: int):
        self.total = total
        self.bar: tqdm | None = None

    def at_start(self, module: GANModule) -> None:
        # Made as the steps start, from the run's generator step (a resume's): its clock times steps alone.
        self.bar = tqdm(total=self.total, initial=module.counters.g, desc="generator steps", dynamic_ncols=True)

    def after_step(self, losses: dict[str, float], logged: bool) -> None:
        self.bar.update(1)
        if logged:
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in losses.items()}, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
