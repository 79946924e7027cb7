"""Tests for jaxemb.losses: NumPy transcriptions of the papers' equations and PyTorch ones of the reference code."""

import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxemb import losses
from tests.support import EPS32, cross_entropy_atol, float32_atol

N, D, TAU = 8, 16, 0.05
REPO = pathlib.Path(__file__).resolve().parents[1]
# float32's rounding of the losses (tests/support.py): a cosine is within (D + 4) eps32 / 2 of itself whatever the
# summation order (its products' magnitudes sum to at most the norms' product), 1 / TAU times that as a logit; the
# loss's own log-sum-exp over up to 3N logits and mean over N rows, on the logits' scale 1 / TAU.
LOGIT_ATOL = (D + 4) * EPS32 / 2 / TAU
LOSS_ROUNDINGS = 3 * N + 4 + N


def loss_atol(loss, evaluations: int = 2) -> float:
  """Two float32 losses of the same vectors (`evaluations` 1: one against float64's)."""
  return evaluations * cross_entropy_atol(loss, LOGIT_ATOL) + float32_atol(1 / TAU, LOSS_ROUNDINGS, evaluations)


def gradient_atol(expected) -> float:
  """Two float32 gradients of the loss in the vectors: on the scale of their largest entry over TAU (a softmax's
  rounding, from logits 1 / TAU times the cosines', enters each term), the loss's roundings and the cosines' back."""
  return float32_atol(np.abs(expected).max() / TAU, 2 * (LOSS_ROUNDINGS + D + 4))


