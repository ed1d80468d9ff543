"""A run's state: the run as the loop holds it (:class:`Training`, built by gan/training/assemble.py), what a
checkpoint holds of it (:func:`training_state`), and all of that put back, in one place, when a run resumes
(:func:`resume`): the networks and their running statistics, the optimizers and schedules with this config's rates,
the loss scale, the health check's streaks and every random stream, so a resumed run draws the same noise as an
uninterrupted one. (The data order needs none: it is a function of the seed and the checkpoint's step counter.) Under
DDP, ranks > 0 are reseeded apart from rank 0 (:func:`separate_rank_streams`). What a resume may change of the
config was checked before the run started (gan/training/resume.py)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from gan.core.models import FourierFeatures
from gan.run.checkpoint import save_checkpoint
from gan.run.module import GANModule
from gan.training.fabric_adapter import load_precision_state, precision_state
from gan.training.observer import Observer
from gan.training.resume import Change

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from gan.core.phases import PhaseTimer, StepPhases
    from gan.data.loader import GANData
    from gan.training.autograd_audit import AutogradAudit
    from gan.training.checkpoints import Checkpoints
    from gan.training.guard import NonFiniteGuard
    from gan.training.health import HealthWatch
    from gan.training.outputs import Metrics, Progress, Samples
    from gan.training.timing import StepTimer

log = logging.getLogger(__name__)


@dataclass
class Training:
    """One run as the loop holds it: every part declared here, built once by gan/training/assemble.py."""

    config: dict[str, Any]  # the checked config as plain values, resolved once: a DictConfig read costs microseconds
    fabric: Fabric
    data: GANData
    loader: Iterable[tuple[Tensor, Tensor]]  # the batches from the run's generator step on (the loop draws them)
    module: GANModule  # the networks and their running statistics, placed: what a checkpoint saves
    optimizers: list[Optimizer]  # G's and D's
    schedules: list[LambdaLR]  # one per optimizer under optim.decay, else none
    scaler: Any  # float16's loss scaler (None otherwise): the optimizers step through it
    step_optimizers: tuple[Any, ...]  # what the step steps: the optimizers, through the scaler under float16
    autocast: Callable[[], AbstractContextManager[Any]]  # the precision's context (none outside mixed precision)
    G: nn.Module  # G and D as the step runs them: their DDP wrappers under trainer=ddp, else the networks
    D: nn.Module
    timer: PhaseTimer  # the step's phases, timed (timing.enabled) ...
    phases: StepPhases  # ... and recorded, for the timer, the guard, the audit and the pictures
    guard: NonFiniteGuard
    audit: AutogradAudit | None  # audit=true
    backward: Callable[[Tensor], None]  # what the step calls for each loss: its watchers, then the backward
    samples: Samples
    checkpoints: Checkpoints
    metrics: Metrics | None  # eval.every, rank 0
    step_timer: StepTimer | None  # timing.enabled
    progress: Progress | None  # the progress bar, rank 0
    profiler: Any
    health: HealthWatch | None  # health.enabled, rank 0
    # The step the loop is at, as the observers read it: whether it logged its scalars, and whether the run stops.
    logged: bool = False
    stopping: bool = False
    # What the run logged last: loss/d and loss/g, and the last evaluation's metrics/*.
    last_losses: dict[str, float] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)
    health_stopped: bool = False  # the ranks agreed to stop for rank 0's health check

    # What the loop and the outputs read of the run, named once.
    @cached_property
    def run_dir(self) -> Path:
        return Path(self.config["paths"]["run_dir"])

    @cached_property
    def zero(self) -> bool:
        return self.fabric.is_global_zero  # rank 0 logs, samples, measures and writes for every rank

    @cached_property
    def loggers(self) -> list[Any]:
        return self.fabric.loggers if self.zero else []

    @cached_property
    def d_steps(self) -> int:
        return self.config["loss"]["d_steps"]

    @cached_property
    def batch_size(self) -> int:
        return self.config["data"]["batch_size"]

    @cached_property
    def health_every(self) -> int:
        """Generator steps between health checks (0: none); every rank's, though rank 0 alone checks."""
        health = self.config["health"]
        return health["every"] if health["enabled"] else 0

    @cached_property
    def observers(self) -> list[Observer]:
        """The run's outputs, in the order each is told: the audit's checks of the step first. (The step timer,
        which times them, is told apart, after them: gan/training/loop.py.)"""
        return [o for o in (self.audit, self.checkpoints, self.samples, self.metrics, self.health, self.progress)
                if o is not None]

    def health_due(self, step: int) -> bool:
        """Whether generator step ``step`` is a health check's (a logging step, on every rank)."""
        return bool(self.health_every) and step % self.health_every == 0


