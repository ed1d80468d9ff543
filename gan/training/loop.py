"""The training loop. :func:`train` reads as a run goes -- its checks (gan/training/checks.py), its parts assembled
(gan/training/assemble.py), the generator steps, the end -- and each part of the loop is a function below it, in that
order. Lightning Fabric launches the processes (``trainer=ddp``), places the networks and chooses the precision;
the loop is written out here, step by step."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig
from torch import Tensor, nn

from gan.core import snapshot, step
from gan.core.audit import check_plain_numbers
from gan.core.distributed import broadcast_buffers
from gan.errors import ConfigError, Interrupted, RunError, Unhealthy
from gan.run.hold import TRAIN_FIX, holding
from gan.run.module import grad_norm
from gan.training.assemble import assemble
from gan.training.checks import check_writable, checked
from gan.training.fabric_adapter import every_rank, kill_other_ranks
from gan.training.host import launched_by
from gan.training.state import Training

log = logging.getLogger(__name__)


class Probe:
    """What a test or a benchmark watches a run with (``train(cfg, probes=[...])``); the run's own outputs
    are called by the loop itself. Each method is called where its name says; all do nothing here."""

    def on_start(self, run: Training) -> None: ...
    def on_step_start(self, run: Training, batch: Any) -> None: ...
    def on_step_end(self, run: Training) -> None: ...
    def on_end(self, run: Training) -> None: ...


def train(cfg: DictConfig, probes: Sequence[Probe] = ()) -> Training:
    """Train the GAN described by ``cfg`` (composed from configs/train.yaml); returns the run: its ``module``, and
    the last logged losses and metrics in ``last_losses`` and ``last_metrics``. The run directory is held while it
    trains: another process that would write there is refused (gan/run/hold.py)."""
    run_dir = Path(cfg.paths.run_dir)
    check_writable(run_dir)
    threads = torch.get_num_threads()
    try:
        with holding(run_dir, "training", TRAIN_FIX):  # train.py: takes over the hold its Hydra callback took
            # train.py, gan.train: the checks they made before anything was written, taken over
            start = checked(cfg, run_dir)
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

def run_steps(run: Training, probes: Sequence[Probe]) -> None:
    """Generator steps from the module's counter to ``trainer.max_steps``, each followed by what is due after it,
    until the last or a signal; the outputs at the end."""
    fabric, module, phases, cfg, batches = run.fabric, run.module, run.phases, run.cfg, run.batches
    to_device = (lambda batch: batch) if run.data.in_memory else fabric.to_device  # in-memory data is there already
    # Under DDP every rank must stop at the same step: agreed once per logging window, the one place a
    # step reads from the device anyway; on one process the request is read at every step, for nothing.
    agree_every = cfg.log.every if fabric.world_size > 1 else 1
    max_steps, log_every = cfg.trainer.max_steps, cfg.log.every  # plain ints: a config read costs microseconds
    status = "failed"
    try:
        at_start(run)
        for probe in probes:
            probe.on_start(run)
        stop = False
        while module.counters.g < max_steps and not stop:
            with phases.phase("data"):
                batch = next(batches)
                for probe in probes:
                    probe.on_step_start(run, batch)
                batch = to_device(batch)
            if run.audit is not None:
                run.audit.step_start()
            with run.profiler.profile("generator_step"), run.autocast():
                result = run_step(run, batch)
                with phases.phase("statistics"):
                    update_statistics(run, result)
            g = module.counters.g
            if g % agree_every == 0:
                stop = agree_to_stop(fabric, run.checkpoints.stop_requested)
            # The last step logs too: a run shorter than log.every, or stopped between logging steps, ends logged;
            # a health check reads its figures with a logging step's scalars.
            logged = g % log_every == 0 or g == max_steps or stop or run.health_due(g)
            with phases.phase("callbacks"):
                stop = after_step(run, result, g, logged, stop)
                for probe in probes:
                    probe.on_step_end(run)
            if run.step_timer is not None:  # after the callbacks: their time is in this window
                run.step_timer.after_step(g, logged)
        for probe in probes:
            probe.on_end(run)
        at_end(run)
        status = "success"
    except BaseException:
        kill_other_ranks(fabric)  # a rank that failed alone would leave the others waiting in a collective
        raise
    finally:
        close(run, status)


def at_start(run: Training) -> None:
    """Before the first step, each output started the same way: the hyper-parameters logged, the first samples, the
    metrics' and the health check's references, the audit's record of the frozen weights, the progress bar, the
    signal handlers, the clocks."""
    module = run.module
    for logger in run.loggers:
        logger.log_hyperparams(module.hparams)
    if run.zero:
        run.samples.at_start(module)
    if run.metrics is not None:
        run.metrics.at_start(module, run.data)
    if run.health is not None:
        run.health.at_start(module, run.data)
    if run.audit is not None:
        run.audit.at_start()
    if run.progress is not None:
        run.progress.at_start(module)
    run.checkpoints.at_start()
    if run.step_timer is not None:
        run.step_timer.at_start()


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


@torch.no_grad()
def update_statistics(run: Training, result: step.StepResult) -> None:
    """After a generator step: the counters, learning rates, the objective's statistics, the EMA generator
    and the augmentation probability."""
    module = run.module
    for d in result.d:
        module.counters.count_d_step()
        module.objective.observe(d)
    module.counters.count_g_step(run.batch_size * run.fabric.world_size)  # real images, over all processes
    for schedule in run.schedules:  # optim.decay=linear: one schedule per optimizer
        schedule.step()
    broadcast_buffers(module.G, module.D)  # DDP: rank 0's BatchNorm statistics on every rank, before EMA copies G's
    if module.ema is not None:
        module.ema.update(module.G, module.counters.g)
    augment = module.objective.augment
    if augment is not None and module.counters.g % augment.interval == 0:
        augment.adjust(run.batch_size * run.fabric.world_size)


def after_step(run: Training, result: step.StepResult, g: int, logged: bool, stop: bool) -> bool:
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


def log_step(run: Training, result: step.StepResult) -> None:
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
