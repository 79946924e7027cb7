"""The encoder's architecture: the fields of a Hugging Face BERT/RoBERTa/ELECTRA config that the model uses."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from jaxemb.errors import ConfigError

MODEL_TYPES = ("bert", "roberta", "electra")
# HF `hidden_act` names -> whether jax.nn.gelu uses the tanh approximation; other activations are named below.
_GELU_APPROXIMATE = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True, "gelu_fast": True}
ACTIVATIONS = (*_GELU_APPROXIMATE, "relu", "silu", "swish")
_COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # config.model.dtype -> the encoder's dtype.


def compute_dtype(name: str) -> Any:
  """The encoder's compute dtype that config.model.dtype names (params stay float32)."""
  if name not in _COMPUTE_DTYPES:
    raise ConfigError(f"model.dtype {name!r} is not one of {sorted(_COMPUTE_DTYPES)}")
  return _COMPUTE_DTYPES[name]


def at_least_float32(x: Any) -> Any:
  """`x` in float32, or in float64 when it is float64 (x64 enabled): the softmaxes and losses, which reduced
  precisions round too coarsely, in float32, and in float64 where tests compute a reference free of float32's
  rounding."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Architecture of a BERT, RoBERTa or ELECTRA encoder (hashable, so it can be a static jit argument).

  ELECTRA (HF `ElectraModel`) is BERT with embeddings `embedding_size` wide, projected to `hidden_size` when the
  two differ, no pooler, and (its discriminator) no MLM head.
  """

  model_type: str  # "bert", "roberta" or "electra": RoBERTa differs from BERT only in where position ids start.
  vocab_size: int  # Rows of the word-embedding table.
  hidden_size: int  # Width of every hidden state.
  num_hidden_layers: int  # Transformer layers.
  num_attention_heads: int  # Heads per attention layer.
  intermediate_size: int  # Width of the feed-forward block.
  max_position_embeddings: int  # Rows of the position-embedding table.
  type_vocab_size: int = 2  # Rows of the token-type table (1 for RoBERTa).
  layer_norm_eps: float = 1e-12  # LayerNorm epsilon (1e-5 for RoBERTa).
  pad_token_id: int = 0  # RoBERTa's padding_idx: default positions skip it and start after it.
  hidden_act: str = "gelu"  # Feed-forward (and BERT MLM transform) activation, HF name.
  hidden_dropout_prob: float = 0.1  # Dropout on embeddings and block outputs during training.
  attention_probs_dropout_prob: float = 0.1  # Dropout on attention probabilities during training.
  tie_word_embeddings: bool = True  # The MLM decoder reuses the word-embedding matrix.
  # ELECTRA: width of the word/position/type embeddings, projected to hidden_size after their LayerNorm when it
  # differs (the small models: 128 vs 256). None (BERT, RoBERTa, whose configs have no such field): hidden_size.
  embedding_size: int | None = None

  def __post_init__(self):
    if self.model_type not in MODEL_TYPES:
      raise ValueError(f"model_type {self.model_type!r} is not supported; expected one of {MODEL_TYPES}")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; expected one of {ACTIVATIONS}")
    if self.embedding_size is not None and self.model_type != "electra":
      raise ValueError(
        f"embedding_size applies to ELECTRA only; a {self.model_type} model's embeddings are "
        f"hidden_size wide (got embedding_size {self.embedding_size})"
      )
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
        f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
      )

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def embedding_width(self) -> int:
    """Width of the embedding tables and of the static word vectors (the static methods average these rows)."""
    return self.hidden_size if self.embedding_size is None else self.embedding_size

  @property
  def projects_embeddings(self) -> bool:
    """Whether h0 is the embedding output projected to hidden_size (HF `ElectraModel.embeddings_project`)."""
    return self.embedding_width != self.hidden_size

  @property
  def is_masked_lm(self) -> bool:
    """Whether pretraining taught the model to represent [MASK]: not ELECTRA's discriminator, which learnt to tell
    replaced tokens from original ones and never saw [MASK] (Ditto §4), and has no MLM head."""
    return self.model_type != "electra"

  @property
  def has_pooler(self) -> bool:
    """Whether the HF base model has a pooler (dense + tanh on [CLS]): `ElectraModel` has none."""
    return self.model_type != "electra"

  @property
  def position_offset(self) -> int:
    """The position id of the first token: HF RoBERTa counts from padding_idx + 1, BERT from 0."""
    return self.pad_token_id + 1 if self.model_type == "roberta" else 0

  @property
  def max_length(self) -> int:
    """The longest input the position table allows."""
    return self.max_position_embeddings - self.position_offset

  @property
  def gelu_approximate(self) -> bool | None:
    """For gelu activations, whether the tanh approximation is used; None for the others."""
    return _GELU_APPROXIMATE.get(self.hidden_act)

  @classmethod
  def from_hf(cls, hf_config: Mapping[str, Any], source: str = "config") -> EncoderConfig:
    """Reads the fields this model uses from a Hugging Face config.json dict; `source` names it in errors."""
    embedding_type = hf_config.get("position_embedding_type", "absolute")
    if embedding_type != "absolute":
      raise ValueError(f"{source}: position_embedding_type {embedding_type!r} is not supported (only 'absolute')")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    required = [name for name, f in fields.items() if f.default is dataclasses.MISSING]
    missing = [name for name in required if name not in hf_config]
    if missing:
      raise ValueError(f"{source}: missing fields {missing}")
    try:
      return cls(**{name: hf_config[name] for name in fields if name in hf_config})
    except ValueError as e:
      raise ValueError(f"{source}: {e}") from None

  def to_hf(self, architecture: str) -> dict[str, Any]:
    """A Hugging Face config.json dict for `architecture` (e.g. "BertForMaskedLM"); unset fields are left out."""
    fields = {name: value for name, value in dataclasses.asdict(self).items() if value is not None}
    return {"architectures": [architecture], **fields, "position_embedding_type": "absolute"}
