"""Every random stream in the checkpoint, so a resumed run draws the same noise as an uninterrupted one.
(The data order needs none: it is a function of the seed and the restored step counter.) Under DDP,
ranks > 0 are reseeded apart from rank 0 (:func:`separate_rank_streams`)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """torch's (CPU and CUDA), numpy's and Python's RNG states, as a checkpoint's ``rng`` holds them."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": numpy_state_to_plain(np.random.get_state()),
        "python": random.getstate(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Every stream as :func:`rng_state` saved it; called just before the first step a resumed run takes."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(plain_to_numpy_state(state["numpy"]))
    random.setstate(state["python"])


def separate_rank_streams(rank: int) -> None:
    """Under DDP every rank starts from the same seed (and a resume restores rank 0's state on all of them);
    reseed ranks > 0 so the global batch of fakes is not world_size copies of one. Rank 0 keeps its stream:
    a single-process run is unaffected."""
    if rank > 0:
        torch.manual_seed(int(torch.randint(2**62, ())) + rank)


def numpy_state_to_plain(state: tuple) -> tuple:
    # weights_only loading accepts tensors and builtins, not numpy arrays.
    return (state[0], torch.from_numpy(state[1].astype(np.int64)), *state[2:])


def plain_to_numpy_state(state: tuple) -> tuple:
    return (state[0], state[1].numpy().astype(np.uint32), *state[2:])
