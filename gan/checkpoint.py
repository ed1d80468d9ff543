"""Files written atomically: checkpoints, and every other file a reader must never see half-written."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(f)`` into a temporary file beside ``path``, fsync, then ``os.replace`` it onto ``path``.

    A rename within one directory is atomic, so a process killed at any moment leaves either the old
    file or the new one, never a truncated one; fsync first, or after a crash of the machine the
    rename could be on disk before the bytes it names. A failed ``write`` leaves the old file and no
    temporary behind. Creates the parent directory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` through :func:`atomic_write`.

    Lightning's own writer stages the bytes in the system temp directory and *moves* them, which
    degrades to a non-atomic copy when the run directory is on another filesystem.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        atomic_write(path, lambda f: torch.save(checkpoint, f))

