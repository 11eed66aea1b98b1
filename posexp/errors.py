"""Errors a user can cause. The CLI prints their message and exits non-zero, no traceback.

:class:`Terminated` (SIGTERM as Ctrl-C) sits here beside :class:`TrainingInterrupted`: the command raises it, a
job and ``posexp resume``'s hint read it.
"""

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


class TrainingDiverged(PosexpError):
    """The training loss became NaN or infinite.

    Args:
        step: the first step (1-based, as in ``metrics.csv``) whose loss was not finite.
        message: what happened and what to try.
    """

    def __init__(self, step: int, message: str):
        self.step = step
        super().__init__(message)


class PluginFailed(PosexpError):
    """Code of the user's own (a plugin encoder's hook, a task's generator) raised while a run trained or evaluated:
    the run's train.log holds the traceback (a training's folder also records the run as failed); the message names
    the component, what it raised and that log.

    Args:
        message: the one line the terminal shows.
    """

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM outside the training steps (while evaluating, or writing): stops a run as Ctrl-C does."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class TrainingInterrupted(PosexpError):
    """SIGINT or SIGTERM during training: the current step finished and a checkpoint was written.

    Args:
        message: where training stopped and the command that continues it.
        exit_code: 128 + the signal number, as a shell reports a process killed by it.
    """

    def __init__(self, message: str, exit_code: int):
        self.exit_code = exit_code
        super().__init__(message)
