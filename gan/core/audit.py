"""The audit's checks that need no training loop (pure PyTorch): that sampling leaves a generator exactly as
it was and returns no graph, and that logged values are plain numbers; and how state is compared bit for
bit. gan/training/audit.py checks the training step itself with them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


class AuditError(AssertionError):
    """The training code broke an autograd rule this project relies on."""


def snapshot(tensors: dict[str, Tensor | None],
             reuse: dict[str, Tensor | None] | None = None) -> dict[str, Tensor | None]:
    """A copy of ``tensors``. ``reuse``: an earlier snapshot of the same names, shapes and dtypes, copied into
    in place of new memory (an audit that snapshots the same weights every step allocates nothing)."""
    if reuse is not None and reuse.keys() == tensors.keys() and all(
            (old is None) == (t is None) and (t is None or (old.shape == t.shape and old.dtype == t.dtype))
            for old, t in zip(reuse.values(), tensors.values())):
        for old, t in zip(reuse.values(), tensors.values()):
            if t is not None:
                old.copy_(t.detach())
        return reuse
    return {name: None if t is None else t.detach().clone() for name, t in tensors.items()}


def first_difference(before: dict[str, Tensor | None], after: dict[str, Tensor | None]) -> str | None:
    """Name of the first entry that changed (None <-> tensor, or any element), else None."""
    for name, old in before.items():
        new = after[name]
        if (old is None) != (new is None) or (old is not None and not same(old, new)):
            return name
    return None


def same(a: Tensor, b: Tensor) -> bool:
    """Element for element equal, NaN equal to NaN (a skipped non-finite update leaves NaN gradients)."""
    if torch.equal(a, b):  # the usual answer in one operation; only a NaN, which equals nothing, needs the rest
        return True
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0, 0.0, 0.0), b.nan_to_num(0.0, 0.0, 0.0))


def checked_sampling(generator: nn.Module, sample: Callable[[], Tensor]) -> Tensor:
    """Run ``sample()`` and check it left ``generator`` exactly as it was and returned no graph."""
    state = snapshot(dict(generator.state_dict(keep_vars=True)))
    modes = [(name, m.training) for name, m in generator.named_modules()]
    flags = [(name, p.requires_grad) for name, p in generator.named_parameters()]
    out = sample()
    changed = first_difference(state, dict(generator.state_dict(keep_vars=True)))
    if changed:
        raise AuditError(f"sampling changed generator.{changed}: sample in eval mode under no_grad "
                         "(gan.core.contexts.evaluating)")
    after_modes = dict((name, m.training) for name, m in generator.named_modules())
    for name, mode in modes:
        if after_modes[name] != mode:
            raise AuditError(f"sampling left generator.{name or '<root>'} in the wrong train/eval mode")
    after_flags = dict((name, p.requires_grad) for name, p in generator.named_parameters())
    for name, flag in flags:
        if after_flags[name] != flag:
            raise AuditError(f"sampling changed requires_grad of generator.{name}")
    if out.requires_grad or out.grad_fn is not None:
        raise AuditError("sampling returned a tensor attached to a graph: sample under torch.no_grad()")
    return out


def check_plain_numbers(values: dict[str, Any]) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise AuditError(f"logged value '{name}' is {type(value).__name__} {value!r}, "
                             "not a finite Python number: log .item()")
