"""What a training run writes while it trains besides its checkpoints (gan/training/checkpoints.py), each output an
observer of the run (gan/training/observer.py): pictures (samples, the G loss's autograd graph), in-training
metrics, the progress bar. Each counts generator steps (``module.counters.g``)."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.loggers import Logger
from torch import Tensor
from tqdm import tqdm

from gan.config.eval_settings import EvalSettings
from gan.core.audit import check_plain_numbers
from gan.evaluation.graphs import ForwardRecorder, dot_path, picture
from gan.evaluation.metrics import ImageMetrics, MixtureMetrics, build_metrics, scalars
from gan.evaluation.pictures import DASHBOARD_LAYOUT, render_samples, write_hparams
from gan.evaluation.sampling import sample_and_score
from gan.training.observer import ObservedRun, Observer

if TYPE_CHECKING:
    from gan.run.module import GANModule

log = logging.getLogger(__name__)


class Samples(Observer):
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

    def on_start(self, run: ObservedRun) -> None:
        module = run.module
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

    def on_step_end(self, run: ObservedRun) -> None:
        if run.module.counters.g % self.every == 0:
            self.draw(run.module)

    def on_end(self, run: ObservedRun) -> None:
        if run.module.counters.g != self.last_step:
            self.draw(run.module)

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


class Metrics(Observer):
    """Every ``every`` generator steps: the metrics of fresh samples, to every logger as ``metrics/*``.

    Measured on rank 0 only (``loggers`` is empty elsewhere); the noise is the same at every evaluation
    (seeded with the run's seed), so the curve follows the generator, not the draw.
    """

    def __init__(self, every: int, settings: EvalSettings, seed: int, loggers: list[Logger]):
        self.every, self.settings, self.seed, self.loggers = every, settings, seed, loggers
        self.metrics: MixtureMetrics | ImageMetrics | None = None

    def on_start(self, run: ObservedRun) -> None:
        # Built once the module sits on its device; a first run on image data trains the classifier here.
        module, data = run.module, run.data
        with own_rng(module.device):  # e.g. building a cached classifier initialises weights
            self.metrics = build_metrics(data.cfg, data.population(), self.settings, module.device)

    def on_step_end(self, run: ObservedRun) -> None:
        module = run.module
        step = module.counters.g
        if step % self.every:
            return
        with own_rng(module.device):
            _, values = sample_and_score(module, self.metrics, self.settings, self.seed)
        logged = scalars(values)
        if module.audit:
            check_plain_numbers(logged)
        run.last_metrics = logged  # what gan.train returns
        for logger in self.loggers:
            logger.log_metrics(logged, step=step)


class Progress(Observer):
    """A bar of generator steps out of ``trainer.max_steps``, with the last logged losses."""

    def __init__(self, total: int):
        self.total = total
        self.bar: tqdm | None = None

    def on_start(self, run: ObservedRun) -> None:
        # Made as the steps start, from the run's generator step (a resume's): its clock times steps alone.
        self.bar = tqdm(total=self.total, initial=run.module.counters.g, desc="generator steps", dynamic_ncols=True)

    def on_step_end(self, run: ObservedRun) -> None:
        self.bar.update(1)
        if run.logged:
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in run.last_losses.items()}, refresh=False)

    def on_close(self, run: ObservedRun, status: str) -> None:
        if self.bar is not None:
            self.bar.close()
