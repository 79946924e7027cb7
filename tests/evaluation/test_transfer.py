"""Tests for jaxemb.evaluation.transfer: SentEval's order of a split and the task protocols, on synthetic tasks."""

import itertools
import json
import zlib

import numpy as np
import pytest

from jaxemb.data.transfer import TransferSplit, TransferTask
from jaxemb.evaluation import transfer
from tests.evaluation_support import FAST_LOGREG


def test_senteval_order_sorts_by_token_count_then_label():
  split = TransferSplit((["a b c", "a", "b  c", "d e", "f"],), [1, 1, 0, 1, 0])
  assert transfer.senteval_order(split).tolist() == [4, 1, 2, 3, 0]
  pairs = TransferSplit((["a b", "a", "a"], ["x", "y z", "y"]), [0, 0, 1])
  assert transfer.senteval_order(pairs).tolist() == [2, 1, 0]


def _synthetic_tasks():
  """One task per protocol; a sentence's class is its first word, and MRPC-like pairs are paraphrases when equal."""
  rng, serial = np.random.default_rng(0), itertools.count()
  words = lambda n: [f"{w} {next(serial)}" for w in rng.choice(["good", "bad"], n)]  # All distinct.
  label = lambda sentences: [int(s.startswith("good")) for s in sentences]
  split = lambda s: TransferSplit((s,), label(s))
  mr = TransferTask("MR", ("negative", "positive"), {"all": split(words(90))})
  sst = TransferTask("SST2", ("negative", "positive"), {name: split(words(60)) for name in ("train", "dev", "test")})

  def pairs(n):
    first = words(n)
    same = rng.integers(0, 2, n)
    return TransferSplit((first, [a if s else b for a, b, s in zip(first, words(n), same)]), same)

  mrpc = TransferTask("MRPC", ("not paraphrase", "paraphrase"), {"train": pairs(300), "test": pairs(60)})
  return [mr, sst, mrpc]


def _embed(sentences):
  """A vector per sentence: +1 or -1 on every axis by its first word, plus noise seeded by the text."""
  noise = lambda s: 0.3 * np.random.default_rng(zlib.crc32(s.encode())).normal(size=32)
  return np.array([(1.0 if s.startswith("good") else -1.0) + noise(s) for s in sentences], np.float32)


def test_evaluate_transfer_runs_each_protocol_once_per_distinct_sentence():
  calls = []
  embed = lambda sentences: calls.append(list(sentences)) or _embed(sentences)
  result = transfer.evaluate_transfer(embed, _synthetic_tasks(), config=FAST_LOGREG)
  assert len(calls) == 1 and len(calls[0]) == len(set(calls[0]))
  assert list(result.tasks) == ["MR", "SST2", "MRPC"]
  assert result["MR"].acc > 95 and result["SST2"].acc > 95 and result["MR"].ndev == 90
  # MRPC features [|u - v|, u * v]: identical sentences give |u - v| = 0, so paraphrases are separable.
  assert result["MRPC"].acc > 90 and result["MRPC"].f1 > 90 and result["SST2"].f1 is None
  assert "MRPC" in result.table() and json.loads(result.to_json())["tasks"]["MRPC"]["f1"] == result["MRPC"].f1


def test_evaluate_transfer_rejects_bad_embeddings():
  with pytest.raises(ValueError, match="embed returned shape"):
    transfer.evaluate_transfer(lambda s: np.zeros((len(s), 2, 3)), _synthetic_tasks()[:1], config=FAST_LOGREG)
