"""Evaluators: scores of an encoder that a training run logs every so many steps (config.evals). One type per
module, each registered under its TYPE with its fields (jaxemb/evaluation/evaluators/base.py says what a type owns).
Adding a type is a module, its tests and an import line below, which registers it, as for methods.

Types and their fields (`type_defaults` gives each type's defaults):
  sts            tasks, split: the Spearman ("all") of each task, and their average when there are several
  transfer       tasks, mode: each SentEval transfer task's dev accuracy with logreg.MODES[mode], and their average
                 when there are several
  align_uniform  threshold: alignment over STS-B dev pairs with gold above it and uniformity over every dev sentence
"""

# The types, in the order of `types()` (and so of the types listed in error messages).
from jaxemb.evaluation.evaluators import base
from jaxemb.evaluation.evaluators import sts
from jaxemb.evaluation.evaluators import transfer
from jaxemb.evaluation.evaluators import align_uniform
from jaxemb.evaluation.evaluators.base import (
  Evaluator,
  evaluator_config,
  from_config,
  from_configs,
  is_due,
  type_defaults,
  types,
)

__all__ = [
  "Evaluator",
  "align_uniform",
  "base",
  "evaluator_config",
  "from_config",
  "from_configs",
  "is_due",
  "sts",
  "transfer",
  "type_defaults",
  "types",
]
