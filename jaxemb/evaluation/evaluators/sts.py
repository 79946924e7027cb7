"""The `sts` evaluator type: Spearman x100 ("all") of each STS task of one split, and their average when there are
several."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder
from jaxemb.evaluation import common, sts
from jaxemb.evaluation.evaluators import base


@base.register
@dataclasses.dataclass(frozen=True)
class StsEvaluator:
  """Spearman x100 of each STS task (one split), and their average when there are several."""

  TYPE: ClassVar[str] = "sts"
  FIELDS: ClassVar[dict[str, Any]] = {"tasks": "STSBenchmark", "split": "dev"}

  name: str
  every: int
  tasks: list[sts_data.StsTask]
  preprocess: common.Preprocess

  @classmethod
  def build(cls, entry: base.Entry, fields: dict[str, Any], data: Any) -> StsEvaluator:
    tasks = [
      sts_data.load_sts_task(data.senteval_dir, task, fields["split"], data.source)
      for task in common.task_names(fields["tasks"], entry.field("tasks"))
    ]
    return cls(entry.name, entry.every, tasks, entry.preprocess)

  @property
  def metrics(self) -> tuple[str, ...]:
    return base.averaged_metrics([task.name for task in self.tasks])

  def run(self, encoder: Encoder) -> dict[str, float]:
    result = sts.evaluate_sts(encoder.encode, self.tasks, self.preprocess)
    return base.with_average({task.name: result[task.name, task.split].all for task in self.tasks})
