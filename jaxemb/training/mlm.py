"""Masked language modelling, BERT's pre-training objective (PromptBERT App. A.2 pre-trains with it): which tokens
of a batch are masked and how, and the cross-entropy of the MLM head on them. Both run inside the jitted step, the
masks drawn from the step's rng.

The masking is Hugging Face's `DataCollatorForLanguageModeling` (what `run_mlm.py` trains with;
huggingface/transformers `src/transformers/data/data_collator.py`, `torch_mask_tokens`): each sentence token is
selected with probability 0.15; a selected token becomes [MASK] with probability 0.8, a token drawn uniformly from
the vocabulary with 0.1, and stays itself with 0.1. [CLS], [SEP], template tokens and padding are never selected.
With whole-word masking (`WordStarts`, `select_words`) a word is selected, and all its pieces with it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxemb import templates
from jaxemb.errors import ConfigError

SELECT_RATE = 0.15  # The share of sentence tokens the loss predicts.
MASK_RATE = 0.8  # Of those: replaced by [MASK] ...
RANDOM_RATE = 0.1  # ... or by a random token; the rest are kept.
BYTE_LEVEL_WORD_START = "\u0120"  # "Ġ", RoBERTa's byte-level BPE pieces after a space.


@dataclasses.dataclass(frozen=True)
class WordStarts:
  """Which vocabulary ids begin a word, for whole-word masking: a [vocab] bool table computed once on the host,
  bits packed so that the Objective holding it stays hashable (a static argument of the jitted step).

  WordPiece pieces begin a word unless they start with its continuation prefix, "##"; RoBERTa's byte-level pieces
  begin one when they start with "Ġ" (a space before them), the others continue the piece before them. A sentence's
  first token always begins a word (`select_words`): RoBERTa's has no "Ġ" when the sentence is tokenised alone.
  """

  packed: bytes
  size: int

  @classmethod
  def from_tokenizer(cls, tokenizer: Any) -> WordStarts:
    """The table of a Hugging Face tokenizer's vocabulary, by its kind (its backend's model and pre-tokenizer: a
    RoBERTa vocabulary holds "##" pieces too); ConfigError for a kind whose pieces mark no word boundaries."""
    import tokenizers  # pylint: disable=g-import-not-at-top

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and isinstance(backend.model, tokenizers.models.WordPiece):
      prefix = backend.model.continuing_subword_prefix
      begins = lambda token: not token.startswith(prefix)
    elif backend is not None and isinstance(backend.pre_tokenizer, tokenizers.pre_tokenizers.ByteLevel):
      begins = lambda token: token.startswith(BYTE_LEVEL_WORD_START)
    else:
      name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
      raise ConfigError(
        f"objective.whole_word_mask: the vocabulary of {name} gives no word starts: it is neither "
        f"WordPiece ('##' continuation pieces) nor byte-level BPE ('{BYTE_LEVEL_WORD_START}' "
        "word-initial pieces); set objective.whole_word_mask=False (token-level masking)"
      )
    table = np.zeros(len(tokenizer), bool)
    for token, index in tokenizer.get_vocab().items():
      if index < len(table):
        table[index] = begins(token)
    return cls(np.packbits(table).tobytes(), len(table))

  @property
  def table(self) -> np.ndarray:
    """[vocab] bool: whether each id begins a word."""
    return np.unpackbits(np.frombuffer(self.packed, np.uint8), count=self.size).astype(bool)


def maskable(rows: templates.TemplateBatch, template: templates.Template) -> jax.Array:
  """[B, L] bool: the positions of the sentence's own tokens (after [CLS] and the template's prefix)."""
  start = 1 + len(template.prefix_ids)
  positions = jnp.arange(rows.input_ids.shape[1])[None, :]
  return (positions >= start) & (positions < start + rows.sentence_lengths[:, None])


def mask_tokens(
  rng: jax.Array,
  input_ids: jax.Array,
  maskable_positions: jax.Array,
  mask_id: int,
  vocab_size: int,
  word_starts: WordStarts | None = None,
) -> tuple[jax.Array, jax.Array]:
  """(corrupted input ids, [B, L] bool of the selected positions, whose original ids the loss predicts): tokens
  selected one by one, or whole words (`select_words`) given `word_starts`; then each selected token is replaced
  80/10/10."""
  select_key, kind_key, random_key = jax.random.split(rng, 3)
  if word_starts is None:
    selected = maskable_positions & jax.random.bernoulli(select_key, SELECT_RATE, input_ids.shape)
  else:
    selected = select_words(select_key, input_ids, maskable_positions, word_starts)
  kind = jax.random.uniform(kind_key, input_ids.shape)
  random_ids = jax.random.randint(random_key, input_ids.shape, 0, vocab_size, input_ids.dtype)
  ids = jnp.where(selected & (kind < MASK_RATE), mask_id, input_ids)
  ids = jnp.where(selected & (kind >= MASK_RATE) & (kind < MASK_RATE + RANDOM_RATE), random_ids, ids)
  return ids, selected


def select_words(
  rng: jax.Array, input_ids: jax.Array, maskable_positions: jax.Array, word_starts: WordStarts
) -> jax.Array:
  """[B, L] bool: whole-word selection. Each word of the maskable positions (a word start and the pieces after it) is
  selected with probability SELECT_RATE, and its pieces inherit the selection.

  A per-word Bernoulli draw, as transformers' `DataCollatorForLanguageModeling(whole_word_mask=True)` draws
  (huggingface/transformers `src/transformers/data/data_collator.py`, `torch_mask_tokens`: the probability is set
  on each word's first token, then spread to the word). Its older `DataCollatorForWholeWordMask` (the same file,
  `_whole_word_mask`, after google-research/bert `create_pretraining_data.py`) shuffled the words and took whole
  ones until round(0.15 x tokens) tokens were covered: a fixed count. Here each token is selected with its word's
  probability, 0.15, so the share is the same in expectation, with no shuffle in jit. Words are told apart by the
  vocabulary (`WordStarts`), as the older collator and google-research/bert tell them ("##"), not by character
  offsets as the newer collator does ("don't" is then one word, not three).
  """
  previous = jnp.pad(maskable_positions[:, :-1], ((0, 0), (1, 0)))
  starts = maskable_positions & (jnp.asarray(word_starts.table)[input_ids] | ~previous)
  drawn = starts & jax.random.bernoulli(rng, SELECT_RATE, input_ids.shape)
  positions = jnp.arange(input_ids.shape[1])
  word_start = jax.lax.cummax(jnp.where(starts, positions[None, :], 0), axis=1)  # Each position's word's start.
  return maskable_positions & jnp.take_along_axis(drawn, word_start, axis=1)


def prediction_slots(num_tokens: int) -> int:
  """How many selected positions of a batch of `num_tokens` positions the loss decodes: twice the expected number
  (a batch selects more with a vanishing probability, and the loss then leaves the extra ones out), so the
  vocabulary logits are computed for a fraction of the positions."""
  return min(num_tokens, math.ceil(2 * SELECT_RATE * num_tokens) + 16)


def masked_lm_loss(
  mlm_logits: Callable[[jax.Array], jax.Array], hidden: jax.Array, targets: jax.Array, selected: jax.Array
) -> tuple[jax.Array, jax.Array]:
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