def embeddings(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """z1, z2, z3 [N, D] float32; z2 = z1 + noise so that the positives stand out, as after some training."""
  rng = np.random.default_rng(seed)
  z1, noise, z3 = rng.normal(size=(3, N, D)).astype(np.float32)
  return z1, z1 + noise, z3


# NumPy, float64, term by term as the papers write the equations.
def np_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  a, b = a.astype(np.float64), b.astype(np.float64)
  norm = lambda x: np.maximum(np.linalg.norm(x, axis=1), 1e-8)
  return a @ b.T / np.outer(norm(a), norm(b))


def np_info_nce(z1, z2, z3, tau):
  del z3
  a = np.exp(np_cos(z1, z2) / tau)
  return np.mean([-np.log(a[i, i] / a[i].sum()) for i in range(len(z1))])


def np_hard_negatives(z1, z2, z3, tau, weight=0.0):
  positive, negative = np.exp(np_cos(z1, z2) / tau), np.exp(np_cos(z1, z3) / tau)
  alpha = np.where(np.eye(len(z1)), np.exp(weight), 1.0)
  return np.mean([-np.log(positive[i, i] / (positive[i].sum() + (alpha * negative)[i].sum())) for i in range(len(z1))])


def np_extended(z1, z2, z3, tau):
  a_pos, a_neg, a_pos_neg = (np.exp(np_cos(x, y) / tau) for x, y in ((z1, z2), (z1, z3), (z2, z3)))
  return np.mean([-np.log(a_pos[i, i] / (a_pos[i] + a_neg[i] + a_pos_neg[i]).sum()) for i in range(len(z1))])


# PyTorch, float32, the computation of the reference `cl_forward`s: `Similarity` (nn.CosineSimilarity(dim=-1) / temp)
# on broadcast [n, 1, d] x [1, m, d], blocks concatenated on dim 1, SimCSE's weight on the z3 block's diagonal,
# nn.CrossEntropyLoss with labels arange(n).
def torch_similarity(x, y, temp):
  return torch.nn.CosineSimilarity(dim=-1)(x.unsqueeze(1), y.unsqueeze(0)) / temp


def torch_reference(z1, z2, z3, temp, objective, weight=0.0):
  cos_sim = torch_similarity(z1, z2, temp)
  if objective == "hard_negatives":  # SimCSE and Prompt-BERT `prompt_bert/models.py`.
    cos_sim = torch.cat([cos_sim, torch_similarity(z1, z3, temp)], 1)
    rows = torch.arange(len(z1))
    weights = torch.zeros_like(cos_sim).index_put((rows, len(z2) + rows), torch.tensor(weight, dtype=cos_sim.dtype))
    cos_sim = cos_sim + weights
  elif objective == "extended":  # CoT-BERT `models.py`, num_sent == 3.
    cos_sim = torch.cat([cos_sim, torch_similarity(z1, z3, temp), torch_similarity(z2, z3, temp)], 1)
  return torch.nn.CrossEntropyLoss()(cos_sim, torch.arange(cos_sim.size(0)).long())


OBJECTIVES = {  # name: (jax loss of (z1, z2, z3), NumPy loss of (z1, z2, z3), torch objective, hard-negative weight)
  "info_nce": (lambda z1, z2, z3: losses.info_nce(z1, z2, TAU), np_info_nce, "info_nce", 0.0),
  "hard_negatives": (
    lambda z1, z2, z3: losses.info_nce_with_hard_negatives(z1, z2, z3, TAU),
    np_hard_negatives,
    "hard_negatives",
    0.0,
  ),
  "hard_negatives_weighted": (
    lambda z1, z2, z3: losses.info_nce_with_hard_negatives(z1, z2, z3, TAU, 0.7),
    lambda z1, z2, z3, tau: np_hard_negatives(z1, z2, z3, tau, 0.7),
    "hard_negatives",
    0.7,
  ),
  "extended": (lambda z1, z2, z3: losses.extended_info_nce(z1, z2, z3, TAU), np_extended, "extended", 0.0),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_loss_matches_numpy_equation(name, seed):
  loss_fn, np_fn, _, _ = OBJECTIVES[name]
  z = embeddings(seed)
  expected = np_fn(*z, TAU)
  np.testing.assert_allclose(loss_fn(*z), expected, rtol=0, atol=loss_atol(expected, evaluations=1))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_loss_and_gradients_match_torch_reference(name, seed):
  loss_fn, _, objective, weight = OBJECTIVES[name]
  z = embeddings(seed)
  tz = [torch.tensor(x, requires_grad=True) for x in z]
  expected = torch_reference(*tz, TAU, objective, weight)
  expected.backward()
  loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2))(*map(jnp.asarray, z))
  np.testing.assert_allclose(loss, expected.item(), rtol=0, atol=loss_atol(expected.item()))
  for grad, t in zip(grads, tz):
    expected_grad = np.zeros(t.shape) if t.grad is None else t.grad.numpy()  # info_nce does not read z3.
    np.testing.assert_allclose(grad, expected_grad, rtol=0, atol=gradient_atol(expected_grad))


def np_diagonal_cross_entropy(logits: np.ndarray) -> tuple[float, np.ndarray]:
  """In float64, mean_i (logsumexp_j x_ij - x_ii) of float32 logits x and its gradient (softmax(x) - [i = j]) / n."""
  x = logits.astype(np.float64)
  n = len(x)
  top = x.max(axis=1, keepdims=True)
  logsumexp = top[:, 0] + np.log(np.exp(x - top).sum(axis=1))
  grad = np.exp(x - logsumexp[:, None]) - np.eye(n, x.shape[1])
  return float(np.mean(logsumexp - np.diag(x[:, :n]))), grad / n


def near_trained_logits(n: int, k: int, seed: int) -> np.ndarray:
  """float32 [n, k n] logits cos / TAU of a trained model: positives at cosine 0.99-1.0, the others at 0.3-0.7."""
  rng = np.random.default_rng(seed)
  cos = rng.uniform(0.3, 0.7, size=(n, k * n)).astype(np.float32)
  cos[np.arange(n), np.arange(n)] = rng.uniform(0.99, 1.0, size=n)
  return cos / np.float32(TAU)


