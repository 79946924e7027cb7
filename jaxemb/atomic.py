"""Files written whole or not at all: a temporary file beside the target, renamed into place. A kill or a full disk
mid-write leaves the old file (or none), never half of a new one that a rerun would take for finished work."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import IO, Any, Callable


def write(path: str | pathlib.Path, fill: Callable[[IO[bytes]], Any]):
  """Creates `path`'s folder, calls `fill` on a temporary binary file beside `path`, then renames it to `path`.
  The temporary file has a unique name (concurrent writers do not share one) and is removed if `fill` fails."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name + ".", suffix=".partial", delete=False) as f:
    try:
      fill(f)
    except BaseException:
      f.close()
      os.unlink(f.name)
      raise
  os.replace(f.name, path)


def write_text(path: str | pathlib.Path, text: str):
  """`text` to `path` as UTF-8, whole or not at all."""
  write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: str | pathlib.Path, value: Any, indent: int = 2):
  """`value` as JSON (and a final newline) to `path`, whole or not at all."""
  write_text(path, json.dumps(value, indent=indent) + "\n")
