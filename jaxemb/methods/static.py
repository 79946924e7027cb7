"""Static token embeddings (PromptBERT §3, Tables 3 and 12): the average of a sentence's token rows, no encoder pass,
with or without the biased tokens removed first."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxemb import bias_removal, pooling, templates
from jaxemb.errors import ConfigError
from jaxemb.methods import base
from jaxemb.models import EncoderConfig, Transformer

# The rows the static methods average (PromptBERT Table 12): the word embeddings, or the MLM head's decoder rows of
# a model whose decoder is not tied to them.
STATIC_ROWS = ("word_embeddings", "mlm_decoder")
# The BiasFilter fields that a config block holds flat (its token list is not configurable).
_BIAS_SWITCHES = ("remove_frequent", "remove_subwords", "lowercase", "remove_punctuation")


def static_rows(params: Any, kind: str) -> jax.Array:
  """[vocab, width] token rows of an encoder's params: the word embeddings, or the untied MLM decoder's rows
  (`mlm_head/decoder` is [hidden, vocab]; HF's `cls.predictions.decoder.weight`). `kind` is one of STATIC_ROWS."""
  if kind == "word_embeddings":
    return params["embeddings"]["word"]["embedding"]
  if "decoder" not in params.get("mlm_head", {}):
    raise ConfigError("'mlm_decoder' rows: these params have no untied MLM decoder (mlm_head/decoder)")
  return params["mlm_head"]["decoder"].T


def check_static_rows(kind: str, config: EncoderConfig):
  """Rejects rows `kind` that this model does not have."""
  if kind == "mlm_decoder" and (not config.is_masked_lm or config.tie_word_embeddings):
    why = "has no MLM head" if not config.is_masked_lm else "ties its MLM decoder to the word embeddings"
    raise ConfigError(
      f"the 'mlm_decoder' rows are an untied MLM decoder's; this model {why} (its config.json's "
      "tie_word_embeddings); use 'word_embeddings'"
    )


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Static(base.Tokenized):
  """`static_avg`: the rows of the sentence's tokens, [CLS] and [SEP] included, averaged; `static_remove_biases`:
  those of the sentence's text with the biased tokens removed (`bias_removal.tokenize_filtered`, whose rows are its
  own tokens, not a template's), [CLS] and [SEP] excluded. Their vectors are as wide as the rows (ELECTRA-small's
  word embeddings are 128 wide, not 256: no projection).

  Attributes:
    token_rows: the token rows averaged, one of STATIC_ROWS.
    bias_filter: static_remove_biases: which biased tokens are dropped (default: all four, as published).
  """

  NAMES = ("static_avg", "static_remove_biases")
  FIELD_OWNERS = {
    "tokenization": ("static_avg",),
    "bias_filter": ("static_remove_biases",),
  }

  token_rows: str = "word_embeddings"
  bias_filter: bias_removal.BiasFilter = bias_removal.BiasFilter()

  def __post_init__(self):
    super().__post_init__()
    if self.token_rows not in STATIC_ROWS:
      raise ConfigError(f"token_rows {self.token_rows!r} is not one of {STATIC_ROWS}")

  @classmethod
  def fields(cls, name: str) -> tuple[str, ...]:
    """The block holds static_remove_biases's filter as its four switches."""
    own = tuple(key for key in cls.arguments(name) if key != "bias_filter")
    return (*own, *_BIAS_SWITCHES) if name == "static_remove_biases" else own

  def to_block(self) -> dict[str, Any]:
    owner = lambda key: self.bias_filter if key in _BIAS_SWITCHES else self
    return {"name": self.name, **{key: getattr(owner(key), key) for key in self.fields(self.name)}}

  @classmethod
  def from_fields(cls, name: str, fields: dict[str, Any]) -> base.Method:
    switches = {key: fields.pop(key) for key in _BIAS_SWITCHES if key in fields}
    return cls(name, **fields, **({"bias_filter": bias_removal.BiasFilter(**switches)} if switches else {}))

  def validate(self, config: EncoderConfig, num_masks: int):
    check_static_rows(self.token_rows, config)

  def rows(
    self,
    template: templates.Template,
    tokenizer: Any,
    sentences: list[str],
    max_sentence_tokens: int | None,
    max_length: int,
  ) -> templates.TemplateBatch:
    if self.name == "static_remove_biases":
      return bias_removal.tokenize_filtered(tokenizer, sentences, self.bias_filter, max_sentence_tokens)
    return super().rows(template, tokenizer, sentences, max_sentence_tokens, max_length)

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
    rows = static_rows(params, self.token_rows)
    if self.name == "static_avg":
      return pooling.static_avg(rows, batch.input_ids, batch.attention_mask)
    return pooling.static_sentence_avg(rows, batch.input_ids, batch.sentence_lengths)

  def width(self, config: EncoderConfig) -> int:
    return config.embedding_width
