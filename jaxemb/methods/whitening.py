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

from jaxemb import atomic
from jaxemb.errors import ConfigError
from jaxemb.methods import base, transform
from jaxemb.models import EncoderConfig

_MODULE = "whitening"  # The Dense module's folder in an export, after the whitened method's modules.


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Whitening(transform.Transform):
  """Whitening of another method's vectors: `Method("whitening", source=Method("prompt", template=...))`; in a
  config the source method's block is nested in this one's
  (`--config.method.name=whitening --config.method.source.name=prompt --config.method.source.template=...`).

  Attributes:
    dims: k, the dimensions kept (Su et al.'s "-whitening-256" keeps 256); 0 keeps all, as the tables' rows.
  """

  NAMES = ("whitening",)

  dims: int = 0

  def __post_init__(self):
    super().__post_init__()
    if self.dims < 0:
      raise ConfigError(f"whitening dims must be >= 0 (0 keeps every dimension); got {self.dims}")

  def validate(self, config: EncoderConfig, num_masks: int):
    super().validate(config, num_masks)
    if self.dims > self.source.width(config):
      raise ConfigError(
        f"whitening dims {self.dims} exceeds the {self.source.width(config)} dimensions of method {self.source.name!r}"
      )

  def fitted_for(self) -> dict[str, Any]:
    fields = super().fitted_for()
    del fields["dims"]  # Applied at load (`load_transform`): one fit serves every k.
    return fields

  def fit(self, embed: Callable[[base.Method, list[str]], np.ndarray], sentences: list[str]) -> dict[str, np.ndarray]:
    """{"mean": mu, "kernel": W} (all dimensions; `dims` cuts W at load) of the whitened method's
    vectors of `sentences`, in float64 as Su et al.'s `compute_kernel_bias` (np.cov, so 1/(n - 1))."""
    x = np.asarray(embed(self.source, sentences), np.float64)
    if len(x) <= x.shape[1]:  # Fewer sentences than dimensions leave zero variances, which 1/sqrt(s) cannot take.
      raise ConfigError(
        f"whitening {x.shape[1]}-dimensional vectors needs more than {x.shape[1]} distinct "
        f"sentences to fit on; got {len(x)}"
      )
    u, s, _ = np.linalg.svd(np.cov(x.T))
    return {"mean": x.mean(0), "kernel": u / np.sqrt(s)}

  def load_transform(self, config: EncoderConfig, fitted: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """The fitted mean and kernel, cut to `dims` columns, in float32."""
    width = self.source.width(config)
    if fitted["kernel"].shape != (width, width):
      raise ConfigError(
        f"the fitted whitening is {fitted['kernel'].shape[0]}-dimensional; method "
        f"{self.source.name!r} gives {width} dimensions on this model"
      )
    kernel = fitted["kernel"][:, : self.dims or width]
    return {"mean": jnp.asarray(fitted["mean"], jnp.float32), "kernel": jnp.asarray(kernel, jnp.float32)}

  def transform(self, state: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    # The highest precision: the kernel's 1/sqrt(s) scales small directions up a lot.
    return jnp.dot(x - state["mean"], state["kernel"], precision=jax.lax.Precision.HIGHEST)

  def width(self, config: EncoderConfig) -> int:
    return self.dims or self.source.width(config)

  # Export, model card.

  @property
  def exportable(self) -> bool:
    return self.source.exportable

  def check_exportable(self):
    """NotExportable naming the whitened method: whitening exports as that method's modules plus a Dense."""
    if not self.exportable:
      raise base.NotExportable(
        f"method 'whitening' of source {self.source.name!r} has no sentence-transformers form "
        f"here: whitening exports over {', '.join(n for n in base.exportable_names() if n != self.name)} "
        "(config.method.source)"
      )

  def export(
    self, out: Any, config: EncoderConfig, params: Any, tokenizer: Any, fitted: dict[str, np.ndarray] | None = None
  ):
    """The whitened method's modules, then a Dense module (identity activation) computing x W + b with
    b = -mu W, which is (x - mu) W."""
    from safetensors.numpy import save  # pylint: disable=g-import-not-at-top

    self.check_exportable()
    if fitted is None:
      raise ConfigError("whitening exports with its fitted state; none was given")
    self.source.export(out, config, params, tokenizer)
    state = self.load_transform(config, fitted)
    kernel, mean = np.asarray(state["kernel"], np.float64), np.asarray(state["mean"], np.float64)
    modules = json.loads((out / "modules.json").read_text())
    modules.append(
      {"idx": len(modules), "name": str(len(modules)), "path": _MODULE, "type": "sentence_transformers.models.Dense"}
    )
    atomic.write_json(out / "modules.json", modules)
    atomic.write_json(
      out / _MODULE / "config.json",
      {
        "in_features": kernel.shape[0],
        "out_features": kernel.shape[1],
        "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity",
      },
    )
    weights = save(
      {"linear.weight": np.ascontiguousarray(kernel.T, np.float32), "linear.bias": (-mean @ kernel).astype(np.float32)},
      metadata={"format": "pt"},
    )
    atomic.write(out / _MODULE / "model.safetensors", lambda f: f.write(weights))

  def card_text(self) -> str:
    kept = f"its top {self.dims} dimensions kept" if self.dims else "all dimensions kept"
    return (
      self.source.card_text() + f"\nThen BERT-whitening (Su et al., 2021): (x - mu) W, the mean and the "
      f"SVD-based whitening matrix fitted on a set of sentences' vectors, {kept}; the last module (a Dense "
      "layer) holds them.\n"
    )
