"""The training loop of train.py: data, sharded state, the jitted step, the evaluators and selection, checkpoints."""

from __future__ import annotations

import functools
import math
import signal
import threading
import time
from typing import Any, Callable, Iterator

import jax
from jax.experimental import multihost_utils
import tqdm

from jaxemb import atomic, hosts, sharding, storage, xla
from jaxemb.data import corpus, lines
from jaxemb.encode import Encoder, Method
from jaxemb.errors import ConfigError, DataError
from jaxemb.evaluation import common, evaluators
from jaxemb.methods import prompt
from jaxemb.models import hf, run_dir
from jaxemb.training import batches, checkpoints, objectives, preflight
from jaxemb.training import state as train_state
from jaxemb.training.metrics import StepRecorder
from jaxemb.training.trainer import Trainer, build_trainer, load_start
from jaxemb.training.workdir import Claim, claim_workdir, data_identity, refuse_if_busy


def read_columns(config: Any) -> dict[str, list[str]]:
  """config.data's training corpus by column (corpus.read_columns); `datasets` caches its tables in data.cache_dir
  when that is a local folder."""
  cache_dir = config.data.cache_dir
  return corpus.read_columns(
    config.data.train_file, config.data.format, cache_dir if cache_dir and not storage.is_remote(cache_dir) else None
  )


def _saved_encoder_shapes(saved: dict[str, Any]) -> dict[str, Any]:
  """The pretrained encoder's shapes in a saved train state: its trained and frozen parts in one tree."""
  return train_state.merge_params(saved["frozen"].get("encoder", {}), saved["params"].get("encoder", {}))


class Preempted(Exception):
  """The run stopped on SIGTERM or Ctrl-C (SIGINT) after saving its state; rerunning the same command resumes it."""

  def __init__(self, step: int, signum: int = signal.SIGTERM):
    stopped = "preempted" if signum == signal.SIGTERM else "stopped on Ctrl-C"
    super().__init__(f"{stopped} at step {step}; checkpoint saved; rerun the same command to resume")
    self.step = step
    self.exit_code = 128 + signum  # The status a command exits with: that of a process the signal ended.


class _CleanStop:
  """Notes a request to stop, SIGTERM (a preempted TPU VM, a cluster scheduler) or Ctrl-C (SIGINT), so the loop
  stops cleanly after a step, saving it.

  One process installs its own handlers. A first Ctrl-C is said at once, and a second one stops the run at once:
  the handler gives SIGINT back to Python's, whose KeyboardInterrupt jaxemb.cli says in one line. Where SIGINT is
  not Python's own (ignored, as by a shell for a background job, or another program's) it is left alone.

  A multi-host job leaves SIGTERM to JAX's preemption service, which jax.distributed.initialize starts: it tells every
  host of a notice to any one of them and names a step that all of them reach, so they save the same step together.
  The service hears no SIGINT, so Ctrl-C keeps Python's meaning there: that host stops at once, and the job with it,
  as when a host is killed. A job stops with a checkpoint on SIGTERM (`kill PID` on any host).
  """

  def __init__(self):
    self.received = None  # The first signal that asked to stop.
    self._previous = {}  # Signal -> the handler to give back.
    self._calls = 0  # Calls of the jitted steps so far: the preemption service's counter.

  def __enter__(self):
    # signal.signal works in the main thread only.
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._note)
      if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._note)
    return self

  def __exit__(self, *exc_info):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

  def _note(self, signum, frame):  # pylint: disable=unused-argument
    self.received = self.received or signum
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, self._previous[signal.SIGINT])  # The next Ctrl-C raises KeyboardInterrupt.
      _say("Ctrl-C: stopping once this step is saved; Ctrl-C again stops at once")

  def stop(self) -> bool:
    """Whether this process stops after the call that just ended (each process of a job asks after every call,
    the same calls on every host: the preemption service names a sync point in calls)."""
    self._calls += 1
    if jax.process_count() == 1:
      return self.received is not None
    return multihost_utils.reached_preemption_sync_point(self._calls)

  @property
  def signum(self) -> int:
    """The signal the run stops on: the first received, or the preemption service's SIGTERM."""
    return self.received or signal.SIGTERM


