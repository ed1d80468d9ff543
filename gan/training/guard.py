"""A non-finite loss or gradient never reaches the weights, and the step never waits for the device to
say so.

After each backward and before its optimizer step (an optimizer step pre-hook the loop registers), the loss
and the gradients are judged on the device, by torch's fused non-finite check over all of them at once.
The verdict goes to the optimizer as ``found_inf``, the tensor torch's fused optimizers take (as GradScaler
uses them): a non-finite update is skipped on the device -- weights, moments and step count untouched --
with no host read. The host reads the verdicts once per logging window (``log.every`` generator steps,
where the logged scalars are read anyway), and before any checkpoint is written:

* by default the run then stops with a RunError naming the first bad generator step, the network and
  the phase; every bad update was skipped, and no checkpoint after it was written;
* with ``train.skip_nonfinite=true`` it goes on, and the skipped updates are counted at each read
  (``counters.skipped_d``, ``counters.skipped_g``, logged as ``train/skipped_*`` and saved in checkpoints,
  which are written after a read).

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
from gan.core.torch_private import flag_nonfinite, foreach_norm
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
        self.windows: dict[str, Window] = {}  # network -> its updates judged on the device since the last read

    def before_backward(self, loss: Tensor, network: str) -> None:
        self.loss = loss.detach()  # judged with the gradients it gives, before the optimizer steps

    def judge(self, optimizer: torch.optim.Optimizer, network: str, d_step: int) -> None:
        """Before ``network``'s optimizer steps (D's: its update ``d_step`` of the generator step, 0-based)."""
        step = self.counters.g + 1
        scaler = self.scaler
        # Not the gradients under float16's GradScaler: non-finite ones are how it learns its scale is too
        # high, and it skips such a step itself.
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if scaler is None and takes_found_inf(optimizer):
            window = self.windows.get(network)
            if window is None:
                window = self.windows[network] = Window(self.loss.device, self.d_steps if network == "D" else 1)
            optimizer.found_inf = window.judge(grads, self.loss, step)  # the fused step skips it where this is 1
            return
        finite = torch.isfinite(self.loss)
        if grads and scaler is None:
            finite = finite & torch.stack(foreach_norm(grads)).isfinite().all()
        # Judged now, with one host read: an optimizer that takes no found_inf cannot skip on the device.
        ok = bool(finite.item())
        if scaler is not None:  # each rank judged its own loss: all must agree (DDP; nothing on one device)
            ok = self.agree(ok)
        if not ok:
            self.failed(network, step, d_step, bool(torch.isfinite(self.loss)))
            optimizer.zero_grad(set_to_none=True)  # torch's optimizers step no parameter that has no gradient
            self.counters.count_skipped(network)

    def read(self) -> None:
        """The verdicts since the last read, from the device in one transfer: the skipped updates counted,
        the first bad one reported; then a new window."""
        if not self.windows:
            return
        networks = list(self.windows)
        tallies = torch.stack([self.windows[n].tally for n in networks]).tolist()
        bad = []
        for network, (skipped, _, from_first_bad, from_first_bad_loss) in zip(networks, tallies):
            window = self.windows[network]
            if skipped:
                self.counters.count_skipped(network, int(skipped))
                step, update = window.first_bad(int(from_first_bad))
                # its loss was bad if the first bad loss came with it (a bad loss makes its update bad)
                bad.append((step, network == "G", update, network, from_first_bad != from_first_bad_loss))
            window.reset()
        if bad:
            step, _, update, network, loss_finite = min(bad)  # the first to run: a step's D updates run before G's
            self.failed(network, step, update, loss_finite)

    def failed(self, network: str, step: int, update: int, loss_finite: bool) -> None:
        d_steps = self.d_steps
        where = f"generator step {step}, {network} update" + (f" {update + 1} of {d_steps}"
                                                                if network == "D" and d_steps > 1 else "")
        what = ("the loss is finite but its gradients are not (backward)" if loss_finite
                else "the loss is not finite (forward)")
        if not self.skip:
            raise RunError(f"{where}: {what}; the update was skipped and no checkpoint written after it: {ADVICE}")
        log.warning(f"skipped {where}: {what} (train.skip_nonfinite)")


class Window:
    """One network's updates judged on the device since the last read (``per_step`` of them a generator step),
    in five operations an update and no host read: the update's two flags (its loss and gradients; its loss
    alone), whether any update since the last read raised each, and a running tally of all four, from which
    the read tells how many updates were bad, which came first, and whether its loss was finite."""

    def __init__(self, device: torch.device, per_step: int):
        self.per_step = per_step
        # One buffer, zeroed in one call: [bad update, bad loss, seen: bad update, seen: bad loss] (1.0: so),
        # then their tally [skipped updates, bad losses, updates from the first bad one on, from the first bad
        # loss on] (float32: exact counts up to 2**24 updates a window).
        self.state = torch.zeros(8, dtype=torch.float32, device=device)
        self.flags, self.tally = self.state[:4], self.state[4:]
        self.now, self.seen = self.flags[:2], self.flags[2:]
        self.bad_update, self.bad_loss = self.flags[0], self.flags[1]  # views made once: a view is an operation too
        self.one = torch.ones((), device=device)
        self.judged, self.first_step = 0, 0  # host numbers: the updates judged, and the generator step of the first

    def judge(self, grads: list[Tensor], loss: Tensor, step: int) -> Tensor:
        """Flag one update of generator step ``step``; returns its verdict as ``found_inf`` (1.0: skip it)."""
        if self.judged == 0:
            self.first_step = step
        self.judged += 1
        self.now.zero_()
        # torch's fused non-finite check (GradScaler's, with a scale of 1): it sets a flag to 1 if any
        # element of the tensors is inf or NaN, in one kernel over all of them.
        flag_nonfinite([*grads, loss], self.bad_update, self.one)
        flag_nonfinite([loss], self.bad_loss, self.one)
        torch.maximum(self.seen, self.now, out=self.seen)  # 1 from the first bad update on
        self.tally.add_(self.flags)
        return self.bad_update

    def first_bad(self, from_first_bad: int) -> tuple[int, int]:
        """The (generator step, update in it) of the first bad update, given how many ran from it on."""
        step, update = divmod(self.judged - from_first_bad, self.per_step)
        return self.first_step + step, update

    def reset(self) -> None:
        self.state.zero_()
        self.judged = 0
