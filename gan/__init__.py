"""A GAN training framework that demonstrates, measures and enforces PyTorch autograd patterns.

``from gan import train, evaluate`` is the Python API (gan/api.py). It is imported on first use, not
here: ``import gan.core`` must stay pure PyTorch, without Lightning or Hydra.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Run", "evaluate", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gan import api

        return getattr(api, name)
    raise AttributeError(f"module 'gan' has no attribute {name!r}")
