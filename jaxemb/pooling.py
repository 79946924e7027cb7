"""Sentence vectors from encoder outputs: every learning-free method of the papers, one small pure function each.

Means run over the attention mask and so include [CLS] and [SEP] (as SimCSE and BERT-whitening do).
`hidden_states[0]` is the embedding-layer output h0 (what Ditto and BERT-whitening call "first"; for ELECTRA the
projected one, HF's hidden_states[0]);
`hidden_states[1]` is the first transformer layer (what SimCSE's `avg_first_last` uses).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxemb.errors import ConfigError
from jaxemb.models.bert import EncoderOutput


def masked_mean(x: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """Mean over the tokens where attention_mask is 1: [batch, length, hidden] -> [batch, hidden]."""
  weights = attention_mask.astype(x.dtype)[..., None]
  return (x * weights).sum(1) / jnp.maximum(weights.sum(1), 1)


def cls_before_pooler(out: EncoderOutput) -> jax.Array:
  """The last-layer [CLS] state."""
  return out.last_hidden_state[:, 0]


def last_avg(out: EncoderOutput, attention_mask: jax.Array) -> jax.Array:
  return masked_mean(out.last_hidden_state, attention_mask)


def first_last_avg(out: EncoderOutput, attention_mask: jax.Array) -> jax.Array:
  """(h0 + hL) / 2 averaged over tokens, h0 the embedding output (BERT-whitening, Ditto, PromptBERT Table 5)."""
  return masked_mean((out.hidden_states[0] + out.hidden_states[-1]) / 2, attention_mask)


def first_layer_last_avg(out: EncoderOutput, attention_mask: jax.Array) -> jax.Array:
  """(h1 + hL) / 2 averaged over tokens, h1 the first transformer layer: SimCSE's `avg_first_last`."""
  return masked_mean((out.hidden_states[1] + out.hidden_states[-1]) / 2, attention_mask)


def top2_avg(out: EncoderOutput, attention_mask: jax.Array) -> jax.Array:
  """The last two layers averaged over tokens (SimCSE's `avg_top2`)."""
  return masked_mean((out.hidden_states[-2] + out.hidden_states[-1]) / 2, attention_mask)


def static_avg(word_embeddings: jax.Array, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """Mean of the word-embedding rows only: no position/type embeddings, no LayerNorm, no encoder pass (and no
  ELECTRA projection: the vectors are as wide as the rows)."""
  return masked_mean(word_embeddings[input_ids], attention_mask)


def static_sentence_avg(word_embeddings: jax.Array, input_ids: jax.Array, sentence_lengths: jax.Array) -> jax.Array:
  """`static_avg` over the sentence tokens of rows `[CLS] sentence [SEP]` only: [CLS] and [SEP] excluded."""
  positions = jnp.arange(input_ids.shape[1])
  return static_avg(word_embeddings, input_ids, (positions >= 1) & (positions <= sentence_lengths[:, None]))


def mlm_top_k(mask_logits: jax.Array, word_embeddings: jax.Array, k: int) -> jax.Array:
  """PromptBERT Eq. 3: the static embeddings of the k tokens the MLM head ranks highest at [MASK], averaged
  with their probabilities renormalised over those k."""
  probs = jax.nn.softmax(mask_logits.astype(jnp.float32), axis=-1)
  top_probs, top_ids = jax.lax.top_k(probs, k)
  weights = top_probs / top_probs.sum(-1, keepdims=True)
  return jnp.einsum("bk,bkh->bh", weights, word_embeddings[top_ids].astype(jnp.float32))


# Which token vectors Ditto weights: (h0 + hL) / 2, hL, the raw word embeddings (the authors' "static":
# `word_embeddings(input_ids)`, no position/type embeddings or LayerNorm), or h0, the embedding-layer output.
DITTO_VARIANTS = ("first_last", "last", "static", "embedding_output")


def diagonal_attention(out: EncoderOutput, layer: int) -> jax.Array:
  """Ditto §2 Observation 2: each token's attention to itself, A_ii, for every head of `layer`:
  [batch, heads, length]. Needs `output_attentions` to include `layer`."""
  return jnp.diagonal(out.attentions[layer], axis1=-2, axis2=-1)


def ditto_all_heads(
  out: EncoderOutput, attention_mask: jax.Array, layer: int, variant: str, word_vectors: jax.Array | None = None
) -> jax.Array:
  """Ditto for every head of `layer` at once: [batch, heads, hidden] (the head search scores them all).

  Each vector is the token vectors weighted by the diagonal of that head's attention matrix, summed (not
  averaged). `variant` (one of DITTO_VARIANTS) picks the vectors; "static" reads `word_vectors`, the rows' raw
  word embeddings [batch, length, embedding width] (ELECTRA's unprojected). Needs `output_attentions=(layer,)`
  and, for first_last and embedding_output, `output_hidden_states=True`.
  """
  diagonals = diagonal_attention(out, layer)
  if variant == "first_last":
    states = (out.hidden_states[0] + out.hidden_states[-1]) / 2
  elif variant == "last":
    states = out.last_hidden_state
  elif variant == "static":
    states = word_vectors.astype(out.last_hidden_state.dtype)
  elif variant == "embedding_output":
    states = out.hidden_states[0]
  else:
    raise ConfigError(f"Ditto variant {variant!r} is not one of {DITTO_VARIANTS}")
  weights = (diagonals * attention_mask[:, None, :]).astype(states.dtype)
  return jnp.einsum("bnt,bth->bnh", weights, states)


def tfidf_first_last(out: EncoderOutput, attention_mask: jax.Array, token_weights: jax.Array) -> jax.Array:
  """Ditto Table 1's first-last TF-IDF: (h0 + hL) / 2 weighted by each token's IDF and summed, as Ditto sums.

  Summing over positions gives a token that occurs n times n x IDF in all: the TF factor. Dividing by the weight total
  or L2-normalising the weights (gensim) would only rescale each vector, which cosine similarity ignores.
  """
  states = (out.hidden_states[0] + out.hidden_states[-1]) / 2
  return jnp.einsum("bt,bth->bh", (token_weights * attention_mask).astype(states.dtype), states)
