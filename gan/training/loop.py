"""The training loop. :func:`train` reads as a run goes -- its checks, the build, the resume, the generator
steps, the end -- and each part is a function below it, in that order.

On Lightning Fabric, which launches the processes (``trainer=ddp``), places the networks, wraps each for
DDP and chooses the precision, from the ``trainer.*`` keys. Everything else is decided once, before the
first step, so that a step pays only for what the run asked for: no wrapper on one device, the loss
scaler only under float16, the autocast context only under mixed precision.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from gan.config.eval_settings import EvalSettings
from gan.core import snapshot, step
from gan.core.audit import check_plain_numbers
from gan.core.distributed import broadcast_buffers
from gan.core.health import HealthJudge
from gan.core.models import g_condition
from gan.core.phases import PhaseTimer, StepPhases
from gan.data.datasets import data_shape, held_out, is_points, mixture_means, num_classes, population
from gan.data.loader import GANData
from gan.errors import ConfigError, Interrupted, RunError, Unhealthy
from gan.evaluation.pictures import real_points_for_plot
from gan.run.build import build_module, build_optimizers
from gan.run.checkpoint import save_checkpoint
from gan.run.finetune import start_from
from gan.run.hold import TRAIN_FIX, holding
from gan.run.module import GANModule, grad_norm
from gan.training.autograd_audit import AutogradAudit
from gan.training.checks import SEPARATE_DDP, Start, check_writable, checked
from gan.training.fabric_adapter import (
    autocast,
    every_rank,
    kill_other_ranks,
    load_precision_state,
    loss_scaler,
    placed,
    precision_state,
    wrapped,
)
from gan.training.guard import NonFiniteGuard
from gan.training.health import HealthWatch
from gan.training.host import launched_by, prepare_host, slow_bf16_warning
from gan.training.loggers import build_loggers, summary_writer
from gan.training.outputs import Checkpoints, Metrics, Progress, Samples
from gan.training.profiling import build_profiler
from gan.training.resume import apply_on_resume, restore
from gan.training.rng import restore_rng, rng_state, separate_rank_streams
from gan.training.timing import StepTimer

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
            prepare_host(start.cfg.train.threads, start.cfg.trainer.devices)
            run = build(start)
            resume(run, start)
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


# --- the build: processes, data, networks, optimizers, and what watches the step ------------------------------

class Training:
    """One run as the loop holds it, built by :func:`build`: its config (``cfg``, and ``container``: the same
    as plain values), Fabric, the data, ``module`` (the networks and their state, as saved), the optimizers and
    schedules, ``G`` and ``D`` as the step runs them (their DDP wrappers under trainer=ddp, else the networks
    themselves), the step's record of its phases and the timer reading it, the run's outputs, and what it logged
    last (``last_losses``: loss/d and loss/g; ``last_metrics``: the last evaluation's metrics/*)."""

    def __init__(self, cfg: DictConfig, container: dict[str, Any], fabric: Fabric, data: GANData, module: GANModule):
        self.cfg, self.container = cfg, container
        self.run_dir = Path(cfg.paths.run_dir)
        self.fabric, self.data, self.module = fabric, data, module
        self.zero = fabric.is_global_zero  # rank 0 logs, samples, measures and writes for every rank
        self.loggers = fabric.loggers if self.zero else []
        # What the step reads each time, as plain values: a config read costs microseconds.
        self.d_steps, self.batch_size = cfg.loss.d_steps, cfg.data.batch_size
        # Generator steps between health checks (0: none); every rank's, though rank 0 alone checks.
        self.health_every = cfg.health.every if cfg.health.enabled else 0
        self.health_stopped = False  # the ranks agreed to stop for rank 0's health check
        self.progress: Progress | None = None  # the console's progress bar, made as the steps start
        self.last_losses: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}

    def health_due(self, step: int) -> bool:
        """Whether generator step ``step`` is a health check's (a logging step, on every rank)."""
        return bool(self.health_every) and step % self.health_every == 0


def build(start: Start) -> Training:
    """Everything a run trains with, from its checked config: each piece in the order the next needs it."""
    cfg = start.cfg
    container = OmegaConf.to_container(cfg, resolve=True)
    fabric = build_fabric(container["trainer"], build_loggers(container.get("logger") or {}))
    fabric.launch()  # trainer=ddp on one node: starts the other ranks, each running this same command
    fabric.seed_everything(cfg.seed, workers=True, verbose=False)
    data = GANData(container["data"], cfg.data.batch_size, cfg.loss.d_steps, cfg.seed, start.dataset)
    module, lines = networks(start, container, data)
    run = Training(cfg, container, fabric, data, module)
    if run.zero:
        for line in lines:
            log.info(line)
    place(run)
    observe(run)
    return run


