"""Modules whose whole state is registered buffers: saved in the checkpoint, moved by ``.to()``,
never seen by an optimizer (they are not parameters).

Under DDP (``trainer=ddp``) every rank holds these buffers and must hold the same values: what a rank
gathers from its own batch is reduced over all ranks before it updates state (:func:`sum_over_ranks`),
and the buffers of G and D are rank 0's after every step (:func:`gan.core.distributed.broadcast_buffers`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from gan.core.distributed import sum_over_ranks, world_size
from gan.core.torch_private import foreach_lerp_


class StepCounters(nn.Module):
    """Generator updates, discriminator updates and real images seen; and the updates of each network
    skipped for a non-finite loss or gradient (``train.skip_nonfinite``; those count as updates too).

    Buffers rather than Python ints so they travel inside ``state_dict()`` with the weights they
    describe; one count of optimizer steps (G's and D's alike) could not say how many generator updates
    a run has made.

    ``g`` and ``d`` mirror the two step buffers as Python ints for the hot path: reading a buffer that
    lives on a GPU (``int(tensor)``) makes the host wait for the device, several times a step. The
    buffers stay the saved state; the mirrors are rebuilt from them whenever a state dict is loaded.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("g_updates", torch.zeros((), dtype=torch.long))
        self.register_buffer("d_updates", torch.zeros((), dtype=torch.long))
        self.register_buffer("images_seen", torch.zeros((), dtype=torch.long))
        self.register_buffer("skipped_g", torch.zeros((), dtype=torch.long))
        self.register_buffer("skipped_d", torch.zeros((), dtype=torch.long))
        self.g, self.d = 0, 0
        self.register_load_state_dict_post_hook(StepCounters.after_load)

    @staticmethod
    def after_load(module: StepCounters, incompatible_keys: object) -> None:
        module.g, module.d = int(module.g_updates), int(module.d_updates)

    def count_d_step(self) -> None:
        self.d += 1
        self.d_updates.fill_(self.d)  # an asynchronous write: no device sync

    def count_g_step(self, images: int) -> None:
        self.g += 1
        self.g_updates.fill_(self.g)
        self.images_seen += images

    def count_skipped(self, network: str, updates: int = 1) -> None:
        """``updates`` more updates of ``network`` ("G" or "D") skipped."""
        getattr(self, f"skipped_{network.lower()}").add_(updates)


class RunningMean(nn.Module):
    """Exponential running mean of a scalar statistic, e.g. D's mean output on real images."""

    def __init__(self, decay: float = 0.99) -> None:
        super().__init__()
        self.decay = decay
        self.register_buffer("value", torch.zeros(()))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update(self, mean: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Move the running mean toward ``mean``, one batch's mean of the statistic; under DDP, toward the
        mean over every rank's (batches of one size), so that the value is the same on every rank.
        ``keep``: a 0-dim bool; where False (e.g. ``mean`` is not finite), nothing moves. Decided on the
        device with torch.where, not with ``if``, which would make the host wait for a GPU at every call."""
        mean = mean.to(self.value.dtype)
        if world_size() > 1:
            mean = sum_over_ranks(mean) / world_size()
        # where, not a zero weight: lerp toward a NaN with weight 0 is still NaN
        target = mean if keep is None else torch.where(keep, mean, self.value)
        # Bias-free start: the first update sets the mean (it lerps from the target itself) rather than pulling
        # it from zero.
        start = torch.where(self.count == 0, target, self.value)
        torch.lerp(start, target, 1.0 - self.decay, out=self.value)
        self.count += 1 if keep is None else keep


class EMAGenerator(nn.Module):
    """An exponential moving average of the generator's weights, held as buffers.

    Written by hand rather than with ``torch.optim.swa_utils.AveragedModel``: that class keeps the
    average as ``nn.Parameter``s (``requires_grad=True``) of a submodule, so they appear in the
    run module's ``parameters()``, where DDP registers them and reports them as unused every
    step. Here the copy's parameters are re-registered as buffers: the average is in ``state_dict()``
    and follows ``.to()``, yet no optimizer, gradient clip or DDP reducer can see it.

    BatchNorm policy: the running mean/var of G's BatchNorm layers are copied, not averaged (as
    StyleGAN2-ADA does): they describe the activations of the current G, which the averaged weights
    approximate.

    Decay schedule: during the first ``start`` generator steps the copy tracks G exactly; after that
    the decay ramps as ``min(decay, (1 + k) / (10 + k))`` over its k updates, so early samples are not
    dominated by the random initial weights.
    """

    def __init__(self, generator: nn.Module, decay: float, start: int = 0) -> None:
        super().__init__()
        self.decay, self.start = decay, start
        self.generator = copy.deepcopy(generator)
        for module in self.generator.modules():
            for name, param in list(module._parameters.items()):
                if param is not None:
                    del module._parameters[name]
                    module.register_buffer(name, param.detach().clone())
        self.generator.requires_grad_(False)
        self.pairs: tuple | None = None  # (G, then what update() pairs), found at the first update

    def weight(self, g_step: int) -> float:
        """How far the average moves toward G after G update number ``g_step`` (1-based): 1 (a copy) during
        the warm-up, then ``1 - min(decay, (1 + k) / (10 + k))`` at the k-th update after it (k from 0).
        Computed on the host from the step count: a weight held on the device would be read back at
        every step (torch's lerp takes its weight as a host number)."""
        if g_step <= self.start:
            return 1.0
        k = g_step - self.start - 1
        return 1.0 - min(self.decay, (1.0 + k) / (10.0 + k))

    @torch.no_grad()
    def update(self, generator: nn.Module, g_step: int) -> None:
        """Average ``generator``'s current weights in; ``g_step`` is the number of G updates so far."""
        if self.pairs is None or self.pairs[0] is not generator:
            self.pairs = (generator, *self.pair_with(generator))
        _, averages, weights, copies, buffers = self.pairs
        # One fused call for all weights rather than one lerp_ (and its dispatch) per tensor.
        foreach_lerp_(averages, weights, self.weight(g_step))
        for copy_, buffer in zip(copies, buffers):
            copy_.copy_(buffer)

    def pair_with(self, generator: nn.Module) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
        """This copy's buffers beside ``generator``'s weights and buffers, found by name once: walking the
        modules for them costs about 0.1 ms, at every step."""
        mine = dict(self.generator.named_buffers())
        names, weights = zip(*generator.named_parameters())  # no detach(): nothing here is recorded (no_grad)
        copied = dict(generator.named_buffers())
        return [mine[n] for n in names], list(weights), [mine[n] for n in copied], list(copied.values())

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> EMAGenerator:
        self.pairs = None  # .to() and its kin replace buffers: pair them again at the next update
        return super()._apply(fn, recurse)
