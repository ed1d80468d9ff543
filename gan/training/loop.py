"""The training loop: :func:`train` builds a run from its composed config, resumes it where asked, then runs
generator steps (gan/core/step.py) to ``trainer.max_steps`` and writes what is due after each.

On Lightning Fabric, which launches the processes (``trainer=ddp``), places the networks, wraps each for
DDP and chooses the precision, from the ``trainer.*`` keys. Everything else is decided once, before the
first step, so that a step pays only for what the run asked for: no wrapper on one device, the loss
scaler only under float16, the autocast context only under mixed precision.
"""

from __future__ import annotations

import logging
import shlex
import signal
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins import Precision
from lightning.fabric.strategies import DDPStrategy
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from gan.core import snapshot, step
from gan.core.audit import check_plain_numbers
from gan.core.distributed import broadcast_buffers
from gan.core.models import g_condition
from gan.core.phases import PhaseTimer, StepPhases
from gan.data.datasets import data_shape, is_points, mixture_means, num_classes, population
from gan.data.module import GANData
from gan.errors import ConfigError, Interrupted, RunError
from gan.evaluation.pictures import real_points_for_plot
from gan.run.build import build_module
from gan.run.checkpoint import read_checkpoint, save_checkpoint
from gan.run.finetune import start_from
from gan.run.hold import TRAIN_FIX, holding
from gan.run.module import GANModule, grad_norm
from gan.run.settings import EvalSettings
from gan.training.audit import AutogradAudit
from gan.training.checks import SEPARATE_DDP, check_resumable, check_run_dir, check_writable, config_changes, validate
from gan.training.guard import NonFiniteGuard
from gan.training.host import launched_by, no_gpu_probe_per_step, slow_bf16_warning, torch_threads
from gan.training.loggers import build_loggers, summary_writer
from gan.training.outputs import Checkpoints, Metrics, Progress, Samples
from gan.training.profiling import build_profiler
from gan.training.resume import apply_on_resume, check_changes, log_changes, restore
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


class Training:
    """The parts of one training run as the loop holds them: ``module`` (the networks and their state, as
    saved), the optimizers and schedules, ``G`` and ``D`` as the step runs them (their DDP wrappers under
    trainer=ddp, else the networks themselves), the step's record of its phases and the timer reading it."""

    def __init__(self, fabric: Fabric, module: GANModule, optimizers: list[Any], schedules: list[Any],
                 G: nn.Module, D: nn.Module, phases: StepPhases, timer: PhaseTimer):
        self.fabric, self.module, self.optimizers, self.schedules = fabric, module, optimizers, schedules
        self.G, self.D, self.phases, self.timer = G, D, phases, timer
        self.step_optimizers = tuple(optimizers)  # as the step steps them (through the loss scaler under float16)


def train(cfg: DictConfig, probes: Sequence[Probe] = ()) -> GANModule:
    """Train the GAN described by ``cfg`` (composed from configs/train.yaml); returns its module, with the
    last logged losses and metrics in ``module.last_losses`` and ``module.last_metrics``. The run directory
    is held while it trains: another process that would write there is refused (gan/run/hold.py)."""
    run_dir = Path(cfg.paths.run_dir)
    check_writable(run_dir)
    threads = torch.get_num_threads()
    try:
        with holding(run_dir, "training", TRAIN_FIX):  # train.py: takes over the hold its Hydra callback took
            return fit(cfg, probes)
    finally:
        torch.set_num_threads(threads)  # train.threads is the run's: a notebook or a test suite keeps its own count


