"""Evaluators from their config blocks, each type on the tiny BERT and small data: the numbers of the scorers they
wrap, and a bad block refused when it is built."""

import ml_collections
import numpy as np
import pytest

from jaxemb.data import sts as sts_data
from jaxemb.data import transfer as transfer_data
from jaxemb.encode import Encoder, Method
from jaxemb.errors import ConfigError, DataError
from jaxemb.evaluation import analysis, evaluators, logreg, sts, transfer
from jaxemb.evaluation.evaluators import evaluator_config
from tests.support import shared_path, short_senteval

# The STS tasks cut to 40 pairs a subset: the evaluators' numbers are compared with their scorers', on any pairs.
SENTEVAL = ml_collections.ConfigDict({"senteval_dir": str(short_senteval()), "source": "senteval"})


@pytest.fixture(scope="module")
def encoder(tiny_bert):
  return Encoder.from_pretrained(tiny_bert, Method("last_avg"), length_multiple=32, batch_size=256)


def test_sts_gives_each_tasks_spearman_and_their_average(encoder):
  block = evaluator_config("sts", every=5, tasks="STSBenchmark, SICKRelatedness")
  evaluator = evaluators.from_config("dev", block, SENTEVAL, sts_data.join_tokens)
  assert (evaluator.name, evaluator.every) == ("dev", 5)
  scores = evaluator.run(encoder)
  tasks = [sts_data.load_sts_task(SENTEVAL.senteval_dir, name, "dev") for name in ("STSBenchmark", "SICKRelatedness")]
  expected = sts.evaluate_sts(encoder.encode, tasks, sts_data.join_tokens)
  assert scores == {
    "STSBenchmark": expected["STSBenchmark", "dev"].all,
    "SICKRelatedness": expected["SICKRelatedness", "dev"].all,
    "average": pytest.approx(np.mean([t.all for t in expected.tasks.values()])),
  }
  assert evaluator.metrics == tuple(scores)  # Known before it runs: what model selection checks its metric against.


def test_align_uniform_measures_the_dev_pairs(encoder):
  evaluator = evaluators.from_config(
    "geometry", evaluator_config("align_uniform", every=1), SENTEVAL, sts_data.join_tokens
  )
  scores = evaluator.run(encoder)
  (pairs,) = sts_data.load_sts_task(SENTEVAL.senteval_dir, "STSBenchmark", "dev").subsets.values()
  # Encoded as the evaluator does, both sides of the pairs in one call: the same batches, so the same vectors (two
  # calls would batch them otherwise, and float32 rounding differ).
  vectors = encoder.encode([sts_data.join_tokens(s) for s in pairs.sentences1 + pairs.sentences2])
  first, second = vectors[: len(pairs)], vectors[len(pairs) :]
  expected = analysis.pair_alignment_uniformity(first, second, pairs.scores, 4.0)
  assert scores == {"alignment": expected["alignment"], "uniformity": expected["uniformity"]}
  assert evaluator.metrics == tuple(scores)


def test_transfer_gives_the_tasks_dev_accuracy(encoder, tmp_path):
  """A 40-sentence MR (SentEval's layout): the fasttest classifier's dev accuracy; one task, so no average."""
  (tmp_path / "MR").mkdir()
  for file in ("rt-polarity.pos", "rt-polarity.neg"):
    lines = (shared_path("data", "senteval", "MR") / file).read_bytes().splitlines()[:20]
    (tmp_path / "MR" / file).write_bytes(b"\n".join(lines) + b"\n")
  data = ml_collections.ConfigDict({"senteval_dir": str(tmp_path), "source": "senteval"})
  evaluator = evaluators.from_config(
    "transfer", evaluator_config("transfer", every=1, tasks="MR"), data, sts_data.join_tokens
  )
  scores = evaluator.run(encoder)
  result = transfer.evaluate_transfer(
    encoder.encode, transfer_data.load_transfer_tasks(tmp_path, ["MR"]), sts_data.join_tokens, logreg.MODES["fasttest"]
  )
  assert scores == {"MR": result["MR"].devacc}
  assert evaluator.metrics == tuple(scores)


@pytest.mark.parametrize(
  "block, error, message",
  [
    ({"type": "bleu", "every": 1}, ConfigError, r"config\.evals\.x\.type='bleu': must be one of"),
    ({"type": "sts", "every": 0}, ConfigError, r"config\.evals\.x\.every=0: must be a positive int"),
    ({"type": "sts", "every": True}, ConfigError, r"config\.evals\.x\.every=True"),
    ({"type": "sts", "every": 1, "classifier": "x"}, ConfigError, r"unknown fields \['classifier'\]"),
    ({"type": "sts", "every": 1, "tasks": "STS99"}, ConfigError, r"unknown STS task 'STS99'"),
    ({"type": "sts", "every": 1, "tasks": " , "}, ConfigError, r"config\.evals\.x\.tasks: names no task"),
    ({"type": "transfer", "every": 1, "tasks": "MR,SST5"}, ConfigError, r"unknown tasks \['SST5'\]"),
    ({"type": "transfer", "every": 1, "mode": "quick"}, ConfigError, r"mode='quick'"),
  ],
)
def test_a_bad_block_is_refused_naming_its_field(block, error, message):
  with pytest.raises(error, match=message):
    evaluators.from_config("x", ml_collections.ConfigDict(block), SENTEVAL, sts_data.join_tokens)


def test_data_is_read_when_the_evaluator_is_built(tmp_path):
  nowhere = ml_collections.ConfigDict({"senteval_dir": str(tmp_path / "nowhere"), "source": "senteval"})
  with pytest.raises(DataError, match="nowhere"):
    evaluators.from_configs(
      ml_collections.ConfigDict({"geometry": evaluator_config("align_uniform", every=1)}), nowhere, sts_data.join_tokens
    )


def test_an_evaluator_is_due_every_period_and_at_the_last_step():
  evaluator = evaluators.from_config("stsb", evaluator_config("sts", every=3), SENTEVAL, sts_data.join_tokens)
  assert [step for step in range(1, 9) if evaluators.is_due(evaluator, step, last_step=8)] == [3, 6, 8]


def test_a_registered_type_is_built_from_its_own_fields(monkeypatch):
  """The registry as a new type meets it: registered once under its TYPE, its fields completed and checked by
  from_config, built by its own `build`."""
  monkeypatch.setattr(evaluators.base, "_TYPES", dict(evaluators.base._TYPES))  # pylint: disable=protected-access
  assert evaluators.types() == ("sts", "transfer", "align_uniform")

  @evaluators.base.register
  class Constant:
    TYPE, FIELDS = "constant", {"value": 1.0}

    @classmethod
    def build(cls, entry, fields, data):
      del data
      return ml_collections.ConfigDict({"name": entry.name, "every": entry.every, "value": fields["value"]})

  built = evaluators.from_config("c", evaluator_config("constant", every=2, value=3.0), SENTEVAL, sts_data.join_tokens)
  assert (built.name, built.every, built.value) == ("c", 2, 3.0)
  assert evaluators.type_defaults("constant") == {"value": 1.0} and evaluators.type_defaults("nope") == {}
  with pytest.raises(ConfigError, match=r"a 'constant' evaluator has \['every', 'value'\]"):
    evaluators.from_config("c", ml_collections.ConfigDict({"type": "constant", "every": 1, "x": 0}), SENTEVAL, None)
  with pytest.raises(ValueError, match="registered already"):
    evaluators.base.register(Constant)
