"""Errors a user can act on: the entry points print them as one line and exit with status 1, no traceback.

Every other exception is a bug and keeps its traceback. The subclasses also derive from the builtin a caller
would catch (ValueError for a bad value, OSError for the file system), so `except ValueError` still sees them.
"""

from __future__ import annotations


class UserError(Exception):
  """Something the person running the command can fix: the message names the file, field or value and what to do."""


class ConfigError(UserError, ValueError):
  """A config field or value that cannot work (an unknown field, a bad batch size, a template without [MASK])."""


class DataError(UserError, ValueError):
  """An input file that is missing, unreadable, corrupt or of the wrong shape; the message names the file."""


class WorkdirError(UserError):
  """A run directory that cannot be used as it is: busy (another process holds it), or made by another command."""


class WorkdirBusy(WorkdirError):
  """A folder another process holds by its lock (a run directory, an embedding's output: jaxemb/folder_lock.py):
  `holder` names that process, with the lock."""

  def __init__(self, message: str, holder: str):
    super().__init__(message)
    self.holder = holder


class StorageError(UserError, OSError):
  """The file system refused a write (a full disk, no permission, an I/O error); the message names the path."""


class Diverged(UserError, FloatingPointError):
  """Training produced a non-finite loss or param; the last good checkpoint is kept (a lower learning rate, another
  seed or bfloat16 -> float32 are the usual remedies)."""
