"""Ditto (Chen et al., 2023): the token vectors weighted by the diagonal of one attention head, summed."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxemb import pooling, templates
from jaxemb.errors import ConfigError
from jaxemb.methods import base
from jaxemb.models import EncoderConfig, Transformer


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Ditto(base.Tokenized):
  """`ditto`: one head's vectors; `ditto_all_heads`: every head of the layer at once, [heads, width] per sentence
  (the head search scores them all).

  Attributes:
    layer: the layer whose attention weights the tokens (0-based).
    head: ditto: the head (0-based; bert-base-uncased's best on STS-B dev is layer 0, head 9).
    variant: which states are weighted (pooling.DITTO_VARIANTS): first_last (h0 + hL) / 2, last, static (the
      raw word-embedding rows, as the authors' code reads them) or embedding_output (h0).
  """

  NAMES = ("ditto", "ditto_all_heads")

  layer: int = 0
  head: int = 9
  variant: str = "first_last"

  def __post_init__(self):
    super().__post_init__()
    if self.variant not in pooling.DITTO_VARIANTS:
      raise ConfigError(f"ditto variant {self.variant!r} is not one of {pooling.DITTO_VARIANTS}")

  def validate(self, config: EncoderConfig, num_masks: int):
    if not (0 <= self.layer < config.num_hidden_layers and 0 <= self.head < config.num_attention_heads):
      raise ConfigError(
        f"ditto layer {self.layer} / head {self.head} out of range for a model with "
        f"{config.num_hidden_layers} layers x {config.num_attention_heads} heads"
      )

  def forward_outputs(self) -> dict[str, Any]:
    return {"output_hidden_states": True, "output_attentions": (self.layer,)}

  def vectors(
    self,
    model: Transformer,
    params: Any,
    batch: templates.TemplateBatch,
    *,
    state: Any = None,
    prompt: jax.Array | None = None,
    template: templates.Template | None = None,
  ) -> jax.Array:
    words = params["embeddings"]["word"]["embedding"][batch.input_ids]
    heads = pooling.ditto_all_heads(
      self.encoder_outputs(model, params, batch), batch.attention_mask, self.layer, self.variant, words
    )
    return heads if self.name == "ditto_all_heads" else heads[:, self.head]

  def width(self, config: EncoderConfig) -> int:
    # The static variant adds up raw word-embedding rows, as wide as they are (ELECTRA-small's: 128, not 256).
    return config.embedding_width if self.variant == "static" else config.hidden_size

  def vector_shape(self, config: EncoderConfig) -> tuple[int, ...]:
    heads = (config.num_attention_heads,) if self.name == "ditto_all_heads" else ()
    return (*heads, self.width(config))
