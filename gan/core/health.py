"""Training health: figures of a run's state that say it is failing, and the conditions they trip.

The figures are made on the device, from what a step already has (D's outputs on its real and fake batch) and
from two small fixed sets a run picks at its start (training images and images D never trains on; the fixed
noise batch's samples against real ones); the loop reads them with a logging step's other scalars, in one
transfer. :class:`HealthJudge` turns the numbers read into conditions on the host: each starts when its figure's
median over the last ``patience`` health checks is past its threshold, and ends when that median is back.

Each figure is a share or a rank, free of the data's scale and the network's, so one threshold serves every
dataset: D's loss is measured against its own value at chance (the loss's, so a WGAN critic, whose loss has no such
value, is not judged on it); docs/usage.md#training-health says how each threshold was chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gan.core.losses import AdversarialLoss


def separation(higher: Tensor, lower: Tensor) -> Tensor:
    """How often a value of ``higher`` exceeds one of ``lower``, over every pair (ties count half): 0.5 when
    the two cannot be told apart, 1.0 when every value of ``higher`` lies above every value of ``lower``.
    The area under D's ROC curve, on the device."""
    diff = higher.detach().float().flatten()[:, None] - lower.detach().float().flatten()[None, :]
    return (diff > 0).float().mean() + 0.5 * (diff == 0).float().mean()