def fit(cfg: DictConfig, probes: Sequence[Probe]) -> GANModule:
    """:func:`train`, in its held run directory."""
    cfg = validate(cfg)
    run_dir = Path(cfg.paths.run_dir)
    check_run_dir(run_dir, cfg.ckpt_path)
    check_writable(run_dir)
    no_gpu_probe_per_step()
    threads, why = torch_threads(cfg.train.threads, cfg.trainer.devices)
    if threads is not None:
        torch.set_num_threads(threads)
        log.info(f"torch threads: {threads} ({why})")
    container = OmegaConf.to_container(cfg, resolve=True)

    # --- build: processes, data, networks, optimizers ------------------------------------------------
    fabric = build_fabric(container["trainer"], build_loggers(container.get("logger") or {}))
    fabric.launch()  # trainer=ddp on one node: starts the other ranks, each running this same command
    fabric.seed_everything(cfg.seed, workers=True, verbose=False)
    data = GANData(container["data"], cfg.train.batch_size, cfg.train.d_steps, cfg.seed)
    # What G takes beside its noise, and which of the data's classes it trains on.
    condition = g_condition(container["model"], num_classes(data.dataset), container["data"].get("classes"))
    module = build_module(container, data_shape(container["data"]), condition)
    module.global_rank = fabric.global_rank
    checkpoint = None
    if cfg.ckpt_path is not None:
        checkpoint = read_checkpoint(cfg.ckpt_path, "ckpt_path")
        check_changes(config_changes(checkpoint, container), cfg)  # train.py's line first, as it refuses a change
        found = check_resumable(module, cfg)
        log_changes(found)
        restore(module, checkpoint, container, found)  # with what the config changes of the restored state
    # Fine-tuning: another run's weights (unless resuming), then the frozen blocks, before the optimizers exist.
    for line in start_from(module, container, checkpoint):
        if fabric.is_global_zero:
            log.info(line)
    if fabric.is_global_zero:
        log.info(f"networks:\n{describe_networks(module)}")
    precision = fabric.strategy.precision
    if fabric.is_global_zero and (warning := slow_bf16_warning(fabric.device, str(cfg.trainer.precision))):
        log.warning(warning)
    if cfg.trainer.get("sync_batchnorm", False):  # trainer=ddp's key
        module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
    module = precision.convert_module(module).to(fabric.device)  # *-true precisions: the weights in that dtype
    optimizers, schedules = module.configure_optimizers()
    if checkpoint is not None:
        for optimizer, state in zip(optimizers, checkpoint["optimizer_states"]):
            optimizer.load_state_dict(state)
        for schedule, state in zip(schedules, checkpoint.get("lr_schedulers", [])):
            schedule.load_state_dict(state)
        apply_on_resume(container["optim"], optimizers, schedules)  # this config's rates, not the checkpoint's
        precision.load_state_dict(checkpoint.get("precision", {}))
    # trainer=ddp: one DistributedDataParallel each for G and D (see configs/trainer/ddp.yaml for why).
    ddp = isinstance(fabric.strategy, DDPStrategy)
    G, D = (fabric.strategy.setup_module(module.G), fabric.strategy.setup_module(module.D)) if ddp else \
        (module.G, module.D)
    timer = PhaseTimer(cfg.timing.enabled, cfg.timing.sync, fabric.device)
    phases = StepPhases(timer)  # which update runs, for the guard, the audit and the pictures; the timer reads it
    run = Training(fabric, module, optimizers, schedules, G, D, phases, timer)

    # --- what the step calls, decided once -----------------------------------------------------------
    scaler = getattr(precision, "scaler", None)  # float16's GradScaler (trainer.precision=16-mixed), else None
    # Under float16 the optimizers step through the scaler (unscale, skip a non-finite step, update the scale).
    if scaler is not None:
        run.step_optimizers = fabric.setup_optimizers(*optimizers)
    autocast = nullcontext if type(precision) is Precision else precision.forward_context  # 32-true: none
    loggers = fabric.loggers if fabric.is_global_zero else []
    guard = NonFiniteGuard(cfg.train.skip_nonfinite, module.counters, module.d_steps, scaler,
                           lambda ok: fabric.strategy.reduce_boolean_decision(ok, all=True))
    for optimizer in optimizers:  # before the audit's hooks: the audit sees the guard's verdict
        optimizer.register_step_pre_hook(lambda o, args, kwargs: guard.judge(o, phases.network, phases.d_update))
    checker = AutogradAudit(module, *optimizers, phases, scaler) if cfg.audit else None
    writer = summary_writer(loggers)
    points = is_points(module.data_shape)
    samples = Samples(cfg.log.sample_every, run_dir / "samples", writer, fabric.is_global_zero,
                      real_points_for_plot(data.dataset) if points else None,
                      mixture_means(cfg.data.name) if points else None)

    def backward(loss: Tensor) -> None:
        guard.before_backward(loss)
        if checker is not None:
            checker.before_backward(loss)
        samples.before_backward(loss, phases.network)
        if scaler is not None:
            fabric.backward(loss)  # the loss scaled first
        else:
            loss.backward()

    def write_checkpoint(path: Path) -> None:
        guard.read()  # raises rather than let a state after a bad update be saved
        if fabric.is_global_zero:
            save_checkpoint(training_state(run), path)

    checkpoints = Checkpoints(run_dir / "checkpoints", cfg.checkpoint.every, cfg.checkpoint.keep, write_checkpoint,
                              fabric.is_global_zero, lambda: kill_other_ranks(fabric))
    metrics = (Metrics(cfg.eval.every, EvalSettings.from_config(cfg.eval, cfg.data.name), cfg.seed, loggers)
               if cfg.eval.every else None)
    step_timer = StepTimer(timer, cfg.train.batch_size * fabric.world_size, loggers) \
        if cfg.timing.enabled else None
    profiler = build_profiler(cfg.trainer.profiler, run_dir, fabric.local_rank)
    phases.labels = cfg.trainer.profiler == "pytorch"  # each phase a labelled range in its traces

    # --- resume where the checkpoint left off, then the generator steps -----------------------------
    start = module.counters.g
    batches = iter(data.loader(start, fabric.global_rank, fabric.world_size, fabric.device))
    to_device = (lambda batch: batch) if data.in_memory else fabric.to_device  # in-memory data is there already
    if checkpoint is not None:
        restore_rng(checkpoint["rng"])
    separate_rank_streams(fabric.global_rank)
    # Under DDP every rank must stop at the same step: agreed once per logging window, the one place a
    # step reads from the device anyway; on one process the request is read at every step, for nothing.
    agree_every = cfg.log.every if fabric.world_size > 1 else 1
    for logger in loggers:
        logger.log_hyperparams(module.hparams)
    if fabric.is_global_zero:
        samples.at_start(module)
        if metrics is not None:
            measured = data.dataset if cfg.data.get("limit") is None else population(container["data"], cfg.seed)
            metrics.at_start(module, container["data"], measured)
    progress = Progress(cfg.trainer.max_steps, start) if cfg.trainer.enable_progress_bar and fabric.is_global_zero \
        else None
    max_steps, log_every = cfg.trainer.max_steps, cfg.log.every  # plain ints: a config read costs microseconds
    checkpoints.catch_signals()
    status = "failed"
    try:
        for probe in probes:
            probe.on_start(run)
        if step_timer is not None:
            step_timer.at_start()
        stop = False
        while module.counters.g < max_steps and not stop:
            batch = next(batches)
            for probe in probes:
                probe.on_step_start(run, batch)
            batch = to_device(batch)
            timer.stop("data")
            if checker is not None:
                checker.step_start()
            with profiler.profile("generator_step"), autocast():
                result = generator_step(run, batch, backward, scaler)
                with phases.phase("statistics"):
                    update_statistics(run, result)
            timer.start("callbacks")  # what is due after the step, closed by the StepTimer
            g = module.counters.g
            if g % agree_every == 0:
                stop = agree_to_stop(fabric, checkpoints.stop_requested)
            # The last step logs too: a run shorter than log.every, or stopped between logging steps, ends logged.
            logged = g % log_every == 0 or g == max_steps or stop
            if logged:
                guard.read()  # a bad update stops the run before it is logged
                log_step(module, result, loggers)
            if checker is not None:
                checker.step_end()
            checkpoints.after_step(g, stop)
            samples.after_step(module)
            if metrics is not None and fabric.is_global_zero:
                metrics.after_step(module)
                module.last_metrics = metrics.last
            if step_timer is not None:
                step_timer.after_step(g, logged)
            if progress is not None:
                progress.after_step(module.last_losses, logged)
            for probe in probes:
                probe.on_step_end(run)
        for probe in probes:
            probe.on_end(run)
        guard.read()
        checkpoints.at_end(module.counters.g)
        samples.at_end(module)
        if fabric.is_global_zero:
            snapshot.save_snapshot(run_dir / snapshot.FILE, module.snapshot())
        status = "success"
    except BaseException:
        kill_other_ranks(fabric)  # a rank that failed alone would leave the others waiting in a collective
        raise
    finally:
        checkpoints.restore_handlers()
        if checker is not None:
            checker.close()
        if progress is not None:
            progress.close()
        profiler.describe()
        for logger in loggers:
            logger.finalize(status)
    if fabric.is_global_zero:
        log_summary(module, run_dir, checkpoints.stopped_by)
    if checkpoints.stopped_by:
        last = run_dir / "checkpoints" / "last.ckpt"
        raise Interrupted(f"stopped by {checkpoints.stopped_by} at generator step {module.counters.g}, saved in "
                          f"{last}: resume with the same overrides and {shlex.quote(f'ckpt_path={last}')}",
                          checkpoints.exit_code)
    return module


