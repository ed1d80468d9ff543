"""Errors a user can act on, and how train.py and evaluate.py report them: one line on stderr that
names the problem and the fix, no traceback, a non-zero exit code."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """A configuration or input the user can fix; the message says what is wrong and how to fix it."""


class RunError(RuntimeError):
    """A run that cannot go on for a reason the user can act on (its loss diverged, the disk is full);
    the message says what happened and what to do."""


class Interrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C, its checkpoint saved; the message says how to resume."""


def unknown_key(full_key: str, keys: Iterable[Any]) -> str:
    """The message for ``full_key``, which is not among ``keys`` (those of its section)."""
    section, _, key = full_key.rpartition(".")
    close = difflib.get_close_matches(key, [str(k) for k in keys], n=1)
    hint = f" (did you mean {section + '.' if section else ''}{close[0]}?)" if close else ""
    return f"{full_key} is not a config key{hint}: check its spelling; --cfg job prints every key"














