"""What a training run writes while it trains, and when each is due: each output a small object (checkpoints and
the stop signals, pictures -- samples, the G loss's autograd graph --, in-training metrics, the progress bar), and
below them what the loop (gan/training/loop.py) calls after each generator step (:func:`after_step`: the step's
scalars, the health check, the outputs), after the last (:func:`at_end`), however the steps ended (:func:`close`),
and as the run returns (:func:`finish`). Each counts generator steps (``module.counters.g``)."""

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
from lightning.fabric import Fabric
from lightning.fabric.loggers import Logger
from torch import Tensor, nn
from tqdm import tqdm

from gan.config.eval_settings import EvalSettings
from gan.core import snapshot
from gan.core.audit import check_plain_numbers
from gan.errors import Interrupted, StoppedAtOnce, Unhealthy
from gan.evaluation.graphs import ForwardRecorder, dot_path, picture
from gan.evaluation.metrics import ImageMetrics, MixtureMetrics, build_metrics, scalars
from gan.evaluation.pictures import DASHBOARD_LAYOUT, render_samples, write_hparams
from gan.evaluation.sampling import sample_and_score
from gan.training.fabric_adapter import every_rank

if TYPE_CHECKING:
    from gan.core.step import StepResult
    from gan.data.loader import GANData
    from gan.run.module import GANModule
    from gan.training.state import Training

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


# --- what is due after a generator step ------------------------------------------------------------------------

def after_step(run: Training, result: StepResult, g: int, logged: bool, stop: bool) -> bool:
    """What is due after generator step ``g``: its scalars (``logged``) and health check, the audit's end-of-step
    checks, a checkpoint, samples, metrics, the progress bar. Returns whether the run stops here: ``stop`` (the
    ranks agreed to), or its health check stopped it."""
    module = run.module
    if logged:
        run.guard.read()  # a bad update stops the run before it is logged
        log_step(run, result)
        if run.health_due(g):  # rank 0's health check may stop the run: the ranks agree to stop here
            ill = run.health is not None and run.health.stopped_by is not None
            run.health_stopped = agree_to_stop(run.fabric, ill)
            stop = run.health_stopped or stop
    if run.audit is not None:
        run.audit.step_end()
    run.checkpoints.after_step(g, stop)
    run.samples.after_step(module)
    if run.metrics is not None:
        run.metrics.after_step(module)
        run.last_metrics = run.metrics.last
    if run.progress is not None:
        run.progress.after_step(run.last_losses, logged)
    return stop


def log_step(run: Training, result: StepResult) -> None:
    """The step's scalars (and a health check's figures, which it judges, when one is due) to the loggers, read
    from the device in one transfer: one host-device sync per logging step, plain floats to the loggers, and no
    tensor that could keep a graph alive."""
    module = run.module
    d, objective = result.d[-1], module.objective
    values = {
        "loss/d": d.loss, "loss/g": result.g_loss,
        "d/real": d.real_logits.mean(), "d/fake": d.fake_logits.mean(),
        "d/real_running": objective.d_real_mean.value, "d/fake_running": objective.d_fake_mean.value,
        "grad_norm/g": grad_norm(module.G), "grad_norm/d": grad_norm(module.D),
    }
    if objective.augment is not None:
        values["augment/p"] = objective.augment.p
    values.update({f"train/skipped_{n}": getattr(module.counters, f"skipped_{n}") for n in "dg"})
    # Rank 0 checks the run's health, for every rank: they hold the same networks (the verdict is agreed on).
    checking = run.health is not None and run.health_due(module.counters.g)
    if checking:
        values.update(run.health.figures(module, result))
    numbers = dict(zip(values, torch.stack([v.float() for v in values.values()]).tolist()))
    if checking:
        run.health.check(module.counters.g, numbers)
    if module.audit:
        check_plain_numbers(numbers)
    for logger in run.loggers:  # TensorBoard's x axis is generator steps
        logger.log_metrics(numbers, step=module.counters.g)
    run.last_losses = {k: v for k, v in numbers.items() if k.startswith("loss/")}


