"""The audit's checks that need no training loop (pure PyTorch): that sampling leaves a generator exactly as
it was and returns no graph, and that logged values are plain numbers; and how state is compared bit for
bit. gan/training/autograd_audit.py checks the training step itself with them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from gan.core.torch_private import foreach_copy_


class AuditError(AssertionError):
    """The training code broke an autograd rule this project relies on."""


class Snapshot:
    """Bit-exact copies of named tensors (None allowed), kept in one flat buffer per dtype and device: taking
    the copies again (:meth:`take`) is one copy operation and comparing them (:meth:`first_difference`) one
    comparison per buffer, not one per tensor (the audit does both at every update)."""

    def __init__(self, tensors: dict[str, Tensor | None]):
        self.absent = {name for name, t in tensors.items() if t is None}
        self.groups: dict[tuple[torch.dtype, torch.device], list[str]] = {}
        for name, t in tensors.items():
            if t is not None:
                self.groups.setdefault((t.dtype, t.device), []).append(name)
        self.flat = {key: torch.empty(sum(tensors[name].numel() for name in names), dtype=key[0], device=key[1])
                     for key, names in self.groups.items()}
        self.copies: dict[str, Tensor | None] = dict.fromkeys(tensors)
        for key, names in self.groups.items():
            offset = 0
            for name in names:
                shape, size = tensors[name].shape, tensors[name].numel()
                self.copies[name] = self.flat[key][offset:offset + size].view(shape)
                offset += size
        self.smallest_first = sorted((name for names in self.groups.values() for name in names),
                                     key=lambda name: tensors[name].numel())
        self.take(tensors)

    def take(self, tensors: dict[str, Tensor | None]) -> None:
        """Copy the values of ``tensors`` (the names, shapes and dtypes this snapshot was made with) in."""
        if self.smallest_first:
            with torch.no_grad():  # copies of the values, not part of any graph
                foreach_copy_([self.copies[name] for name in self.smallest_first],
                                     [tensors[name] for name in self.smallest_first])

    def first_difference(self, tensors: dict[str, Tensor | None]) -> str | None:
        """Name of the first entry of ``tensors`` that differs from this snapshot (None <-> tensor, a shape
        or any element), else None."""
        if tensors.keys() == self.copies.keys() and self.absent == {name for name, t in tensors.items() if t is None}:
            if all(self.unchanged(key, [tensors[name] for name in names]) for key, names in self.groups.items()):
                return None
        for name, old in self.copies.items():  # something differs: find which, element by element
            new = tensors.get(name)
            if (old is None) != (new is None) or (old is not None and not same(old, new)):
                return name
        return None

    def moved(self, tensors: dict[str, Tensor]) -> bool:
        """Whether any of ``tensors`` (the names and shapes this snapshot was made with) differs from its copy.
        The smallest first: after an update nearly every tensor has moved, and a small one answers in one
        small comparison instead of the whole network's."""
        return any(not same(self.copies[name], tensors[name]) for name in self.smallest_first)

    def unchanged(self, key: tuple[torch.dtype, torch.device], tensors: list[Tensor]) -> bool:
        """All of ``tensors`` equal, in dtype, shape and every element, to the copies in the buffer ``key``."""
        names = self.groups[key]
        if any(t.dtype != key[0] or t.shape != self.copies[name].shape for name, t in zip(names, tensors)):
            return False
        return torch.equal(self.flat[key], torch.cat([t.detach().reshape(-1) for t in tensors]))


def same(a: Tensor, b: Tensor) -> bool:
    """Element for element equal, NaN equal to NaN (a skipped non-finite update leaves NaN gradients)."""
    if torch.equal(a, b):  # the usual answer in one operation; only a NaN, which equals nothing, needs the rest
        return True
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0, 0.0, 0.0), b.nan_to_num(0.0, 0.0, 0.0))


def checked_sampling(generator: nn.Module, sample: Callable[[], Tensor]) -> Tensor:
    """Run ``sample()`` and check it left ``generator`` exactly as it was and returned no graph."""
    state = Snapshot(dict(generator.state_dict(keep_vars=True)))
    modes = [(name, m.training) for name, m in generator.named_modules()]
    flags = [(name, p.requires_grad) for name, p in generator.named_parameters()]
    out = sample()
    changed = state.first_difference(dict(generator.state_dict(keep_vars=True)))
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
