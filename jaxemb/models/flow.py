"""BERT-flow's network (Li et al., 2020): a Glow (Kingma & Dhariwal, 2018) over one vector per sentence, mapping it
invertibly to a standard Gaussian latent of the same width, as pure functions of a params pytree.

The architecture is bohanli/BERT-flow's flow/glow_1x1.py and flow/glow_ops_1x1.py (tensor2tensor's Glow on a 1 x 1
"image" whose channels are the vector) under its default config, flow/config/config_l3_d3_w32.json:
- `levels` levels (3) of `depth` steps (3); after each level but the last, half the channels leave as latents
  scored under N(0, 1) (`split`), and the rest go on; the vector's latent is those halves, then the last level's
  output, concatenated (glow_1x1.py `self.z = concat(eps + [z])`).
- A step: actnorm, then the fixed channel reversal ("permutation": true, no 1x1 weights), then an additive
  coupling: the second half of the channels plus a shift computed from the first half by a network of two
  `width`-wide (32) ReLU layers, each Dense without bias then an actnorm, and a zero-initialised Dense whose output
  is scaled by exp(3 logs) (glow_ops `conv_stack`; 1 x 1 convolutions are Dense layers here).
- Actnorm: (x + b) exp(3 logs) per channel, b and logs set from the first batch so its output has zero mean and
  unit variance there (data-dependent init, `init`); log-determinant 3 sum(logs). The coupling's determinant is 1.

`forward` gives the latent and each vector's log-likelihood; `inverse` maps a latent back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

LOGSCALE = 3.0  # glow_ops' logscale_factor: actnorm and the zero layer learn logs / 3.
INIT_STD = 0.05  # glow_ops default_initializer: the coupling network's Dense kernels.

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class FlowConfig:
  """The flow's shape (bohanli/BERT-flow flow/config/config_l3_d3_w32.json, its run_siamese.py default)."""

  levels: int = 3
  depth: int = 3
  width: int = 32  # coupling_width: the coupling network's hidden width.


def _actnorm(params: Params | None, x: jax.Array) -> tuple[jax.Array, jax.Array, Params]:
  """(x + b) exp(3 logs) per channel, its log-determinant, and its params (set from `x` when `params` is None)."""
  if params is None:
    b = -x.mean(0)
    params = {"b": b, "logs": jnp.log(1.0 / (jnp.sqrt(((x + b) ** 2).mean(0)) + 1e-6)) / LOGSCALE}
  logs = LOGSCALE * params["logs"]
  return (x + params["b"]) * jnp.exp(logs), logs.sum(), params


def _shift(params: Params | None, x1: jax.Array, width: int, key: jax.Array | None) -> tuple[jax.Array, Params]:
  """The additive coupling's shift of the second half, from the first half `x1`."""
  h, new = x1, {}
  for i in range(2):
    name = f"hidden_{i}"
    kernel = (
      INIT_STD * jax.random.normal(jax.random.fold_in(key, i), (h.shape[-1], width))
      if params is None
      else params[name]["kernel"]
    )
    h, _, norm = _actnorm(None if params is None else params[name]["actnorm"], h @ kernel)
    h, new[name] = jax.nn.relu(h), {"kernel": kernel, "actnorm": norm}
  out = x1.shape[-1]
  zero = (
    params["out"]
    if params is not None
    else {"kernel": jnp.zeros((width, out)), "b": jnp.zeros(out), "logs": jnp.zeros(out)}
  )
  return (h @ zero["kernel"] + zero["b"]) * jnp.exp(LOGSCALE * zero["logs"]), {**new, "out": zero}


def _step(params: Params | None, x: jax.Array, width: int, key: jax.Array | None):
  """Actnorm, channel reversal, additive coupling: the step's output, log-determinant and params."""
  x, logdet, norm = _actnorm(None if params is None else params["actnorm"], x)
  x1, x2 = jnp.split(x[:, ::-1], 2, axis=-1)
  shift, coupling = _shift(None if params is None else params["coupling"], x1, width, key)
  return jnp.concatenate([x1, x2 + shift], -1), logdet, {"actnorm": norm, "coupling": coupling}


def _step_inverse(params: Params, y: jax.Array, width: int) -> jax.Array:
  y1, y2 = jnp.split(y, 2, axis=-1)
  x = jnp.concatenate([y1, y2 - _shift(params["coupling"], y1, width, None)[0]], -1)[:, ::-1]
  norm = params["actnorm"]
  return x * jnp.exp(-LOGSCALE * norm["logs"]) - norm["b"]


def _log_normal(z: jax.Array) -> jax.Array:
  """Each row's log-density under N(0, I)."""
  return -0.5 * (z**2 + jnp.log(2 * jnp.pi)).sum(-1)


def _run(params: Params | None, x: jax.Array, config: FlowConfig, key: jax.Array | None):
  latents, log_likelihood, new = [], jnp.zeros(x.shape[0], x.dtype), {}
  for level in range(config.levels):
    steps = new[f"level_{level}"] = {}
    for step in range(config.depth):
      old = None if params is None else params[f"level_{level}"][f"step_{step}"]
      x, logdet, steps[f"step_{step}"] = _step(
        old, x, config.width, None if key is None else jax.random.fold_in(key, level * config.depth + step)
      )
      log_likelihood += logdet
    if level < config.levels - 1:
      x, leaving = jnp.split(x, 2, axis=-1)
      latents.append(leaving)
      log_likelihood += _log_normal(leaving)
  return jnp.concatenate(latents + [x], -1), log_likelihood + _log_normal(x), new


def init(key: jax.Array, x: jax.Array, config: FlowConfig) -> Params:
  """The flow's params, every actnorm set from the batch `x` [batch, channels] as it flows through."""
  check_width(x.shape[-1], config)
  return _run(None, x, config, key)[2]


def forward(params: Params, x: jax.Array, config: FlowConfig) -> tuple[jax.Array, jax.Array]:
  """The latents [batch, channels] of the vectors `x` and their log-likelihoods [batch] (nats)."""
  z, log_likelihood, _ = _run(params, x, config, None)
  return z, log_likelihood


def inverse(params: Params, z: jax.Array, config: FlowConfig) -> jax.Array:
  """The vectors whose latents are `z`: `forward`'s inverse."""
  sizes = [z.shape[-1] // 2 ** (level + 1) for level in range(config.levels - 1)]
  pieces = jnp.split(z, np.cumsum(sizes), axis=-1)
  x = pieces[-1]
  for level in reversed(range(config.levels)):
    if level < config.levels - 1:
      x = jnp.concatenate([x, pieces[level]], -1)
    for step in reversed(range(config.depth)):
      x = _step_inverse(params[f"level_{level}"][f"step_{step}"], x, config.width)
  return x


def check_width(channels: int, config: FlowConfig):
  """ValueError unless every level's coupling can halve its channels."""
  if channels % 2**config.levels:
    raise ValueError(
      f"a {config.levels}-level flow halves the channels {config.levels} times; {channels} vector "
      f"dimensions are not a multiple of {2**config.levels}"
    )
