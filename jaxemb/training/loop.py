"""The training loop of train.py: data, sharded state, the jitted step, STS-B dev evaluation, checkpoints."""

from __future__ import annotations

import json
import math
import pathlib
import queue
import signal
import threading
import time
from typing import Any, Generator, Iterator, TypeVar

import jax
from jax.experimental import multihost_utils
import numpy as np
import tqdm

from jaxemb import sharding, templates
from jaxemb.data import corpus
from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder, Method
from jaxemb.errors import ConfigError, Diverged
from jaxemb.evaluation import run, sts
from jaxemb.models import compute_dtype, hf, load_pretrained, run_dir
from jaxemb.training import checkpoints, objectives, preflight
from jaxemb.training import state as train_state
from jaxemb.training.trainer import batch_field, build_trainer
from jaxemb.training.workdir import claim_workdir, refuse_if_busy

T = TypeVar("T")


def read_columns(config: Any) -> dict[str, list[str]]:
  """The training text by column: {"text"} for a sentence file, {"sent0", "sent1", "hard_neg"} for NLI."""
  if config.data.format == "text":
    return {"text": corpus.read_sentences(config.data.train_file, cache_dir=config.data.cache_dir or None)}
  if config.data.format == "nli":
    return corpus.read_nli_triples(config.data.train_file, cache_dir=config.data.cache_dir or None)
  raise ConfigError(f"data.format {config.data.format!r} is not 'text' or 'nli'")


def maybe_initialize_distributed(config: Any):
  """Multi-host: join the job when a coordinator is configured (each host runs the same command)."""
  d = config.train.distributed
  if d.coordinator_address:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts need it; accelerators ignore it.
    jax.distributed.initialize(coordinator_address=d.coordinator_address, num_processes=d.num_processes,
                               process_id=d.process_id)


def _saved_encoder_shapes(saved: dict[str, Any]) -> dict[str, Any]:
  """The pretrained encoder's shapes in a saved train state: its trained and frozen parts in one tree."""
  return train_state.merge_params(saved["frozen"].get("encoder", {}), saved["params"].get("encoder", {}))


class Preempted(Exception):
  """The run stopped on SIGTERM after saving its state; rerunning the same command resumes it."""

  exit_code = 128 + signal.SIGTERM  # The status a command exits with: that of a job the signal ended.

  def __init__(self, step: int):
    super().__init__(f"preempted at step {step}; checkpoint saved; rerun the same command to resume")
    self.step = step


class _Sigterm:
  """Notes a SIGTERM (a preempted TPU VM, a cluster scheduler) so the loop stops cleanly after a step.

  One process installs its own handler. A multi-host job leaves SIGTERM to JAX's preemption service, which
  jax.distributed.initialize starts: it tells every host of a notice to any one of them and names a step that all
  of them reach, so they save the same step together.
  """

  def __init__(self):
    self.received = False
    self._previous = None
    self._installed = False

  def __enter__(self):
    # signal.signal works in the main thread only.
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._note)
      self._installed = True
    return self

  def __exit__(self, *exc_info):
    if self._installed:
      signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)

  def _note(self, signum, frame):  # pylint: disable=unused-argument
    self.received = True

  def stop(self, done: int) -> bool:
    """Whether this process stops after step `done` (each process of a job calls it at every step)."""
    if jax.process_count() == 1:
      return self.received
    return multihost_utils.reached_preemption_sync_point(done)


SELECTIONS = ("training_view", "eval_method")


def eval_method(config: Any) -> Method:
  """The run's evaluation method (config.method), recorded in its run directory."""
  return Method.from_config(config.method)


def selection_method(config: Any, objective: objectives.Objective) -> Method:
  """How the STS-B dev score that picks the kept step embeds a sentence.

  "training_view" is the authors' trainer (kongds/Prompt-BERT `prompt_bert/trainers.py` `evaluate` + `models.py`
  `sentemb_forward`; the same in ZBWpro/CoT-BERT and princeton-nlp/SimCSE): view 1 in evaluation mode, its template's
  ids around the sentence's own tokens, the position-offset bias subtracted when the objective denoises so and
  config.eval.select_denoise (CoT-BERT: not), the objective's head when it is kept (`--mlp_only_train` off).
  """
  if config.eval.selection not in SELECTIONS:
    raise ConfigError(f"eval.selection {config.eval.selection!r} is not one of {SELECTIONS}")
  if config.eval.selection == "eval_method":
    return eval_method(config)
  (view, *_) = objective.view_list
  keep = config.objective.keep_head
  if view.pooling == "cls":
    return Method("cls" if keep and objective.head == "mlp" else "cls_before_pooler")
  if config.eval.select_denoise and view.denoise not in ("none", "position_offset"):
    raise ConfigError(f"eval.select_denoise: selection subtracts position-offset biases only; this objective "
                     f"denoises with {view.denoise!r} (set --config.eval.select_denoise=False)")
  # A kept MLP is the run's pooler (eval_params).
  head = ("pooler" if objective.head == "mlp" else objective.head) if keep else "none"
  return Method("prompt", template=view.template.text, head=head, tokenization="alone",
                denoise=config.eval.select_denoise and view.denoise == "position_offset",
                bias_positions=view.bias_positions, prompt_placement=view.prompt_placement)


