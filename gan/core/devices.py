"""The one reading of a ``device`` option, shared by every command that takes one."""

from __future__ import annotations

import re

import torch

from gan.errors import ConfigError

# What a user may write. torch.device alone would also accept "meta", "mps:0" or "cpu:3", which these
# commands do not support, and would fail on CUDA only later, in the middle of a run.
DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when torch sees it, else the CPU), ``cpu``, ``cuda`` or ``cuda:<n>`` as a torch.device.

    Anything else, or a CUDA device this machine does not have, is a one-line ConfigError naming the fix.
    """
    if not isinstance(name, str) or not DEVICE_NAME.fullmatch(name):
        raise ConfigError(f"device '{name}' is not one of auto, cpu, cuda, cuda:<n>: use one of those")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device '{name}' needs CUDA, and torch sees no CUDA device here: use cpu or auto")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"device '{name}': torch sees {count} CUDA device(s) here: use cuda:0 to "
                              f"cuda:{count - 1}")
    return device
