"""SentEval's transfer tasks: each task's protocol, run with the classifier of `jaxemb.evaluation.logreg`.

The protocol follows the splits of a task (`tools/validation.py`):

  MR, CR, SUBJ, MPQA  InnerKFoldClassifier: 10 outer folds; in each, the L2 weight with the best mean dev
                      accuracy over 10 inner folds (each inner fold early-stops on its own held-out part); then
                      one fit on the outer training part (early-stopping on a random 5% of it), scored on the
                      outer test fold. Folds use seed 1111 whatever the seed (SentEval hard-codes it).
  TREC, MRPC          KFoldClassifier: the L2 weight by 10-fold cross-validation on train; one fit on train
                      (5% validation split); scored on test. MRPC also reports F1 of the paraphrase class.
  SST-2               SplitClassifier: one fit per L2 weight on train, early-stopping on dev; the best on dev
                      is scored on test.

Before all that, SentEval sorts each split by sentence length in tokens (then label) to batch the encoder, and
the classifier sees the examples in that order, which fixes the folds; it is kept here. MRPC's features are
`[|u - v|, u * v]` (SentEval's `np.c_[np.abs(A - B), A * B]`, without u and v themselves).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Sequence

import numpy as np

from jaxemb.data import transfer as transfer_data
from jaxemb.data.sts import join_tokens
from jaxemb.evaluation.common import Embed, Preprocess, boxed, embed_distinct
from jaxemb.evaluation.logreg import LogRegConfig, inner_kfold_classifier, kfold_classifier, split_classifier

_F1_TASKS = ("MRPC",)


@dataclasses.dataclass(frozen=True)
class TaskScore:
  """Accuracies (%) of one task; F1 (%) of the positive class for MRPC."""

  name: str
  devacc: float
  acc: float
  ndev: int  # SentEval's counts: the cross-validated rows (MR..MPQA), train (TREC, MRPC) or dev (SST-2).
  ntest: int
  seconds: float  # Classifier time.
  f1: float | None = None


@dataclasses.dataclass(frozen=True)
class TransferResult:
  """Scores of the tasks of one `evaluate_transfer` call, by task name."""

  tasks: dict[str, TaskScore]
  encode_seconds: float

  @property
  def average(self) -> float:
    """Mean test accuracy over the tasks: the "Avg." the papers print next to the seven tasks."""
    return float(np.mean([task.acc for task in self.tasks.values()]))

  def __getitem__(self, name: str) -> TaskScore:
    return self.tasks[name]

  def to_dict(self) -> dict[str, Any]:
    tasks = {
      name: {k: v for k, v in dataclasses.asdict(task).items() if k != "name" and v is not None}
      for name, task in self.tasks.items()
    }
    return {"average": self.average, "encode_seconds": self.encode_seconds, "tasks": tasks}

  def to_json(self, indent: int | None = 2) -> str:
    return json.dumps(self.to_dict(), indent=indent)

  def table(self) -> str:
    """One row per task (dev and test accuracy, F1, sizes), then the average test accuracy."""
    rows = [
      [t.name, f"{t.devacc:.2f}", f"{t.acc:.2f}", "" if t.f1 is None else f"{t.f1:.2f}", str(t.ndev), str(t.ntest)]
      for t in self.tasks.values()
    ]
    rows.append(["Avg.", "", f"{self.average:.2f}", "", "", ""])
    header = ["Task", "dev acc", "test acc", "F1", "ndev", "ntest"]
    return boxed(header, rows, left=1)

  def __str__(self) -> str:
    return self.table()


def evaluate_transfer(
  embed: Embed,
  tasks: Sequence[transfer_data.TransferTask],
  preprocess: Preprocess | None = join_tokens,
  config: LogRegConfig = LogRegConfig(),
) -> TransferResult:
  """Scores `tasks`, calling `embed` once with every distinct (preprocessed) sentence among them.

  `preprocess` maps each stored sentence to the text that is embedded: by default SentEval's whitespace join
  (its batcher joins the tokens with spaces); compose `add_period` on top for the prompt methods.
  """
  if not tasks:
    raise ValueError("no tasks to evaluate")
  names = [task.name for task in tasks]
  if len(set(names)) != len(names):
    raise ValueError(f"tasks {names} repeat a name")
  start = time.perf_counter()
  vectors, rows = embed_distinct(
    embed, [column for task in tasks for split in task.splits.values() for column in split.columns], preprocess
  )
  encode_seconds = time.perf_counter() - start
  vectors, rows = vectors.astype(np.float32, copy=False), iter(rows)
  scores = {}
  for task in tasks:
    by_split = {name: [next(rows) for _ in split.columns] for name, split in task.splits.items()}
    scores[task.name] = _score_task(task, vectors, by_split, config)
  return TransferResult(scores, encode_seconds)


def senteval_order(split: transfer_data.TransferSplit) -> np.ndarray:
  """SentEval's order of a split's examples: stably sorted by each sentence's token count, then the label."""
  keys = [tuple(len(sentence.split()) for sentence in example) for example in zip(*split.columns)]
  return np.array(sorted(range(len(split)), key=lambda i: (*keys[i], split.labels[i])), dtype=np.int64)


def _score_task(
  task: transfer_data.TransferTask, vectors: np.ndarray, rows: dict[str, list[np.ndarray]], config: LogRegConfig
) -> TaskScore:
  """Runs the protocol the task's splits call for."""
  start = time.perf_counter()
  data = {}
  for name, split in task.splits.items():
    order = senteval_order(split)
    columns = [vectors[column[order]] for column in rows[name]]
    # Pairs (MRPC): SentEval's np.c_[np.abs(A - B), A * B].
    features = columns[0] if len(columns) == 1 else np.c_[np.abs(columns[0] - columns[1]), columns[0] * columns[1]]
    data[name] = (features, split.labels[order])
  f1 = None
  if set(data) == {"all"}:
    devacc, acc = inner_kfold_classifier(*data["all"], task.num_classes, config)
    ndev = ntest = len(data["all"][1])
  elif set(data) == {"train", "test"}:
    devacc, acc, predictions = kfold_classifier(data["train"], data["test"], task.num_classes, config)
    f1 = _f1(predictions, data["test"][1]) if task.name in _F1_TASKS else None
    ndev, ntest = len(data["train"][1]), len(data["test"][1])
  elif set(data) == {"train", "dev", "test"}:
    devacc, acc = split_classifier(data["train"], data["dev"], data["test"], task.num_classes, config)
    ndev, ntest = len(data["dev"][1]), len(data["test"][1])
  else:
    raise ValueError(f"task {task.name}: splits {sorted(data)} match no SentEval protocol")
  return TaskScore(
    task.name, float(devacc), float(acc), ndev, ntest, time.perf_counter() - start, None if f1 is None else float(f1)
  )


def _f1(predictions: np.ndarray, labels: np.ndarray) -> float:
  """F1 (%) of class 1, as sklearn's f1_score(labels, predictions) (0 when there is nothing to score)."""
  true_positive = np.sum((predictions == 1) & (labels == 1))
  denominator = np.sum(predictions == 1) + np.sum(labels == 1)
  return round(100 * 2 * true_positive / denominator, 2) if denominator else 0.0
