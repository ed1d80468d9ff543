"""The layers of ``model=resnet``, R3GAN's residual G and D (Huang et al., NeurIPS 2024, "The GAN is dead; long live
the GAN!"); gan/core/models.py puts them together.

Mirror-image networks without any normalization layer. Each resolution is a stage of ``blocks`` residual blocks;
a block is a 1x1 convolution widening its channels ``expansion`` times, a 3x3 convolution in ``cardinality``
groups and a 1x1 convolution back, leaky ReLUs between. In place of normalization the block's last layer starts
at zero and its others are scaled by L^(-1/4) (L blocks in the network, 3 layers a block: L^(-1/(2*3-2))), so
the residual sum keeps its scale however deep the network is. G starts from a learned (start x start) basis
scaled channel by channel by a linear map of z; D ends with a depthwise (start x start) convolution and a linear
layer. Stages change resolution through a fixed [1, 2, 1] low-pass filter, and a 1x1 convolution where the
width changes (at the lower resolution, where it is cheaper).

Widths follow DCGAN's rule: ``width`` channels at full resolution, doubled per halving. Every layer that
fine-tuning counts as one block (a residual block, a stage's transition, the basis, the RGB layers) is a module
with ``is_block = True``: gan/core/freezing.py freezes it whole.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

LEAKY_SLOPE = 0.2
LEAKY_GAIN = math.sqrt(2 / (1 + LEAKY_SLOPE**2))  # keeps a unit-variance input's variance through the leaky ReLU


def scaled_init(layer: nn.Conv2d | nn.Linear, gain: float) -> nn.Module:
    """Weights N(0, gain^2 / fan_in) (He et al.'s rule with ``gain``), biases 0; gain 0: all zeros."""
    fan_in = layer.weight[0].numel()
    nn.init.normal_(layer.weight, 0.0, gain / math.sqrt(fan_in))
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class ResidualBlock(nn.Module):
    """x + project(act(grouped(act(expand(x))))); ``project`` starts at zero, so the block starts as the identity.
    The biases of ``expand`` and ``grouped`` are R3GAN's biased activations (a bias, then the leaky ReLU)."""

    is_block = True

    def __init__(self, channels: int, cardinality: int, expansion: int, scale: float, zero_init: bool = True):
        super().__init__()
        hidden = channels * expansion
        self.expand = scaled_init(nn.Conv2d(channels, hidden, 1), LEAKY_GAIN * scale)
        self.grouped = scaled_init(nn.Conv2d(hidden, hidden, 3, padding=1, groups=cardinality), LEAKY_GAIN * scale)
        # Spectral norm divides a weight by its largest singular value: a zero weight would give 0 / 0.
        self.project = scaled_init(nn.Conv2d(hidden, channels, 1, bias=False), 0.0 if zero_init else scale)
        self.act = nn.LeakyReLU(LEAKY_SLOPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.act(self.grouped(self.act(self.expand(x)))))


class LowPass(nn.Module):
    """Doubles (``up``) or halves the resolution with the separable [1, 2, 1] filter, channel by channel: up,
    each new pixel is the mean of its two neighbours (linear interpolation); down, a blur before the stride, so
    that no frequency above the new resolution's folds back. (R3GAN's own resamplers widen the filter to
    [1, 3, 3, 1], bilinear; the 3-tap one keeps each pixel where it was and costs less.)"""

    def __init__(self, channels: int, up: bool):
        super().__init__()
        taps = torch.tensor([1.0, 2.0, 1.0])
        kernel = torch.outer(taps, taps) / (4.0 if up else 16.0)  # up: gain 4, the zeros between the pixels
        # Derived from nothing learned: rebuilt with the module, not saved.
        self.register_buffer("kernel", kernel.expand(channels, 1, 3, 3).contiguous(), persistent=False)
        self.up = up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.up:
            return F.conv_transpose2d(x, self.kernel, stride=2, padding=1, output_padding=1, groups=x.shape[1])
        return F.conv2d(x, self.kernel, stride=2, padding=1, groups=x.shape[1])


class Transition(nn.Module):
    """Between two stages: G up (1x1 convolution at the lower resolution, then the filter), D down (the filter,
    then the 1x1 convolution); no convolution where the width stays."""

    is_block = True

    def __init__(self, channels_in: int, channels_out: int, up: bool):
        super().__init__()
        self.resample = LowPass(channels_out if up else channels_in, up)
        self.conv = scaled_init(nn.Conv2d(channels_in, channels_out, 1, bias=False), 1.0) \
            if channels_in != channels_out else nn.Identity()
        self.up = up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resample(self.conv(x)) if self.up else self.conv(self.resample(x))


class GenerativeBasis(nn.Module):
    """z -> a learned (C, S, S) basis, each channel scaled by a linear function of z."""

    is_block = True

    def __init__(self, z_dim: int, channels: int, size: int):
        super().__init__()
        self.basis = nn.Parameter(torch.randn(channels, size, size))
        self.linear = scaled_init(nn.Linear(z_dim, channels, bias=False), 1.0)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.basis * self.linear(z)[:, :, None, None]


class DiscriminativeBasis(nn.Module):
    """(N, C, S, S) -> a depthwise (S x S) convolution -> a linear layer: (N, outputs)."""

    is_block = True

    def __init__(self, channels: int, size: int, outputs: int):
        super().__init__()
        self.depthwise = scaled_init(nn.Conv2d(channels, channels, size, groups=channels, bias=False), 1.0)
        self.linear = scaled_init(nn.Linear(channels, outputs), 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.depthwise(x).flatten(1))


def stage_widths(width: int, stages: int) -> list[int]:
    """Channels per stage from the lowest resolution to the full one: ``width`` at full resolution, doubled per
    halving (DCGAN's rule)."""
    return [width * 2 ** (stages - 1 - i) for i in range(stages)]


def stages(widths: list[int], blocks: int, cardinality: int, expansion: int, zero_init: bool,
           up: bool) -> list[nn.Module]:
    """Residual stages for ``widths`` in the order they run, with their transitions between: G's from the lowest
    resolution up, D's from the full one down."""
    scale = (len(widths) * blocks) ** -0.25  # L^(-1/(2m - 2)), m = 3 layers a block
    layers: list[nn.Module] = []
    for i, channels in enumerate(widths):
        if i:
            layers.append(Transition(widths[i - 1], channels, up))
        layers += [ResidualBlock(channels, cardinality, expansion, scale, zero_init) for _ in range(blocks)]
    return layers
