"""The training objectives of the papers, assembled from templates, denoising, heads and losses.

One `Objective` describes a setting (REFERENCE.md sections 3-4): the views of each example (which template
each side goes through), how a view becomes a vector (the last [MASK] state or [CLS]), the template denoising
subtracted from it, the projection, and the loss. The order is the reference's:
h[MASK] -> minus template bias -> projection -> cosine / tau (with the MLM transform, `--org_mlp`, the
reference projects h and the bias separately and subtracts after).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxemb import denoise, losses, pooling, templates
from jaxemb.models import Transformer, heads

LOSSES = ("info_nce", "info_nce_with_hard_negatives", "extended_info_nce")
POOLINGS = ("mask", "cls")  # The last template [MASK] state, or the [CLS] state (SimCSE).
DENOISING = denoise.DENOISING
PROJECTIONS = ("mlp", "mlm_transform", "none")  # Fresh dense+tanh (train only), the MLM head transform, none.


@dataclasses.dataclass(frozen=True)
class Objective:
  """A contrastive training setting. Hashable: a static argument of the jitted step.

  Attributes:
    views: the batch field each side of the loss reads (e.g. ("t1", "t2"); SimCSE unsupervised reads the same
      field twice, so only dropout differs).
    view_templates: the template of each view.
    pooling: "mask" or "cls".
    denoising: the template bias subtracted from each view's vector: "none", "position_offset" (PromptBERT) or
      "pad" (CoT-BERT).
    projection: "mlp" (SimCSE's --mlp_only_train), "mlm_transform" (supervised PromptBERT's --org_mlp) or "none".
    loss: one of LOSSES.
    temperature: tau of the cosine logits.
    max_sentence_tokens: the longest sentence (the bias table has one row per length 0..max).
    trainable: "all", or "prompt" (OptiPrompt: only the continuous template vectors and the projection train).
  """

  views: tuple[str, ...]
  view_templates: tuple[templates.Template, ...]
  pooling: str
  denoising: str
  projection: str
  loss: str
  temperature: float
  max_sentence_tokens: int
  trainable: str = "all"

  def __post_init__(self):
    expected = {"info_nce": 2, "info_nce_with_hard_negatives": 3, "extended_info_nce": 3}
    if self.loss not in expected:
      raise ValueError(f"loss {self.loss!r} is not one of {LOSSES}")
    if len(self.views) != expected[self.loss] or len(self.view_templates) != len(self.views):
      raise ValueError(f"loss {self.loss!r} needs {expected[self.loss]} views, each with a template; got "
                       f"{self.views} and {len(self.view_templates)} templates")
    for name, value, allowed in (("pooling", self.pooling, POOLINGS), ("denoising", self.denoising, DENOISING),
                                 ("projection", self.projection, PROJECTIONS),
                                 ("trainable", self.trainable, ("all", "prompt"))):
      if value not in allowed:
        raise ValueError(f"{name} {value!r} is not one of {allowed}")
    needs_mask = self.pooling == "mask" or self.denoising != "none" or self.trainable == "prompt"
    if needs_mask and any(t.num_masks == 0 for t in self.view_templates):
      raise ValueError("mask pooling, denoising and OptiPrompt need templates with [MASK]; got "
                       f"{[t.text for t in self.view_templates]}")


def init_head_params(objective: Objective, hidden_size: int, rng: jax.Array) -> dict[str, Any]:
  """The parameters the objective adds to the encoder's: the fresh MLP."""
  if objective.projection != "mlp":
    return {}
  mlp = heads.DenseTanh(hidden_size)
  return {"mlp": mlp.init(rng, jnp.zeros((1, hidden_size)))["params"]}


def init_prompt_params(template: templates.Template, word_embeddings: jax.Array) -> jax.Array:
  """OptiPrompt's continuous template, initialised from the manual template's static token embeddings:
  one vector per template token (prefix then suffix, [MASK] included; the [MASK] row is never used)."""
  return word_embeddings[jnp.asarray(template.prefix_ids + template.suffix_ids, jnp.int32)]


class _Encoder:
  """The encoder in training mode for one step: every call draws a fresh dropout rng."""

  def __init__(self, model: Transformer, params: dict[str, Any], rng: jax.Array):
    self.model, self.params, self._rng, self._calls = model, params, rng, 0

  def __call__(self, input_ids, attention_mask, **kwargs):
    self._calls += 1
    return self.model.apply({"params": self.params["encoder"]}, input_ids, attention_mask, deterministic=False,
                            rngs={"dropout": jax.random.fold_in(self._rng, self._calls)}, **kwargs)


def _view_vectors(objective: Objective, encode: _Encoder, template: templates.Template,
                  batch: templates.TemplateBatch) -> jax.Array:
  """h of each row of one view: [batch, hidden]."""
  extra = {}
  if objective.trainable == "prompt":
    extra = dict(zip(("inputs_embeds", "inputs_embeds_mask"), templates.continuous_template_inputs(
        template, encode.params["prompt"], batch.sentence_lengths, batch.input_ids.shape[1])))
  out = encode(batch.input_ids, batch.attention_mask, **extra)
  if objective.pooling == "cls":
    return pooling.cls_before_pooler(out)
  return pooling.mask_state(out, batch.mask_positions)


def template_bias_table(objective: Objective, encode: _Encoder, template: templates.Template,
                        position_offset: int) -> jax.Array:
  """The template bias for every sentence length 0..max: [max + 1, hidden], one encoder pass for all lengths
  (REFERENCE.md section 3). Gradients flow through it, as in the reference."""
  prompt = encode.params["prompt"] if objective.trainable == "prompt" else None
  return denoise.template_bias(encode, template, jnp.arange(objective.max_sentence_tokens + 1), objective.denoising,
                               position_offset, objective.max_sentence_tokens, prompt)


def _project(objective: Objective, model: Transformer, params: dict[str, Any], x: jax.Array) -> jax.Array:
  if objective.projection == "mlp":
    return heads.DenseTanh(x.shape[-1]).apply({"params": params["mlp"]}, x)
  if objective.projection == "mlm_transform":
    return model.apply({"params": params["encoder"]}, x, method=Transformer.mlm_transform)
  return x


def loss_and_metrics(objective: Objective, model: Transformer, params: dict[str, Any],
                     batch: dict[str, templates.TemplateBatch], rng: jax.Array) -> tuple[jax.Array, dict[str, Any]]:
  """The objective's loss on one global batch (a dict of views), with dropout from `rng`."""
  encode = _Encoder(model, params, rng)
  biases = {}
  vectors = []
  for view, template in zip(objective.views, objective.view_templates):
    h = _view_vectors(objective, encode, template, batch[view])
    if objective.denoising == "none":
      vectors.append(_project(objective, model, params, h))
      continue
    if template not in biases:  # One bias table per template per step, shared by the views that use it.
      biases[template] = template_bias_table(objective, encode, template, model.config.position_offset)
    bias = biases[template][batch[view].sentence_lengths]
    if objective.projection == "mlm_transform":  # --org_mlp: the reference subtracts after the transform.
      vectors.append(_project(objective, model, params, h) - _project(objective, model, params, bias))
    else:
      vectors.append(_project(objective, model, params, h - bias))
  loss = getattr(losses, objective.loss)(*vectors, temperature=objective.temperature)
  return loss, {"loss": loss}
