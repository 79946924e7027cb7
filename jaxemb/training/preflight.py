"""What a training run's spec decides against its devices, its files and its model, checked before train.py loads
weights, reads the corpus, compiles or writes to its workdir: a bad value stops the run in seconds, as one line
naming the field and what to do, instead of after the weights, the corpus and the first STS-B dev evaluation (or
never, leaving a run that evaluation refuses). Each field's own type and bounds were checked when the spec was built
(jaxemb/spec.py). Once the corpus is read, `check_corpus_size` refuses a batch larger than it before anything is
tokenised."""

from __future__ import annotations

from jax.sharding import Mesh

from jaxemb import sharding, storage
from jaxemb.data import corpus
from jaxemb.encode import open_model
from jaxemb.evaluation import common
from jaxemb.errors import ConfigError, DataError
from jaxemb.models import hf, run_dir
from jaxemb.spec import TrainingRun
from jaxemb.training import objectives, trainer


def check(config: TrainingRun, mesh: Mesh) -> tuple[run_dir.ModelSource, objectives.Objective]:
  """(the model config.model.path names, opened: its config and tokenizer; the objective of config.objective), for
  the loop to train with; raises
  ConfigError (or DataError for a missing file) for the first field of `config` that cannot work on `mesh`. Reads
  config.json and the tokenizer (the evaluators' data is read next, by selection.build_evaluators); loads no weights and
  writes nothing."""
  _check_batch_size(config, mesh)
  _check_columns(config)
  _check_files(config)
  source = _check_method(config)
  hf.retied_config(source.model_dir, source.config, config.model.tie_word_embeddings)
  _check_kept_decoder(config)
  _check_kept_layout(config)
  try:
    objective = trainer.build_objective(config, source.tokenizer)  # Each view's template, pooling, denoising, loss.
  except ValueError as e:
    raise ConfigError(f"config.objective: {e}") from None
  _check_loss_groups(config, objective)
  _check_mlm_head(source, objective)
  return source, objective


def _check_loss_groups(config: TrainingRun, objective: objectives.Objective):
  """The global batch splits into whole loss groups (CoT-BERT's config keeps its authors' 128 rows a GPU: a smaller
  batch failed at the step's trace, after the corpus and the first evaluation), and InfoNCE's negatives are the other
  rows of its group: with one row its loss is 0 and nothing trains (the hard-negative losses still have each row's
  own negative)."""
  batch, group = config.train.batch_size, objective.loss_group_size
  if group and batch % group:
    raise ConfigError(
      f"config.train.batch_size={batch}: does not split into loss groups of config.objective.loss_group_size="
      f"{group}; use a multiple of {group}, or a loss_group_size that divides the batch (0: the whole batch)"
    )
  field = "objective.loss_group_size" if group else "train.batch_size"
  value = group or batch
  least = objectives.LOSSES[objective.loss].least_group_rows
  if value < least:
    raise ConfigError(
      f"config.{field}={value}: loss {objective.loss!r} takes its negatives from the "
      f"other sentences of a batch, so with one its loss is 0 and nothing trains; use at least {least}"
    )


def check_corpus_size(config: TrainingRun, num_examples: int):
  """Raises ConfigError when the corpus read has no full global batch, so no step could run."""
  if num_examples < config.train.batch_size:
    raise ConfigError(
      f"config.train.batch_size={config.train.batch_size}: larger than the {num_examples} examples "
      f"of {config.data.train_file} (no full step); use a batch of at most {num_examples} or a "
      "larger corpus"
    )


def _check_batch_size(config: TrainingRun, mesh: Mesh):
  if config.train.batch_size < 1:
    raise ConfigError(
      f"config.train.batch_size={config.train.batch_size}: must be a positive "
      + ("int" if mesh.size == 1 else f"multiple of the {mesh.size} devices")
    )
  sharding.check_batch_size(config.train.batch_size, mesh, "config.train.batch_size")


def _check_columns(config: TrainingRun):
  if config.data.format not in corpus.FORMATS:
    raise ConfigError(f"config.data.format={config.data.format!r}: must be one of {sorted(corpus.FORMATS)}")
  unknown = [c for c in config.objective.columns if c not in corpus.FORMATS[config.data.format]]
  if unknown:
    raise ConfigError(
      f"config.objective.columns names {unknown[0]!r}; a {config.data.format!r} corpus "
      f"({config.data.train_file}) has {list(corpus.FORMATS[config.data.format])}"
    )


