"""Tests for jaxemb.evaluation.transfer: the protocols, and the jobs."""

import itertools
import json
import subprocess
import sys
import zlib

import numpy as np
import pytest

from configs import eval_transfer
from jaxemb.data.transfer import TransferSplit, TransferTask
from jaxemb.evaluation import transfer
from tests.conftest import REPO, shared_path
from tests.evaluation.test_logreg import FAST


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
  result = transfer.evaluate_transfer(embed, _synthetic_tasks(), config=FAST)
  assert len(calls) == 1 and len(calls[0]) == len(set(calls[0]))
  assert list(result.tasks) == ["MR", "SST2", "MRPC"]
  assert result["MR"].acc > 95 and result["SST2"].acc > 95 and result["MR"].ndev == 90
  # MRPC features [|u - v|, u * v]: identical sentences give |u - v| = 0, so paraphrases are separable.
  assert result["MRPC"].acc > 90 and result["MRPC"].f1 > 90 and result["SST2"].f1 is None
  assert "MRPC" in result.table() and json.loads(result.to_json())["tasks"]["MRPC"]["f1"] == result["MRPC"].f1


def test_evaluate_transfer_rejects_bad_embeddings():
  with pytest.raises(ValueError, match="embed returned shape"):
    transfer.evaluate_transfer(lambda s: np.zeros((len(s), 2, 3)), _synthetic_tasks()[:1], config=FAST)


def _config(model_path, **overrides):
  config = eval_transfer.get_config()
  config.model.path = str(model_path)
  config.data.senteval_dir = str(shared_path("data", "senteval"))
  config.transfer.tasks = "TREC"
  config.transfer.mode = "fasttest"
  config.eval.length_multiple = 32  # Few shapes: compiling dominates on a tiny model.
  for key, value in overrides.items():
    section, field = key.split(".")
    config[section][field] = value
  return config


@pytest.mark.parametrize("overrides, message", [
    ({"transfer.tasks": "TREC,SST5"}, r"unknown tasks \['SST5'\]"),
    ({"transfer.mode": "quick"}, r"transfer.mode 'quick'"),
    ({"data.senteval_dir": "/nowhere"}, r"/nowhere/TREC: no such directory"),
])
def test_bad_configs_are_rejected_before_the_model_loads(overrides, message):
  with pytest.raises(ValueError, match=message):
    transfer.run_transfer(_config("/no/model/here", **overrides))


def test_sts_transfer_job_on_a_tiny_model(tmp_path, tiny_bert):
  out = tmp_path / "results.json"
  config = _config(tiny_bert, **{"eval.tasks": "STS16", "eval.output_json": str(out)})
  config.job = "sts+transfer"
  summary = transfer.run_sts_transfer(config)
  assert set(summary["sts"]["tasks"]) == {"STS16"} and set(summary["transfer"]["tasks"]) == {"TREC"}
  trec = summary["transfer"]["tasks"]["TREC"]
  assert (trec["ndev"], trec["ntest"]) == (5452, 500) and 0 <= trec["acc"] <= 100
  assert summary["classifier"]["kfold"] == 5 and json.loads(out.read_text())["transfer"] == summary["transfer"]


@pytest.mark.slow
def test_evaluate_py_runs_the_transfer_job(tmp_path, tiny_bert):
  out = tmp_path / "r.json"
  command = [sys.executable, str(REPO / "evaluate.py"), "--config", str(REPO / "configs" / "eval_transfer.py"),
             f"--config.model.path={tiny_bert}", f"--config.data.senteval_dir={shared_path('data', 'senteval')}",
             "--config.transfer.tasks=MRPC", "--config.transfer.mode=fasttest", "--config.eval.length_multiple=32",
             f"--config.eval.output_json={out}", f"--config.compilation_cache_dir={tmp_path / 'xla'}"]
  result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "MRPC" in result.stdout and "test acc" in result.stdout
  assert set(json.loads(out.read_text())["tasks"]["MRPC"]) >= {"acc", "f1", "devacc"}
