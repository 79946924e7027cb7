"""The dense layer: Flax's nn.Dense's params and forward, gradients equal to float64's, and the backward's dots in
the form XLA's CPU runs without copying the wider operand transposed or reducing the bias over columns; the
embedding lookup: Flax's nn.Embed's params and outputs, its gradient added in float32."""

import re

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxemb import xla
from jaxemb.models import linears
from tests.support import EPS32, USERS_XLA_OPTIONS, assert_float32_close

# (input shape, features): x wider than the output (the FFN's output layer), narrower (its input layer), equal.
SHAPES = [((3, 5, 24), 8), ((3, 5, 8), 24), ((15, 8), 8)]


def _float64_gradients(x, kernel, g):
  x, kernel, g = (np.asarray(a, np.float64) for a in (x, kernel, g))
  rows_x, rows_g = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
  return g @ kernel.T, rows_x.T @ rows_g, rows_g.sum(0)


@pytest.mark.parametrize("shape,features", SHAPES)
def test_the_params_and_outputs_are_flax_dense_s(shape, features):
  x = jax.random.normal(jax.random.key(1), shape)
  ours, theirs = linears.Dense(features), nn.Dense(features)
  params = ours.init(jax.random.key(0), x)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, theirs.init(jax.random.key(0), x))
  np.testing.assert_array_equal(params["params"]["kernel"], theirs.init(jax.random.key(0), x)["params"]["kernel"])
  # Each side's n-term dot and bias within (n + 1) eps32 / 2 of |x| @ |W| + |b| (Higham, 3.1): twice that apart.
  kernel, bias = (np.abs(np.asarray(params["params"][name], np.float64)) for name in ("kernel", "bias"))
  bound = (shape[-1] + 1) * EPS32 * (np.abs(np.asarray(x, np.float64)) @ kernel + bias)
  np.testing.assert_array_less(np.abs(ours.apply(params, x) - np.asarray(theirs.apply(params, x), np.float64)), bound)


def test_apply_reads_the_params_without_their_initializer_and_checks_their_shapes():
  """Flax's own `param` traces the initializer at each apply to check an existing param's shape: a Dense reads its
  params as they are, and a kernel of another shape is Flax's shape error all the same."""
  calls = []

  def counted(key, shape, dtype):
    calls.append(shape)
    return nn.initializers.lecun_normal()(key, shape, dtype)

  x = jnp.ones((2, 4))
  dense = linears.Dense(3, kernel_init=counted)
  params = dense.init(jax.random.key(0), x)
  assert calls == [(4, 3)]
  np.testing.assert_array_equal(dense.apply(params, x), x @ params["params"]["kernel"] + params["params"]["bias"])
  assert calls == [(4, 3)]
  wrong = {"params": {**params["params"], "kernel": jnp.ones((4, 5))}}
  with pytest.raises(flax.errors.ScopeParamShapeError, match=r"shape \(4, 3\).*shape \(4, 5\)"):
    dense.apply(wrong, x)


