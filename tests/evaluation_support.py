"""What the evaluation tests share: hand-made STS tasks with fixed vectors (tests/evaluation/test_sts.py checks them
against scipy by hand) and a logistic regression fast enough for small synthetic problems. Kept apart from
tests/support.py, which conftest.py imports, so that a pytest process loads JAX only when its tests do."""

import numpy as np

from jaxemb.data.sts import StsSubset, StsTask, join_tokens
from jaxemb.evaluation import logreg

rng = np.random.default_rng(0)
TEXTS = ["a cat", "a dog", "the sun", "a car", "two men", "rain", "snow", "a tree", "blue sky", "old boat", "new boat"]
VECTORS = {text: rng.normal(size=4) for text in TEXTS}
VECTORS["zero"] = np.zeros(4)  # Pairs with these score 0 (plain numpy would give NaN).
VECTORS["nan"] = np.full(4, np.nan)


def subset(name, pairs):
  return StsSubset(name, [p[0] for p in pairs], [p[1] for p in pairs], np.array([p[2] for p in pairs]))


# "a cat" and "a dog" recur across subsets and tasks; " a  cat " is "a cat" once whitespace is joined.
STS_X = subset(
  "x",
  [
    ("a cat", "a dog", 4.0),
    ("the sun", "a car", 0.5),
    ("two men", "rain", 1.0),
    (" a  cat ", "snow", 2.5),
    ("a tree", "blue sky", 1.5),
  ],
)
STS_Y = subset(
  "y", [("old boat", "new boat", 4.5), ("a dog", "rain", 0.0), ("snow", "a tree", 2.0), ("zero", "a cat", 3.0)]
)
STS_Z = subset("z", [("blue sky", "the sun", 3.5), ("a car", "nan", 1.0), ("two men", "a dog", 0.5)])
STSB = subset(
  "test", [("a cat", "old boat", 1.0), ("a dog", "two men", 2.0), ("rain", "snow", 3.5), ("the sun", "blue sky", 3.0)]
)
TASKS = [
  StsTask("STS12", "test", {"x": STS_X, "y": STS_Y, "z": STS_Z}),
  StsTask("STSBenchmark", "test", {"test": STSB}),
]


class FakeEncoder:
  """`embed` with fixed vectors that records what it was asked for."""

  def __init__(self):
    self.calls = []

  def __call__(self, sentences):
    self.calls.append(list(sentences))
    return np.stack([VECTORS[join_tokens(s).rstrip(".")] for s in sentences]).astype(np.float32)


# jaxemb's logistic regression on small synthetic problems: few folds, short batches.
FAST_LOGREG = logreg.LogRegConfig(kfold=3, batch_size=8, max_epoch=40)
