"""Files written atomically: checkpoints, and every other file a reader must never see half-written;
and checkpoints read back safely."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from gan.errors import ConfigError, RunError


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(f)`` into a temporary file beside ``path``, fsync, then ``os.replace`` it onto ``path``.

    A rename within one directory is atomic, so a process killed at any moment leaves either the old
    file or the new one, never a truncated one; fsync first, or after a crash of the machine the
    rename could be on disk before the bytes it names. A failed ``write`` leaves the old file and no
    temporary behind; a full disk or an unwritable directory is a RunError that says so. Creates the
    parent directory.
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as e:  # ENOSPC, EACCES, EROFS, ...
        raise RunError(f"cannot write {path} ({e.strerror or e}): free disk space or choose a writable directory; "
                       f"the previous {path.name}, if there was one, is unchanged") from e
    finally:
        temporary.unlink(missing_ok=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` through :func:`atomic_write`.

    Lightning's own writer stages the bytes in the system temp directory and *moves* them, which
    degrades to a non-atomic copy when the run directory is on another filesystem.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        atomic_write(path, lambda f: torch.save(checkpoint, f))


# torch.load(weights_only=True)'s words for a pickled object it will not rebuild.
UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def read_checkpoint(path: str | Path, key: str) -> dict[str, Any]:
    """The checkpoint train.py wrote at ``path``, as ``torch.load(weights_only=True)`` reads it: tensors
    and plain containers only, so a file that holds any other pickled object -- which unpickling would
    call, and which could run any code -- is refused before anything in it runs. ``key`` is the setting
    that named the file (``ckpt_path``, ``ckpt``), for the ConfigError of a file that is no checkpoint."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file fails in many ways: zip, EOF, unpickling
        if unsafe := UNSAFE_GLOBAL.search(str(e)):
            raise ConfigError(f"{key}={path} refused: it holds a pickled {unsafe[1]}, which loading it would call; "
                              "load only checkpoints train.py wrote") from None
        raise ConfigError(f"{key}={path} is not a readable checkpoint ({type(e).__name__}: truncated, or no "
                          "checkpoint): give another, e.g. a step_*.ckpt beside it") from None
    if not isinstance(checkpoint, dict) or not {"state_dict", "hyper_parameters"} <= checkpoint.keys():
        raise ConfigError(f"{key}={path} is not a train.py checkpoint (it has no state_dict and hyper_parameters)")
    upgrade(checkpoint)
    return checkpoint


def upgrade(checkpoint: dict[str, Any]) -> None:
    """A checkpoint written before the skipped-update counters existed skipped no update: zeros, so that
    older runs still resume and evaluate."""
    for name in ("counters.skipped_g", "counters.skipped_d"):
        checkpoint["state_dict"].setdefault(name, torch.zeros((), dtype=torch.long))


def mismatched(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], listed: int = 3) -> str:
    """The tensors where a checkpoint's state dict (``found``) does not fit a module's (``expected``),
    the first ``listed`` by name and shape, then how many more; empty when it fits."""
    problems = ([f"{k} {tuple(found[k].shape)} in the checkpoint, {tuple(v.shape)} here"
                 for k, v in expected.items() if k in found and found[k].shape != v.shape]
                + [f"{k} missing" for k in expected if k not in found]
                + [f"{k} not in this model" for k in found if k not in expected])
    more = f"; {len(problems) - listed} more" if len(problems) > listed else ""
    return "; ".join(problems[:listed]) + more
