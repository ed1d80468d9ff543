"""What the claims run on: the project's own models, losses and optimizer settings, made small.

:func:`make_gan` builds the DCGAN pair of gan.core.models; :func:`training_module` the GANModule that
``python train.py`` builds from the project's configs; :func:`gan_inputs` the noise and stand-in images
they take. Equal seeds give equal models and inputs, so the variants a claim compares start alike.
"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from gan.config.compose import compose
from gan.core.losses import get_loss
from gan.core.models import build_models, g_condition
from gan.run.build import build_module
from gan.run.module import GANModule

Z_DIM = 16
SIZE = 16  # image side of the small models most demonstrations use
LOSS = get_loss("nonsaturating")  # the default loss of configs/train.yaml


def make_gan(device: torch.device, *, size: int = SIZE, width: int = 8, num_classes: int = 0,
             seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """The project's DCGAN (G, D) for 1-channel ``size`` x ``size`` images, identical for equal seeds."""
    with torch.random.fork_rng(devices=[]):  # seeded weights without resetting the caller's RNG
        torch.manual_seed(seed)
        g, d = build_models({"name": "dcgan", "width": width}, Z_DIM, (1, size, size), num_classes)
    return g.to(device), d.to(device)


def gan_inputs(device: torch.device, batch: int, size: int = SIZE, seed: int = 1) -> tuple[Tensor, Tensor]:
    """Noise for G and a stand-in batch of "real" images in [-1, 1]; equal seeds give equal tensors."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(batch, Z_DIM, generator=generator)
    real = torch.rand(batch, 1, size, size, generator=generator) * 2 - 1
    return z.to(device), real.to(device)


def adam(module: nn.Module) -> torch.optim.Adam:
    return torch.optim.Adam(module.parameters(), lr=2e-4, betas=(0.5, 0.999))


def training_module(device: torch.device, num_classes: int = 0, width: int = 8, model: str = "dcgan") -> GANModule:
    """The GANModule that ``python train.py model=<model>`` builds -- composed from the project's configs -- for
    1-channel SIZE x SIZE images, with augmentation and regularizers off (D's loss is the plain loss)."""
    # model=resnet: its default groups (one channel each at full resolution) at this width
    groups = [f"model.cardinality={width}"] if model == "resnet" else []
    cfg = compose("data=digits", f"model={model}", "augment=none", "reg=none", "loss=nonsaturating",
                  f"model.width={width}", *groups, f"data.image_size={SIZE}", f"train.z_dim={Z_DIM}",
                  f"model.conditional={bool(num_classes)}")
    container = OmegaConf.to_container(cfg, resolve=True)
    return build_module(container, (1, SIZE, SIZE), g_condition(container["model"], num_classes)).to(device)
