"""The loop's one adapter to Lightning Fabric below its public wrappers. ``fabric.setup()`` would wrap G, D and the
optimizers in Fabric's _FabricModule and _FabricOptimizer, whose forward and step cost about 0.2 ms a generator step
on the ring's sizes (docs/design.md, "The loop, owned"). The loop takes from Fabric only what it needs: the precision
plugin (its autocast context, float16's loss scaler, the weights' dtype, its state), the strategy's DDP wrapper and
collectives, and the launcher that started the other ranks -- through these functions, and
tests/test_library_adapters.py checks that Fabric still has each of them."""

from __future__ import annotations

import signal
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins import Precision
from lightning.fabric.strategies import DDPStrategy
from torch import nn


def loss_scaler(fabric: Fabric) -> torch.amp.GradScaler | None:
    """float16's GradScaler (trainer.precision=16-mixed), else None."""
    return getattr(fabric.strategy.precision, "scaler", None)


def autocast(fabric: Fabric) -> Callable[[], AbstractContextManager[Any]]:
    """The context a step runs in: autocast under mixed precision; under 32-true none at all."""
    precision = fabric.strategy.precision
    return nullcontext if type(precision) is Precision else precision.forward_context


def placed(fabric: Fabric, module: nn.Module) -> nn.Module:
    """``module`` on the run's device, its weights in the precision's dtype (float32 but under a *-true precision)."""
    return fabric.strategy.precision.convert_module(module).to(fabric.device)


def wrapped(fabric: Fabric, network: nn.Module) -> nn.Module:
    """``network`` as the step runs it: under trainer=ddp in a DistributedDataParallel of its own, else itself."""
    return fabric.strategy.setup_module(network) if isinstance(fabric.strategy, DDPStrategy) else network


def precision_state(fabric: Fabric) -> dict[str, Any]:
    """The precision plugin's state, which a checkpoint keeps: float16's loss scale; empty otherwise."""
    return fabric.strategy.precision.state_dict()


def load_precision_state(fabric: Fabric, state: dict[str, Any]) -> None:
    fabric.strategy.precision.load_state_dict(state)


def every_rank(fabric: Fabric, decision: bool, all: bool) -> bool:
    """``decision`` agreed over the ranks (``all``: every rank's is True, else any rank's), one collective."""
    return fabric.strategy.reduce_boolean_decision(decision, all=all)


def kill_other_ranks(fabric: Fabric) -> None:
    """trainer=ddp on one node: end the processes this one started for the other ranks (Fabric's launcher keeps them
    in ``procs``), if any: a rank that failed alone would leave them waiting in a collective until its timeout."""
    for process in getattr(fabric.strategy.launcher, "procs", []):
        process.send_signal(signal.SIGKILL)
