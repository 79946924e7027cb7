"""BERT-whitening (Su et al., 2021, https://github.com/bojone/BERT-whitening): another method's vectors x, fitted
on a set of sentences, become (x - mu) W[:, :k], mu their mean and W = U diag(1/sqrt(s)) from the SVD U diag(s) U^T
of their covariance, so they have zero mean and identity covariance (and keep the top k directions).

The published rows (PromptBERT Table 5, CoT-BERT Table 1: "BERT-whitening", "-whitening") fit on the NLI corpus's
sentences (their "NLI" setting, quoted from SimCSE's table); Su et al. also fit on the target tasks' own sentences
(train, dev and test). Here the fit set is a corpus file or, by default, the evaluated STS test tasks' sentences
(`base.TASK_SENTENCES`); evaluate.py prints which. The transform exports as a sentence-transformers Dense module
after the whitened method's own modules.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxemb import atomic, templates
from jaxemb.errors import ConfigError
from jaxemb.methods import base, pooled
from jaxemb.models import EncoderConfig, Transformer

_MODULE = "whitening"  # The Dense module's folder in an export, after the whitened method's modules.


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Whitening(base.Method):
  """Whitening of another method's vectors. In the flat `config.method` block the whitened method is
  `whitened_method` and its own fields sit beside this method's (e.g. `--config.method.name=whitening
  --config.method.whitened_method=prompt --config.method.template=...`).

  Attributes:
    whitened: the method whose vectors are whitened: one vector per sentence, fitting nothing itself (default
      first_last_avg, Su et al.'s and the tables' rows).
    whitening_dims: k, the dimensions kept (Su et al.'s "-whitening-256" keeps 256); 0 keeps all, as the tables'
      rows.
    whitening_corpus: a text file, one sentence a line, to fit on; "" fits on the evaluated STS test tasks'
      sentences.
  """

  NAMES = ("whitening",)

  whitened: base.Method = pooled.Pooled("first_last_avg")
  whitening_dims: int = 0
  whitening_corpus: str = ""

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.whitened, base.Method) or self.whitened.fit_source() is not None:
      raise ConfigError(f"whitening whitens a method that fits nothing itself; got {self.whitened!r}")
    if self.whitening_dims < 0:
      raise ConfigError(f"whitening_dims must be >= 0 (0 keeps every dimension); got {self.whitening_dims}")

  # The flat block: this method's fields and the whitened method's side by side.

  def to_flat(self) -> dict[str, Any]:
    return {"whitened_method": self.whitened.name, "whitening_dims": self.whitening_dims,
            "whitening_corpus": self.whitening_corpus, **self.whitened.to_flat()}

  @classmethod
  def from_flat(cls, name: str, fields: dict[str, Any]) -> base.Method:
    fields = dict(fields)
    whitened = fields.pop("whitened_method", "first_last_avg")
    own = {key: fields.pop(key) for key in ("whitening_dims", "whitening_corpus") if key in fields}
    return cls(name, whitened=base.family(whitened).from_flat(whitened, fields), **own)

  # What the Encoder asks: the whitened method's, its vectors then transformed.

  @property
  def template(self) -> str:
    return self.whitened.template

  def validate(self, config: EncoderConfig, num_masks: int):
    self.whitened.validate(config, num_masks)
    if len(self.whitened.vector_shape(config)) != 1:
      raise ConfigError(f"whitening whitens one vector per sentence; method {self.whitened.name!r} gives "
                        f"{self.whitened.vector_shape(config)} per sentence")
    if self.whitening_dims > self.whitened.width(config):
      raise ConfigError(f"whitening_dims {self.whitening_dims} exceeds the {self.whitened.width(config)} "
                        f"dimensions of method {self.whitened.name!r}")

  def required_weights(self) -> dict[str, str]:
    return self.whitened.required_weights()

  def rows(self, template: templates.Template, tokenizer: Any, sentences: list[str], max_sentence_tokens: int | None,
           max_length: int) -> templates.TemplateBatch:
    return self.whitened.rows(template, tokenizer, sentences, max_sentence_tokens, max_length)

  def fit_source(self) -> str:
    return self.whitening_corpus or base.TASK_SENTENCES

  def fit(self, embed: Callable[[base.Method, list[str]], np.ndarray], sentences: list[str]) -> dict[str, np.ndarray]:
    """{"mean": mu, "kernel": W} (all dimensions; `whitening_dims` cuts W at load) of the whitened method's
    vectors of `sentences`, in float64 as Su et al.'s `compute_kernel_bias` (np.cov, so 1/(n - 1))."""
    x = np.asarray(embed(self.whitened, sentences), np.float64)
    if len(x) <= x.shape[1]:  # Fewer sentences than dimensions leave zero variances, which 1/sqrt(s) cannot take.
      raise ConfigError(f"whitening {x.shape[1]}-dimensional vectors needs more than {x.shape[1]} distinct "
                        f"sentences to fit on; got {len(x)}")
    u, s, _ = np.linalg.svd(np.cov(x.T))
    return {"mean": x.mean(0), "kernel": u / np.sqrt(s)}

  def load_state(self, config: EncoderConfig, fitted: dict[str, np.ndarray] | None = None) -> Any:
    """The whitened method's state and the fitted mean and kernel, cut to `whitening_dims` columns, in float32."""
    if fitted is None:
      return None
    width = self.whitened.width(config)
    if fitted["kernel"].shape != (width, width):
      raise ConfigError(f"the fitted whitening is {fitted['kernel'].shape[0]}-dimensional; method "
                        f"{self.whitened.name!r} gives {width} dimensions on this model")
    kernel = fitted["kernel"][:, :self.whitening_dims or width]
    return {"whitened": self.whitened.load_state(config), "mean": jnp.asarray(fitted["mean"], jnp.float32),
            "kernel": jnp.asarray(kernel, jnp.float32)}

  def vectors(self, model: Transformer, params: Any, batch: templates.TemplateBatch, *, state: Any = None,
              prompt: jax.Array | None = None, template: templates.Template | None = None) -> jax.Array:
    x = self.whitened.vectors(model, params, batch, state=state["whitened"], prompt=prompt, template=template)
    # float32 and the highest precision: the kernel's 1/sqrt(s) scales small directions up a lot.
    return jnp.dot(x.astype(jnp.float32) - state["mean"], state["kernel"], precision=jax.lax.Precision.HIGHEST)

  def width(self, config: EncoderConfig) -> int:
    return self.whitening_dims or self.whitened.width(config)

  # Export, model card, MTEB.

  @property
  def exportable(self) -> bool:
    return self.whitened.exportable

  def export(self, out: Any, config: EncoderConfig, params: Any, tokenizer: Any,
             fitted: dict[str, np.ndarray] | None = None):
    """The whitened method's modules, then a Dense module (identity activation) computing x W + b with
    b = -mu W, which is (x - mu) W."""
    from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
    self.check_exportable()
    if fitted is None:
      raise ConfigError("whitening exports with its fitted state; none was given")
    self.whitened.export(out, config, params, tokenizer)
    state = self.load_state(config, fitted)
    kernel, mean = np.asarray(state["kernel"], np.float64), np.asarray(state["mean"], np.float64)
    modules = json.loads((out / "modules.json").read_text())
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": _MODULE,
                    "type": "sentence_transformers.models.Dense"})
    atomic.write_json(out / "modules.json", modules)
    atomic.write_json(out / _MODULE / "config.json", {
        "in_features": kernel.shape[0], "out_features": kernel.shape[1], "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity"})
    weights = save({"linear.weight": np.ascontiguousarray(kernel.T, np.float32),
                    "linear.bias": (-mean @ kernel).astype(np.float32)}, metadata={"format": "pt"})
    atomic.write(out / _MODULE / "model.safetensors", lambda f: f.write(weights))

  @property
  def remote_code(self) -> bool:
    return self.whitened.remote_code

  def card_tags(self) -> tuple[str, ...]:
    return (*self.whitened.card_tags(), "whitening")

  def card_text(self) -> str:
    kept = f"its top {self.whitening_dims} dimensions kept" if self.whitening_dims else "all dimensions kept"
    return (self.whitened.card_text() + f"\nThen BERT-whitening (Su et al., 2021): (x - mu) W, the mean and the "
            f"SVD-based whitening matrix fitted on a set of sentences' vectors, {kept}; the last module (a Dense "
            "layer) holds them.\n")

  @property
  def add_period(self) -> bool:
    return self.whitened.add_period
