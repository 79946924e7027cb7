"""What the post-processings of the papers' baseline tables share (BERT-whitening, BERT-flow): a method that maps
another method's vectors through a transform fitted on a set of sentences' vectors.

A family here names the field holding the method it transforms (`SOURCE`, e.g. whitening's `whitened_method`) and
its own fitted transform (`load_transform`, `transform`); this base owns the rest: the flat block (the same field
holding the source method's name, its fields beside the transform's), the Encoder's questions answered by the source
method, the fit set (a corpus field or the evaluated tasks' sentences), and the state (the source's and the
transform's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxemb import templates
from jaxemb.errors import ConfigError
from jaxemb.methods import base
from jaxemb.models import EncoderConfig, Transformer


@dataclasses.dataclass(frozen=True, kw_only=True)
class Transform(base.Method):
  """Another method's vectors, one per sentence, through a fitted transform (a family's base, not a method)."""

  # The field holding the transformed method: a Method (in Python, a method name gives that method at its defaults);
  # in the flat block, the method's name.
  SOURCE: ClassVar[str]
  CORPUS: ClassVar[str]  # The field naming the fit set's corpus file ("": the evaluated STS test tasks' sentences).

  def __post_init__(self):
    super().__post_init__()
    if isinstance(self.source, str):
      object.__setattr__(self, self.SOURCE, base.Method(self.source))
    if not isinstance(self.source, base.Method) or self.source.fit_source() is not None:
      raise ConfigError(f"{self.name} transforms a method that fits nothing itself; got {self.source!r}")

  @property
  def source(self) -> base.Method:
    return getattr(self, self.SOURCE)

  @classmethod
  def own_fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("name", cls.SOURCE))

  # The flat block: the transform's fields and the source method's side by side.

  def to_flat(self) -> dict[str, Any]:
    own = {key: getattr(self, key) for key in self.own_fields()}
    return {self.SOURCE: self.source.name, **own, **self.source.to_flat()}

  @classmethod
  def from_flat(cls, name: str, fields: dict[str, Any]) -> base.Method:
    fields = dict(fields)
    default = next(f.default for f in dataclasses.fields(cls) if f.name == cls.SOURCE)
    source = fields.pop(cls.SOURCE, default.name)
    own = {key: fields.pop(key) for key in cls.own_fields() if key in fields}
    return cls(name, **{cls.SOURCE: base.family(source).from_flat(source, fields)}, **own)

  # What the Encoder asks: the source method's, its vectors then transformed.

  @property
  def template(self) -> str:
    return self.source.template

  def validate(self, config: EncoderConfig, num_masks: int):
    self.source.validate(config, num_masks)
    if len(self.source.vector_shape(config)) != 1:
      raise ConfigError(
        f"{self.name} maps one vector per sentence; method {self.source.name!r} gives "
        f"{self.source.vector_shape(config)} per sentence"
      )

  def required_weights(self) -> dict[str, str]:
    return self.source.required_weights()

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
    return getattr(self, self.CORPUS) or base.TASK_SENTENCES

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
