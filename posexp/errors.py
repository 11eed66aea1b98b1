"""Errors a user can cause. The CLI prints their message and exits non-zero, no traceback."""

from __future__ import annotations


class PosexpError(Exception):
    """A problem with the user's input (config, paths, run folders), explained in words."""

    exit_code = 2


class ConfigError(PosexpError):
    """A config value that is out of range or inconsistent with another.

    Args:
        key: the dotted config key, as the user would type it (``encoder.base``).
        message: what is wrong and what is allowed.
    """

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


def require(condition: bool, key: str, message: str) -> None:
    """Raise :class:`ConfigError` for ``key`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(key, message)
