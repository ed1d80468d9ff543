"""The training loop. :func:`train` reads as a run goes -- its checks (gan/training/checks.py), its parts assembled
(gan/training/assemble.py), the generator steps (:func:`run_steps`, here), the end (gan/training/run_end.py) -- and
each step reads the same way: its batch, the step itself (gan/core/step.py), the running statistics that follow it
(gan/run/module.py), and what is due after it (gan/training/after_step.py). Lightning Fabric launches the processes
(``trainer=ddp``), places the networks and chooses the precision; the loop is written out here, step by step."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from gan.core import step
from gan.errors import ConfigError, RunError
from gan.run.hold import TRAIN_FIX, holding
from gan.training.after_step import after_step, agree_to_stop
from gan.training.assemble import assemble
from gan.training.checks import Start, check_before_writing, check_writable
from gan.training.fabric_adapter import kill_other_ranks
from gan.training.host import launched_by
from gan.training.observer import Observer
from gan.training.run_end import at_end, close, close_after_error, finish
from gan.training.state import Training


def train(cfg: DictConfig, probes: Sequence[Observer] = (), start: Start | None = None) -> Training:
    """Train the GAN described by ``cfg`` (composed from configs/train.yaml); returns the run: its ``module``, and
    the last logged losses and metrics in ``last_losses`` and ``last_metrics``. ``probes``: what a test or a
    benchmark watches the run with, told after the run's own outputs (gan/training/observer.py). ``start``: the
    checks of ``cfg`` made before anything was written (gan/training/checks.py), or None to make them now. The run
    directory is held while it trains: another process that would write there is refused (gan/run/hold.py)."""
    run_dir = Path(cfg.paths.run_dir)
    check_writable(run_dir)
    threads = torch.get_num_threads()
    try:
        with holding(run_dir, "training", TRAIN_FIX):  # train.py: takes over the hold its Hydra callback took
            if start is None:  # train.py: its Hydra callback's checks keep nothing; the loop's are the run's
                start = check_before_writing(cfg, run_dir)
            run = assemble(start)
            run_steps(run, probes)
            return finish(run)
    finally:
        torch.set_num_threads(threads)  # train.threads is the run's: a notebook or a test suite keeps its own count


def train_task(cfg: DictConfig) -> float | None:
    """train.py's task: :func:`train`, returning to Hydra the last logged value of ``cfg.metric`` (None when
    unset), which a sweeper such as Optuna's optimises."""
    if cfg.get("metric") is None and "optuna" in str(launched_by("sweeper").get("_target_", "")):
        raise ConfigError("hydra/sweeper=optuna optimises the number train.py returns: set metric=<a logged scalar>, "
                          "e.g. metric=metrics/fid eval.every=<trainer.max_steps>, or use a preset: search=ring")
    run = train(cfg)
    if cfg.get("metric") is None or not run.zero:  # DDP: rank 0 alone measures, and reports
        return None
    return returned_metric(run, cfg.metric)


def returned_metric(run: Training, name: str) -> float:
    """The last logged value of ``name`` (``loss/d``, ``loss/g`` or ``metrics/<name>``); a RunError if the run
    never logged it."""
    logged = {**run.last_losses, **run.last_metrics}
    if name not in logged:
        names = ", ".join(sorted(logged)) or "nothing"
        raise RunError(f"metric={name} was not logged by this run (it logged {names}): choose one of those")
    return logged[name]


# --- the generator steps --------------------------------------------------------------------------------------

def run_steps(run: Training, probes: Sequence[Observer]) -> None:
    """Generator steps from the module's counter to ``trainer.max_steps``, each followed by what is due after it,
    until the last or a signal; the outputs at the end. Each observer (the run's outputs, then ``probes``) is told
    of each."""
    fabric, module, phases, config = run.fabric, run.module, run.phases, run.config
    batches = iter(run.loader)  # data workers, where the run has them, start here
    to_device = (lambda batch: batch) if run.data.in_memory else fabric.to_device  # in-memory data is there already
    # Under DDP every rank must stop at the same step: agreed once per logging window, the one place a
    # step reads from the device anyway; on one process the request is read at every step, for nothing.
    log_every, max_steps = config["log"]["every"], config["trainer"]["max_steps"]
    agree_every = log_every if fabric.world_size > 1 else 1
    images = run.batch_size * fabric.world_size  # real images a generator step takes, over all processes
    observers, clock = [*run.observers, *probes], run.step_timer
    try:
        for logger in run.loggers:
            logger.log_hyperparams(module.hparams)
        for observer in observers:
            observer.on_start(run)
        if clock is not None:  # last: its clock starts with the steps
            clock.on_start(run)
        while module.counters.g < max_steps and not run.stopping:
            with phases.phase("data"):
                batch = next(batches)
                for observer in observers:
                    observer.on_step_start(run, batch)
                batch = to_device(batch)
            with run.profiler.profile("generator_step"), run.autocast():
                result = run_step(run, batch)
                with phases.phase("statistics"):
                    module.update_statistics(result, images)
                    for schedule in run.schedules:  # optim.decay=linear: one schedule per optimizer
                        schedule.step()
            g = module.counters.g
            if g % agree_every == 0:
                run.stopping = agree_to_stop(fabric, run.checkpoints.stop_requested)
            # The last step logs too: a run shorter than log.every, or stopped between logging steps, ends logged;
            # a health check reads its figures with a logging step's scalars.
            run.logged = g % log_every == 0 or g == max_steps or run.stopping or run.health_due(g)
            with phases.phase("callbacks"):
                after_step(run, result, observers)
            if clock is not None:  # after the callbacks' phase: their time is in this window
                clock.on_step_end(run)
        at_end(run, observers)
    except BaseException:
        kill_other_ranks(fabric)  # a rank that failed alone would leave the others waiting in a collective
        close_after_error(run, observers)
        raise
    close(run, observers, "success")


def run_step(run: Training, batch: tuple[Tensor, Tensor]) -> step.StepResult:
    """One generator step on ``batch``: ``loss.d_steps`` D updates, then G's (gan/core/step.py)."""
    module, objective, scaler, d_steps = run.module, run.module.objective, run.scaler, run.d_steps
    images = batch[0].contiguous(memory_format=torch.channels_last) if module.channels_last else batch[0]
    reals = images.chunk(d_steps)
    kind = module.condition.kind
    labels = ([module.latent_code(len(real)) for real in reals] if kind == "code" else
              batch[1].chunk(d_steps) if kind == "classes" else [None] * d_steps)
    # One (noise, real, labels) per D update; the last batch's G forward also serves G's update.
    batches = [step.Batch(module.noise(len(real)), real, y) for real, y in zip(reals, labels)]
    done = module.counters.d  # the run's D updates before this step: its k-th is the run's number done + k

    def d_loss(D: nn.Module, real: Tensor, fake: Tensor, y: Tensor | None, k: int) -> tuple[Tensor, ...]:
        # The penalties' inner backward is scaled like the loss under float16 (a device tensor: no sync).
        scale = (scaler.scale(torch.ones((), device=module.device))
                 if scaler is not None and objective.needs_loss_scale(done + k) else None)
        return objective.d_loss(D, real, fake, y, done + k, scale)

    opt_g, opt_d = run.step_optimizers
    return step.generator_step(run.G, run.D, opt_g, opt_d, batches, d_loss, objective.g_loss, run.backward,
                               run.phases.phase)


