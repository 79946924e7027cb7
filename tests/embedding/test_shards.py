"""The shard format's reader (jaxemb/embedding/shards.py): `Rows`, one array over the shards, and what `load`
refuses; a folder embed.py wrote is loaded in tests/embedding/test_job.py."""

import json

import numpy as np
import pytest

from jaxemb import embedding
from jaxemb.embedding import shards
from jaxemb.errors import DataError


def test_rows_index_like_the_array_they_stack():
  parts = [np.arange(k, k + 3 * n).reshape(n, 3).astype(np.float32) for k, n in ((0, 4), (100, 1), (200, 5))]
  whole = np.concatenate(parts)
  rows = shards.Rows(parts)
  assert (len(rows), rows.shape, rows.dtype, rows.ndim) == (10, (10, 3), np.float32, 2)
  for key in (
    slice(None),
    slice(2, 7),
    slice(4, 5),
    slice(3, 3),
    slice(-3, None),
    slice(1, 9, 3),
    slice(None, None, -1),
  ):
    np.testing.assert_array_equal(rows[key], whole[key])
  for key in (0, 4, 9, -1, np.int64(5)):
    np.testing.assert_array_equal(rows[key], whole[key])
  indices = np.array([9, 0, 4, 4, -2, 5])
  np.testing.assert_array_equal(rows[indices], whole[indices])
  np.testing.assert_array_equal(rows[[[1, 2], [8, 0]]], whole[[[1, 2], [8, 0]]])
  np.testing.assert_array_equal(np.asarray(rows), whole)
  with pytest.raises(IndexError):
    rows[10]
  with pytest.raises(IndexError):
    rows[np.array([0.5])]


def _folder(tmp_path, complete=True, rows=2, shape=(2, 3)):
  """A folder of one shard as embed.py writes it; its manifest says `rows` rows, its vectors have `shape`."""
  (tmp_path / "shards").mkdir()
  (tmp_path / "shards" / "00000.npy").write_bytes(shards.npy_bytes(np.ones(shape, np.float32)))
  (tmp_path / "shards" / "00000.ids.npy").write_bytes(shards.npy_bytes(np.arange(shape[0], dtype=np.int64)))
  manifest = {
    "format": shards.FORMAT,
    "dim": 3,
    "dtype": "float32",
    "corpus": {"id_column": ""},
    "shards": [{"index": 0, "rows": rows, "first_line": 0, "sha256": ""}],
    "complete": complete,
  }
  (tmp_path / "manifest.json").write_text(json.dumps(manifest))
  return tmp_path


def test_load_reads_the_shards_memory_mapped(tmp_path):
  vectors, ids, manifest = embedding.load(_folder(tmp_path))
  assert isinstance(vectors, shards.Rows) and vectors.shape == (2, 3) and manifest["dim"] == 3
  assert isinstance(vectors._parts[0], np.memmap)  # pylint: disable=protected-access
  np.testing.assert_array_equal(ids[:], [0, 1])


@pytest.mark.parametrize(
  "folder, message",
  [
    (lambda p: p, "{p}: no manifest.json: not a folder embed.py wrote"),
    (lambda p: _folder(p, complete=False), "{p}: its embedding is not finished: rerun the embed.py command"),
    (lambda p: _folder(p, rows=3), "{p}/shards/00000.npy: float32[2, 3], its manifest says float32[3, 3]"),
  ],
)
def test_load_refuses_what_is_not_a_finished_embedding_in_one_line(tmp_path, folder, message):
  with pytest.raises(DataError) as raised:
    embedding.load(folder(tmp_path))
  assert str(raised.value).startswith(message.format(p=tmp_path))


def test_load_names_a_missing_shard(tmp_path):
  (_folder(tmp_path) / "shards" / "00000.npy").unlink()
  with pytest.raises(DataError, match=r"shards/00000.npy: No such file or directory: rerun embed.py"):
    embedding.load(tmp_path)
