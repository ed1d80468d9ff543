"""Discriminator regularizers, chosen with ``reg=none|r1|r1r2|lecam`` (configs/reg/) through one registry,
as the losses are: each adds its penalty to D's loss; the training step never compares names.

A regularizer answers two questions per D update: do D's inputs need ``requires_grad`` (R1
differentiates D with respect to the real samples; R2, with ``penalizes_fake``, the fake ones too), and
what does it add to the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from gan.core.losses import input_gradients
from gan.errors import ConfigError


class Regularizer:
    """``reg=none``: adds nothing. The base of the others."""

    penalizes_fake = False  # whether its penalty differentiates D with respect to the fake samples too

    def needs_input_grad(self, d_step: int) -> bool:
        """Whether the D update numbered ``d_step`` (0-based) differentiates D with respect to ``real``."""
        return False

    def penalty(self, d_step: int, real: Tensor, real_logits: Tensor, fake: Tensor, fake_logits: Tensor,
                scale: Tensor | None = None, anchors: tuple[Tensor, Tensor] | None = None) -> Tensor | None:
        """What this regularizer adds to D's loss in update ``d_step``; None for nothing. ``scale``:
        float16 mixed precision's loss scale (:func:`gan.core.losses.input_gradients`); ``anchors``: the
        running means of D's outputs on real and on fake data (:class:`gan.core.objective.Objective`)."""
        return None


class R1(Regularizer):
    """``gamma / 2 * E[|grad_x D(x)|^2]`` on real data (Mescheder et al. 2018).

    Lazy when ``every`` > 1 (StyleGAN2): computed on every ``every``-th D update only, with its gain
    multiplied by ``every`` so that its average weight is unchanged.
    """

    def __init__(self, gamma: float, every: int):
        if every < 1:
            raise ConfigError(f"reg.every={every}: R1 is computed every N >= 1 D updates")
        self.gamma, self.every = gamma, every

    def needs_input_grad(self, d_step: int) -> bool:
        return d_step % self.every == 0

    def penalty(self, d_step: int, real: Tensor, real_logits: Tensor, fake: Tensor, fake_logits: Tensor,
                scale: Tensor | None = None, anchors: tuple[Tensor, Tensor] | None = None) -> Tensor | None:
        if not self.needs_input_grad(d_step):
            return None
        return self.gamma / 2 * self.every * r1_penalty(real_logits, real, scale)


class R1R2(R1):
    """``gamma / 2 * (E[|grad_x D(x)|^2] + E[|grad_x D(G(z))|^2])``: R1 on real and R2 on fake samples, the
    pair R3GAN (Huang et al., NeurIPS 2024) proves locally convergent with the relativistic loss. R2 keeps
    D smooth where G's samples are, so D cannot push them with a steep slope onto a mode's centre."""

    penalizes_fake = True

    def penalty(self, d_step: int, real: Tensor, real_logits: Tensor, fake: Tensor, fake_logits: Tensor,
                scale: Tensor | None = None, anchors: tuple[Tensor, Tensor] | None = None) -> Tensor | None:
        if not self.needs_input_grad(d_step):
            return None
        # Both input gradients from one inner backward: a second call would cost the engine's fixed overhead again.
        real_grad, fake_grad = input_gradients((real_logits, fake_logits), (real, fake), scale)
        return self.gamma / 2 * self.every * (squared_norm(real_grad) + squared_norm(fake_grad))


class LeCam(Regularizer):
    """``weight * lecam_penalty``, anchored on running means of D's outputs (Tseng et al., CVPR 2021)."""

    def __init__(self, weight: float):
        self.weight = weight

    def penalty(self, d_step: int, real: Tensor, real_logits: Tensor, fake: Tensor, fake_logits: Tensor,
                scale: Tensor | None = None, anchors: tuple[Tensor, Tensor] | None = None) -> Tensor | None:
        if anchors is None:
            raise ValueError("LeCam anchors on the running means of D's outputs: pass anchors=(real, fake)")
        return self.weight * lecam_penalty(real_logits, fake_logits, *anchors)


REGULARIZERS: dict[str, Callable[[dict[str, Any]], Regularizer]] = {
    "none": lambda cfg: Regularizer(),
    "r1": lambda cfg: R1(cfg["gamma"], cfg["every"]),
    "r1r2": lambda cfg: R1R2(cfg["gamma"], cfg["every"]),
    "lecam": lambda cfg: LeCam(cfg["weight"]),
}


def build_regularizer(cfg: dict[str, Any]) -> Regularizer:
    """The regularizer of the ``reg`` config group."""
    if cfg["name"] not in REGULARIZERS:
        raise ConfigError(f"unknown regularizer '{cfg['name']}': use reg={'|'.join(REGULARIZERS)}")
    return REGULARIZERS[cfg["name"]](cfg)


def r1_penalty(real_logits: Tensor, real: Tensor, scale: Tensor | None = None) -> Tensor:
    """R1 (Mescheder et al. 2018): E[||grad_x D(x)||^2] on real data, before the gamma / 2 factor; on fake
    data the same expression is R2.

    ``real`` must have ``requires_grad=True`` and ``real_logits`` must come from it. ``scale``: see
    :func:`gan.core.losses.input_gradients`.
    """
    (grad,) = input_gradients((real_logits,), (real,), scale)
    return squared_norm(grad)


def squared_norm(grad: Tensor) -> Tensor:
    """E[||g||^2] over a batch of per-sample gradients."""
    return grad.pow(2).flatten(1).sum(dim=1).mean()


def lecam_penalty(real_logits: Tensor, fake_logits: Tensor, real_anchor: Tensor, fake_anchor: Tensor) -> Tensor:
    """LeCam (Tseng et al., CVPR 2021, eq. 3): E[(D(x) - a_F)^2] + E[(D(G(z)) - a_R)^2].

    The anchors a_R, a_F are running means of D's outputs on real and fake data (buffers of
    :class:`gan.core.state.RunningMean`), constants here: the penalty pulls each side toward the other's
    recent average, keeping D's predictions from drifting apart when data is scarce.
    """
    return (real_logits - fake_anchor).pow(2).mean() + (fake_logits - real_anchor).pow(2).mean()
