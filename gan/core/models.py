"""Generators and discriminators: ``mlp`` (2D data and flattened images), ``dcgan`` and ``resnet`` (R3GAN's,
from the layers of gan/core/resnet.py).

A conditional discriminator does not take labels itself. With ``d_condition: input`` (Mirza and Osindero
2014) the training step builds its input as ``torch.cat((condition, x), dim=1)``, so the detach of ``x``
is visible where it happens, and its input width includes ``num_classes`` condition channels. With
``d_condition: classifier`` (AC-GAN, Odena et al. 2017) it sees the image alone and outputs
``1 + num_classes`` numbers: its real/fake logit, then logits over the classes.

Without labels, ``codes: K`` gives G a categorical latent code of K values beside its noise (InfoGAN,
Chen et al. 2016), drawn uniformly for every sample; D names it from G's samples as an AC-GAN D names a
class. Noise is connected, so a G of noise alone must spread some samples between separate modes; a
code lets it send each value to its own mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from gan.core.resnet import DiscriminativeBasis, GenerativeBasis, scaled_init, stage_widths, stages
from gan.errors import ConfigError


def one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N, K) float one-hot rows. Not ``F.one_hot``: on a CPU it reads the labels' min and max back to check
    their range, two host reads per call, which on a GPU would be two waits for the device."""
    return (labels[:, None] == torch.arange(num_classes, device=labels.device)).float()


def condition_input(labels: torch.Tensor, num_classes: int, shape: tuple[int, ...]) -> torch.Tensor:
    """One-hot labels shaped to concatenate with a batch of ``shape``: (N, K) or (N, K, H, W) maps."""
    rows = one_hot(labels, num_classes)
    if len(shape) == 1:
        return rows
    return rows[:, :, None, None].expand(-1, -1, shape[1], shape[2])


def balanced_labels(num_samples: int, num_classes: int) -> torch.Tensor:
    """Labels cycling 0, 1, ..., K-1, 0, 1, ...: every class gets ``num_samples // K`` samples or one
    more (exactly equal shares when K divides ``num_samples``). The same for every seed: only the noise
    follows the seed. Cycling, not blocks, so the first 8 K samples hold 8 of each class for the grid."""
    return torch.arange(num_samples) % max(num_classes, 1)


def resolution_plan(size: int, model: str = "dcgan") -> tuple[int, int]:
    """(start, n): the image is ``start * 2**n`` pixels wide, halving while it stays >= 4 pixels."""
    if size < 4:
        raise ConfigError(f"model={model} needs data.image_size >= 4, got {size}")
    n = 0
    while size % 2 == 0 and size // 2 >= 4:
        size //= 2
        n += 1
    return size, n