def loss_ratio(loss: AdversarialLoss, real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """D's loss on a batch's real and fake outputs over its value at chance (``loss.chance``, not None): near 1
    while D is unsure, falling towards 0 as it tells the two apart with confidence."""
    return loss.d(real_logits.detach().float(), fake_logits.detach().float()) / loss.chance


def spread(x: Tensor) -> Tensor:
    """The mean distance between two of the samples ``x`` (each flattened), on the device."""
    return torch.pdist(x.detach().float().flatten(1)).mean()


@dataclass(frozen=True)
class Condition:
    """A way a run fails: its ``name``, the ``figure`` that shows it (a scalar logged as ``health/<figure>``), the
    ``threshold`` past which the figure is bad (``above``: bad at or above it, else at or below), and what it
    means, for the log line."""

    name: str
    figure: str
    threshold: float
    above: bool
    meaning: str

    def bad(self, value: float) -> bool:
        return value >= self.threshold if self.above else value <= self.threshold


# The conditions and their thresholds (measured: docs/results.md#training-health).
CONDITIONS = (
    Condition("d_wins", "d_loss_ratio", 0.1, False,
              "D's loss fell to a small share of its value at chance: it tells the batch's real images from its "
              "fakes with confidence, so G's gradient carries little"),
    Condition("d_memorises", "d_memorisation", 0.80, True,
              "D scores the training images above images it never trained on: it remembers its data"),
    Condition("collapse", "diversity", 0.30, False,
              "G's samples of the fixed noise lie much closer together than real images do"),
    Condition("divergence", "blowup", 2.0, True,
              "a gradient norm or D's output grew a hundredfold and more above the level it held, or an update was "
              "non-finite"),
)
BY_NAME = {c.name: c for c in CONDITIONS}
# Scalars whose size divergence follows (HealthJudge.blowup).
WATCHED_SCALES = ("grad_norm/g", "grad_norm/d", "d/real_running", "d/fake_running")


@dataclass
class Event:
    """A condition that started at generator step ``started`` with its figure at ``value``; ``ended``: the step it
    was over (None: still on)."""

    condition: str
    started: int
    value: float
    ended: int | None = None


class HealthJudge:
    """The conditions of one run, judged at each health check from the numbers it read (:meth:`judge`): a
    condition starts when the median of its figure over the last ``patience`` checks is past its threshold, and
    ends when that median is back (a median, so that one check's outlier neither starts nor ends one); a
    non-finite figure starts divergence at once. Checks before generator step ``start`` are kept, not judged: a
    run's first steps look like several failures (G's first samples are alike; D tells them from real ones at
    once)."""

    def __init__(self, start: int, patience: int):
        self.start, self.patience = start, patience
        self.recent: dict[str, list[float]] = {c.name: [] for c in CONDITIONS}  # the last ``patience`` figures
        self.on: dict[str, Event] = {}
        self.events: list[Event] = []
        # Of each watched scale, as log10: its last ``patience`` checks, and the lowest median of as many since start.
        self.sizes: dict[str, list[float]] = {name: [] for name in WATCHED_SCALES}
        self.lowest: dict[str, float] = {}
        self.skipped = 0.0  # non-finite updates skipped, as of the last check

    def blowup(self, step: int, numbers: dict[str, float]) -> float:
        """How many orders of magnitude a watched scale (a gradient norm, D's running output) lies above the lowest
        level it held since ``start`` (the median of ``patience`` checks), or above 1 where that was lower: in a
        run that trains, these are of order one and stay within an order or so of their level. Infinite for a
        non-finite scalar or an update skipped since the last check (``train.skip_nonfinite``); 0 before ``start``."""
        skipped = numbers.get("train/skipped_d", 0.0) + numbers.get("train/skipped_g", 0.0)
        newly_skipped, self.skipped = skipped > self.skipped, skipped
        if newly_skipped or not all(math.isfinite(v) for v in numbers.values()):
            return math.inf
        if step < self.start:
            return 0.0
        worst = 0.0
        for name, sizes in self.sizes.items():
            if name not in numbers:
                continue
            size = math.log10(abs(numbers[name]) + 1e-30)
            sizes[:] = [*sizes, size][-self.patience:]
            if len(sizes) == self.patience:
                self.lowest[name] = min(self.lowest.get(name, math.inf), median(sizes))
                worst = max(worst, size - max(0.0, self.lowest[name]))
        return worst

    def judge(self, step: int, figures: dict[str, float]) -> tuple[list[Event], list[Event]]:
        """The conditions that start and those that end at generator step ``step``, given the check's ``figures``
        (those of :data:`CONDITIONS`, by figure name; a figure not measured for this run is absent)."""
        started, ended = [], []
        for condition in CONDITIONS:
            value = figures.get(condition.figure)
            if value is None:
                continue
            recent = self.recent[condition.name]
            recent[:] = [*recent, value][-self.patience:]
            if step < self.start and math.isfinite(value):  # a non-finite update is never a first step's look
                continue
            on = self.on.get(condition.name)
            typical = median(recent)
            if on is None and (not math.isfinite(value) or len(recent) == self.patience and condition.bad(typical)):
                event = Event(condition.name, step, value if not math.isfinite(value) else typical)
                self.on[condition.name] = event
                self.events.append(event)
                started.append(event)
            elif on is not None and len(recent) == self.patience and not condition.bad(typical):
                on.ended = step
                del self.on[condition.name]
                ended.append(on)
        return started, ended

    def state_dict(self) -> dict[str, Any]:
        """Plain values, for the checkpoint (read back with ``torch.load(weights_only=True)``)."""
        return {"recent": {k: list(v) for k, v in self.recent.items()}, "events": [vars(e).copy() for e in self.events],
                "sizes": {k: list(v) for k, v in self.sizes.items()}, "lowest": dict(self.lowest),
                "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent.update({k: list(v) for k, v in state["recent"].items()})
        self.events = [Event(**e) for e in state["events"]]
        self.on = {e.condition: e for e in self.events if e.ended is None}
        self.sizes.update({k: list(v) for k, v in state["sizes"].items()})
        self.lowest = dict(state["lowest"])
        self.skipped = state["skipped"]


def median(values: list[float]) -> float:
    """The middle value (the upper of the two middle ones for an even count); inf and nan sort last."""
    return sorted(values, key=lambda v: (not math.isfinite(v), v if math.isfinite(v) else 0.0))[len(values) // 2]
