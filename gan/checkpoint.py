"""Checkpoints named by generator step, written atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to a temporary file beside the target, fsync, then ``os.replace``.

    A rename within one directory is atomic, so a process killed at any moment leaves either the old
    checkpoint or the new one, never a truncated file. Lightning's own writer stages the bytes in the
    system temp directory and *moves* them, which degrades to a non-atomic copy when the run
    directory is on another filesystem.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)


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