class MLPGenerator(nn.Module):
    def __init__(self, z_dim: int, shape: tuple[int, ...], hidden: int, layers: int, num_classes: int = 0):
        super().__init__()
        self.shape, self.num_classes = shape, num_classes
        dims = [z_dim + num_classes] + [hidden] * layers
        blocks: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            blocks += [nn.Linear(a, b), nn.ReLU()]
        blocks.append(nn.Linear(dims[-1], math.prod(shape)))
        if len(shape) > 1:  # images live in [-1, 1]; 2D points are unbounded
            blocks.append(nn.Tanh())
        self.net = nn.Sequential(*blocks)

    def forward(self, z: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.num_classes:
            z = torch.cat((z, one_hot(labels, self.num_classes)), dim=1)
        return self.net(z).view(-1, *self.shape)


class FourierFeatures(nn.Module):
    """x -> (x, sin 2 pi x B, cos 2 pi x B), B an (in_features, n) matrix of N(0, scale^2) entries drawn once
    (Tancik et al. 2020): a few coordinates fed to an MLP as they are give it only coarse functions of them,
    and with these it can resolve structure about 1 / scale wide. B is a buffer: fixed, saved, moved by .to()."""

    def __init__(self, in_features: int, n: int, scale: float):
        super().__init__()
        self.register_buffer("frequencies", torch.randn(in_features, n) * (2 * math.pi * scale))
        self.out_features = in_features + 2 * n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phases = x @ self.frequencies
        return torch.cat((x, phases.sin(), phases.cos()), dim=1)


class MLPDiscriminator(nn.Module):
    def __init__(self, in_features: int, hidden: int, layers: int, outputs: int = 1, fourier: int = 0,
                 fourier_scale: float = 1.0):
        super().__init__()
        blocks: list[nn.Module] = [nn.Flatten()]
        if fourier:
            blocks.append(FourierFeatures(in_features, fourier, fourier_scale))
            in_features = blocks[-1].out_features
        dims = [in_features] + [hidden] * layers
        for a, b in zip(dims[:-1], dims[1:]):
            blocks += [nn.Linear(a, b), nn.LeakyReLU(0.2)]
        blocks.append(nn.Linear(dims[-1], outputs))
        self.net = nn.Sequential(*blocks)
        self.outputs = outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N,) logits, or (N, outputs) for more than one output."""
        out = self.net(x)
        return out.view(-1) if self.outputs == 1 else out


class DCGANGenerator(nn.Module):
    """z -> (start x start) -> n doublings by transposed convolutions -> tanh image."""

    def __init__(self, z_dim: int, channels: int, image_size: int, width: int, num_classes: int = 0):
        super().__init__()
        self.num_classes = num_classes
        start, n = resolution_plan(image_size)
        widths = [width * 2 ** (n - 1 - i) for i in range(n)] + [channels]
        blocks: list[nn.Module] = [nn.Unflatten(1, (z_dim + num_classes, 1, 1))]
        if n == 0:
            blocks += [nn.ConvTranspose2d(z_dim + num_classes, channels, start), nn.Tanh()]
        else:
            blocks += [nn.ConvTranspose2d(z_dim + num_classes, widths[0], start, bias=False),
                       nn.BatchNorm2d(widths[0]), nn.ReLU()]
            for i in range(n):
                last = i == n - 1
                blocks.append(nn.ConvTranspose2d(widths[i], widths[i + 1], 4, 2, 1, bias=last))
                blocks += [nn.Tanh()] if last else [nn.BatchNorm2d(widths[i + 1]), nn.ReLU()]
        self.net = nn.Sequential(*blocks)
        dcgan_init(self)

    def forward(self, z: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.num_classes:
            z = torch.cat((z, one_hot(labels, self.num_classes)), dim=1)
        return self.net(z)


class DCGANDiscriminator(nn.Module):
    """n strided convolutions halve the image to (start x start); one convolution gives the score: (N,), or
    (N, outputs) for more than one output."""

    def __init__(self, in_channels: int, image_size: int, width: int, batchnorm: bool = True, outputs: int = 1):
        super().__init__()
        start, n = resolution_plan(image_size)
        blocks: list[nn.Module] = []
        channels = in_channels
        for i in range(n):
            out = width * 2 ** i
            blocks.append(nn.Conv2d(channels, out, 4, 2, 1, bias=not (batchnorm and i > 0)))
            if batchnorm and i > 0:  # no BatchNorm on the input layer (Radford et al.)
                blocks.append(nn.BatchNorm2d(out))
            blocks.append(nn.LeakyReLU(0.2))
            channels = out
        blocks += [nn.Conv2d(channels, outputs, start), nn.Flatten(0 if outputs == 1 else 1)]
        self.net = nn.Sequential(*blocks)
        dcgan_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ResNetGenerator(nn.Module):
    """z (and one-hot labels) -> the basis at (start x start) -> stages doubling to the image -> 1x1 to the
    channels. No tanh, as in R3GAN: samples are clamped to [-1, 1] where they become pixels."""

    def __init__(self, z_dim: int, channels: int, image_size: int, width: int, blocks: int, cardinality: int,
                 expansion: int, num_classes: int = 0):
        super().__init__()
        self.num_classes = num_classes
        start, n = resolution_plan(image_size, "resnet")
        widths = stage_widths(width, n + 1)
        self.net = nn.Sequential(
            GenerativeBasis(z_dim + num_classes, widths[0], start),
            *stages(widths, blocks, cardinality, expansion, zero_init=True, up=True),
            scaled_init(nn.Conv2d(widths[-1], channels, 1), 1.0))

    def forward(self, z: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.num_classes:
            z = torch.cat((z, one_hot(labels, self.num_classes)), dim=1)
        return self.net(z)


class ResNetDiscriminator(nn.Module):
    """1x1 from the channels -> stages halving to (start x start) -> the basis: (N,), or (N, outputs) for more
    than one output. ``zero_init=False`` (under spectral norm) starts each block's last layer scaled, not at 0."""

    def __init__(self, in_channels: int, image_size: int, width: int, blocks: int, cardinality: int, expansion: int,
                 outputs: int = 1, zero_init: bool = True):
        super().__init__()
        start, n = resolution_plan(image_size, "resnet")
        widths = stage_widths(width, n + 1)[::-1]
        self.net = nn.Sequential(
            scaled_init(nn.Conv2d(in_channels, widths[0], 1), 1.0),
            *stages(widths, blocks, cardinality, expansion, zero_init, up=False),
            DiscriminativeBasis(widths[-1], start, outputs))
        self.outputs = outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out.view(-1) if self.outputs == 1 else out


