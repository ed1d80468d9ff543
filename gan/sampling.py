"""Drawing the samples that are measured: seeded noise, balanced labels, images rounded as saved.

Typed against :class:`SampleSource`, not the training module: anything that generates (a GANModule,
a loaded generator in a test) can be sampled and scored, and the metrics never depend on how a
generator was trained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

from gan.data import is_point_data
from gan.metrics import EvalSettings, ImageMetrics, MixtureMetrics, quantize
from gan.models import balanced_labels


class SampleSource(Protocol):
    """What sampling needs of a generator; :class:`gan.module.GANModule` is one."""

    z_dim: int
    num_classes: int  # 0: unconditional
    cfg: Mapping[str, Any]  # the run's config: ``cfg["data"]["name"]`` says whether it makes points or images

    @property
    def device(self) -> torch.device: ...

    def generate(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """Samples for noise ``z`` (and class ``labels``), graph-free and without changing any state."""
        ...


def generate_samples(source: SampleSource, num_samples: int, seed: int, batch_size: int = 250) -> Tensor:
    """``num_samples`` samples of ``source``.

    Noise comes from a generator seeded with ``seed`` on the CPU (the same noise on any device); a
    conditional generator gets :func:`balanced_labels` (an unconditional one ignores them). Images are
    rounded to 8 bits (:func:`quantize`): what is scored is what would be saved.
    """
    noise = torch.randn(num_samples, source.z_dim, generator=torch.Generator().manual_seed(seed))
    labels = balanced_labels(num_samples, source.num_classes)
    samples = torch.cat([source.generate(z.to(source.device), y.to(source.device))
                         for z, y in zip(noise.split(batch_size), labels.split(batch_size))])
    return samples if is_point_data(source.cfg["data"]["name"]) else quantize(samples)


def sample_and_score(source: SampleSource, metrics: MixtureMetrics | ImageMetrics, settings: EvalSettings,
                     seed: int) -> tuple[Tensor, dict[str, Any]]:
    """Samples of ``source`` and their metrics; a conditional generator's samples are scored per class
    too, with the labels :func:`generate_samples` gave them."""
    samples = generate_samples(source, settings.num_samples, seed, settings.batch_size)
    labels = balanced_labels(settings.num_samples, source.num_classes) if source.num_classes else None
    return samples, metrics.score(samples, seed, labels)