SELECTIONS = ("training_view", "eval_method")


def eval_method(config: Any) -> Method:
  """The run's evaluation method (config.method), recorded in its run directory."""
  return Method.from_config(config.method)


def selection_method(config: Any, objective: objectives.Objective) -> Method:
  """How the STS-B dev score that picks the kept step embeds a sentence.

  "training_view" is the authors' trainer (kongds/Prompt-BERT `prompt_bert/trainers.py` `evaluate` + `models.py`
  `sentemb_forward`; the same in ZBWpro/CoT-BERT and princeton-nlp/SimCSE): view 1 in evaluation mode, its template's
  ids around the sentence's own tokens, the objective's template bias subtracted when it denoises and
  config.eval.select_denoise (CoT-BERT: not), the objective's head when it is kept (`--mlp_only_train` off).
  """
  if config.eval.selection not in SELECTIONS:
    raise ConfigError(f"eval.selection {config.eval.selection!r} is not one of {SELECTIONS}")
  if config.eval.selection == "eval_method":
    return eval_method(config)
  (view, *_) = objective.view_list
  # A kept MLP is the run's pooler (eval_params).
  head = ("pooler" if objective.head == "mlp" else objective.head) if config.objective.keep_head else "none"
  return prompt.from_view(view, head, config.eval.select_denoise)


def eval_params(config: Any, params: dict[str, Any]) -> dict[str, Any]:
  """The encoder params that evaluation reads from a train state's params: a kept MLP is the pooler (the authors'
  checkpoint conversion, run.sh and SimCSE's simcse_to_huggingface.py, renames mlp -> pooler)."""
  if config.objective.keep_head and "mlp" in params:
    return {**params["encoder"], "pooler": params["mlp"]}
  return params["encoder"]


def selection_preprocess(config: Any) -> common.Preprocess:
  """The sentence rules the evaluators apply: the authors' trainer batcher joins SentEval's tokens and appends no "."
  (training_view); with the evaluation method, config.eval's rules."""
  if config.eval.selection == "training_view":
    return common.preprocess(join_tokens=config.eval.join_tokens, add_period=False)
  return common.preprocess_from_config(config)


def build_evaluators(config: Any) -> list[evaluators.Evaluator]:
  """config.evals, their data read; ConfigError when config.eval.select_metric names none of them."""
  built = evaluators.from_configs(config.evals, config.data, selection_preprocess(config))
  name, _, metric = config.eval.select_metric.partition("/")
  if not metric or name not in [e.name for e in built]:
    raise ConfigError(
      f"config.eval.select_metric={config.eval.select_metric!r}: must be <evaluator>/<metric>, "
      f"<evaluator> one of config.evals {[e.name for e in built]}"
    )
  return built


def train(config: Any, resume_changed: bool = False) -> dict[str, Any]:
  """Runs (or resumes) the configured training; returns a summary of the run. `resume_changed` continues a run
  made with other fields (train.py --resume_changed).

  Raises:
    Preempted: on SIGTERM or a first Ctrl-C, after saving the state (_CleanStop). The handlers are installed before
      anything is loaded, so a signal that arrives while the run loads data or compiles stops it after its first
      step.
    WorkdirError: before the model is loaded, when another process trains in the workdir or it holds a run of
      another command or on other data: a corpus or evaluation file whose size or digest changed
      (workdir.claim_workdir).
    DataError: the best step of a resumed run is unreadable or deleted and its params are gone
      (_Evaluation.keep_best).
  """
  started = time.perf_counter()
  hosts.join_job(**config.train.distributed)  # Once per process: a sweep calls train() again.
  xla.keep_step_memory()
  with _CleanStop() as stop:
    if jax.process_count() == 1:  # A job's hosts are refused together, by claim_workdir.
      refuse_if_busy(run_dir.RunDir(config.workdir))
    mesh = sharding.make_mesh(config.train.mesh_data, config.train.mesh_fsdp)
    # Before anything is loaded or written: a bad field, evaluator data or a corpus too small for one batch costs
    # seconds, not a run, and leaves the workdir as it was (reading the corpus writes nothing there).
    source, objective = preflight.check(config, mesh)
    with lines.recording_reads() as evaluated:  # The evaluators' files, whose identity the run records.
      evals = build_evaluators(config)
    columns = read_columns(config)
    preflight.check_corpus_size(config, len(next(iter(columns.values()))))
    data = functools.partial(data_identity, config, evaluated)
    with claim_workdir(config, resume_changed, _say, data) as claim:
      return _train(config, stop, mesh, columns, (source, objective), evals, started, claim)