@pytest.mark.parametrize("n,k", [(64, 1), (64, 3), (256, 1), (256, 3)])
def test_near_trained_loss_and_gradient_match_float64(n, k):
  """A trained model's small loss (0.02 at 64 x 64, 0.23 at 256 x 768) to 1e-6 of itself, its gradient to 2e-6.

  Relative errors, worst over seeds 0-9 for (64, 64), (64, 192), (256, 256), (256, 768): logsumexp - positive, the
  former formula, loss 5.9e-6, 2.0e-6, 9.1e-7, 3.0e-7 and gradient 1.6e-5, 5.3e-6, 4.4e-6, 1.4e-6 (the positives'
  softmax - 1), so it fails one bound or both except at 256 x 768, where the loss is largest; a plain log-softmax loss
  1.1e-6, 4.1e-7, 1.4e-7, 4.9e-8; diagonal_cross_entropy's loss 2.2e-7, 1.8e-7, 8.2e-8, 8.0e-8 and gradient 5.7e-7,
  3.7e-7, 3.8e-7, 4.2e-7. No float32 formula gets each gradient entry much closer: e^{x_ij - c} of a float32 difference
  x_ij - c of up to 14 (logits 6-20) is off by up to 14 eps32 / 2 = 8e-7.
  """
  logits = near_trained_logits(n, k, seed=0)
  expected_loss, expected_grad = np_diagonal_cross_entropy(logits)
  loss, grad = jax.jit(jax.value_and_grad(losses.diagonal_cross_entropy))(logits)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6, atol=0)
  np.testing.assert_allclose(grad, expected_grad, rtol=2e-6, atol=0)


def test_loss_and_gradient_match_float64_whichever_logit_is_largest():
  """Rows where the positive is the largest logit, is not, ties with others, or is 100 above or below the rest (where
  e^{x_ij - x_ii} would overflow): float64's loss and gradient, finite; a single column (a batch of one) gives 0."""
  rng = np.random.default_rng(0)
  logits = rng.normal(scale=5, size=(N, 3 * N)).astype(np.float32)  # Cosines / TAU span +-20.
  logits[0, 0] = logits[0].max() + 1  # The positive is the largest.
  logits[1, 1] = logits[1].min()  # The positive is not.
  logits[2] = 7  # Every logit ties.
  logits[3, [3, 5, N + 3]] = logits[3].max() + 1  # The positive ties with two negatives at the top.
  logits[4, 4] = logits[4].max() + 100
  logits[5, 5] = logits[5].min() - 100
  expected_loss, expected_grad = np_diagonal_cross_entropy(logits)
  loss, grad = jax.jit(jax.value_and_grad(losses.diagonal_cross_entropy))(logits)
  assert np.isfinite(grad).all()
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6, atol=0)
  # Differences up to ~40 between the random logits carry up to 40 eps32 / 2 = 2.4e-6 into e^{x_ij - c} (measured:
  # 1.3e-6); row 4's negatives, e^-100 / N, are below float32's range.
  np.testing.assert_allclose(grad, expected_grad, rtol=5e-6, atol=1e-40)
  np.testing.assert_allclose(grad[2], (1 / (3 * N) - np.eye(N, 3 * N)[2]) / N, rtol=1e-6)
  single, single_grad = jax.value_and_grad(losses.diagonal_cross_entropy)(np.full((1, 1), 3.0, np.float32))
  assert single == 0 and single_grad == 0


def test_cosine_similarity_matrix_matches_torch_including_tiny_and_zero_rows():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(5, D)).astype(np.float32), rng.normal(size=(3, D)).astype(np.float32)
  a[1] *= 1e-9  # Norms below eps: torch clamps each norm, so these rows come out scaled down, not unit.
  a[2] = 0
  b[0] *= 1e-5
  expected = torch.nn.CosineSimilarity(dim=-1)(torch.tensor(a)[:, None], torch.tensor(b)[None]).numpy()
  got = losses.cosine_similarity_matrix(jnp.asarray(a), jnp.asarray(b))
  assert got.shape == (5, 3) and got.dtype == jnp.float32
  # Each side within (D + 5) eps32 / 2 of the exact cosine (products' magnitudes sum to at most the norms' product;
  # the norms, their product, the quotient; torch's clamped norms scale the small rows down, not up).
  np.testing.assert_allclose(got, expected, rtol=0, atol=(D + 5) * EPS32)


