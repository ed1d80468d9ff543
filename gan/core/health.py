"""Training health: figures of a run's state that say it is failing, and the conditions they trip.

The figures are made on the device, from what a step already has (D's outputs on its real and fake batch) and
from two small fixed sets a run picks at its start (training images and images D never trains on; the fixed
noise batch's samples against real ones, in a feature space that does not train with D); the loop reads them
with a logging step's other scalars, in one transfer. :class:`HealthJudge` turns the numbers read into conditions
on the host: each starts when its figure's median over the last ``patience`` health checks is past its threshold,
and ends when that median is back.

Each figure is a share or a rank, free of the data's scale and the network's, so one threshold serves every
dataset: D's loss is measured against its own value at chance (the loss's, so a WGAN critic, whose loss has no such
value, is not judged on it); docs/usage.md#training-health says how each threshold was chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

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

    def better(self, value: float, than: float) -> bool:
        return value < than if self.above else value > than


# The conditions and their thresholds (measured: docs/results.md#training-health).
CONDITIONS = (
    Condition("d_wins", "d_loss_ratio", 0.1, False,
              "D's loss fell to a small share of its value at chance: it tells the batch's real images from its "
              "fakes with confidence, so G's gradient carries little"),
    Condition("d_memorises", "d_memorisation", 0.80, True,
              "D scores the training images above images it never trained on: it remembers its data"),
    Condition("collapse", "diversity", 0.30, False,
              "G's samples of the fixed noise lie much closer together than real images do"),
    Condition("off_data", "fit", 0.3, False,
              "far fewer of G's samples of the fixed noise lie among real data (in a feature space that does not "
              "train with D) than real data of its own: the samples are not yet the data's, whatever D says"),
    Condition("partial_collapse", "coverage", 0.3, False,
              "G's samples of the fixed noise reach far fewer of the real data's neighbourhoods than real data "
              "does: parts of the data are missing"),
    Condition("labels_ignored", "labels_obeyed", 0.5, False,
              "a classifier that does not train with D names the class G was asked for far less often in G's "
              "samples than in real data: G does not follow its labels"),
    Condition("divergence", "blowup", 2.0, True,
              "a gradient norm or D's output grew a hundredfold and more above the level it held or above any "
              "a run needs, D's loss is a hundred times its value at chance, or an update was non-finite"),
)
BY_NAME = {c.name: c for c in CONDITIONS}
# Scalars whose size divergence follows (HealthJudge.blowup).
WATCHED_SCALES = ("grad_norm/g", "grad_norm/d", "d/real_running", "d/fake_running")
# D's running outputs above this are a blow-up of their own (HealthJudge.blowup counts the orders above it).
OUTPUT_BOUND = 100.0


@dataclass
class Event:
    """A condition that started at generator step ``started`` with its figure at ``value``; ``ended``: the step it
    was over (None: still on)."""

    condition: str
    started: int
    value: float
    ended: int | None = None


class HealthJudge(nn.Module):
    """The conditions of one run, judged at each health check from the numbers it read (:meth:`judge`): a
    condition starts when the median of its figure over the last ``patience`` checks is past its threshold, and
    ends when that median is back (a median, so that one check's outlier neither starts nor ends one); a
    non-finite figure starts divergence at once.

    When to judge: every run starts out looking ill (G's first samples are alike and off the data; D tells them
    from real ones at once) and gets better while it learns, slowly or fast, and a run still learning looks like
    one that never will. So a condition is judged from the figure's own trend: from the first check at which its
    median is no better than the best median it had (it stopped improving), if that median is healthy (the run's
    first phase is over for it, and a relapse from there is a failure) or generator step ``start`` is reached (a
    share of the run: a figure stuck unhealthy by then is failing). A figure still improving is not judged: its
    run is still learning. Divergence is judged from the first check: a blow-up is never a first step's look.

    Its state lives in registered buffers, like the run's other running statistics: the checkpoint holds them, and
    a resume picks the judging up where it stopped."""

    def __init__(self, start: int, patience: int):
        super().__init__()
        self.start, self.patience = start, patience
        nan = math.nan
        # Each condition's last ``patience`` figures, newest last (nan: no check yet).
        self.register_buffer("history", torch.full((len(CONDITIONS), patience), nan, dtype=torch.float64))
        self.register_buffer("judging", torch.zeros(len(CONDITIONS), dtype=torch.bool))  # judged from now on
        self.register_buffer("best", torch.full((len(CONDITIONS),), nan, dtype=torch.float64))  # each best median
        # Of each watched scale, as log10: its last ``patience`` checks, and the lowest median of as many since start.
        self.register_buffer("sizes", torch.full((len(WATCHED_SCALES), patience), nan, dtype=torch.float64))
        self.register_buffer("lowest", torch.full((len(WATCHED_SCALES),), math.inf, dtype=torch.float64))
        self.register_buffer("skipped", torch.zeros((), dtype=torch.float64))  # non-finite updates skipped so far
        # Every condition met: (index in CONDITIONS, step started, figure then, step ended or -1 while on).
        self.register_buffer("met", torch.empty(0, 4, dtype=torch.float64))
        self.register_load_state_dict_pre_hook(fit_saved_shapes)

    @property
    def events(self) -> list[Event]:
        return [Event(CONDITIONS[int(i)].name, int(started), float(value), None if ended < 0 else int(ended))
                for i, started, value, ended in self.met.tolist()]

    @property
    def on(self) -> dict[str, Event]:
        """The conditions on now, by name."""
        return {e.condition: e for e in self.events if e.ended is None}

    def blowup(self, step: int, numbers: dict[str, float]) -> float:
        """How many orders of magnitude the run lies past where a run that trains stays: the most of

        - a watched scale (a gradient norm, D's running output) above the lowest level it held since ``start`` (the
          median of ``patience`` checks), or above 1 where that was lower (these are of order one, and stay within
          an order or so of their level);
        - D's loss above its value at chance (``health/d_loss_ratio`` above 1: D confidently wrong);
        - D's running outputs above ``OUTPUT_BOUND`` (a logit of that size is a certainty no data asks for);

        so a run that starts blown up counts as much as one that blows up later. Infinite for a non-finite scalar
        or an update skipped since the last check (``train.skip_nonfinite``)."""
        skipped = numbers.get("train/skipped_d", 0.0) + numbers.get("train/skipped_g", 0.0)
        newly_skipped = skipped > float(self.skipped)
        self.skipped.fill_(skipped)
        if newly_skipped or not all(math.isfinite(v) for v in numbers.values()):
            return math.inf
        worst = orders(numbers.get("health/d_loss_ratio", 1.0))
        for name in ("d/real_running", "d/fake_running"):
            worst = max(worst, orders(numbers.get(name, 0.0)) - math.log10(OUTPUT_BOUND))
        if step < self.start:
            return worst
        for i, name in enumerate(WATCHED_SCALES):
            if name not in numbers:
                continue
            size = orders(numbers[name])
            self.sizes[i] = push(self.sizes[i], size)
            if not self.sizes[i].isnan().any():
                self.lowest[i] = min(float(self.lowest[i]), median(self.sizes[i].tolist()))
                worst = max(worst, size - max(0.0, float(self.lowest[i])))
        return worst

    def judge(self, step: int, figures: dict[str, float]) -> tuple[list[Event], list[Event]]:
        """The conditions that start and those that end at generator step ``step``, given the check's ``figures``
        (those of :data:`CONDITIONS`, by figure name; a figure not measured for this run is absent)."""
        started, ended, on = [], [], self.on
        for i, condition in enumerate(CONDITIONS):
            value = figures.get(condition.figure)
            if value is None:
                continue
            self.history[i] = push(self.history[i], value)
            recent = self.history[i].tolist()
            typical, complete = median(recent), not math.isnan(recent[0])
            if complete:
                best = float(self.best[i])
                improving = math.isnan(best) or condition.better(typical, best)
                if improving:
                    self.best[i] = typical
                # Judged once it stops improving, healthy (a relapse from there is a failure) or from ``start`` on.
                self.judging[i] |= not improving and (not condition.bad(typical) or step >= self.start)
            self.judging[i] |= condition.name == "divergence"  # from the first check: never a first step's look
            if not self.judging[i] and math.isfinite(value):  # a non-finite update is never a first step's look
                continue
            if condition.name not in on and (not math.isfinite(value) or complete and condition.bad(typical)):
                shown = value if not math.isfinite(value) else typical
                self.met = torch.cat((self.met, self.met.new_tensor([[i, step, shown, -1]])))
                started.append(self.events[-1])
            elif condition.name in on and complete and not condition.bad(typical):
                self.met[((self.met[:, 0] == i) & (self.met[:, 3] < 0)).nonzero()[0, 0], 3] = step
                ended.append(Event(**{**vars(on[condition.name]), "ended": step}))
        return started, ended


def judging_start(share: float, max_steps: int) -> int:
    """The generator step from which a figure that stopped improving unhealthy is judged: ``share`` of the run."""
    return round(share * max_steps)


def fit_saved_shapes(module: HealthJudge, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Take a saved judge's state as it is where its shapes differ from this one's: the conditions met so far
    (their count grows), and the windows of a run that ``health.patience`` changed for on resume (each keeps its
    newest checks, nan before them). A judge saved before it kept each figure's best median starts that anew."""
    module.met = torch.empty_like(state_dict[prefix + "met"])
    state_dict.setdefault(prefix + "best", module.best.clone())
    for name in ("history", "sizes"):
        saved, width = state_dict[prefix + name], getattr(module, name).shape[1]
        padding = saved.new_full((len(saved), max(0, width - saved.shape[1])), math.nan)
        state_dict[prefix + name] = torch.cat((padding, saved), dim=1)[:, -width:]


def push(window: Tensor, value: float) -> Tensor:
    """``window`` with ``value`` appended and its oldest value dropped."""
    return torch.cat((window[1:], window.new_tensor([value])))


def orders(value: float) -> float:
    """log10 of ``value``'s size (``value`` finite)."""
    return math.log10(abs(value) + 1e-30)


def median(values: list[float]) -> float:
    """The middle value (the upper of the two middle ones for an even count); inf and nan sort last."""
    return sorted(values, key=lambda v: (not math.isfinite(v), v if math.isfinite(v) else 0.0))[len(values) // 2]