def _train(
  config: Any,
  stop: _CleanStop,
  mesh: jax.sharding.Mesh,
  columns: dict[str, list[str]],
  checked: tuple[run_dir.ModelSource, objectives.Objective],
  evals: list[evaluators.Evaluator],
  started: float,
  claim: Claim,
) -> dict[str, Any]:
  """The run from preflight's `checked` model source and objective: setup, then the steps, evaluations and saves;
  `started`: train's perf_counter; `claim`: the workdir's, whose fingerprint is recorded once the run has started."""
  tokenizer = checked[0].tokenizer
  workdir = run_dir.RunDir(config.workdir)
  ckpt = checkpoints.RunCheckpoints(workdir.path, config.train.keep_checkpoints, _say)
  total_steps = config.train.num_steps or config.train.epochs * corpus.steps_per_epoch(
    len(next(iter(columns.values()))), config.train.batch_size
  )
  trainer, model_config, state, meta = _start(config, checked, mesh, ckpt, total_steps)
  claim.record_fingerprint()  # Not before: a restore that fails (a changed train state) leaves the run's as it was.
  plan = _batches(config, columns, trainer.objective, tokenizer, workdir, mesh)
  start_step = int(state.step)
  method = selection_method(config, trainer.objective)
  encoder = Encoder(model_config, None, tokenizer, method, mesh=mesh, **common.encoder_options(config))
  evaluation = _Evaluation(config, evals, encoder, ckpt, meta)
  evaluation.keep_best(state, total_steps)
  before = _score_before_while_compiling(
    evaluation, state, trainer, plan.shapes(start_step) if start_step < total_steps else None
  )
  recorder = StepRecorder(config, workdir, trainer.schedule, start_step, total_steps, started)
  if before:
    recorder.write(0, before)
  placed = batches.prefetch(map(plan.place, range(start_step, total_steps)), config.train.prefetch)
  steps = zip(range(start_step, total_steps), placed)

  def save(state):
    recorder.flush()  # The records up to a saved step outlive a kill after it.
    ckpt.save(state, meta)

  try:
    state = _run_steps(config, stop, trainer, state, steps, total_steps, evaluation, recorder, save)
    evaluation.keep_best(state, total_steps)
  except Preempted as preempted:
    ckpt.wait()  # The stopped step's state is written before the line says so.
    _say(str(preempted))
    raise
  finally:  # Pending async saves finish even when a step fails, so no half-written checkpoint is left.
    placed.close()
    recorder.close()
    ckpt.wait()
    ckpt.close()
  return _summary(meta, recorder, total_steps, start_step, workdir)


def _run_steps(
  config: Any,
  stop: _CleanStop,
  trainer: Trainer,
  state: train_state.TrainState,
  steps: Iterator[tuple[int, Any]],
  total_steps: int,
  evaluation: _Evaluation,
  recorder: StepRecorder,
  save: Callable[[train_state.TrainState], None],
) -> train_state.TrainState:
  """The steps of `steps` ((step, placed batch) pairs), up to trainer.steps_per_call a call, with their
  evaluations and saves; the last state. A call's metrics are read once the next call is queued (no host sync per
  call); a clean stop (preemption, Ctrl-C) saves the state at the end of the call and raises Preempted."""
  is_save_step = lambda done: done % config.train.save_every == 0 or done == total_steps
  ends_call = lambda done: is_save_step(done) or bool(evaluation.due(done, total_steps))
  pending = None  # The last call's (first step done, steps, metrics), not read yet.
  for call in _calls(steps, trainer.steps_per_call, ends_call):
    state, metrics = trainer.run(state, [batch for _, batch in call])
    if pending:
      recorder.record(*pending)
    done = call[-1][0] + 1
    pending = (call[0][0] + 1, len(call), metrics)
    due, saving = evaluation.due(done, total_steps), is_save_step(done)
    if due or saving:  # Nothing is evaluated or saved before its loss is known to be finite.
      recorder.record(*pending)
      pending = None
    if due:
      with recorder.pause():
        scores = evaluation.run(due, state, done)
      recorder.write(done, scores)
    if saving:
      save(state)
    if done < total_steps and stop.stop():
      if pending:  # Its loss must be known finite before it is saved.
        recorder.record(*pending)
      if not saving:
        save(state)
      raise Preempted(done, stop.signum)
  return state


