"""Tests for jaxemb.evaluation.transfer: SentEval's folds and classifier, the protocols, and the jobs."""

import dataclasses
import itertools
import json
import math
import subprocess
import sys
import zlib

import numpy as np
import pytest

from configs import eval_transfer
from jaxemb.data.transfer import TransferSplit, TransferTask
from jaxemb.evaluation import transfer
from tests.conftest import REPO, shared_path

FAST = transfer.LogRegConfig(kfold=3, batch_size=8, max_epoch=40)  # Small synthetic problems: short batches.


def _blobs(n: int, dim: int = 64, spread: float = 0.3, seed: int = 0):
  """Two Gaussian blobs at -1 and +1 on every axis (float32 features, 0/1 labels): wide enough that a few dozen
  Adam steps (lr 1e-3 per weight) outweigh the random initial weights."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, n)
  return ((2 * labels - 1)[:, None] + spread * rng.normal(size=(n, dim))).astype(np.float32), labels


def test_stratified_kfold_matches_sklearn():
  # sklearn 1.9 StratifiedKFold(4, shuffle=True, random_state=seed): the test fold of each row.
  labels = np.array([2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2, 0, 1, 1, 2, 0, 0, 1, 2, 1, 0, 1])
  expected = {1111: [3, 0, 2, 2, 2, 1, 1, 3, 3, 1, 3, 0, 1, 1, 0, 0, 2, 3, 0, 2, 2, 0, 1],
              7: [1, 1, 0, 2, 2, 3, 0, 1, 3, 2, 1, 1, 1, 3, 3, 0, 0, 0, 0, 2, 2, 3, 2]}
  for seed, folds in expected.items():
    test_fold = np.empty(len(labels), int)
    for i, (train, test) in enumerate(transfer.stratified_kfold(labels, 4, seed)):
      assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(len(labels)))
      test_fold[test] = i
    assert test_fold.tolist() == folds


def test_stratified_kfold_keeps_class_shares_and_rejects_too_many_folds():
  labels = np.random.default_rng(1).integers(0, 3, 101)
  per_fold = np.array([np.bincount(labels[test], minlength=3) for _, test in transfer.stratified_kfold(labels, 10, 0)])
  assert np.all(per_fold.max(0) - per_fold.min(0) <= 1)
  with pytest.raises(ValueError, match="cannot make 5 stratified folds"):
    transfer.stratified_kfold(np.array([0, 0, 1, 1]), 5, 0)


def test_validation_split_is_senteval_seeded_permutation():
  # np.random.seed(1111); np.random.permutation(20), SentEval's draw: the first int(0.05 * 20) = 1 is dev.
  fold = transfer.Fold.validation_split(100 + np.arange(20), transfer.LogRegConfig())
  assert fold.dev.tolist() == [119] and fold.train.tolist()[:3] == [118, 107, 110] and fold.drawn == 20


def test_separable_data_is_learned():
  x, y = _blobs(300)
  folds = [transfer.Fold(train, test) for train, test in transfer.stratified_kfold(y, 3, 0)]
  fits = transfer.fit_logreg(x, y, 2, folds, np.full((3, 2), 1e-5), FAST)
  assert fits.weights.shape == (3, 2, 64, 2) and fits.dev_accuracy.shape == (3, 2)
  assert np.all(fits.dev_accuracy == 1.0)
  assert np.array_equal(fits.predict(x, 1, 0), y)


def test_fits_are_deterministic_under_a_seed():
  x, y = _blobs(200, spread=2.0)  # Overlapping: the weights keep moving, so the seed shows.
  folds = [transfer.Fold(np.arange(150), np.arange(150, 200))]
  fit = lambda config: transfer.fit_logreg(x, y, 2, folds, [[1e-4]], config)
  first, again, other = fit(FAST), fit(FAST), fit(dataclasses.replace(FAST, seed=3))
  assert np.array_equal(first.weights, again.weights) and np.array_equal(first.bias, again.bias)
  assert not np.array_equal(first.weights, other.weights)


class _FakeFits:
  """Records what `fit_logreg` is asked for and answers with chosen dev accuracies and constant predictions."""

  def __init__(self, dev_accuracy):
    self.dev_accuracy, self.calls = dev_accuracy, []

  def __call__(self, features, labels, num_classes, folds, regs, config):
    self.calls.append(np.asarray(regs))
    accuracy = self.dev_accuracy(len(folds)) if len(self.calls) == 1 else np.ones((len(folds), 1))
    return transfer.Fits(np.zeros((len(folds), regs.shape[1], features.shape[1], num_classes)),
                         np.zeros((len(folds), regs.shape[1], num_classes)), accuracy, np.ones(accuracy.shape))


def test_l2_search_picks_the_weight_best_on_dev_first_of_ties(monkeypatch):
  x, y = _blobs(90)
  regs = np.array(FAST.regs)
  # KFold: candidate 2 has the best mean over the folds; candidates 1 and 3 tie below it.
  fake = _FakeFits(lambda folds: np.tile([0.5, 0.7, 0.8, 0.7], (folds, 1)))
  monkeypatch.setattr(transfer, "fit_logreg", fake)
  devacc, _, _ = transfer.kfold_classifier((x, y), (x, y), 2, FAST)
  assert devacc == 80 and fake.calls[1].tolist() == [[regs[2]]]
  # A tie at the top goes to the first (smallest) weight, as np.argmax.
  fake = _FakeFits(lambda folds: np.tile([0.5, 0.8, 0.8, 0.7], (folds, 1)))
  monkeypatch.setattr(transfer, "fit_logreg", fake)
  transfer.kfold_classifier((x, y), (x, y), 2, FAST)
  assert fake.calls[1].tolist() == [[regs[1]]]
  # InnerKFold: each outer fold picks by the mean over its own inner folds; outer fold o prefers candidate o.
  def by_outer(folds):
    accuracy = np.full((folds, 4), 0.5)
    accuracy[np.arange(folds), np.arange(folds) // FAST.kfold] = 0.9
    return accuracy
  fake = _FakeFits(by_outer)
  monkeypatch.setattr(transfer, "fit_logreg", fake)
  devacc, _ = transfer.inner_kfold_classifier(x, y, 2, FAST)
  assert devacc == 90 and fake.calls[1][:, 0].tolist() == regs[:3].tolist()


def test_early_stopping_follows_senteval():
  x, y = _blobs(200)
  folds = [transfer.Fold(np.arange(150), np.arange(150, 200))]
  for tenacity in (0, 2):
    # 100% dev at the first evaluation; then each evaluation fails, and the one after `tenacity` failures stops.
    fits = transfer.fit_logreg(x, y, 2, folds, [[1e-5]], dataclasses.replace(FAST, tenacity=tenacity, max_epoch=200))
    assert fits.evaluations.tolist() == [[tenacity + 2]]
  capped = transfer.fit_logreg(x, y, 2, folds, [[1e-5]], dataclasses.replace(FAST, max_epoch=3, epoch_size=4))
  assert capped.evaluations.tolist() == [[1]]  # Passes 0..3 <= max_epoch: one evaluation.


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


@pytest.mark.parametrize("dim, classes, seed", [(384, 2, 1111), (1536, 2, 1111), (7, 6, 3)])
def test_init_is_torch_nn_linear_bit_for_bit(dim, classes, seed):
  torch = pytest.importorskip("torch")
  torch.manual_seed(seed)
  linear = torch.nn.Linear(dim, classes)
  start = transfer.torch_linear_init(dim, classes, seed)
  weight, bias = linear.weight.detach().numpy().T, linear.bias.detach().numpy()
  if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
    assert np.array_equal(start["w"], weight)
    assert np.array_equal(start["b"], bias)
  else:
    # torch's AVX2 and AVX-512 kernels, which every x86 CPU since Haswell and Zen runs, fuse uniform_'s
    # u (high - low) + low into one rounding, as torch_linear_init does. Its scalar fallback (a CPU without AVX2, or
    # ATEN_CPU_CAPABILITY=default) rounds the product first: two roundings against one, at most 2 ulps of the bound b
    # (1 / sqrt(dim) for both; measured: 1 ulp). A wrong bound or draw order is off by a fraction of b.
    atol = 2 * np.spacing(np.float32(1 / math.sqrt(dim)))
    np.testing.assert_allclose(start["w"], weight, rtol=0, atol=atol)
    np.testing.assert_allclose(start["b"], bias, rtol=0, atol=atol)