def eval_params(config: Any, params: dict[str, Any]) -> dict[str, Any]:
  """The encoder params that evaluation reads from a train state's params: a kept MLP is the pooler (the authors'
  checkpoint conversion, run.sh and SimCSE's simcse_to_huggingface.py, renames mlp -> pooler)."""
  if config.objective.keep_head and "mlp" in params:
    return {**params["encoder"], "pooler": params["mlp"]}
  return params["encoder"]


def train(config: Any, resume_changed: bool = False) -> dict[str, Any]:
  """Runs (or resumes) the configured training; returns a summary of the run. `resume_changed` continues a run
  made with other fields (train.py --resume_changed).

  Raises:
    Preempted: on SIGTERM, after saving the state. The handler is installed before anything is loaded, so a
      SIGTERM that arrives while the run loads data or compiles stops it after its first step.
    WorkdirError: before anything is loaded, when another process trains in the workdir or it holds a run of
      another command (workdir.claim_workdir).
  """
  maybe_initialize_distributed(config)
  with _Sigterm() as sigterm:
    if jax.process_count() == 1:  # A job's hosts are refused together, by claim_workdir.
      refuse_if_busy(run_dir.RunDir(config.workdir))
    mesh = sharding.make_mesh(config.train.mesh_data, config.train.mesh_fsdp)
    # Before anything is loaded or written: a bad field or a corpus too small for one batch costs seconds, not a
    # run, and leaves the workdir as it was (reading the corpus writes nothing there).
    source = preflight.check(config, mesh)
    columns = read_columns(config)
    preflight.check_corpus_size(config, len(next(iter(columns.values()))))
    with claim_workdir(config, resume_changed, _say):
      return _train(config, sigterm, mesh, columns, source)


