"""The `align_uniform` evaluator type: Wang & Isola's alignment over the STS-B dev pairs with gold above `threshold`
and uniformity over every dev sentence (as SimCSE and PromptBERT analyse them; jaxemb.evaluation.analysis)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder
from jaxemb.evaluation import analysis, common
from jaxemb.evaluation.evaluators import base


@base.register
@dataclasses.dataclass(frozen=True)
class AlignUniformEvaluator:
  """Alignment of the STS-B dev pairs with gold above `threshold` and uniformity of every dev sentence."""

  TYPE: ClassVar[str] = "align_uniform"
  FIELDS: ClassVar[dict[str, Any]] = {"threshold": 4.0}
  metrics: ClassVar[tuple[str, ...]] = ("alignment", "uniformity")

  name: str
  every: int
  dev: sts_data.StsTask
  preprocess: common.Preprocess
  threshold: float

  @classmethod
  def build(cls, entry: base.Entry, fields: dict[str, Any], data: Any) -> AlignUniformEvaluator:
    dev = sts_data.load_sts_task(data.senteval_dir, "STSBenchmark", "dev", data.source)
    return cls(entry.name, entry.every, dev, entry.preprocess, float(fields["threshold"]))

  def run(self, encoder: Encoder) -> dict[str, float]:
    (pairs,) = self.dev.subsets.values()
    vectors = encoder.encode([self.preprocess(s) for s in pairs.sentences1 + pairs.sentences2])
    first, second = vectors[: len(pairs)], vectors[len(pairs) :]
    scores = analysis.pair_alignment_uniformity(first, second, pairs.scores, self.threshold)
    return {metric: scores[metric] for metric in self.metrics}
