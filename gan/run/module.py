"""GANModule: what a training run holds and a checkpoint saves -- G, D, the objective, the EMA generator,
the step counters and the fixed sample noise -- as one plain ``nn.Module``, so that ``state_dict()``,
``load_state_dict()`` and ``.to()`` cover all of it, and how its running statistics follow each generator step.
The loop that trains it is gan/training/loop.py; everything here is built by :func:`gan.run.build.build_module`
from the config and handed in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from gan.core.audit import checked_sampling
from gan.core.contexts import evaluating
from gan.core.distributed import broadcast_buffers
from gan.core.models import UNCONDITIONAL, Condition
from gan.core.objective import Objective
from gan.core.snapshot import make_snapshot
from gan.core.state import EMAGenerator, StepCounters

if TYPE_CHECKING:
    from gan.core.step import StepResult


class GANModule(nn.Module):
    """``G``, ``D``, the ``objective`` (losses, regularizer, augmentation and their running statistics), the EMA
    generator, the step counters and the fixed noise behind the sample grids; ``z_dim``, ``data_shape`` and
    ``condition`` say what G takes and makes; ``hparams`` is what the checkpoint records of the run (its config,
    plain values). How it trains (optimizers, batch, D steps) is the loop's, from the config."""

    def __init__(self, G: nn.Module, D: nn.Module, objective: Objective, *, ema: EMAGenerator | None, z_dim: int,
                 data_shape: tuple[int, ...], condition: Condition = UNCONDITIONAL, sample_noise: Tensor,
                 sample_labels: Tensor, hparams: dict[str, Any] | None = None):
        super().__init__()
        # Plain containers only: an OmegaConf DictConfig in the checkpoint would make it unloadable
        # with torch.load(weights_only=True) ("Unsupported global").
        self.hparams: dict[str, Any] = hparams or {}
        self.cfg = self.hparams.get("cfg", {})  # the run's config, as the checkpoint records it
        self.G, self.D, self.objective, self.ema = G, D, objective, ema
        self.z_dim, self.data_shape, self.condition = z_dim, tuple(data_shape), condition  # (2,) points, (C, H, W)
        self.channels_last = False  # NHWC weights (data.channels_last): its inputs are made NHWC too
        self.audit = False  # audit=true: sampling is checked too (gan.core.audit.checked_sampling)
        self.counters = StepCounters()
        # Fixed noise (and labels) for sample grids: persistent buffers, so grids stay comparable across resume.
        self.register_buffer("sample_noise", sample_noise)
        self.register_buffer("sample_labels", sample_labels)

    @property
    def device(self) -> torch.device:
        return self.sample_noise.device

    def noise(self, n: int) -> Tensor:
        return torch.randn(n, self.z_dim, device=self.device)

    def latent_code(self, n: int) -> Tensor:
        """G's categorical code for ``n`` samples, uniform over its values (model.codes), drawn on the device."""
        return torch.randint(self.condition.values, (n,), device=self.device)

    @torch.no_grad()
    def update_statistics(self, result: StepResult, images: int) -> None:
        """After a generator step (``result``) that took ``images`` real images over all processes: the counters,
        the objective's running statistics, the EMA generator and the augmentation probability."""
        for d in result.d:
            self.counters.count_d_step()
            self.objective.observe(d)
        self.counters.count_g_step(images)
        broadcast_buffers(self.G, self.D)  # DDP: rank 0's BatchNorm statistics on every rank, before EMA copies G's
        if self.ema is not None:
            self.ema.update(self.G, self.counters.g)
        augment = self.objective.augment
        if augment is not None and self.counters.g % augment.interval == 0:
            augment.adjust(images)

    # --- sampling --------------------------------------------------------------------------------

    @property
    def sampling_generator(self) -> nn.Module:
        """The generator used for samples and metrics: the EMA copy when enabled."""
        return self.ema.generator if self.ema is not None else self.G

    def generate(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """Samples through the one evaluation context (eval mode, no_grad, state restored)."""
        generator = self.sampling_generator
        labels = labels if self.condition.values else None

        def sample() -> Tensor:
            with evaluating(generator):
                return generator(z, labels)

        return checked_sampling(generator, sample) if self.audit else sample()

    def snapshot(self, **info: Any) -> dict[str, Any]:
        """The sampling generator as ``generator.pt`` holds it (gan/core/snapshot.py): the EMA copy's weights
        where there is one, else G's; ``info``: more plain values to keep with them."""
        return make_snapshot(self.sampling_generator, model=self.cfg["model"], z_dim=self.z_dim,
                             data_shape=tuple(self.hparams["data_shape"]), condition=self.condition,
                             generator="G" if self.ema is None else "ema", step=self.counters.g,
                             data=self.cfg["data"]["name"], **self.started_from(), **info)

    def started_from(self) -> dict[str, Any]:
        """Where a fine-tuning run's weights came from (``init_from``: its checkpoint and generator step)."""
        record = self.hparams.get("init_from")
        return {} if record is None else {"init_from": record}

