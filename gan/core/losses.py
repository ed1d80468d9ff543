"""Adversarial losses, each a pair of small functions, and the discriminator penalties.

``d(real_logits, fake_logits)`` is minimised by the discriminator, ``g(fake_logits)`` by the
generator; logits are D's raw outputs, shape (N,). The sigmoid losses use ``softplus`` for
numerical stability: ``-log(sigmoid(l)) == softplus(-l)`` and ``-log(1 - sigmoid(l)) == softplus(l)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gan.errors import ConfigError


@dataclass(frozen=True)
class AdversarialLoss:
    """``relativistic``: ``g`` takes ``(fake_logits, real_logits)``, the pairing of each fake with a real.
    ``chance``: ``d``'s value when D cannot tell real from fake (at its best constant output), the level its
    loss falls from as D learns to tell them; None for the Wasserstein critic, whose loss has no such level."""

    d: Callable[[Tensor, Tensor], Tensor]
    g: Callable[..., Tensor]
    relativistic: bool = False
    chance: float | None = None


def sigmoid_d(real: Tensor, fake: Tensor) -> Tensor:
    """-log D(x) - log(1 - D(G(z))): binary cross-entropy, real = 1, fake = 0."""
    return F.softplus(-real).mean() + F.softplus(fake).mean()


def nonsaturating_g(fake: Tensor) -> Tensor:
    """-log D(G(z)): strong gradients while D still rejects the fakes (Goodfellow et al. 2014)."""
    return F.softplus(-fake).mean()


def minimax_g(fake: Tensor) -> Tensor:
    """log(1 - D(G(z))): the original minimax objective; saturates when D wins."""
    return -F.softplus(fake).mean()


def hinge_d(real: Tensor, fake: Tensor) -> Tensor:
    return F.relu(1 - real).mean() + F.relu(1 + fake).mean()


def critic_g(fake: Tensor) -> Tensor:
    """-E[D(G(z))]: the hinge and Wasserstein generators maximise the critic's score."""
    return -fake.mean()


def lsgan_d(real: Tensor, fake: Tensor) -> Tensor:
    """Least squares (Mao et al. 2017), targets 1 for real and 0 for fake."""
    return 0.5 * (real - 1).pow(2).mean() + 0.5 * fake.pow(2).mean()


def lsgan_g(fake: Tensor) -> Tensor:
    return 0.5 * (fake - 1).pow(2).mean()


def wasserstein_d(real: Tensor, fake: Tensor) -> Tensor:
    return fake.mean() - real.mean()


def rpgan_d(real: Tensor, fake: Tensor) -> Tensor:
    """Relativistic pairing (RpGAN; Jolicoeur-Martineau 2019, R3GAN's Huang et al. 2024): D scores each real
    above the fake it is paired with, -log sigmoid(D(x_i) - D(G(z_i))). No single decision boundary
    between real and fake: D cannot rule a whole region fake, so G is not herded off a mode."""
    return F.softplus(-(real - fake)).mean()


def rpgan_g(fake: Tensor, real: Tensor) -> Tensor:
    """G's side of the pairing: each fake scored above its real, -log sigmoid(D(G(z_i)) - D(x_i))."""
    return F.softplus(-(fake - real)).mean()


LOG2 = math.log(2)
LOSSES = {  # chance: 2 log 2 at logits 0; hinge's 2 at any constant in [-1, 1]; least squares' 1/4 at 0.5
    "nonsaturating": AdversarialLoss(sigmoid_d, nonsaturating_g, chance=2 * LOG2),
    "minimax": AdversarialLoss(sigmoid_d, minimax_g, chance=2 * LOG2),
    "hinge": AdversarialLoss(hinge_d, critic_g, chance=2.0),
    "lsgan": AdversarialLoss(lsgan_d, lsgan_g, chance=0.25),
    "wgan_gp": AdversarialLoss(wasserstein_d, critic_g),
    "rpgan": AdversarialLoss(rpgan_d, rpgan_g, relativistic=True, chance=LOG2),
}


def get_loss(name: str) -> AdversarialLoss:
    if name not in LOSSES:
        raise ConfigError(f"unknown loss '{name}': use loss={'|'.join(LOSSES)}")
    return LOSSES[name]


def input_gradients(outputs: Sequence[Tensor], inputs: Sequence[Tensor],
                    scale: Tensor | None = None) -> tuple[Tensor, ...]:
    """The gradient of ``outputs[i].sum()`` with respect to ``inputs[i]`` for each i, themselves
    differentiable, from one inner backward (one call of the autograd engine for all of them). Each
    output must depend on its own input alone, as D's verdicts on real and on fake samples do (two
    forward passes); otherwise a gradient would hold the other outputs' share too.

    ``create_graph=True``: a penalty built from them is differentiated again in D's backward, so it must
    be a function of D's weights, not a detached number. ``scale``: under float16 mixed precision the
    loss scale of the GradScaler (as a tensor on the device: no sync), applied before this inner
    backward so that small gradients do not underflow in float16, and divided out of the result.
    """
    totals = [o.sum() if scale is None else o.sum() * scale for o in outputs]
    grads = torch.autograd.grad(totals, list(inputs), create_graph=True)
    return grads if scale is None else tuple(grad / scale for grad in grads)


def gradient_penalty(critic: Callable[[Tensor], Tensor], real: Tensor, fake: Tensor,
                     scale: Tensor | None = None) -> Tensor:
    """E[(||grad_x critic(x_hat)||_2 - 1)^2] on random interpolates x_hat (WGAN-GP).

    ``fake`` must already be detached: the penalty trains D only. ``scale``: see :func:`input_gradients`.
    """
    alpha = torch.rand(real.shape[0], *([1] * (real.dim() - 1)), device=real.device, dtype=real.dtype)
    x_hat = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    (grad,) = input_gradients((critic(x_hat),), (x_hat,), scale)
    return (grad.flatten(1).norm(dim=1) - 1).pow(2).mean()
