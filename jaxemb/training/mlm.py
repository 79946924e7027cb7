"""Masked language modelling, BERT's pre-training objective (PromptBERT App. A.2 pre-trains with it): which tokens
of a batch are masked and how, and the cross-entropy of the MLM head on them. Both run inside the jitted step, the
masks drawn from the step's rng.

The masking is Hugging Face's `DataCollatorForLanguageModeling` (what `run_mlm.py` trains with;
huggingface/transformers `src/transformers/data/data_collator.py`, `torch_mask_tokens`): each sentence token is
selected with probability 0.15; a selected token becomes [MASK] with probability 0.8, a token drawn uniformly from
the vocabulary with 0.1, and stays itself with 0.1. [CLS], [SEP], template tokens and padding are never selected.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from jaxemb import templates

SELECT_RATE = 0.15  # The share of sentence tokens the loss predicts.
MASK_RATE = 0.8  # Of those: replaced by [MASK] ...
RANDOM_RATE = 0.1  # ... or by a random token; the rest are kept.


def maskable(rows: templates.TemplateBatch, template: templates.Template) -> jax.Array:
  """[B, L] bool: the positions of the sentence's own tokens (after [CLS] and the template's prefix)."""
  start = 1 + len(template.prefix_ids)
  positions = jnp.arange(rows.input_ids.shape[1])[None, :]
  return (positions >= start) & (positions < start + rows.sentence_lengths[:, None])


def mask_tokens(rng: jax.Array, input_ids: jax.Array, maskable_positions: jax.Array, mask_id: int,
                vocab_size: int) -> tuple[jax.Array, jax.Array]:
  """(corrupted input ids, [B, L] bool of the selected positions, whose original ids the loss predicts)."""
  select_key, kind_key, random_key = jax.random.split(rng, 3)
  selected = maskable_positions & jax.random.bernoulli(select_key, SELECT_RATE, input_ids.shape)
  kind = jax.random.uniform(kind_key, input_ids.shape)
  random_ids = jax.random.randint(random_key, input_ids.shape, 0, vocab_size, input_ids.dtype)
  ids = jnp.where(selected & (kind < MASK_RATE), mask_id, input_ids)
  ids = jnp.where(selected & (kind >= MASK_RATE) & (kind < MASK_RATE + RANDOM_RATE), random_ids, ids)
  return ids, selected


def prediction_slots(num_tokens: int) -> int:
  """How many selected positions of a batch of `num_tokens` positions the loss decodes: twice the expected number
  (a batch selects more with a vanishing probability, and the loss then leaves the extra ones out), so the
  vocabulary logits are computed for a fraction of the positions."""
  return min(num_tokens, math.ceil(2 * SELECT_RATE * num_tokens) + 16)


def masked_lm_loss(mlm_logits: Callable[[jax.Array], jax.Array], hidden: jax.Array, targets: jax.Array,
                   selected: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(mean cross-entropy, accuracy) of the MLM head's predictions of `targets` at the `selected` positions.

  Args:
    mlm_logits: hidden states [N, hidden] -> vocabulary logits [N, vocab] (the MLM head).
    hidden: [B, L, hidden] last hidden states of the corrupted batch.
    targets: [B, L] the original ids.
    selected: [B, L] bool, the positions to predict.
  """
  flat = selected.reshape(-1)
  slots = prediction_slots(flat.shape[0])
  (index,) = jnp.nonzero(flat, size=slots, fill_value=0)
  valid = jnp.arange(slots) < flat.sum()
  logits = mlm_logits(hidden.reshape(-1, hidden.shape[-1])[index]).astype(jnp.float32)
  labels = targets.reshape(-1)[index]
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)[:, 0]
  count = jnp.maximum(valid.sum(), 1)
  loss = jnp.where(valid, nll, 0).sum() / count
  accuracy = jnp.where(valid, jnp.argmax(logits, -1) == labels, False).sum() / count
  return loss, accuracy