def grad_norm(module: nn.Module) -> Tensor:
    """L2 norm of all gradients of ``module``, on their device (0 where none exist)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=next(module.parameters()).device)


def agree_to_stop(fabric: Fabric, requested: bool) -> bool:
    """Whether any rank was asked to stop (a signal, or rank 0's health check): one all-reduce of one number under
    DDP, none on one process."""
    return every_rank(fabric, requested, all=False) if fabric.world_size > 1 else requested


# --- the end ---------------------------------------------------------------------------------------------------

def at_end(run: Training) -> None:
    """After the last step: last.ckpt, the last samples, the generator's snapshot."""
    run.guard.read()
    run.checkpoints.at_end(run.module.counters.g)
    run.samples.at_end(run.module)
    if run.zero:
        generator = run.module.snapshot()  # the EMA generator where there is one, with what it needs to sample
        snapshot.save_snapshot(run.run_dir / snapshot.FILE, generator)
    if run.health is not None:
        run.health.at_end(run.module.counters.g)


def close(run: Training, status: str) -> None:
    """However the steps ended: the signal handlers, the audit's hooks, the progress bar, the profiler, the loggers."""
    run.checkpoints.restore_handlers()
    if run.audit is not None:
        run.audit.close()
    if run.progress is not None:
        run.progress.close()
    run.profiler.describe()
    for logger in run.loggers:
        logger.finalize(status)


def finish(run: Training) -> Training:
    """The run's summary; a run a signal stopped ends with :class:`gan.errors.Interrupted`, one its health check
    stopped with :class:`gan.errors.Unhealthy`: each says how to resume."""
    module, run_dir, stopped_by = run.module, run.run_dir, run.checkpoints.stopped_by
    unhealthy = run.health_stopped
    ill = run.health.stopped_by if run.health is not None else None  # None on ranks > 0: rank 0 judged
    if unhealthy:
        stopped_by = f"its health check ({ill.condition if ill else 'on rank 0'})"
    if run.zero:
        log_summary(run, stopped_by)
    if not stopped_by:
        return run
    last = run_dir / "checkpoints" / "last.ckpt"
    resume = shlex.quote(f"ckpt_path={last}")
    if unhealthy:
        condition = f"{ill.condition} since step {ill.started}" if ill else "a condition rank 0 found"
        raise Unhealthy(f"stopped by its health check at generator step {module.counters.g}: {condition} "
                        f"(docs/usage.md#training-health); saved in {last}: resume with the same overrides, {resume} "
                        "and health.action=warn to go on regardless, or start anew with a fix")
    raise Interrupted(f"stopped by {stopped_by} at generator step {module.counters.g}, saved in {last}: resume with "
                      f"the same overrides and {resume}", run.checkpoints.exit_code)


def log_summary(run: Training, stopped_by: str | None = None) -> None:
    """What the run did and where to look next: on the console and in the run's log file (train.log)."""
    steps, run_dir = run.module.counters.g, run.run_dir
    losses = [f"{name} {value:.4g}" for name, value in run.last_losses.items()]
    # The loop logs the last step it trains: none logged means none trained (a resume at trainer.max_steps).
    final = f"final losses {', '.join(losses)} (generator step {steps})" if losses else "no generator step trained"
    how = f"stopped by {stopped_by} after" if stopped_by else "finished:"
    log.info(f"Run {how} {steps} generator steps in {run_dir}; {final}")
    # Quoted for a shell (a run directory may hold spaces): each line can be pasted as it is.
    log.info(f"  curves and samples: tensorboard --logdir {shlex.quote(str(run_dir / 'tensorboard'))}")
    log.info(f"  metrics:            python evaluate.py {shlex.quote(f'run_dir={run_dir}')}")
    log.info(f"  the generator:      {shlex.quote(str(run_dir / snapshot.FILE))} (gan.core.snapshot.load_generator)")
