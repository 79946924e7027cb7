"""The train state, the optimizer (the HF Trainer's AdamW with linear decay) and the jitted, sharded step."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax
import flax.traverse_util
import jax
import jax.numpy as jnp
import optax

from jaxemb import sharding, xla
from jaxemb.errors import ConfigError
from jaxemb.models import EncoderConfig, Transformer
from jaxemb.spec import Train
from jaxemb.training import objectives


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data, whose position is `step`."""

  step: jax.Array  # int32 scalar: optimizer steps taken (= batches consumed).
  params: dict[str, Any]  # Trained: {"encoder", "mlp"} or, for OptiPrompt, {"prompt", "mlp"}.
  frozen: dict[str, Any]  # Not trained: {"encoder"} for OptiPrompt, else {}.
  opt_state: optax.OptState
  rng: jax.Array  # Base dropout key; step s uses fold_in(rng, s), so a resumed run draws the same masks.

  @property
  def all_params(self) -> dict[str, Any]:
    """The trained and the frozen params in one tree."""
    return merge_params(self.frozen, self.params)


def merge_params(frozen: dict[str, Any], trained: dict[str, Any]) -> dict[str, Any]:
  """One tree of two disjoint ones (OptiPrompt trains the encoder's MLM transform but not the rest of it)."""
  merged = dict(frozen)
  for key, value in trained.items():
    merged[key] = merge_params(frozen[key], value) if isinstance(value, dict) and key in frozen else value
  return merged


def zero_padding_rows(config: EncoderConfig, grads: dict[str, Any]) -> dict[str, Any]:
  """Gradients without the embedding rows that HF's `nn.Embedding(padding_idx=...)` never updates: the [PAD]
  word embedding, and for RoBERTa the position row padding_idx (its pad tokens' position; the authors' position-offset
  rows, counted from 0, put their second token there). CoT-BERT's [PAD] denoising rows attend [PAD]s, which would
  otherwise train that row."""
  rows = {("embeddings", "word", "embedding"): config.pad_token_id}
  if config.model_type == "roberta":
    rows[("embeddings", "position", "embedding")] = config.pad_token_id
  encoder = grads.get("encoder")
  if encoder is None:
    return grads
  flat = flax.traverse_util.flatten_dict(encoder)
  for path, row in rows.items():
    if path in flat:
      flat[path] = flat[path].at[row].set(0)
  return {**grads, "encoder": flax.traverse_util.unflatten_dict(flat)}


def learning_rate_schedule(config: Train, total_steps: int) -> optax.Schedule:
  """Linear decay from config.learning_rate to 0 over `total_steps`, no warm-up (the HF Trainer's default)."""
  return optax.linear_schedule(config.learning_rate, 0.0, total_steps)


OPTIMIZERS = ("hf_adamw", "optax_adamw")  # transformers 4.2's AdamW (the authors'), or optax's.


class HFAdamWState(NamedTuple):
  count: jax.Array  # Steps taken.
  mu: optax.Updates  # First moment.
  nu: optax.Updates  # Second moment.


