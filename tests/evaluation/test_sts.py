"""Tests for jaxemb.evaluation.sts on hand-made pairs with fixed vectors, checked against scipy by hand."""

import json

import numpy as np
import pytest
from scipy import stats

from jaxemb.data.sts import StsTask, add_period, join_tokens
from jaxemb.evaluation import sts
from tests.evaluation_support import FakeEncoder, STSB, STS_X, STS_Y, STS_Z, TASKS, VECTORS


def by_hand(pairs):
  """Cosine of each pair, one at a time, the way SentEval's loop computes it."""
  scores = []
  for a, b in zip(pairs.sentences1, pairs.sentences2):
    u, v = VECTORS[join_tokens(a)], VECTORS[join_tokens(b)]
    with np.errstate(invalid="ignore"):
      cos = np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v))
    scores.append(0.0 if np.isnan(cos) else cos)
  return np.array(scores)


@pytest.fixture(scope="module")
def evaluated():
  embed = FakeEncoder()
  return embed, sts.evaluate_sts(embed, TASKS)


def test_embed_is_called_once_with_distinct_sentences(evaluated):
  embed, _ = evaluated
  assert len(embed.calls) == 1
  sentences = embed.calls[0]
  assert len(sentences) == len(set(sentences))
  assert set(sentences) == set(VECTORS)


def test_all_wmean_and_mean_match_scipy(evaluated):
  _, result = evaluated
  subsets = [STS_X, STS_Y, STS_Z]
  predicted = [by_hand(s) for s in subsets]
  spearmans = [stats.spearmanr(p, s.scores).statistic for p, s in zip(predicted, subsets)]
  task = result["STS12"]
  assert task.pairs == 12
  gold = np.concatenate([s.scores for s in subsets])
  np.testing.assert_allclose(task.all, 100 * stats.spearmanr(np.concatenate(predicted), gold).statistic)
  np.testing.assert_allclose(task.wmean, 100 * (5 * spearmans[0] + 4 * spearmans[1] + 3 * spearmans[2]) / 12)
  np.testing.assert_allclose(task.mean, 100 * np.mean(spearmans))
  for score, p, s in zip(task.subsets, predicted, subsets):
    assert (score.name, score.pairs) == (s.name, len(s))
    np.testing.assert_allclose(score.pearson, 100 * stats.pearsonr(p, s.scores).statistic)
  # One subset: every summary is its Spearman.
  stsb = result["STSBenchmark"]
  expected = 100 * stats.spearmanr(by_hand(STSB), STSB.scores).statistic
  np.testing.assert_allclose([stsb.all, stsb.wmean, stsb.mean], [expected] * 3)
  np.testing.assert_allclose(result.average, (task.all + stsb.all) / 2)
  np.testing.assert_allclose(result.average_wmean, (task.wmean + stsb.wmean) / 2)


def test_zero_and_nan_vectors_score_zero():
  a = np.array([[1.0, 2.0], [0.0, 0.0], [np.nan, 1.0], [3.0, 0.0]])
  b = np.array([[2.0, 4.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
  np.testing.assert_allclose(sts.cosine(a, b), [1.0, 0.0, np.sqrt(0.5), 0.0])
  assert sts.cosine(a, b).dtype == np.float64
  np.testing.assert_allclose(sts.cosine(np.full((1, 3), np.nan), np.ones((1, 3))), [0.0])


def test_table_and_json_hold_the_numbers(evaluated):
  _, result = evaluated
  table = result.table()
  lines = table.splitlines()
  assert lines[0].startswith("+-") and lines[-1] == lines[0]
  sts12 = next(line for line in lines if line.startswith("| STS12 "))
  assert f"{result['STS12'].all:.2f}" in sts12 and f"{result['STS12'].wmean:.2f}" in sts12 and " 12 |" in sts12
  assert f"{result.average:.2f}" in next(line for line in lines if line.startswith("| Avg."))
  assert str(result) == table
  loaded = json.loads(result.to_json())
  assert loaded == result.to_dict()
  assert loaded["average"] == pytest.approx(result.average)
  assert loaded["tasks"]["STS12"]["wmean"] == pytest.approx(result["STS12"].wmean)
  assert loaded["tasks"]["STS12"]["subsets"]["y"]["pairs"] == 4
  assert loaded["tasks"]["STSBenchmark"]["pairs"] == 4


def test_preprocess_is_applied_before_embedding():
  embed = FakeEncoder()
  sts.evaluate_sts(embed, TASKS, preprocess=lambda s: add_period(join_tokens(s)))
  assert all(s.endswith(".") for s in embed.calls[0])
  embed = FakeEncoder()
  sts.evaluate_sts(embed, TASKS, preprocess=None)  # The stored text as it is.
  assert " a  cat " in embed.calls[0] and "a cat" in embed.calls[0]


def test_bad_calls():
  with pytest.raises(ValueError, match="embed returned shape"):
    sts.evaluate_sts(lambda sentences: np.zeros((len(sentences) - 1, 4)), TASKS)
  with pytest.raises(ValueError, match="repeat a name"):
    sts.evaluate_sts(FakeEncoder(), [TASKS[1], TASKS[1]])
  with pytest.raises(ValueError, match="no tasks"):
    sts.evaluate_sts(FakeEncoder(), [])


def test_splits_of_one_task_are_scored_in_one_call():
  embed = FakeEncoder()
  result = sts.evaluate_sts(embed, [*TASKS, StsTask("STSBenchmark", "dev", {"dev": STSB})])
  alone = sts.evaluate_sts(FakeEncoder(), TASKS)
  assert len(embed.calls) == 1 and list(result.tasks) == [
    ("STS12", "test"),
    ("STSBenchmark", "test"),
    ("STSBenchmark", "dev"),
  ]
  assert result["STS12"] == result["STS12", "test"] == alone["STS12"]
  assert result["STSBenchmark", "dev"].all == alone["STSBenchmark"].all  # The same pairs.
  with pytest.raises(KeyError, match=r"splits \['test', 'dev'\]; ask for \(name, split\)"):
    result["STSBenchmark"]  # pylint: disable=pointless-statement
  # The averages are the test tasks': dev is scored, not averaged in.
  assert (result.average, result.average_wmean) == (alone.average, alone.average_wmean)
  assert result.select("test").to_dict() == alone.to_dict()
  with pytest.raises(ValueError, match="select one split"):
    result.to_dict()
