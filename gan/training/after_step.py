"""What is due after a generator step (:func:`after_step`, which the loop calls): the step's scalars, read from the
device in one transfer, and the health check's figures with them; then each observer: the audit's end-of-step
checks, a checkpoint, samples, metrics, the progress bar, and a test's probes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from lightning.fabric import Fabric
from torch import Tensor, nn

from gan.core.audit import check_plain_numbers
from gan.training.fabric_adapter import every_rank

if TYPE_CHECKING:
    from gan.core.step import StepResult
    from gan.training.observer import Observer
    from gan.training.state import Training


def after_step(run: Training, result: StepResult, observers: Sequence[Observer]) -> None:
    """What is due after a generator step: its scalars (where ``run.logged``) and health check, which may stop the
    run (``run.stopping``), then each of ``observers``."""
    if run.logged:
        run.guard.read()  # a bad update stops the run before it is logged
        log_step(run, result)
        if run.health_due(run.module.counters.g):  # rank 0's health check may stop the run: the ranks agree here
            ill = run.health is not None and run.health.stopped_by is not None
            run.health_stopped = agree_to_stop(run.fabric, ill)
            run.stopping = run.health_stopped or run.stopping
    for observer in observers:
        observer.on_step_end(run)


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
