"""GANModule: what a training run holds and a checkpoint saves -- G, D, the objective, the EMA generator,
the step counters and the fixed sample noise -- as one plain ``nn.Module``, so that ``state_dict()``,
``load_state_dict()`` and ``.to()`` cover all of it. The loop that trains it is gan/training/loop.py;
everything here is built by :func:`gan.run.build.build_module` from the config and handed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from gan.core.audit import checked_sampling
from gan.core.contexts import evaluating
from gan.core.models import UNCONDITIONAL, Condition
from gan.core.objective import Objective
from gan.core.snapshot import make_snapshot
from gan.core.state import EMAGenerator, StepCounters

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]


class GANModule(nn.Module):
    def __init__(self, G: nn.Module, D: nn.Module, objective: Objective, *, ema: EMAGenerator | None,
                 optimizers: tuple[OptimizerFactory, OptimizerFactory], lr_decay: str, max_steps: int,
                 z_dim: int, d_steps: int, batch_size: int, log_every: int, sample_noise: Tensor,
                 sample_labels: Tensor, data_shape: tuple[int, ...], condition: Condition = UNCONDITIONAL,
                 channels_last: bool = False, audit: bool = False, hparams: dict[str, Any] | None = None):
        super().__init__()
        # Plain containers only: an OmegaConf DictConfig in the checkpoint would make it unloadable
        # with torch.load(weights_only=True) ("Unsupported global").
        self.hparams: dict[str, Any] = hparams or {}
        self.cfg = self.hparams.get("cfg", {})  # what the loop logs and measures by
        self.G, self.D, self.objective, self.ema = G, D, objective, ema
        self.make_optimizers, self.lr_decay, self.max_steps = optimizers, lr_decay, max_steps
        self.z_dim, self.d_steps, self.batch_size, self.log_every = z_dim, d_steps, batch_size, log_every
        self.data_shape, self.condition = tuple(data_shape), condition  # (2,) points, (C, H, W) images
        self.channels_last, self.audit = channels_last, audit
        self.counters = StepCounters()
        self.global_rank = 0  # this process's rank under DDP, set by the loop
        self.last_losses: dict[str, float] = {}  # the last logged loss/d and loss/g
        self.last_metrics: dict[str, float] = {}  # the last evaluation's metrics/* (eval.every), as logged
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

    # --- optimizers ------------------------------------------------------------------------------

    def configure_optimizers(self) -> tuple[list[Optimizer], list[LambdaLR]]:
        """One optimizer each for G and D, in that order; with ``optim.decay=linear`` a schedule each, whose
        learning rate falls linearly to 0 at the last generator step, stepped once per generator step.

        torch's LambdaLR with the factor a function of the step alone, ``1 - step / max_steps``: the
        checkpoint holds the step, so a resumed run continues on the line of its own ``trainer.max_steps``
        (LinearLR would multiply its way there step by step instead).
        """
        # Frozen parameters (finetune.freeze_*) are left out: an optimizer holding them would keep state for them.
        optimizers = [make([p for p in network.parameters() if p.requires_grad])
                      for make, network in zip(self.make_optimizers, (self.G, self.D))]
        if self.lr_decay == "constant":
            return optimizers, []
        return optimizers, [LambdaLR(o, lambda s: max(0.0, 1.0 - s / self.max_steps)) for o in optimizers]


def grad_norm(module: nn.Module) -> Tensor:
    """L2 norm of all gradients of ``module``, on their device (0 where none exist)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=next(module.parameters()).device)
