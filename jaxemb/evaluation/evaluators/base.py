"""What every evaluator type owns, and the registry of the types: scores of an encoder that a training run logs
every so many steps (config.evals).

Each config.evals entry is built once from its block (its data read then, so a bad path fails before the first step)
and `run(encoder)` gives {metric: value}, logged as `<name>/<metric>` (google-research/big_vision
`big_vision/evaluators/common.py`: one object per config entry, its own period, its name as the key prefix). An
evaluator scores whatever params the encoder holds: training binds each evaluated step's to its selection encoder
(`Encoder.with_params`), so the evaluators need not know how a train state keeps them.

A type is a class registered with `register` under its TYPE: its FIELDS (beyond `type` and `every`, at their
defaults) and `build`, which reads its data and checks its fields' values. `from_config` checks what every type
shares (the type, no stray field, `every`) and hands the type its fields over their defaults, as methods are built
from their family's (jaxemb/methods/base.py).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import ml_collections
import numpy as np

from jaxemb.encode import Encoder
from jaxemb.errors import ConfigError, DataError
from jaxemb.evaluation import common


class Evaluator(Protocol):
  """Scores an encoder every `every` steps (and at the last step)."""

  name: str
  every: int
  metrics: tuple[str, ...]  # The keys `run` gives, known before it runs: model selection checks its metric so.

  def run(self, encoder: Encoder) -> dict[str, float]: ...


class EvaluatorType(Protocol):
  """A registered evaluator type: its config name, its fields at their defaults, and how a block becomes one."""

  TYPE: ClassVar[str]
  FIELDS: ClassVar[dict[str, Any]]

  @classmethod
  def build(cls, entry: Entry, fields: dict[str, Any], data: Any) -> Evaluator: ...


class Entry:
  """What `from_config` gives a type's `build`: the entry's name, period and sentence rule, and `field`, the dotted
  config name of one of its fields for an error line."""

  def __init__(self, name: str, every: int, preprocess: common.Preprocess):
    self.name, self.every, self.preprocess = name, every, preprocess

  def field(self, key: str) -> str:
    return f"config.evals.{self.name}.{key}"


_TYPES: dict[str, type[EvaluatorType]] = {}  # Type name -> its class, in registration order.


def register(kind: type[EvaluatorType]) -> type[EvaluatorType]:
  """Class decorator: registers `kind` under its TYPE."""
  if kind.TYPE in _TYPES:
    raise ValueError(f"evaluator type {kind.TYPE!r} is registered already")
  _TYPES[kind.TYPE] = kind
  return kind


def types() -> tuple[str, ...]:
  """Every registered evaluator type."""
  return tuple(_TYPES)


def type_defaults(kind: str) -> dict[str, Any]:
  """The fields of evaluator type `kind` beyond `type` and `every`, at their defaults ({} for no type)."""
  return dict(_TYPES[kind].FIELDS) if kind in _TYPES else {}


def evaluator_config(kind: str, every: int, **fields: Any) -> ml_collections.ConfigDict:
  """A config.evals entry: its type `kind`, its period in steps, and its fields over the type's defaults."""
  if kind not in _TYPES:
    raise ConfigError(f"evaluator type {kind!r} is not one of {sorted(_TYPES)}")
  return ml_collections.ConfigDict({"type": kind, "every": every, **type_defaults(kind), **fields})


def from_config(name: str, block: Any, data: Any, preprocess: common.Preprocess) -> Evaluator:
  """The evaluator config.evals.<name> describes, its data read from SentEval's folder (`data`: config.data's
  senteval_dir and source); sentences go through `preprocess` before they are embedded."""
  where = f"config.evals.{name}"
  if block.get("type") not in _TYPES:
    raise ConfigError(f"{where}.type={block.get('type')!r}: must be one of {sorted(_TYPES)}")
  kind = _TYPES[block["type"]]
  unknown = set(block) - {"type", "every", *kind.FIELDS}
  if unknown:
    raise ConfigError(
      f"{where}: unknown fields {sorted(unknown)}; a {kind.TYPE!r} evaluator has {['every', *kind.FIELDS]}"
    )
  every = block.get("every")
  if isinstance(every, bool) or not isinstance(every, int) or every < 1:
    raise ConfigError(f"{where}.every={every!r}: must be a positive int (steps)")
  fields = {**kind.FIELDS, **{key: value for key, value in block.items() if key in kind.FIELDS}}
  return kind.build(Entry(name, every, preprocess), fields, data)


def from_configs(evals: Any, data: Any, preprocess: common.Preprocess) -> list[Evaluator]:
  """Every evaluator of config.evals, in its order; DataError naming the evaluator and config.data.senteval_dir
  when its data is missing."""
  built = []
  for name, block in evals.items():
    try:
      with common.reading_senteval(data):
        built.append(from_config(name, block, data, preprocess))
    except DataError as e:
      raise DataError(f"config.evals.{name}: {e}") from None
  return built


def is_due(evaluator: Evaluator, step: int, last_step: int) -> bool:
  """Whether `evaluator` runs after `step`: every `every` steps, and at the last step."""
  return step % evaluator.every == 0 or step == last_step


def with_average(scores: dict[str, float]) -> dict[str, float]:
  """`scores`, and their mean as "average" when there are several: the keys `averaged_metrics` names."""
  return {**scores, "average": float(np.mean(list(scores.values())))} if len(scores) > 1 else scores


def averaged_metrics(names: list[str]) -> tuple[str, ...]:
  """The metrics of `with_average` over scores named `names`."""
  return (*names, "average") if len(names) > 1 else tuple(names)
