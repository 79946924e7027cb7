"""Temporary folders of test processes that a kill does not leave behind for good: each is named with the id of the
process that made it, and the next test session removes those whose process is gone (tests/conftest.py). A live
process's folders are kept, whichever session it belongs to (pytest-xdist workers of another session run at once)."""

import os
import pathlib
import re
import shutil
import tempfile

PREFIX = "jaxemb-tests-"
# PREFIX, the kind, the process id, then mkdtemp's random suffix (letters, digits and "_", no "-").
_NAME = re.compile(re.escape(PREFIX) + r"[a-z]+-(\d+)-\w+")


def make(kind: str) -> pathlib.Path:
  """A new empty folder in the temp dir for `kind` (letters, e.g. "xla"), named with this process's id."""
  return pathlib.Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-"))


def remove_orphans():
  """Removes the folders `make` left in the temp dir whose process is gone."""
  for folder in pathlib.Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
    match = _NAME.fullmatch(folder.name)
    if match and not _alive(int(match.group(1))):
      shutil.rmtree(folder, ignore_errors=True)  # Another user's stays: not ours to remove.


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)  # Signal 0 checks that the process exists and sends nothing.
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process.
    return True
  return True