def networks(start: Start, container: dict[str, Any], data: GANData) -> tuple[GANModule, list[str]]:
    """The run's module -- restored from the checkpoint (a resume), fine-tuned from another run's weights with its
    frozen blocks (as the checks built it), or new from the run's seed -- and what fine-tuning logs."""
    if start.fine_tuned is not None:  # built by the checks from the run's seed: the same networks, built once
        torch.set_rng_state(start.fine_tuned.rng)  # the random stream where building them left it
        return start.fine_tuned.module, start.fine_tuned.lines
    # What G takes beside its noise, and which of the data's classes it trains on.
    condition = g_condition(container["model"], num_classes(data.dataset), container["data"].get("classes"))
    module = build_module(container, data_shape(container["data"]), condition)
    if start.checkpoint is not None:  # the state first: fine-tuning freezes blocks of the restored networks
        restore(module, start.checkpoint, start.cfg.ckpt_path, container, start.changes)
    # Fine-tuning: another run's weights (unless resuming), then the frozen blocks, before the optimizers exist.
    return module, start_from(module, container, start.checkpoint)


def build_fabric(trainer: dict[str, Any], loggers: list[Any]) -> Fabric:
    """Fabric from the ``trainer.*`` keys (accelerator, devices, num_nodes, strategy, precision)."""
    strategy = trainer["strategy"]
    if strategy == SEPARATE_DDP:
        # Rank 0's buffers are copied to the others once per step (gan.core.distributed.broadcast_buffers),
        # not at each of the step's four forwards.
        strategy = DDPStrategy(broadcast_buffers=False)
    return Fabric(accelerator=trainer["accelerator"], devices=trainer["devices"], num_nodes=trainer["num_nodes"],
                  strategy=strategy, precision=trainer["precision"], loggers=loggers)


def place(run: Training) -> None:
    """The networks on their device in their precision, their optimizers, and G and D as the step runs them."""
    fabric, cfg = run.fabric, run.cfg
    if run.zero:
        log.info(f"networks:\n{describe_networks(run.module)}")
        if warning := slow_bf16_warning(fabric.device, str(cfg.trainer.precision)):
            log.warning(warning)
    module = run.module
    if cfg.trainer.get("sync_batchnorm", False):  # trainer=ddp's key
        module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
    run.module = module = placed(fabric, module)
    run.optimizers, run.schedules = build_optimizers(module, run.container["optim"], cfg.trainer.max_steps)
    run.scaler = loss_scaler(fabric)
    # Under float16 the optimizers step through the scaler (unscale, skip a non-finite step, update the scale).
    run.step_optimizers = fabric.setup_optimizers(*run.optimizers) if run.scaler is not None else tuple(run.optimizers)
    run.autocast = autocast(fabric)
    # trainer=ddp: one DistributedDataParallel each for G and D (see configs/trainer/ddp.yaml for why).
    run.G, run.D = wrapped(fabric, module.G), wrapped(fabric, module.D)


def observe(run: Training) -> None:
    """What watches the step, each attached once: the phase record (which the timer, the guard, the audit and
    the pictures read), the non-finite guard and the audit (on the optimizers' steps), and the run's outputs."""
    fabric, cfg, module, run_dir = run.fabric, run.cfg, run.module, run.run_dir
    run.timer = PhaseTimer(cfg.timing.enabled, cfg.timing.sync, fabric.device)
    run.phases = phases = StepPhases(run.timer)
    phases.profiled = cfg.trainer.profiler == "pytorch"  # each phase a labelled range in its traces
    run.guard = guard = NonFiniteGuard(cfg.train.skip_nonfinite, module.counters, run.d_steps, run.scaler,
                                       lambda ok: every_rank(fabric, ok, all=True))
    for optimizer in run.optimizers:  # before the audit's hooks: the audit sees the guard's verdict
        optimizer.register_step_pre_hook(lambda o, args, kwargs: guard.judge(o, phases.network, phases.d_update))
    run.audit = AutogradAudit(module, *run.optimizers, phases, run.d_steps, run.scaler) if cfg.audit else None
    points = is_points(module.data_shape)
    run.samples = Samples(cfg.log.sample_every, run_dir / "samples", summary_writer(run.loggers), run.zero,
                          real_points_for_plot(run.data.dataset) if points else None,
                          mixture_means(cfg.data.name) if points else None)
    # What sees each backward: the guard (the loss it judges), the audit, the pictures of the autograd graph.
    watchers = [w for w in (guard, run.audit, run.samples) if w is not None]
    scaler = run.scaler

    def backward(loss: Tensor) -> None:  # made once: the step calls it twice per generator step and more
        for watcher in watchers:
            watcher.before_backward(loss, phases.network)
        if scaler is not None:
            fabric.backward(loss)  # the loss scaled first
        else:
            loss.backward()

    run.backward = backward
    run.checkpoints = Checkpoints(run_dir / "checkpoints", cfg.checkpoint.every, cfg.checkpoint.keep,
                                  lambda path: write_checkpoint(run, path), run.zero, lambda: kill_other_ranks(fabric))
    run.metrics = (Metrics(cfg.eval.every, EvalSettings.from_config(cfg.eval, cfg.data.name), cfg.seed, run.loggers)
                   if cfg.eval.every and run.zero else None)
    run.step_timer = (StepTimer(run.timer, cfg.data.batch_size * fabric.world_size, run.loggers)
                      if cfg.timing.enabled else None)
    run.profiler = build_profiler(cfg.trainer.profiler, run_dir, fabric.local_rank)
    health, judged_from = cfg.health, round(cfg.health.start * cfg.trainer.max_steps)
    run.health = (HealthWatch(health.action, HealthJudge(judged_from, health.patience), health.examples, run_dir,
                              summary_writer(run.loggers)) if health.enabled and run.zero else None)


