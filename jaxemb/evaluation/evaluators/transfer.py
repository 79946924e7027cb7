"""The `transfer` evaluator type: each SentEval transfer task's dev accuracy (%) with logreg.MODES[mode], and their
average when there are several."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from jaxemb.data import transfer as transfer_data
from jaxemb.encode import Encoder
from jaxemb.errors import ConfigError
from jaxemb.evaluation import common, logreg, transfer
from jaxemb.evaluation.evaluators import base


@base.register
@dataclasses.dataclass(frozen=True)
class TransferEvaluator:
  """Dev accuracy (%) of each SentEval transfer task, and their average when there are several."""

  TYPE: ClassVar[str] = "transfer"
  FIELDS: ClassVar[dict[str, Any]] = {"tasks": ",".join(transfer_data.TASKS), "mode": "fasttest"}

  name: str
  every: int
  tasks: list[transfer_data.TransferTask]
  preprocess: common.Preprocess
  classifier: logreg.LogRegConfig

  @classmethod
  def build(cls, entry: base.Entry, fields: dict[str, Any], data: Any) -> TransferEvaluator:
    if fields["mode"] not in logreg.MODES:
      raise ConfigError(f"{entry.field('mode')}={fields['mode']!r}: must be one of {sorted(logreg.MODES)}")
    names = common.task_names(fields["tasks"], entry.field("tasks"), transfer_data.TASKS)
    tasks = transfer_data.load_transfer_tasks(data.senteval_dir, names)
    return cls(entry.name, entry.every, tasks, entry.preprocess, logreg.MODES[fields["mode"]])

  @property
  def metrics(self) -> tuple[str, ...]:
    return base.averaged_metrics([task.name for task in self.tasks])

  def run(self, encoder: Encoder) -> dict[str, float]:
    result = transfer.evaluate_transfer(encoder.encode, self.tasks, self.preprocess, self.classifier)
    return base.with_average({name: score.devacc for name, score in result.tasks.items()})