def training_state(run: Training) -> dict[str, Any]:
    """What a checkpoint holds: everything an exact resume needs, as tensors and plain containers (read back
    with ``torch.load(weights_only=True)``). The keys are those of the checkpoints Lightning's Trainer
    wrote for earlier releases, which therefore resume too."""
    module = run.module
    return {
        "state_dict": module.state_dict(),
        "optimizer_states": [optimizer.state_dict() for optimizer in run.optimizers],
        "lr_schedulers": [schedule.state_dict() for schedule in run.schedules],
        "hyper_parameters": module.hparams,
        "precision": precision_state(run.fabric),  # float16's loss scale; empty otherwise
        "rng": rng_state(),
        "health": run.health.judge.state_dict() if run.health is not None else {},
    }


def write_checkpoint(run: Training, path: Path) -> None:
    """The training state to ``path`` (rank 0), once the guard has read that no bad update came before it."""
    run.guard.read()  # raises rather than let a state after a bad update be saved
    if run.zero:
        save_checkpoint(training_state(run), path)


def resume(run: Training, checkpoint: dict[str, Any], found: list[Change]) -> None:
    """Put back the state of ``checkpoint`` (read from ``ckpt_path``) into the built ``run``, after logging what the
    resume changes (``found``): the module's state, the optimizers' and schedules' with this config's rates, the
    loss scale, the health check's conditions and streaks, the record of a fine-tuning run's start, and the random
    streams."""
    restore_module(run.module, checkpoint, run.config, found)
    if (record := checkpoint["hyper_parameters"].get("init_from")) is not None:  # never read init_from again
        run.module.hparams["init_from"] = record
    for optimizer, state in zip(run.optimizers, checkpoint["optimizer_states"]):
        optimizer.load_state_dict(state)
    for schedule, state in zip(run.schedules, checkpoint.get("lr_schedulers", [])):
        schedule.load_state_dict(state)
    apply_on_resume(run.config["optim"], run.optimizers, run.schedules)  # this config's, not the checkpoint's
    load_precision_state(run.fabric, checkpoint.get("precision", {}))
    if run.health is not None and checkpoint.get("health"):  # the conditions met so far, and their streaks
        run.health.judge.load_state_dict(checkpoint["health"])
    restore_rng(checkpoint["rng"])


