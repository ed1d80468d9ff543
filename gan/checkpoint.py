"""Files written atomically: checkpoints, and every other file a reader must never see half-written."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import lightning as L
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


class GeneratorStepCheckpoint(L.Callback):
    """``checkpoints/step_NNNNNN.ckpt`` every ``every`` generator steps; ``last.ckpt`` then and at the end.

    Written here rather than with Lightning's ModelCheckpoint, which counts Lightning's global step
    (every optimizer step, G and D alike) and, once a periodic checkpoint exists, does not write
    ``last.ckpt`` at the end of training.
    """

    def __init__(self, directory: Path, every: int):
        self.directory, self.every = Path(directory), every
        self.saved_step = -1

    def save(self, trainer: L.Trainer, step: int, periodic: bool) -> None:
        # weights_only=False: the full training state (optimizers, loops), needed to resume.
        if periodic:
            trainer.save_checkpoint(self.directory / f"step_{step:06d}.ckpt", weights_only=False)
        trainer.save_checkpoint(self.directory / "last.ckpt", weights_only=False)
        self.saved_step = step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        step = pl_module.counters.g
        if step % self.every == 0:
            self.save(trainer, step, periodic=True)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        step = pl_module.counters.g
        if step != self.saved_step:
            self.save(trainer, step, periodic=False)
