"""The errors that mean bad input or a bad setting, not a bug: the command-line tools show their
message as one line instead of a traceback. Importing this module imports nothing else.

Each error class of the package derives from :class:`UserError` and from the built-in class it
always was (``ValueError``, ``RuntimeError``, ``FileNotFoundError``), so existing ``except``
clauses keep working.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or a bad setting; the message says what and where."""


class ConfigError(UserError, ValueError):
    """A bad setting, or a resume whose settings contradict the saved run."""


class RunLockedError(UserError, RuntimeError):
    """Another process is using the model folder."""