def dcgan_init(module: nn.Module) -> None:
    """Weights N(0, 0.02), BatchNorm scales N(1, 0.02), as in the DCGAN paper."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


def apply_spectral_norm(module: nn.Module) -> nn.Module:
    """Spectral normalization on every conv and linear layer; its power-iteration vector is a buffer."""
    for name, child in module.named_children():
        if isinstance(child, (nn.Conv2d, nn.Linear)):
            setattr(module, name, spectral_norm(child))
        else:
            apply_spectral_norm(child)
    return module


def build_generator(model_cfg: dict[str, Any], z_dim: int, shape: tuple[int, ...], num_classes: int = 0) -> nn.Module:
    """G alone for the ``model`` config group: what training builds, and what gan/core/snapshot.py rebuilds."""
    name = model_cfg["name"]
    if name == "mlp":
        return MLPGenerator(z_dim, shape, model_cfg["hidden"], model_cfg["layers"], num_classes)
    if name == "dcgan":
        if len(shape) != 3:
            raise ConfigError("model=dcgan needs image data, not 2D points: use model=mlp "
                              "(data=ring or data=grid alone trains its 2D recipe, an MLP)")
        return DCGANGenerator(z_dim, shape[0], shape[1], model_cfg["width"], num_classes)
    if name == "resnet":
        sizes = resnet_sizes(model_cfg, shape)
        return ResNetGenerator(z_dim, shape[0], shape[1], *sizes, num_classes)
    raise ConfigError(f"unknown model '{name}': use model=mlp, model=dcgan or model=resnet")


def resnet_sizes(model_cfg: dict[str, Any], shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(width, blocks, cardinality, expansion) of ``model=resnet``; a ConfigError where its grouped convolutions
    cannot split a stage's channels into ``cardinality`` groups (or for 2D points)."""
    if len(shape) != 3:
        raise ConfigError("model=resnet needs image data, not 2D points: use model=mlp "
                          "(data=ring or data=grid alone trains its 2D recipe, an MLP)")
    width, cardinality, expansion = model_cfg["width"], model_cfg["cardinality"], model_cfg["expansion"]
    if (width * expansion) % cardinality:  # the fewest of any stage; every other stage's are a multiple of them
        raise ConfigError(f"model.cardinality={cardinality} does not divide the {width * expansion} channels of "
                          f"model=resnet's blocks at full resolution (model.width={width} x model.expansion="
                          f"{expansion}): choose a cardinality that divides {width * expansion}")
    return width, model_cfg["blocks"], cardinality, expansion


