"""Pooled encoder outputs: the [CLS] state (with or without the pretrained pooler) and token averages of layers.

`last_avg`, `cls_before_pooler` and `cls` export as sentence-transformers' stock modules: Transformer, Pooling and,
for `cls`, a Dense+tanh module holding the pretrained pooler.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from jaxemb import atomic, pooling, templates
from jaxemb.errors import ConfigError
from jaxemb.methods import base
from jaxemb.models import EncoderConfig, Transformer


@dataclasses.dataclass(frozen=True)
class _Pool:
  """One method of the family: its vectors from the encoder's output and attention mask, whether it reads every
  layer's hidden states, and sentence-transformers' pooling mode (legacy config keys, which every release since 2.0
  reads) or None where it has none."""

  vectors: Callable[[Any, jax.Array], jax.Array]
  hidden_states: bool
  st_mode: str | None


def _cls_state(out: Any, attention_mask: jax.Array) -> jax.Array:
  del attention_mask  # The [CLS] state is the same whatever the sentence's length.
  return pooling.cls_before_pooler(out)


_POOLS = {
  "cls": _Pool(_cls_state, False, "cls_token"),  # Then the pretrained pooler (dense + tanh).
  "cls_before_pooler": _Pool(_cls_state, False, "cls_token"),
  "last_avg": _Pool(pooling.last_avg, False, "mean_tokens"),
  "first_last_avg": _Pool(pooling.first_last_avg, True, None),
  "first_layer_last_avg": _Pool(pooling.first_layer_last_avg, True, None),
  "top2_avg": _Pool(pooling.top2_avg, True, None),
}
_ST_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Pooled(base.Tokenized):
  """A pooling of one encoder pass over the sentence alone ([CLS] sentence [SEP])."""

  NAMES = tuple(_POOLS)

  @property
  def _pool(self) -> _Pool:
    return _POOLS[self.name]

  def validate(self, config: EncoderConfig, num_masks: int):
    if self.name == "cls" and not config.has_pooler:
      raise ConfigError(
        "method 'cls' needs the pretrained pooler, which ELECTRA does not have (HF ElectraModel "
        "defines none); use cls_before_pooler for the [CLS] state"
      )

  def required_weights(self) -> dict[str, str]:
    return {"pooler": "method 'cls'"} if self.name == "cls" else {}

  def forward_outputs(self) -> dict[str, Any]:
    return {"output_hidden_states": self._pool.hidden_states}

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
    vectors = self._pool.vectors(self.encoder_outputs(model, params, batch), batch.attention_mask)
    return model.apply({"params": params}, vectors, method=Transformer.pool) if self.name == "cls" else vectors

  @property
  def exportable(self) -> bool:
    return self._pool.st_mode is not None

  def export(self, out: Any, config: EncoderConfig, params: Any, tokenizer: Any, fitted: Any = None):
    """modules.json and the module folders around the Hugging Face checkpoint already in `out`."""
    from safetensors.numpy import save  # pylint: disable=g-import-not-at-top

    del fitted  # A pooling fits nothing.
    self.check_exportable()
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")] + ([("2_Dense", "Dense")] if self.name == "cls" else [])
    atomic.write_json(
      out / "modules.json",
      [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(modules)
      ],
    )
    atomic.write_json(out / "sentence_bert_config.json", {"max_seq_length": config.max_length, "do_lower_case": False})
    atomic.write_json(
      out / "1_Pooling" / "config.json",
      {
        "word_embedding_dimension": config.hidden_size,
        **{f"pooling_mode_{m}": m == self._pool.st_mode for m in _ST_POOLING_MODES},
      },
    )
    if self.name == "cls":  # The pretrained pooler: [CLS] state -> dense -> tanh.
      dense = params["pooler"]["dense"]
      atomic.write_json(
        out / "2_Dense" / "config.json",
        {
          "in_features": config.hidden_size,
          "out_features": config.hidden_size,
          "bias": True,
          "activation_function": "torch.nn.modules.activation.Tanh",
        },
      )
      weights = save(
        {
          "linear.weight": np.ascontiguousarray(np.asarray(dense["kernel"], np.float32).T),
          "linear.bias": np.asarray(dense["bias"], np.float32),
        },
        metadata={"format": "pt"},
      )
      atomic.write(out / "2_Dense" / "model.safetensors", lambda f: f.write(weights))

  def card_text(self) -> str:
    return (
      f"## Method\n\n`{self.name}`: a sentence-transformers Transformer + Pooling model"
      + (" + the pretrained pooler (dense + tanh)" if self.name == "cls" else "")
      + ".\n"
    )
