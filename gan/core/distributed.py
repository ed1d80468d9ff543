"""Helpers for state that every DDP rank must hold alike; each does nothing in a single process."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gan.core.torch_private import foreach_copy_


def world_size() -> int:
    """The number of processes training together: torch.distributed's world size, 1 without it."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def sum_over_ranks(x: Tensor) -> Tensor:
    """``x`` summed over all ranks, in place (an all-reduce: every rank gets the same total); ``x`` as it
    is in a single process. Every rank must call it, in the same order."""
    if world_size() > 1:
        dist.all_reduce(x)
    return x


def broadcast_buffers(*modules: nn.Module) -> None:
    """Rank 0's floating-point buffers of ``modules`` copied to every rank, in place; nothing in a single
    process.

    For BatchNorm's running statistics: in train mode each rank normalizes with its own batch and moves
    its running statistics toward that batch's, so the ranks drift apart although their weights agree.
    Rank 0's are the run's (its checkpoint holds them), as with DDP's own buffer broadcast. Integer
    buffers (``num_batches_tracked``) count forwards, the same number on every rank.
    """
    buffers = [b for m in modules for b in m.buffers() if b.is_floating_point()] if world_size() > 1 else []
    if buffers:
        # One message for all of them, not one each: every collective waits for all ranks to reach it.
        flat = torch.cat([b.flatten() for b in buffers])
        dist.broadcast(flat, src=0)
        pieces = flat.split([b.numel() for b in buffers])
        foreach_copy_(buffers, [piece.view_as(b) for b, piece in zip(buffers, pieces)])
