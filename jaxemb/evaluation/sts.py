"""The STS scorer of SentEval (SimCSE's fork, "all" setting): cosine similarity against gold, Spearman.

Given `embed(sentences) -> [n, dim]` vectors and tasks from `jaxemb.data.sts`, each pair is scored by the
cosine of its two vectors (float64; 0 for a zero or NaN vector, as SentEval's `nan_to_num`) and compared
with the gold scores by rank correlation. Per task:

  all    one Spearman over the concatenated subsets: the number the papers report
  wmean  the subsets' Spearmans averaged, weighted by subset size (BERT-flow and BERT-whitening report this)
  mean   the subsets' Spearmans averaged

STS Benchmark and SICK-R have one subset per split, so all = wmean = mean there. Tasks are keyed by (name,
split), so STS-B dev can be scored in the same call as the test tasks; the headline number is the average of
"all" over the test tasks only: with the seven, the papers' average. Every correlation in a result is x100, as
the papers print them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Sequence

import numpy as np

from jaxemb.data.sts import StsSubset, StsTask, join_tokens
from jaxemb.evaluation import correlation
from jaxemb.evaluation.common import Embed, Preprocess, boxed, embed_distinct


@dataclasses.dataclass(frozen=True)
class SubsetScore:
  """Correlations (x100) of one subset."""

  name: str
  pairs: int
  spearman: float
  pearson: float


@dataclasses.dataclass(frozen=True)
class TaskScore:
  """Spearman correlations (x100) of one task: over all its pairs, and its subsets' weighted and plain means."""

  name: str
  split: str
  all: float
  wmean: float
  mean: float
  subsets: tuple[SubsetScore, ...]

  @property
  def pairs(self) -> int:
    return sum(subset.pairs for subset in self.subsets)


@dataclasses.dataclass(frozen=True)
class StsResult:
  """Scores of the tasks of one `evaluate_sts` call, by (task name, split)."""

  tasks: dict[tuple[str, str], TaskScore]

  @property
  def average(self) -> float:
    """Mean "all" Spearman over the test tasks (x100): the papers' average for the seven (NaN without one)."""
    return _mean([task.all for task in self._tests])

  @property
  def average_wmean(self) -> float:
    """Mean "wmean" Spearman over the test tasks (x100): the average BERT-flow and BERT-whitening report."""
    return _mean([task.wmean for task in self._tests])

  @property
  def _tests(self) -> list[TaskScore]:
    return [task for task in self.tasks.values() if task.split == "test"]

  def __getitem__(self, key: str | tuple[str, str]) -> TaskScore:
    """The task scored as `key`: a (name, split) pair, or a name scored on one split only."""
    if isinstance(key, tuple):
      return self.tasks[key]
    splits = [split for name, split in self.tasks if name == key]
    if len(splits) != 1:
      raise KeyError(f"{key} was scored on splits {splits}; ask for (name, split)" if splits else key)
    return self.tasks[key, splits[0]]

  def select(self, split: str) -> StsResult:
    """The tasks scored on `split`."""
    return StsResult({key: task for key, task in self.tasks.items() if key[1] == split})

  def to_dict(self) -> dict[str, Any]:
    """The averages and each task by name (`select` a split first where a name has several)."""
    names = [name for name, _ in self.tasks]
    if len(set(names)) != len(names):
      raise ValueError(f"tasks {list(self.tasks)} repeat a name; select one split to key them by name")
    tasks = {
      task.name: {
        "split": task.split,
        "all": task.all,
        "wmean": task.wmean,
        "mean": task.mean,
        "pairs": task.pairs,
        "subsets": {s.name: {"spearman": s.spearman, "pearson": s.pearson, "pairs": s.pairs} for s in task.subsets},
      }
      for task in self.tasks.values()
    }
    return {"average": self.average, "average_wmean": self.average_wmean, "tasks": tasks}

  def to_json(self, indent: int | None = 2) -> str:
    return json.dumps(self.to_dict(), indent=indent)

  def table(self) -> str:
    """One row per task (all, wmean, pairs), then the test tasks' average, boxed like SimCSE's PrettyTable output."""
    rows = [
      [task.name, task.split, f"{task.all:.2f}", f"{task.wmean:.2f}", str(task.pairs)] for task in self.tasks.values()
    ]
    if self._tests:
      rows.append(["Avg.", "", f"{self.average:.2f}", f"{self.average_wmean:.2f}", ""])
    return boxed(["Task", "Split", "all", "wmean", "pairs"], rows, left=2)

  def __str__(self) -> str:
    return self.table()


def distinct_sentences(tasks: Sequence[StsTask], preprocess: Preprocess | None = None) -> list[str]:
  """The tasks' sentences after `preprocess`, each once, in the order they first appear."""
  prepare = preprocess or (lambda sentence: sentence)
  return list(
    dict.fromkeys(
      prepare(s) for task in tasks for subset in task.subsets.values() for s in (*subset.sentences1, *subset.sentences2)
    )
  )


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Row-wise cosine similarity in float64; 0 where a vector is zero or NaN (SentEval's nan_to_num)."""
  a = np.nan_to_num(np.asarray(a, dtype=np.float64))
  b = np.nan_to_num(np.asarray(b, dtype=np.float64))
  with np.errstate(divide="ignore", invalid="ignore"):
    similarity = np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
  return np.nan_to_num(similarity, nan=0.0)


def evaluate_sts(embed: Embed, tasks: Sequence[StsTask], preprocess: Preprocess | None = join_tokens) -> StsResult:
  """Scores `tasks`, calling `embed` once with every distinct (preprocessed) sentence among them.

  `preprocess` maps each stored sentence to the text that is embedded: by default SentEval's
  whitespace join; compose `add_period` on top for the prompt methods; None embeds the text as stored.
  """
  if not tasks:
    raise ValueError("no tasks to evaluate")
  keys = [(task.name, task.split) for task in tasks]
  if len(set(keys)) != len(keys):
    raise ValueError(f"tasks {keys} repeat a name and split")
  vectors, rows = embed_distinct(
    embed,
    [column for task in tasks for subset in task.subsets.values() for column in (subset.sentences1, subset.sentences2)],
    preprocess,
  )
  rows = iter(rows)
  scores = {}
  for task in tasks:
    predictions = [(subset, cosine(vectors[next(rows)], vectors[next(rows)])) for subset in task.subsets.values()]
    scores[task.name, task.split] = _score_task(task, predictions)
  return StsResult(scores)


def _score_task(task: StsTask, predictions: list[tuple[StsSubset, np.ndarray]]) -> TaskScore:
  """SentEval's per-task numbers from each subset's system scores."""
  subsets = tuple(
    SubsetScore(subset.name, len(subset), _spearman(predicted, subset.scores), _pearson(predicted, subset.scores))
    for subset, predicted in predictions
  )
  spearmans = [s.spearman for s in subsets]
  everything = _spearman(
    np.concatenate([p for _, p in predictions]), np.concatenate([subset.scores for subset, _ in predictions])
  )
  return TaskScore(
    task.name,
    task.split,
    all=everything,
    wmean=float(np.average(spearmans, weights=[s.pairs for s in subsets])),
    mean=float(np.mean(spearmans)),
    subsets=subsets,
  )


def _mean(values: list[float]) -> float:
  return float(np.mean(values)) if values else math.nan


def _spearman(predicted: np.ndarray, gold: np.ndarray) -> float:
  return 100 * float(correlation.spearman(predicted, gold))


def _pearson(predicted: np.ndarray, gold: np.ndarray) -> float:
  return 100 * float(correlation.pearson(predicted, gold))
