"""Checkpoints on disk: :func:`save_checkpoint` writes one atomically (gan/files.py's ``atomic_write``),
:func:`read_checkpoint` reads one back with ``torch.load(weights_only=True)`` and brings it to the current
layout (gan/run/legacy.py), :func:`mismatched` names the tensors where its weights do not fit a module, and
:func:`check_fits` refuses a resume of other networks in one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gan.errors import ConfigError
from gan.files import atomic_write
from gan.run.legacy import upgrade


def save_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` through :func:`atomic_write`: a reader never sees half a checkpoint, and a save that
    fails or is killed leaves the file that was there."""
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




def mismatched(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], listed: int = 3) -> str:
    """The tensors where a checkpoint's state dict (``found``) does not fit a module's (``expected``),
    the first ``listed`` by name and shape, then how many more; empty when it fits."""
    problems = ([f"{k} {tuple(found[k].shape)} in the checkpoint, {tuple(v.shape)} here"
                 for k, v in expected.items() if k in found and found[k].shape != v.shape]
                + [f"{k} missing" for k in expected if k not in found]
                + [f"{k} not in this model" for k in found if k not in expected])
    more = f"; {len(problems) - listed} more" if len(problems) > listed else ""
    return "; ".join(problems[:listed]) + more


def check_fits(module: nn.Module, checkpoint: dict[str, Any], ckpt_path: str) -> None:
    """Refuse a checkpoint to resume (read from ``ckpt_path``) of other networks than ``module``, as soon as the
    networks are built, before anything is placed or logged: torch's own error for such a state is a list of every
    tensor."""
    problems = mismatched(module.state_dict(), checkpoint["state_dict"])
    if problems:
        overrides = Path(ckpt_path).resolve().parent.parent / ".hydra" / "overrides.yaml"
        raise ConfigError(f"ckpt_path={ckpt_path} holds other networks than this config builds ({problems}): "
                          "resume with the overrides its run was trained with"
                          + (f" ({overrides})" if overrides.is_file() else ""))