def _calls(
  steps: Iterator[tuple[int, Any]], size: int, ends_call: Callable[[int], bool]
) -> Iterator[list[tuple[int, Any]]]:
  """The (step, batch) pairs of `steps` in consecutive runs, one call's each: at most `size` batches, all of one
  shape, a run ending after each step s with ends_call(s + 1)."""
  call = []
  for step, batch in steps:
    if call and _shapes(batch) != _shapes(call[0][1]):
      yield call
      call = []
    call.append((step, batch))
    if len(call) == size or ends_call(step + 1):
      yield call
      call = []
  if call:
    yield call


def _shapes(batch: Any) -> list[tuple[int, ...]]:
  return [leaf.shape for leaf in jax.tree.leaves(batch)]


def _batches(
  config: Any,
  columns: dict[str, list[str]],
  objective: objectives.Objective,
  tokenizer: Any,
  workdir: run_dir.RunDir,
  mesh: jax.sharding.Mesh,
) -> batches.Batches:
  """The run's batches: the views' rows tokenised (or read from the cache), each host its own share."""
  hosts = corpus.Hosts(jax.process_index(), jax.process_count(), multihost_utils.sync_global_devices)
  fields = batches.tokenize_fields(
    config, columns, objective, tokenizer, storage.path(config.data.cache_dir or workdir.cache_dir), hosts
  )
  return batches.Batches.build(config, fields, sharding.batch_sharding(mesh))


def _start(
  config: Any,
  checked: tuple[run_dir.ModelSource, objectives.Objective],
  mesh: jax.sharding.Mesh,
  ckpt: checkpoints.RunCheckpoints,
  total_steps: int,
) -> tuple[Trainer, Any, train_state.TrainState, dict[str, Any]]:
  """(the trainer, the model config, the state to train from, the selection record): the pretrained model's on a
  new run (its model files and evaluation method written to the run directory), the latest checkpoint's on a
  resumed one."""
  source, objective = checked
  workdir = ckpt.run
  resume_step = ckpt.latest_step()
  if resume_step is None:
    model_config, pretrained = load_start(config, source.model_dir)
  else:  # The checkpoint holds every weight: the pretrained ones are not read, only the shapes it saved.
    model_config = hf.read_config(workdir.model_dir)  # The run's: its MLM decoder as it started (preflight).
    pretrained = _saved_encoder_shapes(ckpt.saved_state_shapes(resume_step))
  trainer = build_trainer(config, model_config, pretrained, objective, mesh, total_steps)
  # A new run records its own model (a decoder untied by model.tie_word_embeddings included), over any that a run
  # stopped before its first save left.
  if jax.process_index() == 0 and (resume_step is None or not workdir.config_file.is_file()):
    hf.write_model_files(workdir.model_dir, model_config, source.tokenizer)
    run_dir.save_eval_method(workdir.path, eval_method(config).config_fields())
  meta = {"select_metric": config.eval.select_metric, "best_value": -math.inf, "best_step": None, "value_before": None}
  restored = None if resume_step is None else ckpt.restore(trainer.abstract_sharded())
  if restored is not None:
    state, meta = restored[0], _selection_record(restored[1])
    _say(f"resumed from {workdir.checkpoints_dir} at step {int(state.step)}")
  else:  # A new run, or a resumed one whose checkpoints all failed to read (each set aside): from the start.
    if resume_step is not None:
      pretrained = load_start(config, source.model_dir)[1]
    state = trainer.initial_state(pretrained)
  return trainer, model_config, state, meta


