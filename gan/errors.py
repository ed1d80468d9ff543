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


class Unhealthy(RunError):
    """Training stopped by its health check (``health.action=stop``) at the end of the step a condition started
    in, its checkpoint saved; the message names the condition and how to resume. Exit code :data:`UNHEALTHY`."""


# train.py's exit code for a run its health check stopped: neither bad input (2) nor a failed run (1).
UNHEALTHY = 3


class Interrupted(KeyboardInterrupt):
    """Training stopped by a signal (Ctrl-C, SIGTERM, SIGUSR1) at the end of a step, its checkpoint saved; the
    message says how to resume. ``code``: the exit code, 128 + the signal's number, as a shell reports a
    process the signal ended (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, code: int = 130):
        super().__init__(message)
        self.code = code


class StoppedAtOnce(SystemExit):
    """A second stopping signal: training stopped where it was, without a checkpoint of that step. A
    SystemExit, so that the loop's cleanup (its ``finally``) still runs and no handler on the way takes it
    for an error; ``code`` is 128 + the signal's number, ``message`` says what to resume from."""

    def __init__(self, message: str, code: int):
        super().__init__(code)
        self.message = message


def unknown_key(full_key: str, keys: Iterable[Any]) -> str:
    """The message for ``full_key``, which is not among ``keys`` (those of its section)."""
    section, _, key = full_key.rpartition(".")
    close = difflib.get_close_matches(key, [str(k) for k in keys], n=1)
    hint = f" (did you mean {section + '.' if section else ''}{close[0]}?)" if close else ""
    return f"{full_key} is not a config key{hint}: check its spelling; --cfg job prints every key"