def hf_adamw(
  learning_rate: optax.Schedule, b1: float, b2: float, eps: float, weight_decay: float, mask: Any
) -> optax.GradientTransformation:
  """transformers 4.2's `AdamW` (`optimization.py`), which every reference trainer ran (kongds/Prompt-BERT,
  ZBWpro/CoT-BERT and princeton-nlp/SimCSE pin transformers 4.2.1):

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p <- p - lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps);  then p <- p - lr wd p (on the updated p)

  eps is added to sqrt(v) BEFORE the bias correction, unlike optax.adamw (sqrt(v / (1 - b2^t)) + eps): at step 1
  the effective eps is eps / sqrt(1 - b2) = 3.2e-7 here against optax's 1e-8, which moves every early update of a
  small gradient. Weight decay applies where `mask(params)` is true (HF's Trainer: not biases or LayerNorm).
  """

  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return HFAdamWState(count=jnp.zeros((), jnp.int32), mu=zeros(), nu=zeros())

  def update(grads, state, params):
    count = state.count + 1
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, grads)
    t = count.astype(jnp.float32)
    lr = learning_rate(state.count)  # The HF scheduler steps after the optimizer: step 1 runs at lr(0).
    step_size = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
    adam = jax.tree.map(lambda m, v: -step_size * m / (jnp.sqrt(v) + eps), mu, nu)
    decay = mask(params) if callable(mask) else mask
    updates = jax.tree.map(lambda a, p, d: a - lr * weight_decay * (p + a) if d else a, adam, params, decay)
    return updates, HFAdamWState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def make_optimizer(config: Train, total_steps: int) -> optax.GradientTransformation:
  """Gradient clipping at config.max_grad_norm (HF Trainer's `max_grad_norm`, 1.0 in every reference; 0 = off), then
  AdamW (config.optimizer: the authors' transformers 4.2 AdamW or optax's) on the linear schedule; weight decay
  skips biases and LayerNorm scales as HF's Trainer does."""
  if config.optimizer not in OPTIMIZERS:
    raise ConfigError(f"train.optimizer {config.optimizer!r} is not one of {OPTIMIZERS}")
  schedule = learning_rate_schedule(config, total_steps)
  decay_mask = lambda params: jax.tree_util.tree_map_with_path(
    lambda path, _: getattr(path[-1], "key", None) not in ("bias", "scale"), params
  )
  if config.optimizer == "hf_adamw":
    tx = hf_adamw(schedule, config.adam_b1, config.adam_b2, config.adam_eps, config.weight_decay, decay_mask)
  else:
    tx = optax.adamw(
      schedule,
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
      mask=decay_mask,
    )
  if config.max_grad_norm > 0:
    tx = optax.chain(clip_by_global_norm(config.max_grad_norm), tx)
  return tx


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """torch.nn.utils.clip_grad_norm_, as HF's Trainer calls it: every gradient times min(1, max_norm / (norm + 1e-6)),
  the norm over all of them (optax's version divides by the norm itself)."""

  def update(grads, state, params=None):
    del params
    scale = jnp.minimum(1.0, max_norm / (global_norm(grads) + 1e-6))
    return jax.tree.map(lambda g: g * scale.astype(g.dtype), grads), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def global_norm(tree: Any) -> jax.Array:
  """The L2 norm of all the entries of a tree of real arrays: `optax.tree.norm`'s value, summed in its order, bit
  for bit. optax squares each leaf's imaginary part too, zeros for a real leaf: half the traced operations of a
  norm, and, with XLA's optimizations off (the tests'), computed. A toy PromptBERT step's three norms (clipping,
  the grad and param norms it logs) so: traced, lowered and compiled as the tests do in 6.5 s against 6.9 s
  (medians of 5 in one process, AMD EPYC Zen 3)."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree)))


def init_state(
  params: dict[str, Any], frozen: dict[str, Any], tx: optax.GradientTransformation, seed: int
) -> TrainState:
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    frozen=frozen,
    opt_state=tx.init(params),
    rng=jax.random.key_data(jax.random.key(seed)),
  )


def train_step(
  objective: objectives.Objective,
  model: Transformer,
  tx: optax.GradientTransformation,
  state: TrainState,
  batch: dict[str, Any],
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on one global batch."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

  def loss_fn(params):
    return objectives.loss_and_metrics(objective, model, merge_params(state.frozen, params), batch, rng)

  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  if objective.ddp_world_size > 1:
    grads = jax.tree.map(lambda g: g / objective.ddp_world_size, grads)
  if objective.freeze_padding_rows:
    grads = zero_padding_rows(model.config, grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {**metrics, "grad_norm": global_norm(grads), "param_norm": global_norm(params)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def train_steps(
  objective: objectives.Objective,
  model: Transformer,
  tx: optax.GradientTransformation,
  state: TrainState,
  batches: tuple[dict[str, Any], ...],
  count: jax.Array,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """`count` optimizer steps, one per batch of `batches[:count]` (all of one shape), in one loop: each step's
  metrics at its index of a [len(batches)] array (the rest zeros). One call holds the step's temporaries once
  for all its steps: XLA's CPU client allocates a program's temporary buffer per call, and glibc maps it fresh
  and faults it in each time (a MiniLM PromptBERT step: 384,000 page faults, a quarter of its time on a 2-core
  Xeon VM; docs/benchmarks.md). The loop's trip count is a value, so one program runs any `count` up to
  len(batches) and every step runs the same code: how a run splits its steps into calls changes no bit (for one
  len(batches)). One batch runs without the loop."""
  if len(batches) == 1:  # No loop around a single step (count is 1): the step's own program.
    state, metrics = train_step(objective, model, tx, state, batches[0])
    return state, jax.tree.map(lambda m: m[None], metrics)
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *batches)
  # Jitted so that the loop's body reuses the trace that gave the metrics' shapes (one trace of the step, not two).
  step = jax.jit(functools.partial(train_step, objective, model, tx))

  def one_step(i, carry):
    state, metrics = carry
    state, step_metrics = step(state, jax.tree.map(lambda x: x[i], stacked))
    return state, jax.tree.map(lambda all_, one: all_.at[i].set(one), metrics, step_metrics)

  metrics = jax.tree.map(
    lambda m: jnp.zeros((len(batches), *m.shape), m.dtype), jax.eval_shape(step, state, batches[0])[1]
  )
  return jax.lax.fori_loop(0, count, one_step, (state, metrics))


def jit_train_steps(
  objective: objectives.Objective,
  model: Transformer,
  tx: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  state_shardings: Any,
  rows: int,
  steps_per_call: int,
):
  """`train_steps` compiled with explicit shardings for `steps_per_call` batches a call: the state stays where it
  is (and is donated), each batch is split over every device, and the contrastive logits are computed on the
  global batch. `rows`: each device's token rows per encoder call, by which jaxemb.xla.is_few_rows picks the
  CPU's dot library."""
  return xla.jit(
    functools.partial(train_steps, objective, model, tx),
    model.dtype,
    xla.is_few_rows(rows),
    cached=True,
    in_shardings=(state_shardings, (sharding.batch_sharding(mesh),) * steps_per_call, sharding.replicated(mesh)),
    out_shardings=(state_shardings, sharding.replicated(mesh)),
    donate_argnums=(0,),
  )