def _score_before_while_compiling(
  evaluation: _Evaluation, state: train_state.TrainState, trainer: Trainer, first_batch: dict[str, Any] | None
) -> dict[str, float]:
  """evaluation.score_before (its scores) while the first step's program compiles for `first_batch`'s shapes (None: no
  step left to run) in a thread: the first step then starts at once. An error in the evaluation waits for the compile
  before it ends the run: a process that exits while that thread is inside XLA's compiler aborts (SIGABRT, the thread
  unwinding through C++ frames as it takes the GIL back during the interpreter's exit) instead of saying the error in
  one line. A Ctrl-C that stops at once does not wait (jaxemb.cli ends the process with os._exit)."""
  compiling = trainer.compile_ahead(first_batch) if first_batch else None
  try:
    before = evaluation.score_before(state)
  except Exception:
    if compiling:
      compiling.join()
    raise
  if compiling:
    compiling.join()
  return before


def _selection_record(meta: dict[str, Any]) -> dict[str, Any]:
  """A checkpoint's selection record; one saved before evaluators (STS-B dev its one metric) in today's names."""
  if "best_stsb_dev" not in meta:
    return meta
  return {
    "select_metric": "stsb_dev/STSBenchmark",
    "best_value": meta["best_stsb_dev"],
    "best_step": meta["best_step"],
    "value_before": meta["stsb_dev_before"],
  }


def _summary(
  meta: dict[str, Any], recorder: StepRecorder, total_steps: int, start_step: int, workdir: run_dir.RunDir
) -> dict[str, Any]:
  """The run's summary (train's value), said in one line and written to <workdir>/summary.json."""
  steps_run = total_steps - start_step
  seconds = time.perf_counter() - recorder.start_time
  summary = {
    **meta,
    "steps": total_steps,
    "steps_run": steps_run,
    "steps_per_second": steps_run / seconds if steps_run else None,
    "first_step_seconds": recorder.first_step_seconds,
    "workdir": str(workdir.path),
  }
  if jax.process_index() == 0:
    atomic.write_json(workdir.summary_file, summary)
  first = f", the first {recorder.first_step_seconds:.1f} s after the start" if steps_run else ""
  _say(
    f"done: best {meta['select_metric']} {meta['best_value']:.2f} at step {meta['best_step']} (before: "
    f"{meta['value_before']:.2f}); {steps_run} steps at {summary['steps_per_second'] or 0:.2f} steps/s{first}"
  )
  return summary


class _Evaluation:
  """The run's evaluators scoring its params with the selection method, and the choice of the step kept in best/:
  the highest config.eval.select_metric so far. `meta` (saved with each checkpoint) records that choice."""

  def __init__(
    self,
    config: Any,
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
    _say(f"{self.metric} before training: {self.meta['value_before']:.2f}")
    return scores

  def scores(self, due: list[evaluators.Evaluator], state: train_state.TrainState) -> dict[str, float]:
    """{<evaluator>/<metric>: value} of the `due` evaluators on the state's params."""
    params = state.all_params
    encoder = self.encoder.with_params(eval_params(self.config, params), params.get("prompt"))
    scores = {}
    for evaluator in due:
      result = evaluator.run(encoder)
      if evaluator is self.selecting and self.metric.partition("/")[2] not in result:
        raise ConfigError(
          f"config.eval.select_metric={self.metric!r}: evaluator {evaluator.name!r} gives {sorted(result)}"
        )
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
    _say(f"best step {best} is missing from {best_dir}: saving it again from the train state of that step")
    self._save_best(state)

  def _save_best(self, state: train_state.TrainState):
    """Saves the params of `state`, the best step, in best/ (what evaluation reads: a kept MLP as the pooler)."""
    params, step = state.all_params, self.meta["best_step"]
    self.ckpt.save_best(
      step,
      {**params, "encoder": eval_params(self.config, params)},
      {"step": step, self.metric: self.meta["best_value"]},
    )


def _say(message: str):
  """A line for the person running the job (process 0 only)."""
  if jax.process_index() == 0:
    tqdm.tqdm.write(message)