@pytest.mark.parametrize("shape,features", SHAPES)
def test_gradients_equal_float64_s(shape, features):
  keys = jax.random.split(jax.random.key(2), 4)
  x = jax.random.normal(keys[0], shape)
  kernel = jax.random.normal(keys[1], (shape[-1], features))
  bias = jax.random.normal(keys[2], (features,))
  g = jax.random.normal(keys[3], (*shape[:-1], features))
  _, vjp = jax.vjp(lambda *a: linears.dense(*a, jax.lax.dot_general), x, kernel, bias)
  # Each an n-term float32 sum of products, within n eps32 / 2 of the sum of their magnitudes (Higham, 3.1; n eps32
  # covers the second-order terms): n = features for x's gradient, the rows for the kernel's and the bias's.
  magnitudes = _float64_gradients(*(np.abs(np.asarray(a)) for a in (x, kernel, g)))
  sizes = (features, g.size // features, g.size // features)
  for ours, expected, magnitude, n in zip(vjp(g), _float64_gradients(x, kernel, g), magnitudes, sizes):
    np.testing.assert_array_less(np.abs(np.asarray(ours, np.float64) - expected), n * EPS32 * magnitude + 1e-300)


NARROW, WIDE, ROWS = 24, 96, (8, 40)


def _compiled_ffn_gradient(dense) -> str:
  """The CPU program of an FFN block's parameter gradients (narrow -> wide -> narrow, as BERT's), compiled with
  the train step's dots (jaxemb.xla: a cached program takes Eigen's) and XLA's options in a user's process."""

  def loss(params, x, r):
    hidden = jax.nn.gelu(dense(x, params["in_kernel"], params["in_bias"]))
    return jnp.sum(jnp.tanh(dense(hidden, params["out_kernel"], params["out_bias"])) * r)

  params = {
    "in_kernel": jnp.ones((NARROW, WIDE)),
    "in_bias": jnp.ones(WIDE),
    "out_kernel": jnp.ones((WIDE, NARROW)),
    "out_bias": jnp.ones(NARROW),
  }
  x = jnp.ones((*ROWS, NARROW))
  gradient = jax.jit(jax.grad(loss), compiler_options=xla.compiler_options(cached=True))
  return gradient.lower(params, x, x).compile(compiler_options=USERS_XLA_OPTIONS).as_text()


def _column_reductions(hlo: str) -> list[str]:
  """The shapes of the reduce and reduce-window fusions in `hlo`'s entry computation."""
  entry = hlo[hlo.index("ENTRY") :]
  return re.findall(r"= (f32\[[\d,]*\])\{[\d,]*\} fusion\([^\n]*calls=%wrapped_reduce", entry)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the form chosen for XLA's CPU dots")
def test_the_cpu_backward_copies_no_wide_activation_transposed_and_reduces_no_wide_bias():
  autodiff = _compiled_ffn_gradient(lambda x, k, b: x @ k + b)
  ours = _compiled_ffn_gradient(lambda x, k, b: linears.dense(x, k, b, jax.lax.dot_general))
  wide_transposed = f"f32[{WIDE},{ROWS[0] * ROWS[1]}]"
  # The control: autodiff's program copies the wide activation transposed and sums the wide bias's gradient with
  # a reduce-window. If XLA stops doing either, this trick may be obsolete: re-measure bench/train_step.py.
  assert wide_transposed in autodiff
  assert f"f32[{WIDE}]" in _column_reductions(autodiff)
  assert wide_transposed not in ours
  assert not [shape for shape in _column_reductions(ours) if str(WIDE) in shape]
  assert _column_reductions(ours)  # The wide layer's narrow bias is still reduced over its rows.


class _Projections(nn.Module):
  """Two projections of one input, as separate Denses or as one `dense_split` over their Weights."""

  split: bool

  @nn.compact
  def __call__(self, x):
    if not self.split:
      return [linears.Dense(features, name=name)(x) for features, name in ((8, "a"), (24, "b"))]
    weights = [linears.Weights(x.shape[-1], features, name=name)() for features, name in ((8, "a"), (24, "b"))]
    return linears.dense_split(x, weights)


def test_dense_split_has_the_denses_params_outputs_and_gradients():
  x = jax.random.normal(jax.random.key(1), (3, 5, 16))
  params = _Projections(split=False).init(jax.random.key(0), x)
  split_params = _Projections(split=True).init(jax.random.key(0), x)
  jax.tree.map(np.testing.assert_array_equal, split_params, params)  # The same names and initial values.
  g = [jax.random.normal(jax.random.key(2), (3, 5, 8)), jax.random.normal(jax.random.key(3), (3, 5, 24))]
  results = {}
  for split in (False, True):
    outputs, vjp = jax.vjp(lambda p, x: _Projections(split).apply(p, x), params, x)
    results[split] = (outputs, vjp(g))
  # Both float32, the sums split or not: the longest is x's gradient over the 8 + 24 features (tests/support.py).
  jax.tree.map(lambda a, b: assert_float32_close(a, b, 8 + 24 + 1), results[True], results[False])


def _embed_and_gradient(module, params, ids, upstream):
  out, pullback = jax.vjp(lambda p: module.apply({"params": p}, ids), params)
  return out, pullback(upstream)[0]["embedding"], jax.make_jaxpr(lambda p: pullback(upstream))(params)


def test_embed_has_flax_embeds_params_and_outputs_and_adds_its_gradient_in_float32():
  # Every row repeats the same tokens, as [CLS], a template's words and [PAD] repeat in a batch.
  ids = jnp.tile(jnp.array([[0, 3, 3, 7, 1]]), (64, 1))
  ours, theirs = (cls(11, 16, dtype=jnp.bfloat16) for cls in (linears.Embed, nn.Embed))
  params = ours.init(jax.random.key(0), ids)["params"]
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, theirs.init(jax.random.key(0), ids)["params"])
  upstream = jax.random.normal(jax.random.key(1), (64, 5, 16)).astype(jnp.bfloat16)
  out, gradient, jaxpr = _embed_and_gradient(ours, params, ids, upstream)
  theirs_out, theirs_gradient, theirs_jaxpr = _embed_and_gradient(theirs, params, ids, upstream)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(out, theirs_out)
  scatter_dtypes = lambda jaxpr: set(re.findall(r"(\w+)\[11,16\] = scatter-add", str(jaxpr)))
  assert scatter_dtypes(jaxpr) == {"f32"}, jaxpr
  assert scatter_dtypes(theirs_jaxpr) == {"bf16"}  # What cost a GPU step two thirds of its time.
  expected = np.zeros((11, 16))
  np.add.at(expected, np.asarray(ids).ravel(), np.asarray(upstream, np.float64).reshape(-1, 16))
  # Float32 sums of up to 128 of the rows (id 3: twice in each of the 64 rows) against float64's: on the scale of
  # the sum of their magnitudes (tests/support.py).
  magnitudes = np.zeros((11, 16))
  np.add.at(magnitudes, np.asarray(ids).ravel(), np.abs(np.asarray(upstream, np.float64)).reshape(-1, 16))
  assert_float32_close(gradient, expected, 128, evaluations=1, scale=magnitudes)
  assert np.abs(theirs_gradient - expected).max() > np.abs(gradient - expected).max()
