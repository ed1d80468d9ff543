"""A GAN training framework that demonstrates, measures and enforces PyTorch autograd patterns.

``from gan import train, evaluate`` is the Python API (gan/api.py). It is imported on first use, not
here: ``import gan.core`` must stay pure PyTorch, without Lightning or Hydra.
"""

from __future__ import annotations

import os
from typing import Any

# Before torch loads its OpenMP runtime, which reads this once: idle pool threads sleep at once instead of spinning
# for milliseconds, so a busy neighbour on a small machine does not stall every operation (docs/design.md, "Threads").
# A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

__all__ = ["Run", "evaluate", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gan import api

        return getattr(api, name)
    raise AttributeError(f"module 'gan' has no attribute {name!r}")
