"""Template-only inputs for template denoising: PromptBERT's position-offset rows (kongds/Prompt-BERT
`prompt_bert/models.py` `get_delta`) and CoT-BERT's [PAD] rows (ZBWpro/CoT-BERT `models.py` `denoising`).

Each function gives one row per sentence length n of a 1-D int array
`lengths`: ``jnp.arange(max_len + 1)`` for a table of every length, or a
batch's `sentence_lengths`. They are jitted with the template static, so they
compile once per template and shape.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from jaxemb.errors import ConfigError
from jaxemb.templates import Template

KINDS = ("none", "position_offset", "pad")  # No denoising, PromptBERT's, CoT-BERT's.


@flax.struct.dataclass
class DenoiseInputs:
  """Template-only model inputs, one row per sentence length.

  Attributes:
    input_ids: int32 ``[N, L]``.
    attention_mask: int32 ``[N, L]``.
    position_ids: int32 ``[N, L]``, or None for the model's default positions.
    mask_positions: int32 ``[N, num_masks]``, the template masks in each row.
  """

  input_ids: jax.Array
  attention_mask: jax.Array
  position_ids: jax.Array | None
  mask_positions: jax.Array


@functools.partial(jax.jit, static_argnames="template")
def position_offset_inputs(template: Template, lengths: jax.Array, position_offset: int) -> DenoiseInputs:
  """PromptBERT's rows: the template alone, positioned as if around n tokens.

  Every row is ``[CLS] prefix suffix [SEP]``, all attended; a token at column
  j has position ``position_offset + j``, plus n from the suffix on, so the
  template sits where it would with an n-token sentence.

  Args:
    template: the template (static).
    lengths: int ``[N]`` sentence lengths.
    position_offset: the position of column 0: 0 for BERT, ``pad_id + 1``
      for RoBERTa (whose positions start after its padding index).

  Returns:
    `DenoiseInputs` of width ``template.num_tokens``.
  """
  lengths = jnp.asarray(lengths, jnp.int32)
  template_row = jnp.asarray(template.row(()), jnp.int32)
  columns = jnp.arange(template.num_tokens, dtype=jnp.int32)
  after_slot = columns > len(template.prefix_ids)
  input_ids = jnp.broadcast_to(template_row, (lengths.size, columns.size))
  return DenoiseInputs(
    input_ids=input_ids,
    attention_mask=jnp.ones_like(input_ids),
    position_ids=position_offset + columns + lengths[:, None] * after_slot,
    # The template does not move within the row: the masks of an empty
    # sentence.
    mask_positions=template.mask_positions(jnp.zeros_like(lengths)),
  )


@functools.partial(jax.jit, static_argnames=("template", "max_len"))
def pad_inputs(template: Template, lengths: jax.Array, max_len: int) -> DenoiseInputs:
  """CoT-BERT's rows: the template with n [PAD]s in the slot.

  Row n is ``[CLS] prefix [PAD]*n suffix [SEP]``, right-padded to
  ``template.num_tokens + max_len``; the attention mask is 1 over the
  template and the n slot [PAD]s, 0 on the tail. Positions are left to the
  model's defaults: natural for BERT, while HF RoBERTa numbers non-pad tokens
  only, so there the suffix does not move with n (just as HF RoBERTa itself
  treats these rows).

  Args:
    template: the template (static).
    lengths: int ``[N]`` sentence lengths, each at most `max_len` (a longer
      one loses the end of its row).
    max_len: the longest sentence length (static).

  Returns:
    `DenoiseInputs` with `position_ids` None.
  """
  lengths = jnp.asarray(lengths, jnp.int32)
  template_row = jnp.asarray(template.row(()), jnp.int32)
  columns = jnp.arange(template.num_tokens + max_len, dtype=jnp.int32)
  slot = len(template.prefix_ids) + 1  # The column of the first slot token.
  # The template column each row column shows: the suffix shifts right by n.
  source = jnp.where(columns < slot, columns, columns - lengths[:, None])
  in_slot = (columns >= slot) & (source < slot)
  attended = source < template.num_tokens
  input_ids = jnp.where(in_slot | ~attended, template.pad_id, jnp.take(template_row, source, mode="clip"))
  return DenoiseInputs(
    input_ids=input_ids,
    attention_mask=attended.astype(jnp.int32),
    position_ids=None,
    mask_positions=template.mask_positions(lengths),
  )


def template_inputs(
  template: Template, lengths: jax.Array, kind: str, position_offset: int, max_len: int
) -> DenoiseInputs:
  """The template-only rows of denoise `kind` ("position_offset" or "pad") for each length; `position_offset` is the
  position-offset rows' first position, `max_len` bounds the lengths ([PAD] rows' width)."""
  if kind == "position_offset":
    return position_offset_inputs(template, lengths, position_offset)
  if kind == "pad":
    return pad_inputs(template, lengths, max_len)
  raise ConfigError(f"denoise {kind!r} is not one of {KINDS[1:]}")
