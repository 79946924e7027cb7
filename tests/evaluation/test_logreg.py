"""Tests for jaxemb.evaluation.logreg: SentEval's folds, validation split, classifier and L2 search."""

import dataclasses
import math

import numpy as np
import pytest

from jaxemb.evaluation import logreg
from tests.evaluation_support import FAST_LOGREG


def _blobs(n: int, dim: int = 64, spread: float = 0.3, seed: int = 0):
  """Two Gaussian blobs at -1 and +1 on every axis (float32 features, 0/1 labels): wide enough that a few dozen
  Adam steps (lr 1e-3 per weight) outweigh the random initial weights."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, n)
  return ((2 * labels - 1)[:, None] + spread * rng.normal(size=(n, dim))).astype(np.float32), labels


def test_stratified_kfold_matches_sklearn():
  # sklearn 1.9 StratifiedKFold(4, shuffle=True, random_state=seed): the test fold of each row.
  labels = np.array([2, 0, 1, 1, 0, 2, 2, 1, 0, 0, 1, 2, 0, 1, 1, 2, 0, 0, 1, 2, 1, 0, 1])
  expected = {
    1111: [3, 0, 2, 2, 2, 1, 1, 3, 3, 1, 3, 0, 1, 1, 0, 0, 2, 3, 0, 2, 2, 0, 1],
    7: [1, 1, 0, 2, 2, 3, 0, 1, 3, 2, 1, 1, 1, 3, 3, 0, 0, 0, 0, 2, 2, 3, 2],
  }
  for seed, folds in expected.items():
    test_fold = np.empty(len(labels), int)
    for i, (train, test) in enumerate(logreg.stratified_kfold(labels, 4, seed)):
      assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(len(labels)))
      test_fold[test] = i
    assert test_fold.tolist() == folds


def test_stratified_kfold_keeps_class_shares_and_rejects_too_many_folds():
  labels = np.random.default_rng(1).integers(0, 3, 101)
  per_fold = np.array([np.bincount(labels[test], minlength=3) for _, test in logreg.stratified_kfold(labels, 10, 0)])
  assert np.all(per_fold.max(0) - per_fold.min(0) <= 1)
  with pytest.raises(ValueError, match="cannot make 5 stratified folds"):
    logreg.stratified_kfold(np.array([0, 0, 1, 1]), 5, 0)


def test_validation_split_is_senteval_seeded_permutation():
  # np.random.seed(1111); np.random.permutation(20), SentEval's draw: the first int(0.05 * 20) = 1 is dev.
  fold = logreg.Fold.validation_split(100 + np.arange(20), logreg.LogRegConfig())
  assert fold.dev.tolist() == [119] and fold.train.tolist()[:3] == [118, 107, 110] and fold.drawn == 20


def test_separable_data_is_learned():
  x, y = _blobs(300)
  folds = [logreg.Fold(train, test) for train, test in logreg.stratified_kfold(y, 3, 0)]
  fits = logreg.fit_logreg(x, y, 2, folds, np.full((3, 2), 1e-5), FAST_LOGREG)
  assert fits.weights.shape == (3, 2, 64, 2) and fits.dev_accuracy.shape == (3, 2)
  assert np.all(fits.dev_accuracy == 1.0)
  assert np.array_equal(fits.predict(x, 1, 0), y)


def test_fits_are_deterministic_under_a_seed():
  x, y = _blobs(200, spread=2.0)  # Overlapping: the weights keep moving, so the seed shows.
  folds = [logreg.Fold(np.arange(150), np.arange(150, 200))]
  fit = lambda config: logreg.fit_logreg(x, y, 2, folds, [[1e-4]], config)
  first, again, other = fit(FAST_LOGREG), fit(FAST_LOGREG), fit(dataclasses.replace(FAST_LOGREG, seed=3))
  assert np.array_equal(first.weights, again.weights) and np.array_equal(first.bias, again.bias)
  assert not np.array_equal(first.weights, other.weights)


class _FakeFits:
  """Records what `fit_logreg` is asked for and answers with chosen dev accuracies and constant predictions."""

  def __init__(self, dev_accuracy):
    self.dev_accuracy, self.calls = dev_accuracy, []

  def __call__(self, features, labels, num_classes, folds, regs, config):
    self.calls.append(np.asarray(regs))
    accuracy = self.dev_accuracy(len(folds)) if len(self.calls) == 1 else np.ones((len(folds), 1))
    return logreg.Fits(
      np.zeros((len(folds), regs.shape[1], features.shape[1], num_classes)),
      np.zeros((len(folds), regs.shape[1], num_classes)),
      accuracy,
      np.ones(accuracy.shape),
    )


def test_l2_search_picks_the_weight_best_on_dev_first_of_ties(monkeypatch):
  x, y = _blobs(90)
  regs = np.array(FAST_LOGREG.regs)
  # KFold: candidate 2 has the best mean over the folds; candidates 1 and 3 tie below it.
  fake = _FakeFits(lambda folds: np.tile([0.5, 0.7, 0.8, 0.7], (folds, 1)))
  monkeypatch.setattr(logreg, "fit_logreg", fake)
  devacc, _, _ = logreg.kfold_classifier((x, y), (x, y), 2, FAST_LOGREG)
  assert devacc == 80 and fake.calls[1].tolist() == [[regs[2]]]
  # A tie at the top goes to the first (smallest) weight, as np.argmax.
  fake = _FakeFits(lambda folds: np.tile([0.5, 0.8, 0.8, 0.7], (folds, 1)))
  monkeypatch.setattr(logreg, "fit_logreg", fake)
  logreg.kfold_classifier((x, y), (x, y), 2, FAST_LOGREG)
  assert fake.calls[1].tolist() == [[regs[1]]]

  # InnerKFold: each outer fold picks by the mean over its own inner folds; outer fold o prefers candidate o.
  def by_outer(folds):
    accuracy = np.full((folds, 4), 0.5)
    accuracy[np.arange(folds), np.arange(folds) // FAST_LOGREG.kfold] = 0.9
    return accuracy

  fake = _FakeFits(by_outer)
  monkeypatch.setattr(logreg, "fit_logreg", fake)
  devacc, _ = logreg.inner_kfold_classifier(x, y, 2, FAST_LOGREG)
  assert devacc == 90 and fake.calls[1][:, 0].tolist() == regs[:3].tolist()


def test_early_stopping_follows_senteval():
  x, y = _blobs(200)
  folds = [logreg.Fold(np.arange(150), np.arange(150, 200))]
  for tenacity in (0, 2):
    # 100% dev at the first evaluation; then each evaluation fails, and the one after `tenacity` failures stops.
    fits = logreg.fit_logreg(
      x, y, 2, folds, [[1e-5]], dataclasses.replace(FAST_LOGREG, tenacity=tenacity, max_epoch=200)
    )
    assert fits.evaluations.tolist() == [[tenacity + 2]]
  capped = logreg.fit_logreg(x, y, 2, folds, [[1e-5]], dataclasses.replace(FAST_LOGREG, max_epoch=3, epoch_size=4))
  assert capped.evaluations.tolist() == [[1]]  # Passes 0..3 <= max_epoch: one evaluation.


@pytest.mark.parametrize("dim, classes, seed", [(384, 2, 1111), (1536, 2, 1111), (7, 6, 3)])
def test_init_is_torch_nn_linear_bit_for_bit(dim, classes, seed):
  torch = pytest.importorskip("torch")
  torch.manual_seed(seed)
  linear = torch.nn.Linear(dim, classes)
  start = logreg.torch_linear_init(dim, classes, seed)
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