def _check_files(config: TrainingRun):
  """The corpus (selection.build_evaluators reads the evaluators' data next, each evaluator's own)."""
  if not storage.path(config.data.train_file).is_file():
    raise DataError(
      f"config.data.train_file={config.data.train_file}: no such file; fetch it with prepare.py or "
      "point the field at the corpus"
    )


def _check_kept_decoder(config: TrainingRun):
  """A run resumes with the MLM decoder it started with (its model/config.json): a rerun (with --resume_changed)
  whose model.tie_word_embeddings says otherwise is refused."""
  tie = config.model.tie_word_embeddings
  run = run_dir.RunDir(config.workdir)
  if tie is None or not run.config_file.is_file() or not run.has_step():
    return
  started = run_dir.read_run_model(run).config.tie_word_embeddings
  if tie != started:
    raise ConfigError(
      f"config.model.tie_word_embeddings={tie}: the run in {run.path} started with {started} "
      f"({run.config_file}) and keeps its MLM decoder; set the field to {started}, or start a new run "
      "in another workdir"
    )


def _check_kept_layout(config: TrainingRun):
  """A run resumes in the layer layout its checkpoints hold: a rerun (with --resume_changed) whose model.scan_layers
  says otherwise is refused, before the change is recorded. Its params and optimizer moments would convert exactly
  (bert.stack_layers), but the steps after the switch would draw other dropout masks (the scan splits each layer's
  rng where the unrolled layers fold in their names: bert.Transformer), so the run would equal no uninterrupted one."""
  run = run_dir.RunDir(config.workdir)
  stacked = run_dir.saved_layers_stacked(run)
  if stacked is not None and stacked != config.model.scan_layers:
    layout = "stacked" if stacked else "per layer"
    raise ConfigError(
      f"config.model.scan_layers={config.model.scan_layers}: the run in {run.path} started with "
      f"{stacked} (its checkpoints hold the layers {layout}) and resumes so; set the field to "
      f"{stacked}, or start a new run in another workdir"
    )


def _check_method(config: TrainingRun) -> run_dir.ModelSource:
  """config.method against the model's config and tokenizer, as evaluation and export check it (open_model), so a
  run never records an evaluation method they refuse; returns the opened model, a Hugging Face checkpoint."""
  with common.opening_model(config.model):
    try:
      source, _ = open_model(config.model.path, config.method)
    except hf.CheckpointError:
      raise  # The model's: opening_model names config.model.path.
    except ValueError as e:
      raise ConfigError(f"config.method: {e}; set config.method to a method evaluate.py can run") from None
  if source.run is not None:  # Its model/ holds config.json and the tokenizer but no weights to start from.
    raise ConfigError(
      f"config.model.path={config.model.path}: a jaxemb run directory; training starts from a "
      "Hugging Face checkpoint (write the run's best step as one with `python -m jaxemb.export` and "
      "train from that)"
    )
  return source


def _check_mlm_head(source: run_dir.ModelSource, objective: objectives.Objective):
  """The checkpoint holds the MLM head the objective reads (OptiPrompt's and supervised PromptBERT's transform, the
  MLM loss: on a checkpoint without one, e.g. a sentence-transformers model, they failed once the workdir was made
  and the corpus read), judged from the weights' names; an architecture initialises one. (The evaluation method's
  head may be the run's own kept head, which the checkpoint need not have.)"""
  if objective.loss == "mlm":
    reader = "config.objective.loss='mlm'"
  elif objective.head == "mlm_transform":
    reader = "config.objective.head='mlm_transform'"
  else:
    return
  groups = None if hf.is_architecture(source.model_dir) else hf.weight_groups(source.model_dir, source.config)
  if groups is not None and "mlm_head" not in groups:
    raise ConfigError(
      f"{reader} needs the checkpoint's MLM head; {source.model_dir} has none (a *ForMaskedLM checkpoint has "
      "one, a *Model or sentence-transformers checkpoint has not)"
    )
