"""Model selection in a training run: the method that embeds for the selecting score (`selection_method`: the
authors' trainer view, or the run's evaluation method), the params evaluation reads, the run's evaluators, and
`Evaluation`, which scores due steps and keeps the best one in best/."""

from __future__ import annotations

from typing import Any

from jaxemb import progress
from jaxemb.encode import Encoder, Method
from jaxemb.errors import ConfigError, DataError
from jaxemb.evaluation import common, evaluators
from jaxemb.methods import prompt
from jaxemb.spec import TrainingRun
from jaxemb.training import checkpoints, objectives
from jaxemb.training import state as train_state


def selection_method(config: TrainingRun, objective: objectives.Objective) -> Method:
  """How the STS-B dev score that picks the kept step embeds a sentence.

  "training_view" is the authors' trainer (kongds/Prompt-BERT `prompt_bert/trainers.py` `evaluate` + `models.py`
  `sentemb_forward`; the same in ZBWpro/CoT-BERT and princeton-nlp/SimCSE): view 1 in evaluation mode, its template's
  ids around the sentence's own tokens, the objective's template bias subtracted when it denoises and
  config.eval.select_denoise (CoT-BERT: not), the objective's head when it is kept (`--mlp_only_train` off).
  """
  if config.eval.selection == "eval_method":
    return config.method  # The run's evaluation method, recorded in its run directory.
  (view, *_) = objective.view_list
  # A kept MLP is the run's pooler (eval_params).
  head = ("pooler" if objective.head == "mlp" else objective.head) if config.objective.keep_head else "none"
  return prompt.from_view(view, head, config.eval.select_denoise)


def eval_params(config: TrainingRun, params: dict[str, Any]) -> dict[str, Any]:
  """The encoder params that evaluation reads from a train state's params: a kept MLP is the pooler (the authors'
  checkpoint conversion, run.sh and SimCSE's simcse_to_huggingface.py, renames mlp -> pooler)."""
  if config.objective.keep_head and "mlp" in params:
    return {**params["encoder"], "pooler": params["mlp"]}
  return params["encoder"]


def selection_preprocess(config: TrainingRun) -> common.Preprocess:
  """The sentence rules the evaluators apply: the authors' trainer batcher joins SentEval's tokens and appends no "."
  (training_view); with the evaluation method, config.eval's rules."""
  if config.eval.selection == "training_view":
    return common.preprocess(join_tokens=config.eval.join_tokens, add_period=False)
  return common.preprocess_from_config(config.eval)


def build_evaluators(config: TrainingRun) -> list[evaluators.Evaluator]:
  """config.evals, their data read; ConfigError when config.eval.select_metric names none of their metrics."""
  built = evaluators.from_configs(config.evals, config.data, selection_preprocess(config))
  name, _, metric = config.eval.select_metric.partition("/")
  if not metric or name not in [e.name for e in built]:
    raise ConfigError(
      f"config.eval.select_metric={config.eval.select_metric!r}: must be <evaluator>/<metric>, "
      f"<evaluator> one of config.evals {[e.name for e in built]}"
    )
  selecting = next(e for e in built if e.name == name)
  if metric not in selecting.metrics:
    raise ConfigError(
      f"config.eval.select_metric={config.eval.select_metric!r}: evaluator {name!r} gives {list(selecting.metrics)}"
    )
  return built


def selection_record(meta: dict[str, Any]) -> dict[str, Any]:
  """A checkpoint's selection record; one saved before evaluators (STS-B dev its one metric) in today's names."""
  if "best_stsb_dev" not in meta:
    return meta
  return {
    "select_metric": "stsb_dev/STSBenchmark",
    "best_value": meta["best_stsb_dev"],
    "best_step": meta["best_step"],
    "value_before": meta["stsb_dev_before"],
  }


