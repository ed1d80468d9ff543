"""The one exception type for bad user input, and how the entry points report it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A configuration or input the user can fix; the message says what is wrong and how to fix it."""


def exit_on_config_error(function: Callable[[Any], Any], cfg: Any) -> None:
    """Run ``function(cfg)``; bad input becomes one line on stderr and exit code 2 (no traceback)."""
    try:
        function(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
