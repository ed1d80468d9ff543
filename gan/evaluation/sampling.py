"""Drawing the samples that are measured: seeded noise, balanced labels, images rounded as saved; and
samples along paths between noise vectors (latent interpolation), for pictures.

Typed against :class:`SampleSource`, not the training module: anything that generates (a GANModule,
a loaded generator in a test) can be sampled and scored, and the metrics never depend on how a
generator was trained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

from gan.config.eval_settings import EvalSettings
from gan.core.models import Condition
from gan.data.datasets import is_points
from gan.evaluation.metrics import ImageMetrics, MixtureMetrics, quantize


class SampleSource(Protocol):
    """What sampling needs of a generator; :class:`gan.run.module.GANModule` is one."""

    z_dim: int
    condition: Condition  # what G takes beside z: nothing, classes, or a latent code
    cfg: Mapping[str, Any]  # the run's config: ``cfg["data"]["name"]`` says whether it makes points or images

    @property
    def device(self) -> torch.device: ...

    def generate(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """Samples for noise ``z`` (and class ``labels``), graph-free and without changing any state."""
        ...


def generate_samples(source: SampleSource, num_samples: int, seed: int, batch_size: int = 250) -> Tensor:
    """``num_samples`` samples of ``source``.

    Noise comes from a generator seeded with ``seed`` on the CPU (the same noise on any device); a
    conditional generator gets balanced labels of the classes it was trained on (:meth:`Condition.cycle`; an
    unconditional one ignores them), a latent code is drawn from its uniform prior, as in training, so the
    samples follow G's own distribution. Images are rounded to 8 bits (:func:`quantize`): what is scored is what
    would be saved.
    """
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(num_samples, source.z_dim, generator=generator)
    labels = source.condition.labels(num_samples, generator)
    samples = torch.cat([source.generate(z.to(source.device), y.to(source.device))
                         for z, y in zip(noise.split(batch_size), labels.split(batch_size))])
    return samples if is_points(samples.shape[1:]) else quantize(samples)


def sample_and_score(source: SampleSource, metrics: MixtureMetrics | ImageMetrics, settings: EvalSettings,
                     seed: int) -> tuple[Tensor, dict[str, Any]]:
    """Samples of ``source`` and their metrics; a class-conditional generator's samples are scored per class
    too, with the labels :func:`generate_samples` gave them (a latent code names no class of the data): the
    classes it was trained on, and no other."""
    samples = generate_samples(source, settings.num_samples, seed, settings.batch_size)
    condition = source.condition
    labels = condition.cycle(settings.num_samples) if condition.classes else None
    return samples, metrics.score(samples, seed, labels)


def slerp(a: Tensor, b: Tensor, t: Tensor) -> Tensor:
    """Spherical interpolation from the rows of ``a`` to those of ``b``: (N, D), (N, D), (T,) -> (N, T, D).

    Along the great circle, not the straight line: Gaussian noise in D dimensions lies near the sphere
    of radius sqrt(D), where G was trained, and a straight line between two draws (nearly orthogonal in
    many dimensions) passes well inside it, at radius about sqrt(D / 2) halfway. Norms are interpolated
    linearly; two independent draws are never parallel, so the angle is never 0.
    """
    norm_a, norm_b = a.norm(dim=1, keepdim=True), b.norm(dim=1, keepdim=True)
    angle = torch.arccos(((a / norm_a) * (b / norm_b)).sum(dim=1, keepdim=True).clamp(-1, 1))[:, None]
    t = t[None, :, None]
    direction = (torch.sin((1 - t) * angle) * (a / norm_a)[:, None] + torch.sin(t * angle) * (b / norm_b)[:, None]
                 ) / torch.sin(angle)
    return direction * ((1 - t) * norm_a[:, None] + t * norm_b[:, None])


def interpolate(source: SampleSource, rows: int, steps: int, seed: int) -> Tensor:
    """Samples along ``rows`` paths of ``steps`` points each, row after row: row r goes from one noise
    vector to another by :func:`slerp` (both ends included). A conditional generator draws row r as the
    r-th (mod K) of the K classes or codes it was trained with: with ``rows`` = K, one row each. Noise from a
    CPU generator seeded with ``seed``; samples through ``source.generate``, the one sampling path."""
    generator = torch.Generator().manual_seed(seed)
    ends = torch.randn(2, rows, source.z_dim, generator=generator)
    z = slerp(ends[0], ends[1], torch.linspace(0, 1, steps)).flatten(0, 1)
    labels = source.condition.cycle(rows).repeat_interleave(steps)
    return source.generate(z.to(source.device), labels.to(source.device))
