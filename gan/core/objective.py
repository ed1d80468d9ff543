"""What the networks minimise, as one plain PyTorch object built from plain arguments: the adversarial
loss, the gradient penalty (wgan_gp), a regularizer (R1, LeCam), differentiable augmentation and class
conditioning (labels beside D's input, or D's own class prediction: AC-GAN) and G's latent code (InfoGAN).
:func:`gan.core.step.generator_step` takes its ``d_loss`` and ``g_loss``.

Its statistics -- running means of D's outputs (logged; LeCam's anchors) and the augmentation
probability's sign counts -- are buffers, moved only by an explicit :meth:`Objective.observe` after an
update, never while a loss is computed; they take only finite values, so a non-finite D output never
reaches them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gan.core.augment import Augment
from gan.core.losses import AdversarialLoss, gradient_penalty
from gan.core.models import UNCONDITIONAL, Condition, condition_input
from gan.core.regularizers import Regularizer
from gan.core.state import RunningMean
from gan.core.step import DUpdate
from gan.core.torch_private import flag_nonfinite


class Objective(nn.Module):
    """``loss``: the adversarial loss; ``regularizer``: D's penalty (``Regularizer()`` for none);
    ``augment``: applied to everything D sees, real and fake (None: no augmentation); ``gp_weight``: the
    WGAN-GP penalty's weight (0: none); a ``condition`` of classes: a conditional D, which sees one-hot maps
    of the labels beside each sample of ``data_shape``, or, with ``classify``, sees the sample alone and
    names its class (AC-GAN, Odena et al. 2017: D and G both add the cross-entropy of that prediction);
    of a latent code: the labels are G's code, not the data's classes, so D names them on G's samples
    alone (InfoGAN, Chen et al. 2016: that cross-entropy is its bound on the code's mutual information)."""

    def __init__(self, loss: AdversarialLoss, regularizer: Regularizer, augment: Augment | None = None,
                 gp_weight: float = 0.0, condition: Condition = UNCONDITIONAL, data_shape: tuple[int, ...] = (),
                 classify: bool = False):
        super().__init__()
        self.loss, self.regularizer, self.augment = loss, regularizer, augment
        self.gp_weight, self.condition, self.data_shape = gp_weight, condition, tuple(data_shape)
        self.classify = classify and condition.values > 0
        self.d_real_mean, self.d_fake_mean = RunningMean(), RunningMean()

    def critic(self, D: nn.Module, x: Tensor, labels: Tensor | None,
               augment: bool = True) -> tuple[Tensor, Tensor | None]:
        """What D says about ``x``: its real/fake logits and, for a classifying D, its class logits (else
        None). ``x`` is augmented (when configured, unless ``augment=False``), then, for a D given the labels,
        ``torch.cat((condition, x), dim=1)``."""
        if self.augment is not None and augment:
            x = self.augment(x)
        if self.classify:
            out = D(x)
            return out[:, 0], out[:, 1:]
        if self.condition.values:
            x = torch.cat((condition_input(labels, self.condition.values, self.data_shape), x), dim=1)
        return D(x), None

    def needs_loss_scale(self, d_update: int) -> bool:
        """Whether D update ``d_update`` runs an inner backward (gradient penalty, R1), which float16's
        loss scale must reach."""
        return bool(self.gp_weight) or self.regularizer.needs_input_grad(d_update)

    def d_loss(self, D: nn.Module, real: Tensor, fake: Tensor, labels: Tensor | None, d_update: int = 0,
               loss_scale: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """D's loss in its update number ``d_update`` (the run's, 0-based), and its logits on real and fake.
        ``fake`` arrives detached (or made under no_grad)."""
        if self.regularizer.needs_input_grad(d_update):
            real = real.detach().requires_grad_(True)  # R1 differentiates D with respect to its input
            if self.regularizer.penalizes_fake:
                fake = fake.detach().requires_grad_(True)  # and R2 too: a new leaf, still cut off from G
        (real_logits, real_classes), (fake_logits, fake_classes) = (self.critic(D, x, labels) for x in (real, fake))
        loss = self.loss.d(real_logits, fake_logits)
        if self.classify and self.condition.classes:  # D learns to name the class of real images by their label ...
            loss = loss + F.cross_entropy(real_classes, labels)
        if self.classify:  # ... and of G's by the class or code G was given
            loss = loss + F.cross_entropy(fake_classes, labels)
        if self.gp_weight:
            penalty = gradient_penalty(lambda x: self.critic(D, x, labels)[0], real, fake, loss_scale)
            loss = loss + self.gp_weight * penalty
        anchors = (self.d_real_mean.value, self.d_fake_mean.value)
        penalty = self.regularizer.penalty(d_update, real, real_logits, fake, fake_logits, loss_scale, anchors)
        return (loss if penalty is None else loss + penalty), real_logits, fake_logits

    def g_loss(self, D: nn.Module, fake: Tensor, real: Tensor, labels: Tensor | None) -> Tensor:
        """G's loss: the adversarial loss on D's verdict about ``fake`` (the step has frozen D) -- for a
        relativistic loss, against D's verdict about ``real`` -- plus, for a classifying D, the cross-entropy
        of the class (or code) D names against the one G was given."""
        logits, classes = self.critic(D, fake, labels)
        if self.loss.relativistic:
            with torch.no_grad():  # D(real) is a constant to G: no graph to D's weights or back to the data
                real_logits = self.critic(D, real, labels)[0]
            loss = self.loss.g(logits, real_logits)
        else:
            loss = self.loss.g(logits)
        return loss + F.cross_entropy(classes, labels) if self.classify else loss

    @torch.no_grad()
    def observe(self, d: DUpdate) -> None:
        """Feed one D update's outputs to the statistics: the running means and ADA's sign counts.
        An update whose loss or logits are not finite moves nothing."""
        # torch's fused non-finite check (GradScaler's, with a scale of 1: the values stay as they are): one
        # kernel sets the flag if any element is inf or NaN, where isfinite() would take several per tensor.
        nonfinite, one = (torch.full((), v, dtype=torch.float32, device=d.loss.device) for v in (0.0, 1.0))
        flag_nonfinite(list(d), nonfinite, one)
        finite = nonfinite == 0
        real, fake = d.real_logits.mean(), d.fake_logits.mean()
        self.d_real_mean.update(real, finite)
        self.d_fake_mean.update(fake, finite)
        if self.augment is not None:
            self.augment.accumulate(d.real_logits, finite)