@torch.no_grad()
def restore_module(module: GANModule, checkpoint: dict[str, Any], composed: dict[str, Any],
                   found: list[Change]) -> None:
    """Load the state of ``checkpoint`` into ``module`` (a GANModule built from the ``composed`` config, a plain
    container, that gan/run/checkpoint.py's ``check_fits`` let through), after logging what the resume changes
    (``found``); then set on it what the config says of that state where a resume changes it on purpose
    (resume.allow_changes=true), which the checkpoint's buffers would otherwise bring back: DiffAugment's p, the
    scale of D's Fourier features, the classes of the grids' rows."""
    for c in found:  # one line per change the resume makes
        if c.kind == "refused":
            log.warning(f"resume: {c.describe()}: the run goes on with it (resume.allow_changes=true)")
        else:
            log.info(f"resume: {c.describe()}: {'applied' if c.kind == 'applied' else 'takes effect'}")
    fourier = [m for m in module.D.modules() if isinstance(m, FourierFeatures)]
    drawn = [m.frequencies.clone() for m in fourier]  # this config's, drawn at its scale from its seed
    labels = module.sample_labels.clone()  # a function of the config: a row per class trained on
    module.load_state_dict(checkpoint["state_dict"])
    changed = {c.key: c for c in found}
    augment = module.objective.augment
    if augment is not None and not augment.adaptive:  # DiffAugment's p is its setting (ADA's: fixed, schema.py)
        augment.p.fill_(float(composed["augment"]["p"]))
    if "model.d_fourier_scale" in changed:
        before, after = (float(getattr(changed["model.d_fourier_scale"], end)) for end in ("before", "after"))
        for features, fresh in zip(fourier, drawn):  # the same directions at the new scale; from 0, this config's
            features.frequencies.copy_(features.frequencies * (after / before) if before else fresh)
    if "data.classes" in changed:
        module.sample_labels.copy_(labels)


def apply_on_resume(optim: dict[str, Any], optimizers: list[Optimizer], schedules: list[LambdaLR]) -> None:
    """Set the learning rates, betas and ``fused`` of ``optim`` (the composed config's ``optim`` section) on G's and
    D's ``optimizers`` and the base learning rates of their ``schedules`` (none, or one each), once both are
    restored from the checkpoint, whose parameter groups hold the options it was trained with. A schedule's current
    rate is its factor at the restored step times the new base rate: optim.decay=linear goes on along the new line."""
    for k, (optimizer, settings) in enumerate(zip(optimizers, [optim["g"], optim["d"]])):
        schedule = schedules[k] if schedules else None
        lr = float(settings["lr"])
        state = optimizer.state_dict()
        if schedule is not None:
            schedule.base_lrs = [lr] * len(state["param_groups"])
        for i, group in enumerate(state["param_groups"]):
            if "initial_lr" in group:  # set by a schedule: the rate it started from
                group["initial_lr"] = lr
            group["lr"] = lr if schedule is None else schedule.base_lrs[i] * schedule.lr_lambdas[i](schedule.last_epoch)
            if "betas" in group and "betas" in settings:
                group["betas"] = tuple(float(b) for b in settings["betas"])
            if "fused" in group and "fused" in settings:
                group["fused"] = bool(settings["fused"])
        optimizer.load_state_dict(state)  # torch keeps each state as its group's options need (fused: on the device)
        if schedule is not None:
            schedule._last_lr = [group["lr"] for group in optimizer.param_groups]  # what get_last_lr() returns


def rng_state() -> dict[str, Any]:
    """torch's (CPU and CUDA), numpy's and Python's RNG states, as a checkpoint's ``rng`` holds them."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": numpy_state_to_plain(np.random.get_state()),
        "python": random.getstate(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Every stream as :func:`rng_state` saved it; the last of a resume's state put back (:func:`resume`)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(plain_to_numpy_state(state["numpy"]))
    random.setstate(state["python"])


def separate_rank_streams(rank: int) -> None:
    """Under DDP every rank starts from the same seed (and a resume restores rank 0's state on all of them);
    reseed ranks > 0 so the global batch of fakes is not world_size copies of one. Rank 0 keeps its stream:
    a single-process run is unaffected."""
    if rank > 0:
        torch.manual_seed(int(torch.randint(2**62, ())) + rank)


def numpy_state_to_plain(state: tuple) -> tuple:
    # weights_only loading accepts tensors and builtins, not numpy arrays.
    return (state[0], torch.from_numpy(state[1].astype(np.int64)), *state[2:])


def plain_to_numpy_state(state: tuple) -> tuple:
    return (state[0], state[1].numpy().astype(np.uint32), *state[2:])
