"""Files written whole or not at all. A kill or a full disk mid-write leaves the old file (or none), never half of
a new one that a rerun would take for finished work.

A local file is written to a temporary file beside it, then renamed into place. An object in a bucket (gs://) is
uploaded in one request: Cloud Storage creates it only when the upload completes, so it is there whole or not at
all without a rename (which it lacks).
"""

from __future__ import annotations

import io
import json
import pathlib
from typing import IO, Any, Callable

from jaxemb import storage
from jaxemb.errors import StorageError


def write(path: storage.PathLike, fill: Callable[[IO[bytes]], Any]):
  """Calls `fill` on a binary file and puts what it wrote at `path` (its folder created), whole or not at all.

  Raises:
    StorageError: the file system refused the write (a full disk, no permission), naming `path`.
  """
  path = storage.path(path)
  try:
    if storage.is_remote(path):
      buffer = io.BytesIO()
      fill(buffer)
      path.write_bytes(buffer.getvalue())
    else:
      storage.replace_file(pathlib.Path(path), fill)
  except OSError as e:
    raise StorageError(f"cannot write {path}: {e.strerror or e}") from e


def write_text(path: storage.PathLike, text: str):
  """`text` to `path` as UTF-8, whole or not at all."""
  write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: storage.PathLike, value: Any, indent: int = 2):
  """`value` as JSON (and a final newline) to `path`, whole or not at all."""
  write_text(path, json.dumps(value, indent=indent) + "\n")