class Evaluation:
  """The run's evaluators scoring its params with the selection method, and the choice of the step kept in best/:
  the highest config.eval.select_metric so far. `meta` (saved with each checkpoint) records that choice."""

  def __init__(
    self,
    config: TrainingRun,
    evals: list[evaluators.Evaluator],
    encoder: Encoder,
    ckpt: checkpoints.RunCheckpoints,
    meta: dict[str, Any],
  ):
    self.config, self.evals, self.encoder, self.ckpt, self.meta = config, evals, encoder, ckpt, meta
    self.metric = config.eval.select_metric
    self.selecting = next(e for e in evals if e.name == self.metric.partition("/")[0])

  def due(self, done: int, total_steps: int) -> list[evaluators.Evaluator]:
    return [e for e in self.evals if evaluators.is_due(e, done, total_steps)]

  def score_before(self, state: train_state.TrainState) -> dict[str, float]:
    """The selecting evaluator's scores of the params before training, once per run (a resumed run has its
    selection metric's in `meta`: {})."""
    if self.meta["value_before"] is not None:
      return {}
    scores = self.scores([self.selecting], state)
    self.meta["value_before"] = scores[self.metric]
    progress.say(f"{self.metric} before training: {self.meta['value_before']:.2f}")
    return scores

  def scores(self, due: list[evaluators.Evaluator], state: train_state.TrainState) -> dict[str, float]:
    """{<evaluator>/<metric>: value} of the `due` evaluators on the state's params."""
    params = state.all_params
    encoder = self.encoder.with_params(eval_params(self.config, params), params.get("prompt"))
    scores = {}
    for evaluator in due:
      result = evaluator.run(encoder)
      scores.update({f"{evaluator.name}/{metric}": value for metric, value in result.items()})
    return scores

  def run(self, due: list[evaluators.Evaluator], state: train_state.TrainState, done: int) -> dict[str, float]:
    """The `due` evaluators' scores of step `done`; its params are saved in best/ when they beat the best so far."""
    scores = self.scores(due, state)
    if self.metric in scores and scores[self.metric] > self.meta["best_value"]:
      self.meta.update(best_value=scores[self.metric], best_step=done)
      self._save_best(state)
    return scores

  def keep_best(self, state: train_state.TrainState, total_steps: int):
    """Makes sure best/ holds the step `meta` names best, when the run starts and when it ends, so that its summary
    never names a step that evaluate.py cannot read.

    A resumed run knows its best step from its checkpoint's record. best/ lacks it when it was unreadable (set aside
    at start, RunCheckpoints._tidy) or deleted; a later step there, which the rest of the run reaches, is no loss: the
    kill of a run between a best save and its next periodic one leaves it, and the replay scores it best again
    (RunCheckpoints.save_best). Otherwise the best step's params are only in the train state of that step: when it is
    the state in hand (the run resumed from its best step, or ends at it) they are saved again; an earlier one's are
    gone, and the run stops with one line saying what to do rather than train on and report a step that is not there.

    Raises:
      DataError: the best step is missing and its params are gone.
    """
    best, at = self.meta["best_step"], int(state.step)
    saved = self.ckpt.best.all_steps()
    if best is None or best in saved or any(at < step <= total_steps for step in saved):
      return
    best_dir = self.ckpt.run.best_dir
    if best != at:
      raise DataError(
        f"best step {best} of the run in {self.ckpt.run.path} is missing from {best_dir} (unreadable or "
        f"deleted) and its params are gone (the run is at step {at}): restore {best_dir / str(best)} "
        "from a copy, or train again in another --config.workdir"
      )
    progress.say(f"best step {best} is missing from {best_dir}: saving it again from the train state of that step")
    self._save_best(state)

  def _save_best(self, state: train_state.TrainState):
    """Saves the params of `state`, the best step, in best/ (what evaluation reads: a kept MLP as the pooler)."""
    params, step = state.all_params, self.meta["best_step"]
    self.ckpt.save_best(
      step,
      {**params, "encoder": eval_params(self.config, params)},
      {"step": step, self.metric: self.meta["best_value"]},
    )
