"""The run's health check (``health.*``): every ``health.every`` generator steps -- logging steps, whose
scalars the loop reads from the device in one transfer -- the figures of gan/core/health.py, logged as
``health/*``; a line in the log when a condition starts and when it ends; at the end (or at a stop) the
conditions met and when, in ``<run>/health.json`` and as text in TensorBoard. ``health.action=stop`` stops
the run at the end of the step a condition starts in, with its checkpoint.

Nothing here changes training: the figures are made under ``torch.no_grad()`` with the networks in eval mode
(no BatchNorm statistic or spectral-norm vector moves), from fixed sets drawn with a generator of their own
(the run's random streams are left alone).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from gan.config.eval_settings import EvalSettings
from gan.core.contexts import evaluating
from gan.core.health import BY_NAME, CONDITIONS, Event, HealthJudge, loss_ratio, separation, spread
from gan.evaluation.metrics import ReferenceSpace, knn_radii, precision_coverage, reference_space
from gan.files import atomic_write
from gan.training.observer import ObservedRun, Observer

if TYPE_CHECKING:
    from gan.core.step import StepResult
    from gan.run.module import GANModule

log = logging.getLogger(__name__)

FILE = "health.json"
K = 3  # neighbours of the k-NN balls of fit and coverage (evaluate.py's precision and coverage use as many)


def fixed_set(dataset: Dataset, count: int, seed: int, after: int = 0) -> tuple[Tensor, Tensor]:
    """``count`` examples of ``dataset`` (at most all of them) and their labels, drawn with ``seed`` by a generator of
    their own; ``after``: skip that many of the draw first (a second set, apart from the first)."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    index = order[after:after + count].tolist()
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return tensors[0][index], tensors[1][index]
    examples = [dataset[i] for i in index]
    return torch.stack([x for x, _ in examples]), torch.tensor([int(y) for _, y in examples])


