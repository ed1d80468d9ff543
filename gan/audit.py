"""The autograd contract, checked while training (``audit=true``; always on in tests and debug presets).

Each check raises :class:`AuditError` naming the module and parameter (or buffer, or logged value)
at the first violation:

* a D update leaves every G gradient untouched (None stays None) and gives D finite gradients;
* a G update gives D's parameters no gradient and does not change D's weights;
* sampling leaves every generator parameter and buffer bit-identical, restores train/eval mode and
  ``requires_grad`` flags, and returns tensors without a graph;
* values sent to loggers are plain Python numbers.

The gradient checks hang on Lightning's hooks (``on_before_backward``, ``on_before_optimizer_step``),
so the training step itself carries no audit code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn


class AuditError(AssertionError):
    """The training code broke an autograd rule this project relies on."""


def snapshot(tensors: dict[str, Tensor | None]) -> dict[str, Tensor | None]:
    return {name: None if t is None else t.detach().clone() for name, t in tensors.items()}


def first_difference(before: dict[str, Tensor | None], after: dict[str, Tensor | None]) -> str | None:
    """Name of the first entry that changed (None <-> tensor, or any element), else None."""
    for name, old in before.items():
        new = after[name]
        if (old is None) != (new is None) or (old is not None and not torch.equal(old, new)):
            return name
    return None


def grads(module: nn.Module) -> dict[str, Tensor | None]:
    return {name: p.grad for name, p in module.named_parameters()}


class AutogradAudit(L.Callback):
    """Checks the detach / freeze split of every D and G update of a :class:`GANModule`."""

    def on_before_backward(self, trainer: L.Trainer, pl_module: Any, loss: Tensor) -> None:
        self.g_grads, self.d_grads = snapshot(grads(pl_module.G)), snapshot(grads(pl_module.D))
        self.d_weights = snapshot(dict(pl_module.D.named_parameters()))

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        d_ids = {id(p) for p in pl_module.D.parameters()}
        if any(id(p) in d_ids for group in optimizer.param_groups for p in group["params"]):
            self.check_d_update(pl_module)
        else:
            self.check_g_update(pl_module)

    def check_d_update(self, pl_module: Any) -> None:
        changed = first_difference(self.g_grads, grads(pl_module.G))
        if changed:
            raise AuditError(f"D update changed the gradient of G.{changed}: the D loss must use fake.detach()")
        for name, p in pl_module.D.named_parameters():
            if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all()):
                state = "no gradient" if p.grad is None else "a non-finite gradient"
                raise AuditError(f"D update left D.{name} with {state}")

    def check_g_update(self, pl_module: Any) -> None:
        changed = first_difference(self.d_grads, grads(pl_module.D))
        if changed:
            raise AuditError(f"G update gave D.{changed} a gradient: D must be frozen during the G update")
        self.pending_d_weights = self.d_weights  # compared once opt_g has stepped

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        changed = first_difference(self.pending_d_weights, dict(pl_module.D.named_parameters()))
        if changed:
            raise AuditError(f"G update changed D.{changed}: D's weights must not move in the G update")


def checked_sampling(generator: nn.Module, sample: Callable[[], Tensor]) -> Tensor:
    """Run ``sample()`` and check it left ``generator`` exactly as it was and returned no graph."""
    state = snapshot(dict(generator.state_dict(keep_vars=True)))
    modes = [(name, m.training) for name, m in generator.named_modules()]
    flags = [(name, p.requires_grad) for name, p in generator.named_parameters()]
    out = sample()
    changed = first_difference(state, dict(generator.state_dict(keep_vars=True)))
    if changed:
        raise AuditError(f"sampling changed generator.{changed}: sample in eval mode under no_grad "
                         "(gan.contexts.evaluating)")
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
