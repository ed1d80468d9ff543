"""Scoped changes of autograd and train/eval state, each restoring exactly what it changed.

``frozen(D)``: the generator step's view of D -- no gradients for D's weights, while gradients still
flow *through* D to G. ``evaluating(G)``: the one way this project samples -- eval mode (BatchNorm uses
its running statistics and does not update them), ``torch.no_grad()`` (no graph is built) and frozen
weights. Every sample grid, metric and evaluate.py call goes through ``evaluating``. ``no_sync(D)``:
the DDP side of freezing -- D's wrapper prepares no gradient reduction for a forward whose backward
gives D's weights no gradient.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext

import torch
from torch import nn


@contextmanager
def frozen(*modules: nn.Module) -> Iterator[None]:
    """``requires_grad_(False)`` on every parameter, then each flag restored as it was.

    Restoring the saved flags (not setting them all back to True) keeps parameters a user froze on
    purpose frozen.
    """
    saved = [(p, p.requires_grad) for m in modules for p in m.parameters()]
    for p, _ in saved:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)


@contextmanager
def evaluating(*modules: nn.Module, inference: bool = False) -> Iterator[None]:
    """Eval mode + no autograd for ``modules``; restores every submodule's mode and every flag.

    ``inference=True`` uses ``torch.inference_mode`` (faster still), for results that will never
    enter autograd later; the default ``no_grad`` gives ordinary tensors.
    """
    modes = [(sub, sub.training) for m in modules for sub in m.modules()]
    with ExitStack() as stack:
        stack.enter_context(frozen(*modules))
        stack.enter_context(torch.inference_mode() if inference else torch.no_grad())
        for m in modules:
            m.eval()
        try:
            yield
        finally:
            for sub, mode in modes:
                sub.training = mode


def no_sync(module: nn.Module) -> AbstractContextManager[None]:
    """``module.no_sync()`` for a DistributedDataParallel module (trainer=ddp), else a context that does nothing.

    A DDP module's forward normally prepares its reducer to all-reduce every parameter's gradient in the
    next backward. Under ``no_sync()`` it prepares nothing, the right thing for a forward whose backward
    computes no gradient for the module's weights.
    """
    return module.no_sync() if hasattr(module, "no_sync") else nullcontext()