def _train(config: Any, sigterm: _Sigterm, mesh: jax.sharding.Mesh, columns: dict[str, list[str]],
           source: run_dir.ModelSource) -> dict[str, Any]:
  workdir = run_dir.RunDir(config.workdir)
  dev = sts_data.load_sts_task(config.eval.senteval_dir, "STSBenchmark", "dev")  # Fail on bad paths early.
  ckpt = checkpoints.RunCheckpoints(workdir.path, config.train.keep_checkpoints, _say)
  resume_step = ckpt.latest_step()
  if resume_step is None:
    model_config, pretrained = load_pretrained(source.model_dir)
  else:  # The checkpoint holds every weight: the pretrained ones are not read, only the shapes it saved.
    model_config = hf.read_config(workdir.model_dir)
    pretrained = _saved_encoder_shapes(ckpt.saved_state_shapes(resume_step))
  tokenizer = source.tokenizer
  num_examples = len(next(iter(columns.values())))
  total_steps = config.train.num_steps or config.train.epochs * corpus.steps_per_epoch(
      num_examples, config.train.batch_size)
  trainer = build_trainer(config, model_config, pretrained, tokenizer, mesh, total_steps)
  objective = trainer.objective
  cache_dir = pathlib.Path(config.data.cache_dir or workdir.cache_dir)
  hosts = corpus.Hosts(jax.process_index(), jax.process_count(), multihost_utils.sync_global_devices)
  fields = {}
  for column, template in zip(config.objective.columns, objective.view_templates):
    fields.setdefault(batch_field(column, template.text), corpus.tokenize_cached(
        columns[column], template, tokenizer, config.data.max_sentence_tokens, cache_dir, config.data.tokenization,
        hosts))
  if resume_step is None:
    state = trainer.initial_state(pretrained)
  del pretrained

  if jax.process_index() == 0 and not workdir.config_file.is_file():
    hf.write_model_files(workdir.model_dir, model_config, tokenizer)
    run_dir.save_eval_method(workdir.path, eval_method(config).config_fields())
  meta = {"best_stsb_dev": -math.inf, "best_step": None, "stsb_dev_before": None}
  if resume_step is not None:
    restored = ckpt.restore(trainer.abstract_sharded())
    if restored is None:  # Each checkpoint failed to read and was set aside: the run starts again.
      state = trainer.initial_state(load_pretrained(source.model_dir)[1])
    else:
      state, meta = restored
      _say(f"resumed from {workdir.checkpoints_dir} at step {int(state.step)}")

  selection = selection_method(config, objective)
  evaluator = Encoder(model_config, None, tokenizer, selection, dtype=compute_dtype(config.model.dtype),
                      length_multiple=config.eval.length_multiple, mesh=mesh)
  # The trainer's batcher joins SentEval's tokens and appends no "."; the evaluation method's rules are the config's.
  preprocess = (run.preprocess(join_tokens=config.eval.join_tokens, add_period=False)
                if config.eval.selection == "training_view" else run.preprocess_from_config(config))

  def stsb_dev(state) -> float:
    params = state.all_params
    encoder = evaluator.with_params(eval_params(config, params), params.get("prompt"))
    embed = lambda sentences: encoder.encode(sentences, batch_size=config.eval.batch_size)
    return sts.evaluate_sts(embed, [dev], preprocess)["STSBenchmark"].all

  if meta["stsb_dev_before"] is None:
    meta["stsb_dev_before"] = stsb_dev(state)
    _say(f"STS-B dev before training: {meta['stsb_dev_before']:.2f}")

  batch_sharding = sharding.batch_sharding(mesh)
  start_step = int(state.step)
  writer = _MetricsWriter(workdir, start_step) if jax.process_index() == 0 else None
  start_time = time.perf_counter()
  progress = tqdm.tqdm(total=total_steps, initial=start_step, disable=jax.process_index() != 0, dynamic_ncols=True)

  # Training throughput between two metrics records, the STS-B dev evaluations in between left out.
  clock = {"step": start_step, "time": time.perf_counter(), "evaluating": 0.0}

  def record(done: int, metrics: dict[str, jax.Array]):
    """Reads one step's metrics (a host sync), stops on a non-finite loss, and reports them."""
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    if not np.isfinite(metrics["loss"]):
      raise Diverged(f"loss is {metrics['loss']} at step {done}; stopped without saving; the last good checkpoint "
                     f"in {workdir.checkpoints_dir} is kept")
    progress.update(1)
    progress.set_postfix(loss=f"{metrics['loss']:.4f}")
    if writer and (done % config.train.log_every == 0 or done == total_steps):
      now = time.perf_counter()
      seconds = now - clock["time"] - clock["evaluating"]
      rate = (done - clock["step"]) * config.train.batch_size / seconds
      clock.update(step=done, time=now, evaluating=0.0)
      writer.write(done, {**metrics, "learning_rate": float(trainer.schedule(done - 1)), "examples_per_second": rate})

  row_lengths = {name: rows.attention_mask.sum(1) for name, rows in fields.items()}

  def place(step: int) -> dict[str, templates.TemplateBatch]:
    """The global batch of `step` on the mesh: this host's rows of each view, cut to the width of the view's
    longest row in the global batch (the same width on every host)."""
    everyone = corpus.batch_indices(num_examples, config.train.batch_size, config.train.seed, step)
    index = corpus.batch_indices(num_examples, config.train.batch_size, config.train.seed, step,
                                 jax.process_index(), jax.process_count())
    widths = {name: corpus.batch_width(row_lengths[name][everyone], config.data.length_multiple,
                                       rows.input_ids.shape[1]) for name, rows in fields.items()}
    return {name: jax.tree.map(lambda x: jax.make_array_from_process_local_data(batch_sharding, x),
                               corpus.gather(rows, index, widths[name])) for name, rows in fields.items()}

  pending = None  # The last step's (step, metrics), read once the next step is queued: no host sync per step.
  batches = prefetch(map(place, range(start_step, total_steps)), config.train.prefetch)
  try:
    for step, batch in zip(range(start_step, total_steps), batches):
      state, metrics = trainer.step(state, batch)
      if pending:
        record(*pending)
      done = step + 1
      pending = (done, metrics)
      evaluate = done % config.train.eval_every == 0 or done == total_steps
      save = done % config.train.save_every == 0 or done == total_steps
      if evaluate or save:  # Nothing is evaluated or saved before its loss is known to be finite.
        record(*pending)
        pending = None
      if evaluate:
        start = time.perf_counter()
        score = stsb_dev(state)
        clock["evaluating"] += time.perf_counter() - start
        if writer:
          writer.write(done, {"stsb_dev": score})
        if score > meta["best_stsb_dev"]:
          meta.update(best_stsb_dev=score, best_step=done)
          params = state.all_params
          ckpt.save_best(done, {**params, "encoder": eval_params(config, params)},
                         {"step": done, "stsb_dev": score})
      if save:
        ckpt.save(state, meta)
      if done < total_steps and sigterm.stop(done):  # Preempted: save this step's state, then stop.
        if pending:  # Its loss must be known finite before it is saved.
          record(*pending)
        if not save:
          ckpt.save(state, meta)
        ckpt.wait()
        preempted = Preempted(done)
        _say(str(preempted))
        raise preempted
  finally:  # Pending async saves finish even when a step fails, so no half-written checkpoint is left.
    batches.close()
    progress.close()
    ckpt.wait()
    ckpt.close()
    if writer:
      writer.close()
  seconds = time.perf_counter() - start_time
  steps_run = total_steps - start_step
  summary = {**meta, "steps": total_steps, "steps_run": steps_run,
             "steps_per_second": steps_run / seconds if steps_run else None, "workdir": str(workdir.path)}
  _say(f"done: best STS-B dev {meta['best_stsb_dev']:.2f} at step {meta['best_step']} (before: "
       f"{meta['stsb_dev_before']:.2f}); {steps_run} steps at {summary['steps_per_second'] or 0:.2f} steps/s")
  return summary


