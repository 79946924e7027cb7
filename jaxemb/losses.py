"""Contrastive losses of SimCSE, PromptBERT and CoT-BERT on sentence embeddings (PromptBERT §4.3, CoT-BERT §3.2;
SimCSE, Gao et al. 2021, §3-4).

Each loss is a cross-entropy over rows of cosine logits in which row i's label is column i, as the reference
`cl_forward`s write it (`Similarity` = `nn.CosineSimilarity(dim=-1)` / temp, `nn.CrossEntropyLoss`, `labels =
arange(n)`; princeton-nlp/SimCSE `simcse/models.py`, kongds/Prompt-BERT `prompt_bert/models.py`, ZBWpro/CoT-BERT
`models.py`). Each `*_logits` function builds one objective's logits, so a training step can report
`contrastive_accuracy` from the same array it takes the loss of.

The arguments are the global batch. Under jit with the batch axis sharded over a mesh, XLA moves what each shard needs,
so every anchor is contrasted with every row of the batch (the reference all-gathers for the same reason) and there is
no per-device loss. The math is float32 for float32, bfloat16 and float16 inputs, and float64 for float64 ones, with
which tests compute references where float32's rounding is the question.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxemb.models.config import at_least_float32

Temperature = float | jax.Array


def cosine_similarity_matrix(a: jax.Array, b: jax.Array, eps: float = 1e-8) -> jax.Array:
  """cos(a_i, b_j) = a_i . b_j / (max(||a_i||, eps) max(||b_j||, eps)): [n, d] x [m, d] -> float32 (at least) [n, m].

  This is what torch.nn.CosineSimilarity computes: ATen clamps each norm, not their product as the module's docstring
  (max(||a|| ||b||, eps)) says; the two differ only for norms below eps.
  """

  def unit_rows(x: jax.Array) -> jax.Array:
    x = at_least_float32(x)
    # rsqrt(max(||x||^2, eps^2)) = 1 / max(||x||, eps) with a finite gradient at a zero row, where sqrt's infinite
    # one gives NaN even behind a clamp (below eps no gradient goes through the norm; torch's still does).
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), eps**2))

  # Under a mesh with Explicit axes a product of two batch-sharded operands has no legal sharding unless told one: keep
  # a's rows where they are and gather all of b (as the reference's all_gather does). Auto axes leave this to XLA.
  sharding = jax.typeof(a).sharding
  rows = sharding.spec[0] if sharding.spec else None
  out_sharding = None if rows is None else sharding.update(spec=jax.sharding.PartitionSpec(rows, None))
  # HIGHEST: by default GPUs and TPUs multiply float32 in reduced-precision passes; on an H100 that is off by up to 5e-5
  # in a cosine of 768-d rows, 1e-3 in a logit at tau = 0.05 (HIGHEST: 5e-8).
  return jnp.matmul(unit_rows(a), unit_rows(b).T, precision=jax.lax.Precision.HIGHEST, out_sharding=out_sharding)


def diagonal_cross_entropy(logits: jax.Array) -> jax.Array:
  """mean_i -log softmax(x_i)_i of logits x, row i's label column i: [n, k n] -> (), computed against the positives.

  Row i's loss logsumexp_j x_ij - x_ii = log(1 + sum_{j != i} e^{x_ij - x_ii}) = softplus(r_i), with r_i =
  logsumexp_{j != i} x_ij - x_ii. Computed as logsumexp - x_ii, a trained model's loss (0.02 at 1 / tau = 20) is the
  difference of two float32 numbers near 20, each rounded by ~1e-6, and loses 1e-5 of itself (a log-softmax, which
  rounds 1 + 0.02, 1e-6). softplus(r) = log1p(e^r) turns an absolute error in r into the same relative error in the
  loss, and r is of the size of log(loss) (-4), not of the logits: r_i = (m_i - x_ii) + log sum_{j != i} e^{x_ij - m_i},
  m_i = max_{j != i} x_ij, a sum of terms at most 1 and at least 1 in all whether the positive is its row's largest
  logit, is not, or ties; jax.nn.softplus is stable for r of either sign. Autodiff of this form gives the same gradient,
  (softmax - [i = j]) / n, with dl_i/dx_ii = -sigmoid(r_i) computed directly rather than as softmax_ii - 1; m_i, on
  which r does not depend, is held constant, as jax.nn.logsumexp holds its max.
  """
  logits = at_least_float32(logits)
  n, width = logits.shape
  if width == 1:  # One sentence and no negatives: the loss is 0 (m_i would be max of nothing, -inf).
    return jnp.zeros((), logits.dtype)
  # The positive by a mask rather than a gather: the gather's gradient is a scatter that Explicit mesh axes cannot
  # shard without being told how, while elementwise selects keep the batch sharding.
  diagonal = jnp.eye(n, width, dtype=bool)
  positives = jnp.sum(jnp.where(diagonal, logits, 0), axis=1)
  negatives = jnp.where(diagonal, -jnp.inf, logits)
  shift = jax.lax.stop_gradient(jnp.max(negatives, axis=1))
  r = (shift - positives) + jnp.log(jnp.sum(jnp.exp(negatives - shift[:, None]), axis=1))
  return jnp.mean(jax.nn.softplus(r))


def contrastive_accuracy(logits: jax.Array) -> jax.Array:
  """The fraction of rows i whose largest logit is column i, their positive."""
  return jnp.mean(jnp.argmax(logits, axis=-1) == jnp.arange(logits.shape[0]))


def info_nce_logits(z1: jax.Array, z2: jax.Array, temperature: Temperature = 0.05) -> jax.Array:
  """s_ij = cos(z1_i, z2_j) / tau: [n, n], the positives on the diagonal."""
  return cosine_similarity_matrix(z1, z2) / temperature


def info_nce(z1: jax.Array, z2: jax.Array, temperature: Temperature = 0.05) -> jax.Array:
  """InfoNCE: mean over i of l_i = -log e^{cos(z1_i, z2_i) / tau} / sum_j e^{cos(z1_i, z2_j) / tau}.

  PromptBERT's unsupervised objective (its Eq. 4, z1 and z2 the two templates' denoised vectors h - h_hat; the code
  also passes them through the training-only dense + tanh MLP first), CoT-BERT's Eq. 1 and unsupervised SimCSE (z1 and
  z2 the same sentences under two dropout masks).
  """
  return diagonal_cross_entropy(info_nce_logits(z1, z2, temperature))


def hard_negative_logits(
  z1: jax.Array,
  z2: jax.Array,
  z3: jax.Array,
  temperature: Temperature = 0.05,
  hard_negative_weight: float | jax.Array = 0.0,
) -> jax.Array:
  """[cos(z1_i, z2_j) / tau | cos(z1_i, z3_j) / tau + w [i = j]]: [n, 2n].

  w, SimCSE's `hard_negative_weight`, is added to the z3 block's diagonal after the division by tau, so it is the log
  of the weight alpha that multiplies exp(cos(z1_i, z3_i) / tau) in the denominator (0: every term weighs 1).
  """
  negatives = cosine_similarity_matrix(z1, z3) / temperature + hard_negative_weight * jnp.eye(len(z1), len(z3))
  return jnp.concatenate([info_nce_logits(z1, z2, temperature), negatives], axis=1)


def info_nce_with_hard_negatives(
  z1: jax.Array,
  z2: jax.Array,
  z3: jax.Array,
  temperature: Temperature = 0.05,
  hard_negative_weight: float | jax.Array = 0.0,
) -> jax.Array:
  """InfoNCE with hard negatives, the supervised SimCSE and PromptBERT loss.

  Mean over i of l_i = -log e^{cos(z1_i, z2_i) / tau} / sum_j (e^{cos(z1_i, z2_j) / tau} + alpha^[i = j] e^{cos(z1_i,
  z3_j) / tau}), alpha = e^hard_negative_weight; z1 premise, z2 entailment (positive), z3 contradiction (hard negative).
  """
  return diagonal_cross_entropy(hard_negative_logits(z1, z2, z3, temperature, hard_negative_weight))


def extended_info_nce_logits(z1: jax.Array, z2: jax.Array, z3: jax.Array, temperature: Temperature = 0.05) -> jax.Array:
  """[cos(z1_i, z2_j) | cos(z1_i, z3_j) | cos(z2_i, z3_j)] / tau: [n, 3n].

  The z2.z3 block keeps its diagonal cos(z2_i, z3_i), as in CoT-BERT's code and its Eq. 3, where j runs over 1..N.
  """
  return (
    jnp.concatenate(
      [cosine_similarity_matrix(z1, z2), cosine_similarity_matrix(z1, z3), cosine_similarity_matrix(z2, z3)], axis=1
    )
    / temperature
  )


def extended_info_nce(z1: jax.Array, z2: jax.Array, z3: jax.Array, temperature: Temperature = 0.05) -> jax.Array:
  """CoT-BERT's extended InfoNCE (Eq. 2-3): mean over i of l_i = -log a_ii+ / sum_j (a_ij+ + a_ij- + a_i+j-).

  a_ij+ = e^{cos(z1_i, z2_j) / tau}, a_ij- = e^{cos(z1_i, z3_j) / tau}, a_i+j- = e^{cos(z2_i, z3_j) / tau}; z1 anchor,
  z2 positive, z3 the negation template's hard negative. Only z1 rows are anchors and no weight is put on any term.
  """
  return diagonal_cross_entropy(extended_info_nce_logits(z1, z2, z3, temperature))
