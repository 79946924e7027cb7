"""BERT-flow (Li et al., 2020, https://github.com/bohanli/BERT-flow): another method's vectors mapped to the Gaussian
latent of a Glow (jaxemb/models/flow.py) fitted by maximum likelihood on a set of sentences' vectors, the encoder
frozen.

The fit follows the authors' unsupervised setting (README "Unsupervised learning of flow-based generative models":
`--flow=1 --flow_loss=1 --num_examples=0 --num_train_epochs=1.0 --flow_learning_rate=1e-3`, run_siamese.py and
optimization_bert_flow.py), where the encoder's own loss is zero:
- one epoch over the fit set, shuffled, batches of 64 sentences (their 32 pairs, both sides through the flow) with
  the last short batch dropped; the loss is their `flow_loss_batch_a + flow_loss_batch_b`, two 32-sentence means of
  bits per dimension, -log-likelihood / (C ln 2): here twice the 64-sentence mean;
- every actnorm set from the first batch (their GlowInitHook);
- BERT's AdamWeightDecayOptimizer at a constant 1e-3: Adam without bias correction, epsilon 1e-6, decoupled weight
  decay 0.01 on every flow parameter (their exclusion patterns, LayerNorm and bias, name none of the flow's), the
  gradient clipped to global norm 1.0 first.
The published rows (PromptBERT Table 5, CoT-BERT Table 1: "BERT-flow", "-flow") fit on NLI's sentences; Li et al.
also fit on the target tasks' own. Here the fit set is a corpus file or, by default, the evaluated STS test tasks'
sentences (`base.TASK_SENTENCES`); evaluate.py prints which. Not exportable: sentence-transformers has no flow module.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxemb.errors import ConfigError
from jaxemb.methods import base, transform
from jaxemb.models import EncoderConfig
from jaxemb.models import flow as glow

PAIRS = 2  # Their batch's sides (a, b): the loss sums the means of a batch's two halves.
_PARAMS, _HISTORY = "params/", "fit/log_likelihood"  # The fitted arrays: the flow's params, each step's mean.


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Flow(transform.Transform):
  """BERT-flow of another method's vectors: `Method("flow", source=Method("prompt", template=...))`, in a config
  `--config.method.name=flow --config.method.source.name=prompt --config.method.source.template=...`.

  Attributes:
    levels, depth, coupling_width: the Glow's levels, steps per level and coupling width (the authors'
      default config_l3_d3_w32: 3, 3, 32).
    epochs, batch_size, learning_rate: the fit (the authors' 1 epoch, 64 sentences, 1e-3).
    seed: the shuffling and the coupling networks' initial kernels.
  """

  NAMES = ("flow",)

  levels: int = 3
  depth: int = 3
  coupling_width: int = 32
  epochs: int = 1
  batch_size: int = 64
  learning_rate: float = 1e-3
  seed: int = 0

  def __post_init__(self):
    super().__post_init__()
    sizes = {
      "levels": self.levels,
      "depth": self.depth,
      "coupling_width": self.coupling_width,
      "epochs": self.epochs,
    }
    for field, value in sizes.items():
      if value < 1:
        raise ConfigError(f"flow {field} must be >= 1; got {value}")
    if self.batch_size < PAIRS or self.batch_size % PAIRS:
      raise ConfigError(f"flow batch_size must be a positive even number (pairs); got {self.batch_size}")
    if not self.learning_rate > 0:
      raise ConfigError(f"flow learning_rate must be > 0; got {self.learning_rate}")

  @property
  def flow_config(self) -> glow.FlowConfig:
    return glow.FlowConfig(levels=self.levels, depth=self.depth, width=self.coupling_width)

  def validate(self, config: EncoderConfig, num_masks: int):
    super().validate(config, num_masks)
    try:
      glow.check_width(self.source.width(config), self.flow_config)
    except ValueError as e:
      raise ConfigError(f"method {self.source.name!r}: {e}") from None

  def fit(self, embed: Callable[[base.Method, list[str]], np.ndarray], sentences: list[str]) -> dict[str, np.ndarray]:
    """The flow's params (keys "params/...") fitted on the flowed method's vectors of `sentences`, and each step's
    mean log-likelihood in nats ("fit/log_likelihood")."""
    x = np.asarray(embed(self.source, sentences), np.float32)
    if len(x) < self.batch_size:
      raise ConfigError(f"flow fits on batches of {self.batch_size} sentences; got {len(x)} distinct sentences")
    params, history = fit_flow(
      x,
      self.flow_config,
      epochs=self.epochs,
      batch_size=self.batch_size,
      learning_rate=self.learning_rate,
      seed=self.seed,
    )
    flat = flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
    return {**{_PARAMS + key: np.asarray(value) for key, value in flat.items()}, _HISTORY: np.asarray(history)}

  def load_transform(self, config: EncoderConfig, fitted: dict[str, np.ndarray]) -> Any:
    params = flax.traverse_util.unflatten_dict(
      {key[len(_PARAMS) :]: jnp.asarray(value) for key, value in fitted.items() if key.startswith(_PARAMS)}, sep="/"
    )
    fitted_width = np.asarray(params["level_0"]["step_0"]["actnorm"]["b"]).shape[0]
    if fitted_width != self.source.width(config):
      raise ConfigError(
        f"the fitted flow is {fitted_width}-dimensional; method {self.source.name!r} gives "
        f"{self.source.width(config)} dimensions on this model"
      )
    return params

  def transform(self, state: Any, x: jax.Array) -> jax.Array:
    return glow.forward(state, x, self.flow_config)[0]

  def card_text(self) -> str:
    return (
      self.source.card_text() + "\nThen BERT-flow (Li et al., 2020): the vectors mapped to the Gaussian latent "
      "of a Glow fitted on a set of sentences' vectors.\n"
    )


def _bert_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6) -> optax.GradientTransformation:
  """The update m / (sqrt(v) + eps) of BERT's AdamWeightDecayOptimizer: Adam's moments without bias correction."""

  def init(params):
    return jax.tree.map(jnp.zeros_like, (params, params))

  def update(grads, state, params=None):
    del params
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state[0], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state[1], grads)
    return jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), m, v), (m, v)

  return optax.GradientTransformation(init, update)


def fit_flow(
  x: np.ndarray, config: glow.FlowConfig, *, epochs: int, batch_size: int, learning_rate: float, seed: int
) -> tuple[Any, np.ndarray]:
  """The flow's params fitted on the vectors `x` [n, C] by maximum likelihood (the module docstring's recipe), and
  each step's mean log-likelihood (nats per vector, before that step's update)."""
  rng = np.random.default_rng(seed)
  steps = len(x) // batch_size
  order = np.concatenate([rng.permutation(len(x))[: steps * batch_size] for _ in range(epochs)])
  batches = jnp.asarray(x[order.reshape(-1, batch_size)])
  params = glow.init(jax.random.key(seed), batches[0], config)
  optimizer = optax.chain(
    optax.clip_by_global_norm(1.0), _bert_adam(), optax.add_decayed_weights(0.01), optax.scale(-learning_rate)
  )
  bits = PAIRS / (np.log(2) * x.shape[1])  # Mean log-likelihood -> their loss, two halves' bits per dimension.

  def step(carry, batch):
    params, opt_state = carry
    mean_log_likelihood, grads = jax.value_and_grad(lambda p: glow.forward(p, batch, config)[1].mean())(params)
    updates, opt_state = optimizer.update(jax.tree.map(lambda g: -bits * g, grads), opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), mean_log_likelihood

  (params, _), history = jax.jit(lambda p, b: jax.lax.scan(step, (p, optimizer.init(p)), b))(params, batches)
  return params, np.asarray(history)
