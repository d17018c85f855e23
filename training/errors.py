"""The one base class of the mistakes a user can fix.

``ltd`` prints a :class:`UserError` as one line and exits with 2; anything else is a bug (or an
environment failure such as running out of memory) and is printed with its traceback, exit 1. So
raise a ``UserError`` subclass only where the message tells the user what to change: a config key,
a path, a flag. Subclasses that used to be ``ValueError``/``RuntimeError`` keep that base too, so
callers that catch those still do.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input the user can fix: the message says what and how, in one line."""


class UserValueError(UserError, ValueError):
    """A user-supplied value that cannot be used (a flag, a file's content, a name)."""


class UserFileNotFound(UserError, FileNotFoundError):
    """A file or folder the user named does not exist."""


class UserFileExists(UserError, FileExistsError):
    """An output the user named is already there (and overwriting it was not asked for)."""


class Unavailable(UserError, RuntimeError):
    """Something the command needs is not there on this machine: a device, an optional package, a
    model that loads."""