def test_extended_info_nce_keeps_the_positive_negative_diagonal():
  # z1_i = e_i, z2_i = (e_i + f_i) / sqrt(2), z3_i = f_i with e, f disjoint one-hots: cos(z1_i, z2_i) = cos(z2_i, z3_i)
  # = c and every other cosine is 0, so the denominator holds e^{c / tau} twice and 3n - 2 ones; masking the z2.z3
  # diagonal would remove one e^{c / tau}.
  e, f = np.eye(N, 2 * N, dtype=np.float32), np.eye(N, 2 * N, k=N, dtype=np.float32)
  big = math.exp(2**-0.5 / TAU)
  expected = -math.log(big / (2 * big + 3 * N - 2))
  np.testing.assert_allclose(losses.extended_info_nce(e, e + f, f, TAU), expected, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_matching_rows_give_near_zero_loss_and_shuffled_rows_do_not(name):
  loss_fn = OBJECTIVES[name][0]
  z1 = 3 * np.eye(N, D, dtype=np.float32)  # Orthogonal rows: cos is 1 with the own row and 0 with the others.
  z3 = -z1  # Hard negatives are opposite to their own anchor and positive.
  low = jax.jit(loss_fn)(z1, z1, z3)
  high = jax.jit(loss_fn)(z1, np.roll(z1, 1, axis=0), z3)
  assert low < 1e-6
  assert high > 10


def test_contrastive_accuracy():
  z1 = np.eye(N, D, dtype=np.float32)
  assert losses.contrastive_accuracy(losses.info_nce_logits(z1, z1)) == 1
  assert losses.contrastive_accuracy(losses.extended_info_nce_logits(z1, np.roll(z1, 1, axis=0), -z1)) == 0
  # Rows 0 and 1 swapped: the other N - 2 rows still find their positive.
  swapped = z1[[1, 0, *range(2, N)]]
  assert losses.contrastive_accuracy(losses.hard_negative_logits(z1, swapped, -z1)) == (N - 2) / N


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_jit_gradients_finite_even_with_a_zero_row(name):
  loss_fn, _, objective, weight = OBJECTIVES[name]
  z1, z2, z3 = embeddings(0)
  z1[3] = 0
  z3[5] = 0
  grads = jax.jit(jax.grad(loss_fn, argnums=(0, 1, 2)))(z1, z2, z3)
  eager = jax.grad(loss_fn, argnums=(0, 1, 2))(z1, z2, z3)
  tz = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (z1, z2, z3)]
  torch_reference(*tz, TAU, objective, weight).backward()
  for grad, eager_grad, t, zero_row in zip(grads, eager, tz, (3, None, 5)):
    grad, eager_grad = np.asarray(grad), np.asarray(eager_grad)
    assert np.isfinite(grad).all()
    rest = np.arange(N) != zero_row
    np.testing.assert_allclose(grad[rest], eager_grad[rest], rtol=0, atol=gradient_atol(eager_grad[rest]))
    if zero_row is None:
      continue
    # A zero row's gradient is 1 / eps = 1e8 times sum_j dL/dcos_ij unit(b_j), a sum that cancels, so an entry's float32
    # value is off by a rounding of the terms, not of itself, and the order of summation (vector width, YNNPACK's
    # kernels) differs by CPU: jit and eager need not agree to rtol 1e-5. Checked instead against float64 (torch, which
    # also passes no gradient through a clamped norm) relative to the row's largest entry: the dL/dcos come from logits
    # up to 1 / tau = 20, so they carry ~eps32 / tau, and the terms sum to at most 2.2 times the largest entry.
    # Measured over 100 seeds, native (AVX-512) and under --xla_cpu_max_isa=AVX2 or SSE4_2: at most 1.3 eps32 / tau.
    # 8 eps32 / tau (1.9e-5) leaves a margin of 6; a wrong formula (no 1 / tau, a clamped product) is off by O(1).
    expected = np.zeros(D) if t.grad is None else t.grad.numpy()[zero_row]  # info_nce does not read z3.
    atol = 8 * np.finfo(np.float32).eps / TAU * np.abs(expected).max()
    np.testing.assert_allclose(grad[zero_row], expected, rtol=0, atol=atol)
    np.testing.assert_allclose(eager_grad[zero_row], expected, rtol=0, atol=atol)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_bfloat16_inputs_give_a_float32_loss(name):
  loss_fn = OBJECTIVES[name][0]
  z16 = [jnp.asarray(x, jnp.bfloat16) for x in embeddings(0)]
  loss = jax.jit(loss_fn)(*z16)
  assert loss.dtype == jnp.float32
  # The same as the float32 loss of the rounded values: nothing after the cast runs in bfloat16.
  expected = loss_fn(*(x.astype(jnp.float32) for x in z16))
  np.testing.assert_allclose(loss, expected, rtol=0, atol=loss_atol(expected))  # bfloat16's steps are 2^16 eps32.
  grads = jax.grad(loss_fn, argnums=(0, 1, 2))(*z16)
  assert all(g.dtype == jnp.bfloat16 and jnp.isfinite(g.astype(jnp.float32)).all() for g in grads)


