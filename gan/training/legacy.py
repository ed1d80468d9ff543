"""Runs and checkpoints from older versions of this project, read in one place."""

from __future__ import annotations

from typing import Any

import torch


def upgrade(checkpoint: dict[str, Any]) -> None:
    """A checkpoint written before the skipped-update counters existed skipped no update: zeros, so that
    older runs still resume and evaluate."""
    for name in ("counters.skipped_g", "counters.skipped_d"):
        checkpoint["state_dict"].setdefault(name, torch.zeros((), dtype=torch.long))
