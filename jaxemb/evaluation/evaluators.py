"""Evaluators: scores of an encoder that a training run logs every so many steps (config.evals).

Each is built once from its config block (its data read then, so a bad path fails before the first step) and
`run(encoder)` gives {metric: value}, logged as `<name>/<metric>` (google-research/big_vision
`big_vision/evaluators/common.py`: one object per config entry, its own period, its name as the key prefix). An
evaluator scores whatever params the encoder holds: training binds each evaluated step's to its selection encoder
(`Encoder.with_params`), so the evaluators need not know how a train state keeps them.

Types and their fields (`evaluator_config` gives each type's defaults):
  sts            tasks, split: the Spearman ("all") of each task, and their average when there are several
  transfer       tasks, mode: each SentEval transfer task's dev accuracy with logreg.MODES[mode], and their average
                 when there are several
  align_uniform  threshold: Wang & Isola's alignment over STS-B dev pairs with gold above it and uniformity over
                 every dev sentence (as SimCSE and PromptBERT analyse them; jaxemb.evaluation.analysis)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import ml_collections
import numpy as np

from jaxemb.data import sts as sts_data
from jaxemb.data import transfer as transfer_data
from jaxemb.encode import Encoder
from jaxemb.errors import ConfigError, DataError
from jaxemb.evaluation import analysis, common, logreg, sts, transfer

# Each type's fields beyond `type` and `every`, at their defaults.
FIELDS = {
  "sts": {"tasks": "STSBenchmark", "split": "dev"},
  "transfer": {"tasks": ",".join(transfer_data.TASKS), "mode": "fasttest"},
  "align_uniform": {"threshold": 4.0},
}


class Evaluator(Protocol):
  """Scores an encoder every `every` steps (and at the last step)."""

  name: str
  every: int

  def run(self, encoder: Encoder) -> dict[str, float]: ...


def evaluator_config(kind: str, every: int, **fields: Any) -> ml_collections.ConfigDict:
  """A config.evals entry: its type `kind` (one of FIELDS), its period in steps, and its fields over the type's
  defaults."""
  if kind not in FIELDS:
    raise ConfigError(f"evaluator type {kind!r} is not one of {sorted(FIELDS)}")
  return ml_collections.ConfigDict({"type": kind, "every": every, **FIELDS[kind], **fields})


@dataclasses.dataclass(frozen=True)
class StsEvaluator:
  """Spearman x100 of each STS task (one split), and their average when there are several."""

  name: str
  every: int
  tasks: list[sts_data.StsTask]
  preprocess: common.Preprocess

  def run(self, encoder: Encoder) -> dict[str, float]:
    result = sts.evaluate_sts(encoder.encode, self.tasks, self.preprocess)
    return _with_average({task.name: result[task.name, task.split].all for task in self.tasks})


@dataclasses.dataclass(frozen=True)
class TransferEvaluator:
  """Dev accuracy (%) of each SentEval transfer task, and their average when there are several."""

  name: str
  every: int
  tasks: list[transfer_data.TransferTask]
  preprocess: common.Preprocess
  classifier: logreg.LogRegConfig

  def run(self, encoder: Encoder) -> dict[str, float]:
    result = transfer.evaluate_transfer(encoder.encode, self.tasks, self.preprocess, self.classifier)
    return _with_average({name: score.devacc for name, score in result.tasks.items()})


@dataclasses.dataclass(frozen=True)
class AlignUniformEvaluator:
  """Alignment of the STS-B dev pairs with gold above `threshold` and uniformity of every dev sentence."""

  name: str
  every: int
  dev: sts_data.StsTask
  preprocess: common.Preprocess
  threshold: float

  def run(self, encoder: Encoder) -> dict[str, float]:
    (pairs,) = self.dev.subsets.values()
    vectors = encoder.encode([self.preprocess(s) for s in pairs.sentences1 + pairs.sentences2])
    first, second = vectors[: len(pairs)], vectors[len(pairs) :]
    scores = analysis.pair_alignment_uniformity(first, second, pairs.scores, self.threshold)
    return {"alignment": scores["alignment"], "uniformity": scores["uniformity"]}


def from_config(name: str, block: Any, data: Any, preprocess: common.Preprocess) -> Evaluator:
  """The evaluator config.evals.<name> describes, its data read from SentEval's folder (`data`: config.data's
  senteval_dir and source); sentences go through `preprocess` before they are embedded."""
  field = f"config.evals.{name}"
  if block.get("type") not in FIELDS:
    raise ConfigError(f"{field}.type={block.get('type')!r}: must be one of {sorted(FIELDS)}")
  unknown = set(block) - {"type", "every", *FIELDS[block.type]}
  if unknown:
    raise ConfigError(
      f"{field}: unknown fields {sorted(unknown)}; a {block.type!r} evaluator has {['every', *FIELDS[block.type]]}"
    )
  every = block.get("every")
  if isinstance(every, bool) or not isinstance(every, int) or every < 1:
    raise ConfigError(f"{field}.every={every!r}: must be a positive int (steps)")
  fields = {**FIELDS[block.type], **{k: v for k, v in block.items() if k in FIELDS[block.type]}}
  if block.type == "sts":
    tasks = [
      sts_data.load_sts_task(data.senteval_dir, task, fields["split"], data.source)
      for task in common.task_names(fields["tasks"], f"{field}.tasks")
    ]
    return StsEvaluator(name, every, tasks, preprocess)
  if block.type == "transfer":
    if fields["mode"] not in logreg.MODES:
      raise ConfigError(f"{field}.mode={fields['mode']!r}: must be one of {sorted(logreg.MODES)}")
    names = common.task_names(fields["tasks"], f"{field}.tasks", transfer_data.TASKS)
    tasks = transfer_data.load_transfer_tasks(data.senteval_dir, names)
    return TransferEvaluator(name, every, tasks, preprocess, logreg.MODES[fields["mode"]])
  dev = sts_data.load_sts_task(data.senteval_dir, "STSBenchmark", "dev", data.source)
  return AlignUniformEvaluator(name, every, dev, preprocess, float(fields["threshold"]))


def from_configs(evals: Any, data: Any, preprocess: common.Preprocess) -> list[Evaluator]:
  """Every evaluator of config.evals, in its order; DataError naming the evaluator and config.data.senteval_dir
  when its data is missing."""
  built = []
  for name, block in evals.items():
    try:
      built.append(from_config(name, block, data, preprocess))
    except DataError as e:
      raise DataError(
        f"config.evals.{name}: config.data.senteval_dir={data.senteval_dir}: {e}; fetch SentEval with prepare.py"
      ) from None
  return built


def is_due(evaluator: Evaluator, step: int, last_step: int) -> bool:
  """Whether `evaluator` runs after `step`: every `every` steps, and at the last step."""
  return step % evaluator.every == 0 or step == last_step


def _with_average(scores: dict[str, float]) -> dict[str, float]:
  """`scores`, and their mean as "average" when there are several."""
  return {**scores, "average": float(np.mean(list(scores.values())))} if len(scores) > 1 else scores