def prefetch(items: Iterator[T], depth: int) -> Generator[T, None, None]:
  """`items` in order, produced by a background thread that stays up to `depth` items ahead (0: produced in the
  caller's thread when asked for). The training loop's items are placed batches: the next ones are gathered, cut
  and sent to the devices while the current step runs. An exception in `items` is raised here, at its place in
  the order; closing the generator stops the thread.
  """
  if depth == 0:
    yield from items
    return
  ready: queue.Queue = queue.Queue(maxsize=depth)
  stop = threading.Event()
  end = object()

  def put(item) -> bool:
    while not stop.is_set():
      try:
        ready.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def produce():
    try:
      for item in items:
        if not put((item, None)):
          return
      put((end, None))
    except Exception as e:  # pylint: disable=broad-except  # Re-raised in the consumer.
      put((end, e))

  thread = threading.Thread(target=produce, name="jaxemb-prefetch", daemon=True)
  thread.start()
  try:
    while True:
      item, error = ready.get()
      if error is not None:
        raise error
      if item is end:
        return
      yield item
  finally:
    stop.set()
    thread.join()


def _say(message: str):
  """A line for the person running the job (process 0 only)."""
  if jax.process_index() == 0:
    tqdm.tqdm.write(message)


class _MetricsWriter:
  """Scalars to <workdir>/metrics.jsonl and TensorBoard event files in <workdir>/tensorboard.

  A run that starts at `start_step` (resumed from its checkpoint of that step, or 0) writes each later step again:
  the records an earlier process wrote past that step (before it was killed) are dropped first, so each step's
  scalars are there once.
  """

  def __init__(self, workdir: run_dir.RunDir, start_step: int):
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    workdir.path.mkdir(parents=True, exist_ok=True)
    _drop_records_after(workdir.metrics_file, start_step)
    self._file = open(workdir.metrics_file, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    # TensorBoard discards the events at purge_step and later from the files already there.
    self._tensorboard = SummaryWriter(str(workdir.tensorboard_dir), purge_step=start_step + 1)

  def write(self, step: int, scalars: dict[str, float]):
    self._file.write(json.dumps({"step": step, **scalars}) + "\n")
    self._file.flush()
    for name, value in scalars.items():
      self._tensorboard.add_scalar(name, value, step)

  def close(self):
    self._file.close()
    self._tensorboard.close()


def _drop_records_after(path: pathlib.Path, step: int):
  """Rewrites the metrics file `path` without its records past `step`, and without a last line cut short by a
  kill; whole or not at all (a temporary file renamed into place)."""
  if not path.is_file():
    return
  kept = []
  for line in path.read_text(encoding="utf-8").splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if record["step"] <= step:
      kept.append(line + "\n")
  partial = path.with_name(path.name + ".partial")
  partial.write_text("".join(kept), encoding="utf-8")
  partial.replace(path)
