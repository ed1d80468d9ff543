"""A non-finite loss or gradient never reaches the weights, and the step never waits for the device to
say so.

After each backward and before its optimizer step (an optimizer step pre-hook the loop registers), the loss
and the gradients are judged on the device: one fused norm over all gradients, since a non-finite
element makes its tensor's norm non-finite. The verdict goes to the optimizer as ``found_inf``, the
tensor torch's fused optimizers take (as GradScaler uses them): a non-finite update is skipped on the
device -- weights, moments and step count untouched -- with no host read. The host reads the verdict
once per logging window (``log.every`` generator steps, where the logged scalars are read anyway), and
before any checkpoint is written:

* by default the run then stops with a RunError naming the first bad generator step, the network and
  the phase; every bad update was skipped, and no checkpoint after it was written;
* with ``train.skip_nonfinite=true`` it goes on, and the skipped updates are counted
  (``counters.skipped_d``, ``counters.skipped_g``, logged as ``train/skipped_*``).

The window is the cost of not reading at every step: a diverged run is reported up to ``log.every - 1``
generator steps late (``log.every=1`` reports at once). An optimizer that takes no ``found_inf`` (not
fused), and float16's GradScaler, which skips such a step itself, are judged at every step instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from gan.core.state import StepCounters
from gan.errors import RunError

log = logging.getLogger(__name__)

ADVICE = ("resume from the last checkpoint with lower learning rates (optim.d.lr, optim.g.lr) or a regularizer "
          "(e.g. reg=r1 resume.allow_changes=true), or set train.skip_nonfinite=true to skip such updates")


def takes_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` skips its step on the device when given ``found_inf`` (torch's fused ones)."""
    return all(group.get("fused", False) for group in optimizer.param_groups)


class NonFiniteGuard:
    """``skip``: train.skip_nonfinite; ``counters``: the module's (gan/core/state.py), which count the skipped
    updates; ``scaler``: float16's GradScaler, or None; ``agree``: under DDP, whether every rank's verdict is
    True (one all-reduce), else the verdict itself. The loop calls :meth:`before_backward` and
    :meth:`judge`, and :meth:`read` before it logs (every ``log.every`` generator steps), before a checkpoint
    is written, and at the end of training."""

    def __init__(self, skip: bool, counters: StepCounters, d_steps: int, scaler: torch.amp.GradScaler | None = None,
                 agree: Callable[[bool], bool] = lambda ok: ok):
        self.skip, self.counters, self.d_steps, self.scaler, self.agree = skip, counters, d_steps, scaler, agree
        self.loss: Tensor | None = None
        # network -> the first bad update since the last read, coded as one integer on the device (NONE: none)
        self.first_bad: dict[str, Tensor] = {}
        self.flags: dict[str, Tensor] = {}  # 1.0 where the update (or its loss alone) is not finite

    def before_backward(self, loss: Tensor) -> None:
        self.loss = loss.detach()  # judged with the gradients it gives, before the optimizer steps

    def judge(self, optimizer: torch.optim.Optimizer, network: str, update: int) -> None:
        """Before ``network``'s optimizer steps (update number ``update`` of the step, as it says)."""
        step = self.counters.g + 1
        scaler = self.scaler
        skipped = getattr(self.counters, f"skipped_{network.lower()}")
        # Not the gradients under float16's GradScaler: non-finite ones are how it learns its scale is too
        # high, and it skips such a step itself.
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if scaler is None and takes_found_inf(optimizer):
            device = self.loss.device
            if network not in self.first_bad:
                self.first_bad[network] = torch.full((), NONE, dtype=torch.long, device=device)
                self.flags.update({name: torch.full((), value, dtype=torch.float32, device=device)
                                   for name, value in (("one", 1.0), ("update", 0.0), ("loss", 0.0))})
            flag, loss_flag = self.flags["update"], self.flags["loss"]
            flag.zero_(), loss_flag.zero_()
            # torch's fused non-finite check (GradScaler's, with a scale of 1): it sets the flag to 1 if any
            # element of the tensors is inf or NaN, in one kernel over all of them.
            torch._amp_foreach_non_finite_check_and_unscale_([*grads, self.loss], flag, self.flags["one"])
            torch._amp_foreach_non_finite_check_and_unscale_([self.loss], loss_flag, self.flags["one"])
            optimizer.found_inf = flag  # the fused step leaves everything as it was where this is 1
            bad = flag > 0
            code = torch.where(bad, encode(step, update, True) - loss_flag.long(), NONE)
            torch.minimum(self.first_bad[network], code, out=self.first_bad[network])
            skipped.add_(bad)
            return
        finite = torch.isfinite(self.loss)
        if grads and scaler is None:
            finite = finite & torch.stack(torch._foreach_norm(grads)).isfinite().all()
        # Judged now, with one host read: an optimizer that takes no found_inf cannot skip on the device.
        ok = bool(finite.item())
        if scaler is not None:  # each rank judged its own loss: all must agree (DDP; nothing on one device)
            ok = self.agree(ok)
        if not ok:
            self.failed(network, step, update, bool(torch.isfinite(self.loss)))
            optimizer.zero_grad(set_to_none=True)  # torch's optimizers step no parameter that has no gradient
            skipped.add_(1)

    def read(self) -> None:
        """The verdicts since the last read, from the device in one transfer; then reset to "none"."""
        if not self.first_bad:
            return
        networks = list(self.first_bad)
        codes = torch.stack([self.first_bad[n] for n in networks]).tolist()
        for first in self.first_bad.values():
            first.fill_(NONE)
        bad = sorted((code, network) for code, network in zip(codes, networks) if code != NONE)
        if bad:
            self.failed(bad[0][1], *decode(bad[0][0]))

    def failed(self, network: str, step: int, update: int, loss_finite: bool) -> None:
        d_steps = self.d_steps
        where = f"generator step {step}, {network} update" + (f" {update + 1} of {d_steps}"
                                                                if network == "D" and d_steps > 1 else "")
        what = ("the loss is finite but its gradients are not (backward)" if loss_finite
                else "the loss is not finite (forward)")
        if not self.skip:
            raise RunError(f"{where}: {what}; the update was skipped and no checkpoint written after it: {ADVICE}")
        log.warning(f"skipped {where}: {what} (train.skip_nonfinite)")


NONE = 2**62  # "no bad update": larger than any code


def encode(step: int, update: int, loss_finite: bool) -> int:
    """An update as one integer that orders as the updates ran: generator step, D update in it (< 2**10)."""
    return (step * 2**10 + update) * 2 + loss_finite


def decode(code: int) -> tuple[int, int, bool]:
    return code // 2**11, code // 2 % 2**10, bool(code % 2)
