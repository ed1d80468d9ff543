"""The GAN training step, written once: every update of one generator step. The training loop
(gan/training/loop.py), the demonstrations (``python -m gan.patterns``) and the tests all run these
functions, so a claim measured on them is a claim about the step that trains.

One generator step::

    fake = G(z)                                    # one G forward; its graph is kept for G's update
    d_update(D, opt_d, d_loss, real, fake.detach())    # D learns from D(real) and D(fake.detach())
    g_update(D, opt_g, g_loss, fake)               # G learns through D(fake), with D frozen

preceded, when D takes several updates per generator step (``loss.d_steps`` > 1, e.g. wgan_gp), by
the extra D updates, whose fakes are made under ``no_grad``.

What the networks minimise is passed in (gan/core/objective.py builds both from plain arguments):
``d_loss(D, real, fake, labels, k) -> (loss, real_logits, fake_logits)`` for the step's D update number
``k`` (0-based: the step's count of its D updates, the one every reader of "which D update" is given),
and ``g_loss(D, fake, real, labels) -> loss`` (``real``: for a relativistic loss, which scores each fake
against a real sample). ``G`` and ``D`` are the modules the step runs: under ``trainer=ddp`` their
DistributedDataParallel wrappers, each of whose backwards all-reduces the network's gradients.
``backward`` differentiates a loss: ``Tensor.backward``, or the loop's, which scales the loss first under
float16. ``phase(name, k)`` says which phase of the step runs (:data:`gan.core.phases.PHASES`), and for D's
phases which D update: the loop's hook keeps a record of it (:class:`gan.core.phases.StepPhases`), which the
audit and the non-finite guard read, and tells the timer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from gan.core.contexts import frozen, no_sync
from gan.core.phases import untimed

DLoss = Callable[[nn.Module, Tensor, Tensor, "Tensor | None", int], tuple[Tensor, Tensor, Tensor]]
GLoss = Callable[[nn.Module, Tensor, Tensor, "Tensor | None"], Tensor]
Backward = Callable[[Tensor], None]
Phase = Callable[..., AbstractContextManager[None]]  # phase(name) or, in a D update, phase(name, k)


class Batch(NamedTuple):
    """What one D update takes: G's noise, real samples and their labels (None when unconditional)."""

    z: Tensor
    real: Tensor
    labels: Tensor | None


class DUpdate(NamedTuple):
    """What one D update computed, detached: safe to keep and log without holding a graph."""

    loss: Tensor
    real_logits: Tensor
    fake_logits: Tensor


class StepResult(NamedTuple):
    """The D updates of one generator step, in order, and G's loss (detached)."""

    d: list[DUpdate]
    g_loss: Tensor


def generator_step(G: nn.Module, D: nn.Module, opt_g: Optimizer, opt_d: Optimizer, batches: Sequence[Batch],
                   d_loss: DLoss, g_loss: GLoss, backward: Backward = Tensor.backward,
                   phase: Phase = untimed) -> StepResult:
    """One generator step: a D update per batch, then one G update from the last batch's G forward."""
    *extra, (z, real, labels) = batches
    updates = []
    for k, (z_k, real_k, labels_k) in enumerate(extra):
        with torch.no_grad(), phase("g_forward"):
            fake_k = G(z_k, labels_k)  # only D learns from these: no graph through G just to cut it off
        updates.append(d_update(D, opt_d, d_loss, real_k, fake_k, labels_k, k, backward, phase))
    with phase("g_forward"):
        fake = G(z, labels)  # one G forward serves both updates; its graph is kept for G's backward
    # detach() cuts the graph at `fake`: D's backward stops there, so it computes nothing for G,
    # leaves G's .grad untouched, and does not free G's graph, which g_update still needs.
    d = d_update(D, opt_d, d_loss, real, fake.detach(), labels, len(extra), backward, phase)
    return StepResult([*updates, d], g_update(D, opt_g, g_loss, fake, real, labels, backward, phase))


def d_update(D: nn.Module, opt_d: Optimizer, d_loss: DLoss, real: Tensor, fake: Tensor, labels: Tensor | None,
             k: int = 0, backward: Backward = Tensor.backward, phase: Phase = untimed) -> DUpdate:
    """D update number ``k`` of a generator step, on ``real`` and ``fake`` (detached, or made under no_grad)."""
    with phase("d_forward_backward", k):
        loss, real_logits, fake_logits = d_loss(D, real, fake, labels, k)
        opt_d.zero_grad(set_to_none=True)  # None, not zeros: no memset, and no stale value to add to
        backward(loss)
    with phase("d_optimizer", k):
        opt_d.step()
    return DUpdate(loss.detach(), real_logits.detach(), fake_logits.detach())


def g_update(D: nn.Module, opt_g: Optimizer, g_loss: GLoss, fake: Tensor, real: Tensor, labels: Tensor | None,
             backward: Backward = Tensor.backward, phase: Phase = untimed) -> Tensor:
    """One generator update through the undetached ``fake``, with D frozen.

    Gradients flow through D's layers to ``fake`` and on into G, but none are computed for D's
    weights: cheaper, and opt_d's next step is not polluted. D is run afresh here: logits computed
    before opt_d.step() used D's old weights, which the step changed in place, so backpropagating
    through them would raise "modified by an inplace operation".
    """
    # Under DDP (trainer=ddp, G and D wrapped separately) only G's gradients are all-reduced here: D is
    # frozen, so it has none, and no_sync(D) keeps D's wrapper from preparing a reduction for them.
    with frozen(D), no_sync(D):
        with phase("g_forward"):
            loss = g_loss(D, fake, real, labels)  # a relativistic loss reads D(real) as a constant (no_grad)
        with phase("g_backward"):
            opt_g.zero_grad(set_to_none=True)
            backward(loss)
    with phase("g_optimizer"):
        opt_g.step()
    return loss.detach()