class HealthWatch(Observer):
    """The health of one run, checked by rank 0 for every rank (they hold the same networks) at the steps the loop
    says: ``action`` (``warn`` or ``stop``), the judge of its conditions, how many examples each fixed set holds
    (``count``), the metrics' settings (which name the reference feature space and its cache), how long the run
    is (``max_steps``) and how often it is checked (``every``), where ``health.json`` goes and TensorBoard's
    writer (None: no TensorBoard)."""

    def __init__(self, action: str, judge: HealthJudge, count: int, settings: EvalSettings, max_steps: int,
                 every: int, run_dir: Path, writer: Any):
        self.action, self.judge, self.count, self.settings = action, judge, count, settings
        # A median of patience checks, no better than the one before: the first check that judges is the next one.
        self.judged = max_steps >= (judge.patience + 1) * every  # a shorter run is logged, judged for divergence alone
        self.run_dir, self.writer = Path(run_dir), writer
        self.stopped_by: Event | None = None  # the condition that stops the run (health.action=stop)
        self.trained: tuple[Tensor, Tensor] | None = None
        self.held: tuple[Tensor, Tensor] | None = None
        self.real_spread: float | None = None
        self.samples = 0
        self.space: ReferenceSpace | None = None
        self.reference: Tensor | None = None  # real data's features in the reference space, and their k-NN radii
        self.radii: Tensor | None = None
        self.floors: dict[str, Tensor] = {}  # what real data apart from the reference scores: fit, coverage, labels

    def on_start(self, run: ObservedRun) -> None:
        """The fixed sets, on the run's device: training images, and images D never trains on (the data's held-out
        ones, where it has some); the real images' spread, which the samples' is measured against; the reference
        space, two sets of the data's population in it (one to compare with, one for the floor: what real data
        itself scores)."""
        module, data = run.module, run.data
        dataset, held, seed = data.dataset, data.held_out(), data.seed
        device, dtype = module.device, next(module.D.parameters()).dtype  # as D's weights: bf16-true has bf16 ones
        self.trained = on_device(fixed_set(dataset, self.count, seed), device, dtype)
        self.held = on_device(fixed_set(held, self.count, seed), device, dtype) if held is not None else None
        self.samples = min(self.count, len(module.sample_noise))  # of the fixed noise, against as many real images
        self.real_spread = float(spread(self.trained[0][:self.samples]))
        population = data.population()
        self.space = reference_space(data.cfg, population, self.settings, module.device)  # trained once per dataset
        self.reference_sets(module, population, seed)
        if module.objective.loss.chance is None:
            log.info("health: d_wins is not watched: a Wasserstein critic's loss has no value at chance to fall "
                     "from (its gradient penalty is what keeps it from winning)")
        if held is None:
            log.info("health: d_memorises is not watched: every image of this data trains, and it has no other split "
                     "here (data.limit=N keeps the rest aside, and this check compares D on both)")
        if not self.judged:
            log.info("health: this run is too short to judge: it makes fewer than health.patience + 1 checks "
                     "(health.every generator steps apart), and a condition is judged once the median of "
                     "health.patience checks stops improving, so its figures are logged and judged for divergence "
                     "alone (a lower health.every judges it)")

    @torch.no_grad()
    def reference_sets(self, module: GANModule, population: Dataset, seed: int) -> None:
        """The reference features and their radii, and the floors of fit, coverage and (conditional runs) labels
        obeyed, from two sets of ``population`` apart: as many images as the fixed noise has, or half of a smaller
        population each."""
        size = min(self.count, len(population) // 2)
        floor_size = min(self.samples, len(population) - size)
        reference, labels = on_device(fixed_set(population, size, seed), module.device, torch.float32)
        floor = on_device(fixed_set(population, floor_size, seed, after=size), module.device, torch.float32)[0]
        self.reference = self.space(reference)
        self.radii = knn_radii(self.reference.double(), min(K, size - 1))
        fit, coverage = precision_coverage(self.reference, self.radii, self.space(floor))
        self.floors = {"fit": fit, "coverage": coverage}
        if module.condition.kind == "classes" and self.space.classifies:
            self.floors["labels_obeyed"] = (self.space.classify(self.reference) == labels).double().mean()

    @torch.no_grad()
    def figures(self, module: GANModule, result: StepResult) -> dict[str, Tensor]:
        """The check's figures, on the device (the loop reads them with the step's other scalars)."""
        last, loss, figures = result.d[-1], module.objective.loss, {}
        if loss.chance is not None:
            figures["health/d_loss_ratio"] = loss_ratio(loss, last.real_logits, last.fake_logits)
        if self.held is not None:
            with evaluating(module.D):
                scores = [self.scores(module, images, labels) for images, labels in (self.trained, self.held)]
            figures["health/d_memorisation"] = separation(*scores)
        labels = module.sample_labels[:self.samples] if module.condition.values else None
        samples = module.generate(module.sample_noise[:self.samples], labels)
        figures["health/diversity"] = spread(samples) / self.real_spread
        features = self.space(samples)
        fit, coverage = precision_coverage(self.reference, self.radii, features)
        figures["health/fit"], figures["health/coverage"] = fit / self.floors["fit"], coverage / self.floors["coverage"]
        if "labels_obeyed" in self.floors:
            obeyed = (self.space.classify(features) == labels).double().mean()
            figures["health/labels_obeyed"] = obeyed / self.floors["labels_obeyed"]
        if module.objective.classify and module.condition.kind == "classes":  # AC-GAN: D's own head says it too
            with evaluating(module.D):
                named = module.objective.critic(module.D, samples, labels, augment=False)[1].argmax(dim=1)
            figures["health/labels_by_d"] = (named == labels).double().mean()
        return figures

    @staticmethod
    def scores(module: GANModule, images: Tensor, labels: Tensor) -> Tensor:
        """D's real/fake scores of ``images``, not augmented: the same images score the same at every check."""
        if module.condition.kind == "code":  # G's latent code, which real images do not have: D is scored without
            labels = torch.zeros_like(labels)
        return module.objective.critic(module.D, images, labels, augment=False)[0]

    def check(self, step: int, numbers: dict[str, float]) -> None:
        """Judge the check at generator step ``step`` from the scalars read (``numbers``, to which this adds
        ``health/blowup``); say what starts and ends, in the log and in TensorBoard's text; under
        ``health.action=stop``, the first condition to start stops the run (``stopped_by``)."""
        numbers["health/blowup"] = self.judge.blowup(step, numbers)
        figures = {name.removeprefix("health/"): v for name, v in numbers.items() if name.startswith("health/")}
        started, ended = self.judge.judge(step, figures)
        lines = []
        for event in started:
            condition = BY_NAME[event.condition]
            sign = ">=" if condition.above else "<="
            lines.append(f"health: {event.condition} at generator step {step}: {condition.figure} "
                         f"{shown(event.value)} {sign} {condition.threshold} (the median of the last "
                         f"{self.judge.patience} checks): {condition.meaning} (docs/usage.md#training-health)")
        lines += [f"health: {e.condition} is over at generator step {step} (since {e.started})" for e in ended]
        for line in lines:
            log.warning(line)
            if self.writer is not None:
                self.writer.add_text("health/events", line, step)
        if started and self.action == "stop":
            self.stopped_by = started[0]

    def summary(self) -> dict[str, Any]:
        """What ``health.json`` holds: each condition met, when it started and ended."""
        return {"conditions": [vars(e) for e in self.judge.events], "judged": self.judged,
                "judged_from": self.judge.start,
                "thresholds": {c.name: {"figure": c.figure, "threshold": c.threshold,
                                        "bad": "at or above" if c.above else "at or below"} for c in CONDITIONS},
                "memorisation_watched": self.held is not None, "stopped_by": self.stopped_by and
                self.stopped_by.condition}

    def on_end(self, run: ObservedRun) -> None:
        """The conditions met, to ``<run>/health.json`` and TensorBoard's text."""
        step = run.module.counters.g
        summary = self.summary()
        atomic_write(self.run_dir / FILE, lambda f: f.write((json.dumps(summary, indent=2) + "\n").encode()))
        if self.writer is not None:
            self.writer.add_text("health", describe(summary["conditions"]), step)


def on_device(examples: tuple[Tensor, Tensor], device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    images, labels = examples
    return images.to(device, dtype), labels.to(device)


def shown(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else str(value)


def describe(events: list[dict[str, Any]]) -> str:
    """The conditions met, a line each (Markdown, for TensorBoard's text tab)."""
    if not events:
        return "No condition was met: the run looked healthy at every check."
    return "\n".join(f"- **{e['condition']}** from generator step {e['started']} ({BY_NAME[e['condition']].figure} "
                     f"{shown(e['value'])})" + (f" to {e['ended']}" if e["ended"] is not None else ", to the end")
                     for e in events)
