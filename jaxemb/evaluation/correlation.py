"""Pearson's and Spearman's correlations along the last axis, in NumPy float64, as scipy.stats computes them.

SentEval scores STS with `scipy.stats.spearmanr` and `pearsonr` (SimCSE `SentEval/senteval/sts.py`); these give
their values to float64 rounding (tests/evaluation/test_correlation.py) without importing scipy.stats, which
cost every command 0.75 s of its ~3 s start-up (train.py --help, evaluate.py, each process of a run) for two
functions. Along the last axis, so Ditto's analysis correlates every head's scores with one call.
"""

from __future__ import annotations

import numpy as np


def ranks(values) -> np.ndarray:
  """Ranks from 1 along the last axis, ties given their average rank (scipy.stats.rankdata's "average"); a row
  holding a NaN is all NaN (rankdata's nan_policy "propagate")."""
  values = np.asarray(values, np.float64)
  n = values.shape[-1]
  order = np.argsort(values, axis=-1, kind="stable")
  ordered = np.take_along_axis(values, order, -1)
  changes = ordered[..., 1:] != ordered[..., :-1]
  edge = np.ones((*values.shape[:-1], 1), bool)
  position = np.arange(n)
  # Each sorted value's tie group spans [first, last]: the last group start at or before it, the first group end
  # at or after it; its rank is their mean, plus 1.
  first = np.maximum.accumulate(np.where(np.concatenate([edge, changes], -1), position, 0), axis=-1)
  ends = np.where(np.concatenate([changes, edge], -1), position, n - 1)
  last = np.flip(np.minimum.accumulate(np.flip(ends, -1), axis=-1), -1)
  ranked = np.empty(values.shape, np.float64)
  np.put_along_axis(ranked, order, (first + last) / 2 + 1, -1)
  return np.where(np.isnan(values).any(-1, keepdims=True), np.nan, ranked)


def pearson(x, y) -> np.ndarray:
  """Pearson's r along the last axis (x and y broadcast), clipped to [-1, 1]; NaN where a row is constant (where
  scipy.stats.pearsonr warns and returns NaN)."""
  x, y = (np.asarray(a, np.float64) for a in (x, y))
  x = x - x.mean(-1, keepdims=True)
  y = y - y.mean(-1, keepdims=True)
  with np.errstate(invalid="ignore", divide="ignore"):
    r = np.sum(x * y, -1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))
  return np.clip(r, -1.0, 1.0)


def spearman(x, y) -> np.ndarray:
  """Spearman's rho along the last axis: Pearson's r of the average ranks (scipy.stats.spearmanr)."""
  return pearson(ranks(x), ranks(y))