@dataclass(frozen=True)
class Condition:
    """What G takes beside its noise: nothing, the data's classes (``model.conditional``) or a latent code
    of ``values`` values (``model.codes``). Decided once, by :func:`g_condition`; the checkpoint and
    generator.pt keep it (:meth:`as_dict`), and training, sampling, evaluation and export read it."""

    kind: str = "none"  # "none" | "classes" | "code"
    values: int = 0  # the data's largest label + 1, or the code's values: the width of the one-hot labels G takes
    # The labels of a subset of the data's classes (data.classes) that G was trained on, in order; (): all values.
    subset: tuple[int, ...] = ()

    @property
    def seen(self) -> tuple[int, ...]:
        """The labels G was trained with, in order: the subset's classes, else every value (none: no label)."""
        return self.subset or tuple(range(self.values))

    @property
    def classes(self) -> int:
        """How many of the data's classes G was trained on (0 unless ``kind`` is "classes": a code names none)."""
        return len(self.seen) if self.kind == "classes" else 0

    def cycle(self, n: int) -> torch.Tensor:
        """Labels for ``n`` samples cycling through those G was trained with (:func:`balanced_labels` over
        :attr:`seen`: equal shares, the first ``k * len(seen)`` a grid of ``k`` rows); zeros, which G ignores, for
        none."""
        return torch.tensor(self.seen or (0,))[balanced_labels(n, len(self.seen))]

    def labels(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Labels for ``n`` samples as G learned them: a code drawn uniformly (its prior), classes balanced over
        those it was trained on (:meth:`cycle`); zeros, which G ignores, for none."""
        if self.kind == "code":
            return torch.randint(self.values, (n,), generator=generator)
        return self.cycle(n)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "values": self.values, **({"subset": list(self.subset)} if self.subset else {})}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Condition:
        return cls(str(saved["kind"]), int(saved["values"]), tuple(int(c) for c in saved.get("subset", ())))


UNCONDITIONAL = Condition()  # G of noise alone


def latent_codes(model_cfg: dict[str, Any]) -> int:
    """The number of values of G's categorical latent code (``codes``; 0: none), refused beside ``conditional``,
    which gives G the data's classes instead."""
    codes = model_cfg.get("codes", 0)  # configs from before the key existed: no code
    if codes and model_cfg["conditional"]:
        raise ConfigError(f"model.codes={codes} with model.conditional=true: G takes the data's classes or a latent "
                          "code, not both: use model.codes=0 or model.conditional=false")
    return codes


def g_condition(model_cfg: dict[str, Any], data_classes: int, subset: Sequence[int] | None = None) -> Condition:
    """The :class:`Condition` of the ``model`` config on data of ``data_classes`` labels (0: unlabelled), of
    which the run trains on ``subset`` (``data.classes``; None: all); a ConfigError for a bad latent code
    (:func:`latent_codes`) or ``conditional`` on unlabelled data."""
    codes = latent_codes(model_cfg)
    if codes:
        return Condition("code", codes)
    if model_cfg["conditional"]:
        if not data_classes:
            raise ConfigError("model.conditional=true needs labelled data, and this data has no labels: "
                              "use model.conditional=false")
        return Condition("classes", data_classes, tuple(sorted(set(subset))) if subset is not None else ())
    return UNCONDITIONAL


def d_classifies(model_cfg: dict[str, Any]) -> bool:
    """Whether D names G's discrete input from the sample alone: always for a latent code (``codes``); for a
    class, with ``d_condition: classifier`` rather than ``input`` (the labels beside D's input)."""
    return model_cfg.get("d_condition", "input") == "classifier" or latent_codes(model_cfg) > 0


def build_models(model_cfg: dict[str, Any], z_dim: int, shape: tuple[int, ...],
                 num_classes: int = 0) -> tuple[nn.Module, nn.Module]:
    """(G, D) for the ``model`` config group; ``num_classes`` > 0 (the data's classes, or the latent code's
    values) makes both conditional, D as :func:`d_classifies` says (see the module's docstring)."""
    g = build_generator(model_cfg, z_dim, shape, num_classes)  # G first: the random streams draw its weights first
    classifier = num_classes > 0 and d_classifies(model_cfg)
    condition_channels = 0 if classifier else num_classes
    outputs = 1 + num_classes if classifier else 1
    if model_cfg["name"] == "mlp":
        d_in = (shape[0] + condition_channels) * math.prod(shape[1:])
        d = MLPDiscriminator(d_in, model_cfg["hidden"], model_cfg["layers"], outputs,
                             model_cfg.get("d_fourier", 0), model_cfg.get("d_fourier_scale", 1.0))
    elif model_cfg["name"] == "resnet":
        d = ResNetDiscriminator(shape[0] + condition_channels, shape[1], *resnet_sizes(model_cfg, shape), outputs,
                                zero_init=not model_cfg.get("spectral_norm", False))
    else:
        channels, size = shape[0], shape[1]
        d = DCGANDiscriminator(channels + condition_channels, size, model_cfg["width"],
                               model_cfg.get("d_batchnorm", True), outputs)
    if model_cfg.get("spectral_norm", False):
        apply_spectral_norm(d)
    return g, d
