"""What a train step is made of, built once from a training config: the objective, the encoder, the optimizer, the
state's shapes and shardings on a mesh, and the jitted step. train.py's loop, the benchmarks and the tests all build
it here."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import pathlib
import threading
from typing import Any

import jax
import optax

from jaxemb import sharding, templates, xla
from jaxemb.models import EncoderConfig, Transformer, bert, compute_dtype, hf
from jaxemb.spec import TrainingRun
from jaxemb.training import mlm, objectives
from jaxemb.training import state as train_state

# The fresh heads' key: seed + this, apart from the dropout stream's (seed), so the two draws are independent.
HEAD_INIT_SEED_OFFSET = 1
# An architecture's params, initialised from scratch (hf.load_pretrained): seed + this, apart from both.
SCRATCH_INIT_SEED_OFFSET = 2


def load_start(config: TrainingRun, model_dir: pathlib.Path) -> tuple[EncoderConfig, dict[str, Any]]:
  """(config, per-layer params) of the encoder a new run starts from: the checkpoint in `model_dir` with its MLM
  decoder tied as config.model.tie_word_embeddings asks (None: as the checkpoint has it), or an architecture
  initialised from scratch with config.train.seed's key."""
  return hf.load_pretrained(
    model_dir, seed=config.train.seed + SCRATCH_INIT_SEED_OFFSET, tie_word_embeddings=config.model.tie_word_embeddings
  )


def build_objective(config: TrainingRun, tokenizer: Any) -> objectives.Objective:
  """config.objective as an Objective: its fields of the same name as they are; the columns and templates as the
  views' batch fields and parsed templates, whole_word_mask as the vocabulary's word starts."""
  o = config.objective
  shared = {field.name for field in dataclasses.fields(objectives.Objective)}
  same = {field.name: getattr(o, field.name) for field in dataclasses.fields(o) if field.name in shared}
  return objectives.Objective(
    views=tuple(batch_field(c, t) for c, t in zip(o.columns, o.templates)),
    view_templates=tuple(templates.Template.parse(t, tokenizer) for t in o.templates),
    word_starts=mlm.WordStarts.from_tokenizer(tokenizer) if o.whole_word_mask else None,
    stack_encoder_calls=config.model.stack_encoder_calls,
    loop_small_calls=config.model.loop_small_calls,
    **same,
  )


def batch_field(column: str, template: str) -> str:
  """The batch field of a view: views with the same column and template share one (SimCSE's two dropouts)."""
  return f"{column}|{template}"


