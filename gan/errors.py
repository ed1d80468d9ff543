"""The one exception type for bad user input: entry points print it as a single line and exit 2."""


class ConfigError(ValueError):
    """A configuration or input the user can fix; the message says what is wrong and how to fix it."""
