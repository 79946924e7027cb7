"""What the post-processings of the papers' baseline tables share (BERT-whitening, BERT-flow): a method that maps
another method's vectors through a transform fitted on a set of sentences' vectors.

A family here owns its fitted transform (`load_transform`, `transform`); this base owns the rest: the method it
transforms (`source`, whose block nests in the transform's), the Encoder's questions answered by the source method,
the fit set (`corpus`, or the evaluated tasks' sentences), and the state (the source's and the transform's).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxemb import templates
from jaxemb.errors import ConfigError
from jaxemb.methods import base, pooled
from jaxemb.models import EncoderConfig, Transformer


@dataclasses.dataclass(frozen=True, kw_only=True)
class Transform(base.Method):
  """Another method's vectors, one per sentence, through a fitted transform (a family's base, not a method).

  Attributes:
    source: the method whose vectors are transformed (a Method, or a method name for that method at its
      defaults; in a config, its block): one vector per sentence, fitting nothing itself (default first_last_avg,
      Su et al.'s and the tables' rows).
    corpus: a text file, one sentence a line, to fit on; "" fits on the evaluated STS test tasks' sentences.
  """

  source: base.Method | str = pooled.Pooled("first_last_avg")
  corpus: str = ""

  def __post_init__(self):
    super().__post_init__()
    if isinstance(self.source, str):
      object.__setattr__(self, "source", base.Method(self.source))
    if not isinstance(self.source, base.Method) or self.source.fit_source() is not None:
      raise ConfigError(f"{self.name} transforms a method that fits nothing itself; got {self.source!r}")

  # The block: the transform's fields, the source method's block nested.

  def to_block(self) -> dict[str, Any]:
    return {**super().to_block(), "source": self.source.to_block()}

  @classmethod
  def from_fields(cls, name: str, fields: dict[str, Any]) -> base.Method:
    source = fields.pop("source", None)
    if hasattr(source, "items"):  # A block (a dict, or a ConfigDict); else a Method, a name or none.
      source = base.Method.from_block(source)
    return cls(name, **fields, **({"source": source} if source is not None else {}))

  # What the Encoder asks: the source method's, its vectors then transformed.

  @property
  def template(self) -> str:
    return self.source.template

  def validate(self, config: EncoderConfig, num_masks: int):
    self.source.validate(config, num_masks)
    base.require_one_vector(self.source, config, f"{self.name} maps one vector a sentence")

  def required_weights(self) -> dict[str, str]:
    return self.source.required_weights()

  def width(self, config: EncoderConfig) -> int:
    return self.source.width(config)  # The transform maps d dimensions to d.

  def rows(
    self,
    template: templates.Template,
    tokenizer: Any,
    sentences: list[str],
    max_sentence_tokens: int | None,
    max_length: int,
  ) -> templates.TemplateBatch:
    return self.source.rows(template, tokenizer, sentences, max_sentence_tokens, max_length)

  def fit_source(self) -> str:
    return self.corpus or base.TASK_SENTENCES

  def load_state(self, config: EncoderConfig, fitted: dict[str, np.ndarray] | None = None) -> Any:
    """The source method's state and the transform's (`load_transform`); None before fitting."""
    if fitted is None:
      return None
    return {"source": self.source.load_state(config), "transform": self.load_transform(config, fitted)}

  def load_transform(self, config: EncoderConfig, fitted: dict[str, np.ndarray]) -> Any:
    """The arrays `transform` reads, from `fit`'s, checked against the source method's width on this model."""
    raise NotImplementedError

  def transform(self, state: Any, x: jax.Array) -> jax.Array:
    """The transformed vectors of the source's float32 vectors `x` [batch, width] (traced)."""
    raise NotImplementedError

  def vectors_of_fit(self, state: Any, embedded: np.ndarray) -> np.ndarray:
    """The fit sentences' vectors: the source's, which the fit embedded, transformed."""
    return np.asarray(jax.jit(self.transform)(state["transform"], jnp.asarray(embedded, jnp.float32)))

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
    x = self.source.vectors(model, params, batch, state=state["source"], prompt=prompt, template=template)
    return self.transform(state["transform"], x.astype(jnp.float32))

  # Model card, MTEB.

  @property
  def remote_code(self) -> bool:
    return self.source.remote_code

  def card_tags(self) -> tuple[str, ...]:
    return (*self.source.card_tags(), self.name)

  @property
  def add_period(self) -> bool:
    return self.source.add_period
