""":func:`assemble` builds a run as the loop (gan/training/loop.py) holds it (gan/training/state.py's ``Training``) from
the run's checked config (gan/training/checks.py's ``Start``) in one pass: the host's threads, Fabric, the data, the
networks, the optimizers, what watches the step, and a resume's state put back (gan/training/state.py). Everything
is decided here, once, so that a step pays only for what the run asked for: no wrapper on one device, the loss
scaler only under float16, the autocast context only under mixed precision."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy
from omegaconf import OmegaConf
from torch import Tensor, nn

from gan.config.eval_settings import EvalSettings
from gan.core.health import HealthJudge, judging_start
from gan.core.models import g_condition
from gan.core.phases import PhaseTimer, StepPhases
from gan.data.datasets import build_dataset, data_shape, is_points, mixture_means, num_classes
from gan.data.loader import GANData
from gan.evaluation.pictures import real_points_for_plot
from gan.run.build import build_module, build_optimizers
from gan.run.checkpoint import check_fits
from gan.run.module import GANModule
from gan.training import state
from gan.training.autograd_audit import AutogradAudit
from gan.training.checkpoints import Checkpoints
from gan.training.checks import SEPARATE_DDP, Start
from gan.training.fabric_adapter import autocast, every_rank, kill_other_ranks, loss_scaler, placed, wrapped
from gan.training.guard import NonFiniteGuard
from gan.training.health import HealthWatch
from gan.training.host import prepare_host, slow_bf16_warning
from gan.training.loggers import build_loggers, summary_writer
from gan.training.outputs import Metrics, Progress, Samples
from gan.training.profiling import build_profiler
from gan.training.timing import StepTimer

log = logging.getLogger(__name__)


def assemble(start: Start) -> state.Training:
    """Everything a run trains with, from its checked config, each piece in the order the next needs it: the host's
    threads, the processes, the dataset, the networks (fine-tuned or new) placed with their optimizers (a resume's
    refused first if they do not fit), the batches from the run's generator step on, what watches the step, and a
    resume's state put back."""
    # From here on the run reads its config as plain values, resolved once: a DictConfig read costs microseconds.
    container = OmegaConf.to_container(start.cfg, resolve=True)
    prepare_host(container["train"]["threads"], container["trainer"]["devices"])
    fabric = build_fabric(container["trainer"], build_loggers(container.get("logger") or {}))
    fabric.launch()  # trainer=ddp on one node: starts the other ranks, each running this same command
    fabric.seed_everything(container["seed"], workers=True, verbose=False)
    dataset = start.dataset if start.dataset is not None else build_dataset(container["data"], container["seed"])
    if start.fine_tuned is not None:  # fine-tuning: built by the checks from the run's seed, so built once
        torch.set_rng_state(start.fine_tuned.rng)  # the random stream where building them left it
        module, lines = start.fine_tuned.module, start.fine_tuned.lines
    else:
        # What G takes beside its noise, and which of the data's classes it trains on.
        condition = g_condition(container["model"], num_classes(dataset), container["data"].get("classes"))
        module, lines = build_module(container, data_shape(container["data"]), condition), []
    placed = place(fabric, container, module, lines, start.checkpoint)
    data = GANData(container["data"], dataset, container["loss"]["d_steps"], container["seed"])
    # The batches from the run's generator step on (a resume's: its checkpoint's, which fits): their order is a
    # function of the seed and the step alone, drawn with a generator of their own.
    first = int(start.checkpoint["state_dict"]["counters.g_updates"]) if start.checkpoint is not None else 0
    loader = data.loader(first, fabric.global_rank, fabric.world_size, fabric.device)
    # ``run`` is bound below: a checkpoint is written only once the steps run.
    watching = observe(fabric, container, data, placed, lambda path: state.write_checkpoint(run, path))
    run = state.Training(config=container, fabric=fabric, data=data, loader=loader, **placed, **watching)
    if start.checkpoint is not None:  # a resume: the state the checkpoint holds, put back into what was built
        state.resume(run, start.checkpoint, start.changes)
    state.separate_rank_streams(fabric.global_rank)  # last: each rank's own random streams
    return run


def build_fabric(trainer: dict[str, Any], loggers: list[Any]) -> Fabric:
    """Fabric from the ``trainer.*`` keys (accelerator, devices, num_nodes, strategy, precision)."""
    strategy = trainer["strategy"]
    if strategy == SEPARATE_DDP:
        # Rank 0's buffers are copied to the others once per step (gan.core.distributed.broadcast_buffers),
        # not at each of the step's four forwards.
        strategy = DDPStrategy(broadcast_buffers=False)
    return Fabric(accelerator=trainer["accelerator"], devices=trainer["devices"], num_nodes=trainer["num_nodes"],
                  strategy=strategy, precision=trainer["precision"], loggers=loggers)


