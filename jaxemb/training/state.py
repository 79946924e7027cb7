"""The train state, the optimizer (the HF Trainer's AdamW with linear decay) and the jitted, sharded step."""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from jaxemb import xla
from jaxemb.models import Transformer
from jaxemb.training import objectives, sharding


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data, whose position is `step`."""

  step: jax.Array  # int32 scalar: optimizer steps taken (= batches consumed).
  params: dict[str, Any]  # Trained: {"encoder", "mlp"} or, for OptiPrompt, {"prompt", "mlp"}.
  frozen: dict[str, Any]  # Not trained: {"encoder"} for OptiPrompt, else {}.
  opt_state: optax.OptState
  rng: jax.Array  # Base dropout key; step s uses fold_in(rng, s), so a resumed run draws the same masks.


def learning_rate_schedule(config: Any, total_steps: int) -> optax.Schedule:
  """Linear decay from config.learning_rate to 0 over `total_steps`, no warm-up (the HF Trainer's default)."""
  return optax.linear_schedule(config.learning_rate, 0.0, total_steps)


def make_optimizer(config: Any, total_steps: int) -> optax.GradientTransformation:
  """AdamW on the linear schedule (the HF Trainer defaults the references ran with); weight decay skips biases
  and LayerNorm scales as HF does; clipping only when asked."""
  schedule = learning_rate_schedule(config, total_steps)
  decay_mask = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) not in ("bias", "scale"), params)
  tx = optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                   weight_decay=config.weight_decay, mask=decay_mask)
  if config.max_grad_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), tx)
  return tx


def init_state(params: dict[str, Any], frozen: dict[str, Any], tx: optax.GradientTransformation,
               seed: int) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, frozen=frozen, opt_state=tx.init(params),
                    rng=jax.random.key_data(jax.random.key(seed)))


def train_step(objective: objectives.Objective, model: Transformer, tx: optax.GradientTransformation,
               state: TrainState, batch: dict[str, Any]) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on one global batch."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

  def loss_fn(params):
    return objectives.loss_and_metrics(objective, model, {**state.frozen, **params}, batch, rng)

  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def jit_train_step(objective: objectives.Objective, model: Transformer, tx: optax.GradientTransformation,
                   mesh: jax.sharding.Mesh, state_shardings: Any):
  """The step compiled with explicit shardings: the state stays where it is (and is donated), the batch is
  split over every device, and the contrastive logits are computed on the global batch."""
  return xla.jit(functools.partial(train_step, objective, model, tx),
                 in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(state_shardings, sharding.replicated(mesh)),
                 donate_argnums=(0,))
