"""Heads on top of the encoder: the MLM head, and dense + tanh (the pooler, the training-only MLP)."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxemb.models import linears
from jaxemb.models.config import EncoderConfig

Dtype = Any


def activation(config: EncoderConfig, x: jax.Array) -> jax.Array:
  """The config's `hidden_act` with Hugging Face semantics ("gelu" is the exact erf form)."""
  if config.gelu_approximate is False:
    # x Phi(x) written with erf, as torch computes it: XLA's erfc in jax.nn.gelu's exact form is 5x slower on
    # the CPU (a sixth of a MiniLM train step).
    return 0.5 * x * (1 + jax.lax.erf(x * jnp.asarray(1 / math.sqrt(2), x.dtype)))
  if config.gelu_approximate:
    return jax.nn.gelu(x, approximate=True)
  return jax.nn.relu(x) if config.hidden_act == "relu" else jax.nn.silu(x)


class MLMHead(nn.Module):
  """Masked-LM head: dense + activation + LayerNorm, then the (usually tied) decoder to vocabulary logits.

  The transform alone (`transform_only=True`) is supervised PromptBERT's `--org_mlp` projection.
  """

  config: EncoderConfig
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, hidden: jax.Array, word_embeddings: jax.Array, transform_only: bool = False) -> jax.Array:
    dense = linears.Dense(self.config.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype, name="dense")
    norm = nn.LayerNorm(self.config.layer_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, name="layer_norm")
    # RoBERTa's lm_head hard-codes exact gelu; BERT's transform uses hidden_act.
    act = (
      (lambda x: jax.nn.gelu(x, approximate=False))
      if self.config.model_type == "roberta"
      else (lambda x: activation(self.config, x))
    )
    hidden = norm(act(dense(hidden)))
    if transform_only:
      return hidden
    if self.config.tie_word_embeddings:
      decoder = word_embeddings.T
    else:
      decoder = self.param(
        "decoder", nn.initializers.normal(0.02), (self.config.hidden_size, self.config.vocab_size), self.param_dtype
      )
    bias = self.param("bias", nn.initializers.zeros, (self.config.vocab_size,), self.param_dtype)
    return hidden @ decoder.astype(self.dtype) + bias.astype(self.dtype)


class DenseTanh(nn.Module):
  """Dense + tanh: BERT's pooler on the [CLS] state, and (freshly initialised) SimCSE's `--mlp_only_train`
  projection used inside the training loss only."""

  hidden_size: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    dense = linears.Dense(self.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype, name="dense")
    return jnp.tanh(dense(x))