def train_task(cfg: DictConfig) -> float | None:
    """train.py's task: :func:`train`, returning to Hydra the last logged value of ``cfg.metric`` (None when
    unset), which a sweeper such as Optuna's optimises."""
    if cfg.get("metric") is None and "optuna" in str(launched_by("sweeper").get("_target_", "")):
        raise ConfigError("hydra/sweeper=optuna optimises the number train.py returns: set metric=<a logged scalar>, "
                          "e.g. metric=metrics/fid eval.every=<trainer.max_steps>, or use a preset: search=ring")
    module = train(cfg)
    if cfg.get("metric") is None or module.global_rank != 0:  # DDP: rank 0 alone measures, and reports
        return None
    return returned_metric(module, cfg.metric)


def returned_metric(module: GANModule, name: str) -> float:
    """The last logged value of ``name`` (``loss/d``, ``loss/g`` or ``metrics/<name>``); a RunError if the run
    never logged it."""
    logged = {**module.last_losses, **module.last_metrics}
    if name not in logged:
        names = ", ".join(sorted(logged)) or "nothing"
        raise RunError(f"metric={name} was not logged by this run (it logged {names}): choose one of those")
    return logged[name]


def build_fabric(trainer: dict[str, Any], loggers: list[Any]) -> Fabric:
    """Fabric from the ``trainer.*`` keys (accelerator, devices, num_nodes, strategy, precision)."""
    strategy = trainer["strategy"]
    if strategy == SEPARATE_DDP:
        # Rank 0's buffers are copied to the others once per step (gan.core.distributed.broadcast_buffers),
        # not at each of the step's four forwards.
        strategy = DDPStrategy(broadcast_buffers=False)
    return Fabric(accelerator=trainer["accelerator"], devices=trainer["devices"], num_nodes=trainer["num_nodes"],
                  strategy=strategy, precision=trainer["precision"], loggers=loggers)


