"""jaxemb.atomic: a file is replaced whole or left as it was."""

import errno
import json
import os

import pytest

from jaxemb import atomic
from jaxemb.errors import StorageError


def test_write_json_replaces_the_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "new" / "result.json"  # The folder is created.
  atomic.write_json(path, {"a": 1})
  atomic.write_json(path, {"a": 2})
  assert json.loads(path.read_text()) == {"a": 2}
  assert [p.name for p in path.parent.iterdir()] == ["result.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("old\n")

  def fail(f):
    f.write(b"half of a new")
    raise OSError(28, "No space left on device")

  with pytest.raises(OSError, match="No space left"):
    atomic.write(path, fail)
  assert path.read_text() == "old\n"
  assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_write_text_is_utf8(tmp_path):
  atomic.write_text(tmp_path / "t.txt", "naïve ✓\n")
  assert (tmp_path / "t.txt").read_bytes() == "naïve ✓\n".encode("utf-8")


def test_a_write_refused_after_fill_names_the_file_and_removes_its_temporary(tmp_path, monkeypatch):
  """A full disk shows when the last buffer is flushed at close, or at the rename: past `fill`, still cleaned up."""
  path = tmp_path / "cache" / "tokens-0.npz"

  def full_disk(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "replace", full_disk)
  with pytest.raises(StorageError, match=f"^cannot write {path}: No space left on device$"):
    atomic.write(path, lambda f: f.write(b"rows"))
  assert not list(path.parent.iterdir())