def place(fabric: Fabric, config: dict[str, Any], module: GANModule, lines: list[str],
          checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    """The networks on their device in their precision, their optimizers, and G and D as the step runs them: the
    :class:`~gan.training.state.Training` fields of those names. First, a resume's ``checkpoint`` of other networks
    is refused, before anything is placed or logged; then what was built is logged (``lines``: fine-tuning's)."""
    if checkpoint is not None:
        check_fits(module, checkpoint, config["ckpt_path"])
    if fabric.is_global_zero:
        for line in lines:
            log.info(line)
        log.info(f"networks:\n{describe_networks(module)}")
        if warning := slow_bf16_warning(fabric.device, str(config["trainer"]["precision"])):
            log.warning(warning)
    if config["trainer"].get("sync_batchnorm", False):  # trainer=ddp's key
        module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
    module = placed(fabric, module)
    optimizers, schedules = build_optimizers(module, config["optim"], config["trainer"]["max_steps"])
    scaler = loss_scaler(fabric)
    return {"module": module, "optimizers": optimizers, "schedules": schedules, "scaler": scaler,
            # Under float16 the optimizers step through the scaler (unscale, skip a non-finite step, update the scale).
            "step_optimizers": fabric.setup_optimizers(*optimizers) if scaler is not None else tuple(optimizers),
            "autocast": autocast(fabric),
            # trainer=ddp: one DistributedDataParallel each for G and D (see configs/trainer/ddp.yaml for why).
            "G": wrapped(fabric, module.G), "D": wrapped(fabric, module.D)}


def observe(fabric: Fabric, config: dict[str, Any], data: GANData, placed: dict[str, Any],
            write: Callable[[Path], None]) -> dict[str, Any]:
    """What watches the step, each attached once: the phase record (which the timer, the guard, the audit and the
    pictures read), the non-finite guard and the audit (on the optimizers' steps), and the run's outputs
    (checkpoints written by ``write``): the :class:`~gan.training.state.Training` fields of those names."""
    module, optimizers, scaler = placed["module"], placed["optimizers"], placed["scaler"]
    timing, trainer, health, data_name = config["timing"], config["trainer"], config["health"], config["data"]["name"]
    run_dir, zero, d_steps, max_steps = (Path(config["paths"]["run_dir"]), fabric.is_global_zero,
                                         config["loss"]["d_steps"], trainer["max_steps"])
    loggers = fabric.loggers if zero else []
    timer = PhaseTimer(timing["enabled"], timing["sync"], fabric.device)
    phases = StepPhases(timer)
    phases.profiled = trainer["profiler"] == "pytorch"  # each phase a labelled range in its traces
    guard = NonFiniteGuard(config["train"]["skip_nonfinite"], module.counters, d_steps, scaler,
                           lambda ok: every_rank(fabric, ok, all=True))
    for optimizer in optimizers:  # before the audit's hooks: the audit sees the guard's verdict
        optimizer.register_step_pre_hook(lambda o, args, kwargs: guard.judge(o, phases.network, phases.d_step))
    audit = AutogradAudit(module, *optimizers, phases, d_steps, scaler) if config["audit"] else None
    points = is_points(module.data_shape)
    real_points, means = (real_points_for_plot(data.dataset), mixture_means(data_name)) if points else (None, None)
    settings = EvalSettings.from_config(config["eval"], data_name)
    # The outputs: pictures, metrics, the progress bar (outputs.py), then checkpoints, timing, profiling, health.
    samples = Samples(config["log"]["sample_every"], run_dir / "samples", summary_writer(loggers), zero,
                      real_points, means)
    every_eval = config["eval"]["every"]
    metrics = Metrics(every_eval, settings, config["seed"], loggers) if every_eval and zero else None
    progress = Progress(max_steps) if trainer["enable_progress_bar"] and zero else None
    # What sees each backward: the guard (the loss it judges), the audit, the pictures of the autograd graph.
    watchers = [w for w in (guard, audit, samples) if w is not None]

    def backward(loss: Tensor) -> None:  # made once: the step calls it twice per generator step and more
        for watcher in watchers:
            watcher.before_backward(loss, phases.network)
        if scaler is not None:
            fabric.backward(loss)  # the loss scaled first
        else:
            loss.backward()

    return {
        "timer": timer, "phases": phases, "guard": guard, "audit": audit, "backward": backward, "samples": samples,
        "metrics": metrics, "progress": progress,
        "checkpoints": Checkpoints(run_dir / "checkpoints", config["checkpoint"]["every"], config["checkpoint"]["keep"],
                                   write, zero, lambda: kill_other_ranks(fabric)),
        "step_timer": (StepTimer(timer, config["data"]["batch_size"] * fabric.world_size, loggers)
                       if timing["enabled"] else None),
        "profiler": build_profiler(trainer["profiler"], run_dir, fabric.local_rank),
        "health": (HealthWatch(health["action"], HealthJudge(judging_start(health["start"], max_steps),
                                                             health["patience"]),
                               health["examples"], settings, max_steps, health["every"], run_dir,
                               summary_writer(loggers)) if health["enabled"] and zero else None),
    }


def describe_networks(module: GANModule) -> str:
    """One line per part of the module: its class, parameters, and how many of them train."""
    lines = []
    for name, part in module.named_children():
        total = sum(p.numel() for p in part.parameters())
        trainable = sum(p.numel() for p in part.parameters() if p.requires_grad)
        lines.append(f"  {name:<10} {type(part).__name__:<22} {total:>10,} parameters, {trainable:,} trainable")
    return "\n".join(lines)
