"""A template batch -> one sentence vector: the path that training, model selection and evaluation share.

    h = the template's last [MASK] state (or the [CLS] state)
    vector = head(h - b_n), b_n the template bias for the sentence's length n (or no bias)

in the order of the authors' code: kongds/Prompt-BERT `prompt_bert/models.py` (`cl_forward` in training,
`sentemb_forward` at the trainer's STS-B dev scoring) and `evaluation.py` (test), ZBWpro/CoT-BERT `models.py`. The MLM
transform (`--mask_embedding_sentence_org_mlp`) is applied to h and to the bias apart, T(h) - T(b); the dense + tanh
heads (the training MLP, the pooler) take the difference.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxemb import denoise, optiprompt, templates
from jaxemb.errors import ConfigError
from jaxemb.models import EncoderConfig, Transformer, heads
from jaxemb.models.config import at_least_float32

POOLINGS = ("mask", "cls")  # The template's last [MASK] state, or the [CLS] state (SimCSE).
# What the (denoised) vector goes through: nothing, the fresh dense + tanh trained with the loss (params["mlp"]),
# the MLM head's transform, the checkpoint's pooler (dense + tanh). The one list of heads: training's (an
# Objective's projection) are all but the pooler; evaluation's (a Method's head) all but the MLP, which a run that
# keeps it evaluates as its pooler (training.selection.eval_params).
HEADS = ("none", "mlp", "mlm_transform", "pooler")
BIAS_POSITIONS = ("from_zero", "model")  # Position-offset rows' positions: from 0 (the authors'), or HF's numbering.

# forward(input_ids, attention_mask, **inputs) -> EncoderOutput: one pass of the encoder, in training or
# evaluation mode.
Forward = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class View:
  """How one template's batch becomes a vector (hashable: a static jit argument).

  Attributes:
    template: the template ("[X]" alone for SimCSE's plain sentences).
    pooling: one of POOLINGS.
    denoise: the template bias subtracted: one of denoise.KINDS.
    head: one of HEADS.
    bias_positions: one of BIAS_POSITIONS. The authors pass position ids arange(L) to their position-offset rows
      (`get_delta` in kongds/Prompt-BERT `prompt_bert/models.py` and `evaluation.py`), so RoBERTa's start at 0 there
      while its sentence rows start at padding_idx + 1; "model" numbers both as HF RoBERTa does.
    prompt_placement: where an OptiPrompt continuous template's vectors go (optiprompt.PLACEMENTS).
  """

  template: templates.Template
  pooling: str = "mask"
  denoise: str = "none"
  head: str = "none"
  bias_positions: str = "from_zero"
  prompt_placement: str = "last_occurrence"

  def __post_init__(self):
    for name, value, allowed in (
      ("pooling", self.pooling, POOLINGS),
      ("denoise", self.denoise, denoise.KINDS),
      ("head", self.head, HEADS),
      ("bias_positions", self.bias_positions, BIAS_POSITIONS),
      ("prompt_placement", self.prompt_placement, optiprompt.PLACEMENTS),
    ):
      if value not in allowed:
        raise ConfigError(f"{name} {value!r} is not one of {allowed}")
    if (self.pooling == "mask" or self.denoise != "none") and self.template.num_masks == 0:
      raise ConfigError(f"mask pooling and denoising need a template with [MASK]; got {self.template.text!r}")


def prompt_inputs(
  view: View, prompt: jax.Array | None, input_ids: jax.Array, slot_tokens: jax.Array
) -> dict[str, jax.Array]:
  """The encoder's extra inputs for an OptiPrompt continuous template (none without one): `slot_tokens` are the
  tokens between prefix and suffix in each row."""
  if prompt is None:
    return {}
  embeds, mask = optiprompt.continuous_template_inputs(
    view.template, prompt, input_ids, slot_tokens, view.prompt_placement
  )
  return {"inputs_embeds": embeds, "inputs_embeds_mask": mask}


def bias_position_offset(bias_positions: str, config: EncoderConfig) -> int:
  """The position of column 0 in position-offset rows (BIAS_POSITIONS)."""
  return 0 if bias_positions == "from_zero" else config.position_offset


class EncoderInputs(NamedTuple):
  """One encoder call's inputs: `forward(input_ids, attention_mask, read_positions=read_positions, **extra)`;
  `read_positions` ([rows]) the one position of each row whose state is read (its last [MASK] or [CLS]: the last
  layer computes those rows alone); `extra` holds position_ids (position-offset rows) and an OptiPrompt template's
  inputs_embeds and inputs_embeds_mask, when they apply."""

  input_ids: jax.Array
  attention_mask: jax.Array
  extra: dict[str, jax.Array]
  read_positions: jax.Array


def read_state(forward: Forward, inputs: EncoderInputs) -> jax.Array:
  """[rows, hidden]: the last-layer state at each row's read position, from one pass of `forward`."""
  out = forward(inputs.input_ids, inputs.attention_mask, read_positions=inputs.read_positions, **inputs.extra)
  return out.last_hidden_state[:, 0]


def bias_inputs(
  view: View, config: EncoderConfig, lengths: jax.Array, max_len: int, prompt: jax.Array | None = None
) -> EncoderInputs:
  """The template-only rows of the view's denoising, one per length in `lengths`, read at their last [MASK]."""
  offset = bias_position_offset(view.bias_positions, config)
  rows = denoise.template_inputs(view.template, lengths, view.denoise, offset, max_len)
  extra = {} if rows.position_ids is None else {"position_ids": rows.position_ids}
  # Position-offset rows hold no sentence tokens (only their positions move); [PAD] rows hold n pads in the slot.
  slot_tokens = jnp.zeros_like(lengths) if view.denoise == "position_offset" else lengths
  extra.update(prompt_inputs(view, prompt, rows.input_ids, slot_tokens))
  return EncoderInputs(rows.input_ids, rows.attention_mask, extra, rows.mask_positions[:, -1])


def template_bias(
  view: View, model: Transformer, forward: Forward, lengths: jax.Array, max_len: int, prompt: jax.Array | None = None
) -> jax.Array:
  """The view's template bias for each sentence length in `lengths`: [N, hidden] (`max_len` bounds them)."""
  return read_state(forward, bias_inputs(view, model.config, lengths, max_len, prompt))


def apply_head(
  view: View, model: Transformer, params: dict[str, Any], h: jax.Array, bias: jax.Array | None
) -> jax.Array:
  """head(h - bias) in the authors' order; `params` holds "encoder" (and "mlp" for the training MLP)."""
  if view.head == "mlm_transform":
    transform = lambda x: model.apply({"params": params["encoder"]}, x, method=Transformer.mlm_transform)
    return transform(h) if bias is None else transform(h) - transform(bias)
  x = h if bias is None else h - bias
  if view.head == "mlp":
    x = at_least_float32(x)  # As the float32 Dense cast a bfloat16 x; float64 in float64 references.
    return heads.DenseTanh(x.shape[-1], dtype=x.dtype).apply({"params": params["mlp"]}, x)
  if view.head == "pooler":
    return model.apply({"params": params["encoder"]}, x, method=Transformer.pool)
  return x


def sentence_inputs(view: View, batch: templates.TemplateBatch, prompt: jax.Array | None = None) -> EncoderInputs:
  """The encoder's inputs for the view's template batch, read where h is: the last-layer state at the template's
  last [MASK] (PromptBERT Eq. 2, CoT-BERT) or the [CLS] state (SimCSE)."""
  read = jnp.zeros_like(batch.sentence_lengths) if view.pooling == "cls" else batch.mask_positions[:, -1]
  return EncoderInputs(
    batch.input_ids,
    batch.attention_mask,
    prompt_inputs(view, prompt, batch.input_ids, batch.sentence_lengths),
    read.astype(jnp.int32),
  )


def vector(
  view: View,
  model: Transformer,
  params: dict[str, Any],
  forward: Forward,
  batch: templates.TemplateBatch,
  prompt: jax.Array | None = None,
  bias: jax.Array | None = None,
) -> jax.Array:
  """[batch, hidden]: each row's vector. `bias` ([batch, hidden], e.g. rows of a per-step table) is computed here for
  the batch's lengths when the view denoises and none is given."""
  h = read_state(forward, sentence_inputs(view, batch, prompt))
  if view.denoise != "none" and bias is None:
    bias = template_bias(view, model, forward, batch.sentence_lengths, batch.input_ids.shape[1], prompt)
  return apply_head(view, model, params, h, bias)