def resume(run: Training, start: Start) -> None:
    """The batches from the module's generator step on, then where the checkpoint left off (a resume): the
    optimizers' and schedules' state, with this config's rates, the loss scale, and the random streams; then each
    rank's own streams."""
    fabric, checkpoint = run.fabric, start.checkpoint
    run.batches = iter(run.data.loader(run.module.counters.g, fabric.global_rank, fabric.world_size, fabric.device))
    if checkpoint is not None:
        for optimizer, state in zip(run.optimizers, checkpoint["optimizer_states"]):
            optimizer.load_state_dict(state)
        for schedule, state in zip(run.schedules, checkpoint.get("lr_schedulers", [])):
            schedule.load_state_dict(state)
        apply_on_resume(run.container["optim"], run.optimizers, run.schedules)  # this config's, not the checkpoint's
        load_precision_state(fabric, checkpoint.get("precision", {}))
        restore_rng(checkpoint["rng"])
        if run.health is not None and checkpoint.get("health"):  # the conditions met so far, and their streaks
            run.health.judge.load_state_dict(checkpoint["health"])
    separate_rank_streams(fabric.global_rank)


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
    """Before the first step: the hyper-parameters logged, the first samples, the metrics' references, the progress
    bar, the signal handlers, the clocks."""
    module, cfg = run.module, run.cfg
    for logger in run.loggers:
        logger.log_hyperparams(module.hparams)
    if run.zero:
        run.samples.at_start(module)
    data = run.container["data"]
    if run.metrics is not None:
        measured = run.data.dataset if data.get("limit") is None else population(data, cfg.seed)
        run.metrics.at_start(module, data, measured)
    if run.health is not None:
        run.health.at_start(module, run.data.dataset, held_out(data, cfg.seed), cfg.seed)
    run.progress = Progress(cfg.trainer.max_steps, module.counters.g) if cfg.trainer.enable_progress_bar and run.zero \
        else None
    run.checkpoints.catch_signals()
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
            run.health_stopped = every_rank(run.fabric, ill, all=False) if run.fabric.world_size > 1 else ill
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
    """Whether any rank was asked to stop (a signal): one all-reduce of one number under DDP, none on one process."""
    return every_rank(fabric, requested, all=False) if fabric.world_size > 1 else requested


# --- the end ---------------------------------------------------------------------------------------------------

def at_end(run: Training) -> None:
    """After the last step: last.ckpt, the last samples, the generator's snapshot."""
    run.guard.read()
    run.checkpoints.at_end(run.module.counters.g)
    run.samples.at_end(run.module)
    if run.zero:
        snapshot.save_snapshot(run.run_dir / snapshot.FILE, run.module.snapshot())
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


def write_checkpoint(run: Training, path: Path) -> None:
    """The training state to ``path`` (rank 0), once the guard has read that no bad update came before it."""
    run.guard.read()  # raises rather than let a state after a bad update be saved
    if run.zero:
        save_checkpoint(training_state(run), path)


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


def describe_networks(module: GANModule) -> str:
    """One line per part of the module: its class, parameters, and how many of them train."""
    lines = []
    for name, part in module.named_children():
        total = sum(p.numel() for p in part.parameters())
        trainable = sum(p.numel() for p in part.parameters() if p.requires_grad)
        lines.append(f"  {name:<10} {type(part).__name__:<22} {total:>10,} parameters, {trainable:,} trainable")
    return "\n".join(lines)


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