@dataclasses.dataclass(frozen=True)
class Trainer:
  """The parts of a training run that do not change while it runs.

  Attributes:
    objective: the loss's views, denoise, head and loss (`build_objective`).
    model: the encoder at the configured dtype.
    tx: the optimizer, its learning rate following `schedule`.
    schedule: the learning rate at each step.
    mesh: the devices the state and the batch are split over.
    seed: config.train.seed: the dropout stream (seed) and the heads' initialisation (seed + HEAD_INIT_SEED_OFFSET);
      an architecture's, from scratch, is `load_start`'s (seed + SCRATCH_INIT_SEED_OFFSET).
    abstract: the train state's shapes and dtypes at step 0.
    shardings: where each leaf of the state lives (sharding.tree_shardings); a resumed run restores into them.
    rows: token rows in each device's encoder call at most (its share of the batch x the widest row): what
      jaxemb.xla.jit compiles the step for.
    steps_per_call: the most optimizer steps one call of `steps` runs (config.train.steps_per_call, or
      jaxemb.xla.steps_per_call's).
  """

  objective: objectives.Objective
  model: Transformer
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  mesh: jax.sharding.Mesh
  seed: int
  abstract: Any
  shardings: Any
  rows: int
  steps_per_call: int

  def initial_params(self, pretrained: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trained, frozen) param trees: the encoder plus the objective's fresh heads, or for OptiPrompt the
    continuous template (initialised from the manual template) and its projection with the encoder frozen."""
    return _initial_params(self.objective, self.model, pretrained, self.seed)

  def initial_state(self, pretrained: dict[str, Any]) -> train_state.TrainState:
    """The train state at step 0, placed by the sharding rules."""
    init = lambda p, f: train_state.init_state(p, f, self.tx, self.seed)
    return jax.jit(init, out_shardings=self.shardings)(*self.initial_params(pretrained))

  def abstract_sharded(self) -> Any:
    """The state's shapes, dtypes and shardings: what a checkpoint restores into."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), self.abstract, self.shardings)

  def compile_ahead(self, batch: Any) -> threading.Thread:
    """Starts compiling the steps for batches of `batch`'s shapes (`batches.step_shapes`) in a thread of its own and
    returns the thread: the run's first call, made once it has ended, finds the program compiled (jit keeps it)
    instead of waiting for it while the run did other work (tokenising the corpus, the evaluation before
    training). A failure here is left to that call's own compile to raise."""

    def compile_steps():
      with contextlib.suppress(Exception):
        self.steps.lower(self.abstract_sharded(), (batch,) * self.steps_per_call, 0).compile()

    thread = threading.Thread(target=compile_steps, name="compile-steps", daemon=True)
    thread.start()
    return thread

  @functools.cached_property
  def steps(self):
    """The jitted, sharded steps: (state, `steps_per_call` batches of one shape, count) -> (state, metrics), the
    first `count` batches trained on in order, each metric a [steps_per_call] array; the state is donated.
    `run` calls it."""
    return train_state.jit_train_steps(
      self.objective, self.model, self.tx, self.mesh, self.shardings, self.rows, self.steps_per_call
    )

  def run(self, state: train_state.TrainState, batches: list[Any]) -> tuple[train_state.TrainState, dict[str, Any]]:
    """Trains on `batches` (at most `steps_per_call`, of one shape) in one call, without waiting for it; each
    metric a [steps_per_call] array whose first len(batches) entries are the steps'."""
    padded = (*batches, *batches[-1:] * (self.steps_per_call - len(batches)))  # Not trained on: the loop ends first.
    return self.steps(state, padded, len(batches))

  def step(self, state: train_state.TrainState, batch: Any) -> tuple[train_state.TrainState, dict[str, Any]]:
    """One optimizer step on `batch` through the same program as `run`; its metrics read back (numpy)."""
    state, metrics = self.run(state, [batch])
    return state, {name: values[0] for name, values in jax.device_get(metrics).items()}


def build_trainer(
  config: TrainingRun,
  model_config: EncoderConfig,
  pretrained: dict[str, Any],
  objective: objectives.Objective,
  mesh: jax.sharding.Mesh,
  total_steps: int,
) -> Trainer:
  """The Trainer of `config` and its `objective` (`build_objective`'s); `pretrained` may be shapes only
  (jax.ShapeDtypeStruct), as when a run resumes, and per layer or stacked (the model's layout is
  config.model.scan_layers')."""
  dtype = compute_dtype(config.model.dtype)
  model = Transformer(
    model_config,
    dtype=dtype,
    scan_layers=config.model.scan_layers,
    scan_unroll=config.model.scan_unroll
    or xla.scan_unroll(model_config.num_hidden_layers, remat=config.model.remat_policy != "none"),
    remat_policy=config.model.remat_policy,
  )
  tx = train_state.make_optimizer(config.train, total_steps)
  seed = config.train.seed
  init = lambda p: train_state.init_state(*_initial_params(objective, model, p, seed), tx, seed)
  abstract = jax.eval_shape(init, pretrained)
  widest = max((t.num_tokens for t in objective.view_templates), default=0) + config.data.max_sentence_tokens
  rows = math.ceil(config.train.batch_size / mesh.size) * widest
  return Trainer(
    objective,
    model,
    tx,
    train_state.learning_rate_schedule(config.train, total_steps),
    mesh,
    seed,
    abstract,
    sharding.tree_shardings(mesh, abstract),
    rows,
    config.train.steps_per_call or xla.steps_per_call(),
  )


def _initial_params(objective: objectives.Objective, model: Transformer, pretrained: dict[str, Any], seed: int):
  # Hugging Face checkpoints are read per layer; a scanned model trains them stacked.
  if model.scan_layers:
    pretrained = bert.stack_layers(pretrained, model.config.num_hidden_layers)
  else:
    pretrained = bert.unstack_layers(pretrained)
  heads = objectives.init_head_params(objective, model.config.hidden_size, jax.random.key(seed + HEAD_INIT_SEED_OFFSET))
  trained, frozen = objectives.split_trainable(objective, pretrained)
  if objective.trainable == "prompt":
    prompt = objectives.init_prompt_params(objective.view_templates[0], pretrained["embeddings"]["word"]["embedding"])
    trained = {**trained, "prompt": prompt}
  return {**trained, **heads}, frozen
