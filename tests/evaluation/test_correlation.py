"""jaxemb.evaluation.correlation against scipy.stats, which SentEval's STS scorer calls: the same ranks, and the same
correlations to float64 rounding, along the last axis."""

import warnings

import numpy as np
import pytest
from scipy import stats

from jaxemb.evaluation import correlation

EPS64 = float(np.finfo(np.float64).eps)


def _atol(n: int) -> float:
  """Two float64 evaluations of a correlation of n pairs (means, centred products and norms: sums of n terms, each
  within n EPS64 / 2 of its value relative to its terms' magnitudes, Higham 3.1) differ by at most ~4 n EPS64 in r,
  which lies in [-1, 1]; a wrong formula (a rank off by one, an unaveraged tie) moves r by far more."""
  return 8 * n * EPS64


@pytest.mark.parametrize("n", [2, 7, 40, 1500])
def test_ranks_average_ties_as_rankdata(n):
  rng = np.random.default_rng(n)
  tied = rng.integers(0, 5, size=(3, 4, n)).astype(np.float64)  # Many ties, and runs of them.
  distinct = rng.normal(size=(2, n))
  for values in (tied, distinct, tied[0, 0]):
    np.testing.assert_array_equal(correlation.ranks(values), stats.rankdata(values, axis=-1))


def test_a_row_holding_a_nan_ranks_as_nan_and_the_others_as_before():
  values = np.array([[1.0, np.nan, 2.0], [3.0, 1.0, 3.0]])
  np.testing.assert_array_equal(correlation.ranks(values), [[np.nan] * 3, [2.5, 1.0, 2.5]])


@pytest.mark.parametrize("n", [2, 7, 40, 1500])
@pytest.mark.parametrize("kind", ["tied", "continuous"])
def test_pearson_and_spearman_equal_scipys(n, kind):
  rng = np.random.default_rng(n)
  if kind == "tied":  # STS gold scores: a few distinct values.
    x, y = rng.integers(0, 6, size=(2, n)).astype(np.float64)
  else:  # Cosines, correlated with the gold.
    y = rng.normal(size=n)
    x = 0.6 * y + rng.normal(size=n)
  if np.ptp(x) == 0 or np.ptp(y) == 0:
    x[0], y[-1] = x[0] + 1, y[-1] + 1
  assert correlation.pearson(x, y) == pytest.approx(stats.pearsonr(x, y).statistic, rel=0, abs=_atol(n))
  assert correlation.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, rel=0, abs=_atol(n))


def test_rows_correlate_each_with_one_vector():
  """Ditto's analysis: every head's scores [layers, heads, tokens] against one TF-IDF vector."""
  rng = np.random.default_rng(0)
  y = rng.normal(size=50)
  x = rng.normal(size=(2, 3, 50)) + y
  pearson, spearman = correlation.pearson(x, y), correlation.spearman(x, y)
  assert pearson.shape == spearman.shape == (2, 3)
  for index in np.ndindex(2, 3):
    assert pearson[index] == pytest.approx(stats.pearsonr(x[index], y).statistic, rel=0, abs=_atol(50))
    assert spearman[index] == pytest.approx(stats.spearmanr(x[index], y).statistic, rel=0, abs=_atol(50))


def test_a_constant_row_is_nan_without_a_warning_and_the_others_are_kept():
  x = np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 3.0]])
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    for correlate in (correlation.pearson, correlation.spearman):
      r = correlate(x, [3.0, 1.0, 2.0])
      assert np.isnan(r[0]) and r[1] == pytest.approx(-0.5, abs=_atol(3))