def generator_step(run: Training, batch: tuple[Tensor, Tensor], backward: step.Backward,
                   scaler: torch.amp.GradScaler | None) -> step.StepResult:
    """One generator step on ``batch``: ``train.d_steps`` D updates, then G's (gan/core/step.py)."""
    module, objective = run.module, run.module.objective
    images = batch[0].contiguous(memory_format=torch.channels_last) if module.channels_last else batch[0]
    reals = images.chunk(module.d_steps)
    kind = module.condition.kind
    labels = ([module.latent_code(len(real)) for real in reals] if kind == "code" else
              batch[1].chunk(module.d_steps) if kind == "classes" else [None] * module.d_steps)
    # One (noise, real, labels) per D update; the last batch's G forward also serves G's update.
    batches = [step.Batch(module.noise(len(real)), real, y) for real, y in zip(reals, labels)]
    first_d_update = module.counters.d

    def d_loss(D: nn.Module, real: Tensor, fake: Tensor, y: Tensor | None, k: int) -> tuple[Tensor, ...]:
        # The penalties' inner backward is scaled like the loss under float16 (a device tensor: no sync).
        scale = (scaler.scale(torch.ones((), device=module.device))
                 if scaler is not None and objective.needs_loss_scale(first_d_update + k) else None)
        return objective.d_loss(D, real, fake, y, first_d_update + k, scale)

    run.phases.begin_step()
    opt_g, opt_d = run.step_optimizers
    return step.generator_step(run.G, run.D, opt_g, opt_d, batches, d_loss, objective.g_loss, backward,
                               run.phases.phase)


