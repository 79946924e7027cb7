"""OptiPrompt's continuous template (PromptBERT §5.2, Zhong et al.'s OptiPrompt): where its vectors replace the
template tokens' word embeddings in a row (kongds/Prompt-BERT `prompt_bert/models.py`, `evaluation.py`: the
`fl_mbv` branches). The vectors themselves are trained params (jaxemb.training.objectives.init_prompt_params)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxemb.errors import ConfigError
from jaxemb.templates import Template


# Where OptiPrompt's continuous template vectors go in a row: at the LAST occurrence of each template token's id
# (the authors' code, kongds/Prompt-BERT `prompt_bert/models.py` `cl_forward`/`sentemb_forward` and `evaluation.py`:
# both `fl_mbv` branches pick the last match, so the opening quote keeps its static embedding and a template word
# that the sentence repeats later lands on the sentence's copy), or exactly on the template's own tokens.
PLACEMENTS = ("last_occurrence", "template")


def continuous_template_inputs(
  template: Template, prompt: jax.Array, input_ids: jax.Array, slot_tokens: jax.Array, placement: str
) -> tuple[jax.Array, jax.Array]:
  """(inputs_embeds, inputs_embeds_mask) that put OptiPrompt's continuous template in rows `[CLS] P S Q [SEP]`.

  `prompt` holds one vector per template token (prefix then suffix; the [MASK] row is never used): every template
  token but [MASK] takes its vector, by `placement` (one of PLACEMENTS), while the sentence, [CLS], [SEP] and [MASK]
  keep their word embeddings. `slot_tokens` are the tokens between prefix and suffix in each row (the sentence
  length; 0 for position-offset rows). Where two vectors land on one position the later template token's wins, as
  the authors write them in template order. A jittable transform.
  """
  if placement not in PLACEMENTS:
    raise ConfigError(f"placement {placement!r} is not one of {PLACEMENTS}")
  ids = template.prefix_ids + template.suffix_ids
  batch, width = input_ids.shape
  index = jnp.arange(len(ids))
  keep = jnp.broadcast_to(jnp.asarray([token != template.mask_id for token in ids]), (batch, len(ids)))
  if placement == "template":
    positions = 1 + index + jnp.where(index >= len(template.prefix_ids), slot_tokens[:, None], 0)
  else:
    matches = input_ids[:, None, :] == jnp.asarray(ids, input_ids.dtype)[None, :, None]  # [batch, tokens, width]
    positions = jnp.argmax(jnp.where(matches, jnp.arange(width), -1), axis=-1)
    overwritten = ((positions[:, :, None] == positions[:, None, :]) & (index[:, None] < index[None, :])).any(-1)
    keep = keep & ~overwritten
  rows = jnp.arange(batch)[:, None]
  positions = jnp.where(keep, positions, width)  # Out of range: dropped by the scatters below.
  embeds = (
    jnp.zeros((batch, width, prompt.shape[-1]), prompt.dtype)
    .at[rows, positions]
    .set(jnp.broadcast_to(prompt, (batch, *prompt.shape)), mode="drop")
  )
  mask = jnp.zeros((batch, width), bool).at[rows, positions].set(True, mode="drop")
  return embeds, mask
