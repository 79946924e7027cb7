"""The encoders' dense layer: Flax's `nn.Dense` (the same params, init and forward) with a backward pass that
computes the kernel's and the bias's gradients the way XLA's CPU dots run fastest.

The kernel's gradient contracts the input x [rows, in] with the output's gradient g [rows, out] over the rows.
XLA's CPU dots take the left operand's contracted dimension last, so autodiff's x^T g first copies x transposed:
for the FFN's output layer (in = 4 x out) the widest activation of the layer. (g^T x)^T copies g, the narrower
one, and transposes only the [out, in] result. Where x is the one copied, a column of ones appended to it (in the
same copy) makes the dot's last row the bias's gradient, the sum of g over the rows, which XLA's CPU backend
otherwise computes as a column reduction (a reduce-window per bias, 4-5x the time of the elementwise op it
follows). Together: a MiniLM train step 15-20% shorter on an Intel Xeon (bench/train_step.py, docs/benchmarks.md).
The same numbers up to the order of the float32 sums (tests/models/test_linears.py). Other backends, whose dots
read either operand transposed, take autodiff's form.

Projections of one input (attention's query, key and value in training) can run as one dot over their concatenated
kernels (`dense_split`), each keeping its own params: one transposed copy of the input in the backward instead of
three.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any
DotGeneral = Callable[..., jax.Array]


class Embed(nn.Embed):
  """`nn.Embed` (the same param "embedding", init and forward values) that gathers rows in the param dtype and then
  casts them to `dtype`, where Flax casts the whole table first. The lookup's gradient is a scatter-add into the
  table, and it then adds in float32 instead of bfloat16: on a GPU XLA's bfloat16 scatter-add into rows that every
  sentence shares ([CLS], the template's tokens, [PAD]) took 141 ms of a 218 ms PromptBERT step at batch 256
  (bert-base, H200, 2026-11-26, bench/accelerator.py --trace); bfloat16 params (`param_dtype`) keep that form."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError("Input type must be an integer or unsigned integer.")
    return jnp.take(self.embedding, inputs, axis=0).astype(self.dtype or self.embedding.dtype)


class Dense(nn.Module):
  """y = x kernel + bias over x's last axis (`nn.Dense`'s params "kernel" [in, features] and "bias" [features]);
  `dot_general` computes the forward's and the backward's dots."""

  features: int
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable[..., jax.Array] = nn.linear.default_kernel_init
  bias_init: Callable[..., jax.Array] = nn.initializers.zeros_init()
  dot_general: DotGeneral = jax.lax.dot_general

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x, kernel, bias = nn.dtypes.promote_dtype(x, *_weights(self, x.shape[-1]), dtype=self.dtype)
    return dense(x, kernel, bias, self.dot_general)


class Weights(nn.Module):
  """A Dense's params alone, (kernel [in_features, features], bias [features]): for `dense_split`."""

  in_features: int
  features: int
  param_dtype: Dtype = jnp.float32
  kernel_init: Callable[..., jax.Array] = nn.linear.default_kernel_init
  bias_init: Callable[..., jax.Array] = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self) -> tuple[jax.Array, jax.Array]:
    return _weights(self, self.in_features)


def _weights(module: Dense | Weights, in_features: int) -> tuple[jax.Array, jax.Array]:
  kernel = _param(module, "kernel", module.kernel_init, (in_features, module.features), module.param_dtype)
  return kernel, _param(module, "bias", module.bias_init, (module.features,), module.param_dtype)


def _param(
  module: nn.Module, name: str, init: Callable[..., jax.Array], shape: tuple[int, ...], dtype: Dtype
) -> jax.Array:
  """`module.param(name, init, shape, dtype)`, reading an existing param with its shape checked against `shape`.
  Flax's `param` checks an existing one against `jax.eval_shape` of its initializer, which traces the initializer
  (the kernel's random normal) at every apply: a fifth of the time of tracing MiniLM's forward (py-spy)."""
  if not module.has_variable("params", name):
    return module.param(name, init, shape, dtype)
  value = module.get_variable("params", name)
  if jnp.shape(value) != shape:
    raise flax.errors.ScopeParamShapeError(name, module.scope.path_text, jnp.shape(value), shape)
  return value


def dense_split(
  x: jax.Array,
  weights: Sequence[tuple[jax.Array, jax.Array]],
  dtype: Dtype | None = None,
  dot_general: DotGeneral = jax.lax.dot_general,
) -> list[jax.Array]:
  """[x kernel + bias for each (kernel, bias) of `weights`] computed as one `dense` over the concatenated kernels
  (in `dtype`, as Dense's), then split."""
  kernels, biases = zip(*weights)
  x, kernel, bias = nn.dtypes.promote_dtype(x, jnp.concatenate(kernels, 1), jnp.concatenate(biases), dtype=dtype)
  ends = list(itertools.accumulate(k.shape[1] for k in kernels))
  return jnp.split(dense(x, kernel, bias, dot_general), ends[:-1], axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array, dot_general: DotGeneral) -> jax.Array:
  """x kernel + bias; the gradients of `kernel` and `bias` are `parameter_gradients`'."""
  return dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ()))) + bias


def _dense_forward(x, kernel, bias, dot_general):
  return dense(x, kernel, bias, dot_general), (x, kernel)


def _dense_backward(dot_general, residuals, g):
  x, kernel = residuals
  dx = dot_general(g, kernel, (((g.ndim - 1,), (1,)), ((), ())))
  return (dx, *parameter_gradients(x, g, dot_general))


dense.defvjp(_dense_forward, _dense_backward)


def parameter_gradients(
  x: jax.Array, g: jax.Array, dot_general: DotGeneral = jax.lax.dot_general
) -> tuple[jax.Array, jax.Array]:
  """The kernel's gradient x^T g [in, out] and the bias's, g summed over every axis but the last [out], from the
  input x and the output's gradient g (see the module docstring for the order of the dots)."""
  rows = tuple(range(x.ndim - 1))
  contract_rows = ((rows, rows), ((), ()))
  if jax.default_backend() != "cpu":  # Accelerators' dots read either operand transposed: autodiff's form.
    return dot_general(x, g, contract_rows), g.sum(rows)
  if x.shape[-1] > g.shape[-1]:
    return dot_general(g, x, contract_rows).T, g.sum(rows)
  with_ones = jnp.concatenate([x, jnp.ones((*x.shape[:-1], 1), x.dtype)], axis=-1)
  both = dot_general(with_ones, g, contract_rows)
  return both[:-1], both[-1]