@torch.no_grad()
def update_statistics(run: Training, result: step.StepResult) -> None:
    """After a generator step: the counters, learning rates, the objective's statistics, the EMA generator
    and the augmentation probability."""
    module = run.module
    for d in result.d:
        module.counters.count_d_step()
        module.objective.observe(d)
    module.counters.count_g_step(module.batch_size * run.fabric.world_size)  # real images, over all processes
    for schedule in run.schedules:  # optim.decay=linear: one schedule per optimizer
        schedule.step()
    broadcast_buffers(module.G, module.D)  # DDP: rank 0's BatchNorm statistics on every rank, before EMA copies G's
    if module.ema is not None:
        module.ema.update(module.G, module.counters.g)
    augment = module.objective.augment
    if augment is not None and module.counters.g % augment.interval == 0:
        augment.adjust(module.batch_size * run.fabric.world_size)


def log_step(module: GANModule, result: step.StepResult, loggers: list[Any]) -> None:
    """The step's scalars to the loggers, read from the device in one transfer: one host-device sync per
    logging step, plain floats to the loggers, and no tensor that could keep a graph alive."""
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
    numbers = dict(zip(values, torch.stack([v.float() for v in values.values()]).tolist()))
    if module.audit:
        check_plain_numbers(numbers)
    for logger in loggers:  # TensorBoard's x axis is generator steps
        logger.log_metrics(numbers, step=module.counters.g)
    module.last_losses = {k: v for k, v in numbers.items() if k.startswith("loss/")}


def agree_to_stop(fabric: Fabric, requested: bool) -> bool:
    """Whether any rank was asked to stop (a signal): one all-reduce of one number under DDP, none on one process."""
    return fabric.strategy.reduce_boolean_decision(requested, all=False) if fabric.world_size > 1 else requested


def kill_other_ranks(fabric: Fabric) -> None:
    """trainer=ddp on one node: end the processes this one started for the other ranks, if any."""
    launcher = fabric.strategy.launcher
    if launcher is not None and hasattr(launcher, "kill") and fabric.world_size > 1:
        launcher.kill(signal.SIGKILL)


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
        "precision": run.fabric.strategy.precision.state_dict(),  # float16's loss scale; empty otherwise
        "rng": rng_state(),
    }


def describe_networks(module: GANModule) -> str:
    """One line per part of the module: its class, parameters, and how many of them train."""
    lines = []
    for name, part in module.named_children():
        total = sum(p.numel() for p in part.parameters())
        trainable = sum(p.numel() for p in part.parameters() if p.requires_grad)
        lines.append(f"  {name:<10} {type(part).__name__:<22} {total:>10,} parameters, {trainable:,} trainable")
    return "\n".join(lines)


def log_summary(module: GANModule, run_dir: Path, stopped_by: str | None = None) -> None:
    """What the run did and where to look next: on the console and in the run's log file (train.log)."""
    step = module.counters.g
    losses = [f"{name} {value:.4g}" for name, value in module.last_losses.items()]
    # The loop logs the last step it trains: none logged means none trained (a resume at trainer.max_steps).
    final = f"final losses {', '.join(losses)} (generator step {step})" if losses else "no generator step trained"
    how = f"stopped by {stopped_by} after" if stopped_by else "finished:"
    log.info(f"Run {how} {step} generator steps in {run_dir}; {final}")
    # Quoted for a shell (a run directory may hold spaces): each line can be pasted as it is.
    log.info(f"  curves and samples: tensorboard --logdir {shlex.quote(str(run_dir / 'tensorboard'))}")
    log.info(f"  metrics:            python evaluate.py {shlex.quote(f'run_dir={run_dir}')}")
    log.info(f"  the generator:      {shlex.quote(str(run_dir / snapshot.FILE))} (gan.core.snapshot.load_generator)")