_SHARDED_SCRIPT = textwrap.dedent("""
    import json
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec
    from jaxemb import losses

    def everything(z1, z2, z3):  # Every loss with its gradients, and an accuracy: one compilation per layout.
      fns = {
          "info_nce": lambda z1, z2, z3: losses.info_nce(z1, z2),
          "hard_negatives": lambda z1, z2, z3: losses.info_nce_with_hard_negatives(z1, z2, z3, 0.05, 0.7),
          "extended": losses.extended_info_nce,
      }
      out = {name: jax.value_and_grad(fn, argnums=(0, 1, 2))(z1, z2, z3) for name, fn in fns.items()}
      out["accuracy"] = losses.contrastive_accuracy(losses.extended_info_nce_logits(z1, z2, z3))
      return out

    # The trainer's layout (Auto axes, the batch split over both axes of a data x fsdp mesh) and jax.make_mesh's
    # Explicit axes, where shardings are part of the types.
    meshes = {
        "auto": (jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2), ("data", "fsdp")),
        "explicit": (jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,)), "batch"),
    }
    rng = np.random.default_rng(0)
    z1, noise, z3 = rng.normal(size=(3, 64, 16))
    z = [jnp.asarray(x, jnp.float32) for x in (z1, z1 + noise, z3)]
    step = jax.jit(everything)
    full = step(*z)
    results = {"devices": jax.device_count()}
    for mesh_name, (mesh, batch_axes) in meshes.items():
      sharded = [jax.device_put(x, NamedSharding(mesh, PartitionSpec(batch_axes))) for x in z]
      compiled = step.lower(*sharded).compile()
      split, hlo = compiled(*sharded), compiled.as_text()
      results[mesh_name] = {
          "shards": [len(x.addressable_shards) for x in sharded],
          "collectives": any(op in hlo for op in ("all-gather", "all-reduce", "collective-permute", "all-to-all")),
          "max_diff": {name: max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(full[name]),
                                                                            jax.tree.leaves(split[name])))
                       for name in full},
      }
    print(json.dumps(results))
""")


def test_sharded_batch_gives_the_global_loss():
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip(),
  }
  done = subprocess.run(
    [sys.executable, "-c", _SHARDED_SCRIPT], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
  )
  assert done.returncode == 0, done.stderr
  results = json.loads(done.stdout.strip().splitlines()[-1])
  assert results.pop("devices") == 8
  for mesh_name, result in results.items():
    assert result["shards"] == [8, 8, 8], mesh_name
    assert result["collectives"], mesh_name
    # Losses, gradients and accuracy; a per-device loss (8 rows against 8) would be far off the 64 x 64 one.
    assert max(result["max_diff"].values()) <= 1e-6, (mesh_name, result)
