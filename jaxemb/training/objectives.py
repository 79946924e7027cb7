"""The training objectives of the papers, assembled from templates, denoising, heads and losses.

One `Objective` describes a setting: the views of each example (which template
each side goes through), how a view becomes a vector (the last [MASK] state or [CLS]), the template denoising
subtracted from it, the head, and the loss. The order is the reference's:
h[MASK] -> minus template bias -> head -> cosine / tau (with the MLM transform, `--org_mlp`, the
reference projects h and the bias separately and subtracts after).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterator
import zlib

import jax
import jax.numpy as jnp

from jaxemb import losses, templates, views, xla
from jaxemb.errors import ConfigError
from jaxemb.models import Transformer
from jaxemb.training import encoder_calls, mlm

POOLINGS = views.POOLINGS
# Fresh dense+tanh, the MLM head's transform, none: views.HEADS but the checkpoint's pooler (SimCSE trains a fresh MLP).
OBJECTIVE_HEADS = tuple(head for head in views.HEADS if head != "pooler")


@dataclasses.dataclass(frozen=True)
class Objective:
  """A training setting: contrastive, or MLM pre-training (loss "mlm": one view, no head, no denoising). Hashable: a
  static argument of the jitted step.

  Attributes:
    views: the batch field each side of the loss reads (e.g. ("t1", "t2"); SimCSE unsupervised reads the same
      field twice, so only dropout differs).
    view_templates: the template of each view.
    pooling: "mask" or "cls".
    denoise: the template bias subtracted from each view's vector: "none", "position_offset" (PromptBERT) or
      "pad" (CoT-BERT).
    head: the projection each view's vector goes through before the loss, one of OBJECTIVE_HEADS: "mlp" (a fresh
      dense+tanh: SimCSE's and PromptBERT's `--mlp_only_train`, or kept when `--mlp_only_train` is off),
      "mlm_transform" (`--mask_embedding_sentence_org_mlp`) or "none".
    loss: one of LOSSES (its name).
    temperature: tau of the cosine logits.
    hard_negative_weight: info_nce_with_hard_negatives only: SimCSE's `--hard_negative_weight`, the log of the weight
      on each row's own hard negative in the denominator (losses.hard_negative_logits; 0: every term weighs 1).
    trainable: "all", or "prompt" (OptiPrompt: the continuous template vectors and the head train, the
      encoder does not).
    loss_group_size: rows per loss (0: the global batch). CoT-BERT ran `nn.DataParallel` on 2 GPUs with 128 rows
      each: each replica computed its own bias tables and its loss over its 128 rows (128 negatives), and the
      Trainer averaged the two losses; 128 reproduces that.
    bias_positions: views.BIAS_POSITIONS.
    prompt_placement: optiprompt.PLACEMENTS.
    freeze_padding_rows: keep the embedding rows HF's `padding_idx` never updates (state.zero_padding_rows).
    ddp_world_size: the processes of the authors' DistributedDataParallel run (supervised PromptBERT and SimCSE: 4).
      Each rank all-gathers the others' vectors without their gradient (`cl_forward`, kongds/Prompt-BERT
      `prompt_bert/models.py`, princeton-nlp/SimCSE `simcse/models.py`) and takes the loss over every gathered row,
      so it back-propagates the global loss through its own rows only; DDP averages the ranks' gradients, which
      leaves the global loss's gradient divided by the world size (the loss value is the global one). The
      step divides the gradient by this before clipping, as that run did.
    word_starts: loss "mlm" with whole-word masking: the vocabulary's word-initial pieces (mlm.WordStarts); None:
      tokens are masked one by one.
    stack_encoder_calls: run the step's encoder passes of near shapes as one call (encoder_calls); None: as this
      backend does best (jaxemb.xla.stacks_encoder_calls). The same loss; a part padded to share a call draws other
      dropout masks.
    loop_small_calls: run the step's small encoder calls with the layer scan's loop (encoder_calls.SMALL_CALL).
  """

  views: tuple[str, ...]
  view_templates: tuple[templates.Template, ...]
  pooling: str
  denoise: str
  head: str
  loss: str
  temperature: float
  hard_negative_weight: float = 0.0
  trainable: str = "all"
  loss_group_size: int = 0
  bias_positions: str = "from_zero"
  prompt_placement: str = "last_occurrence"
  freeze_padding_rows: bool = True
  ddp_world_size: int = 1
  word_starts: mlm.WordStarts | None = None
  stack_encoder_calls: bool | None = None
  loop_small_calls: bool = False
  # Each side of the loss as a views.View (the objective's head is each view's), built in __post_init__: building it
  # checks pooling, denoise and the templates' masks.
  view_list: tuple[views.View, ...] = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ConfigError(f"loss {self.loss!r} is not one of {tuple(LOSSES)}")
    loss = LOSSES[self.loss]
    if len(self.views) != loss.num_views or len(self.view_templates) != len(self.views):
      raise ConfigError(
        f"loss {self.loss!r} needs {loss.num_views} views, each with a template; got "
        f"{self.views} and {len(self.view_templates)} templates"
      )
    for name, value, allowed in (
      ("head", self.head, OBJECTIVE_HEADS),
      ("trainable", self.trainable, ("all", "prompt")),
    ):
      if value not in allowed:
        raise ConfigError(f"{name} {value!r} is not one of {allowed}")
    if self.hard_negative_weight and not loss.weighs_hard_negatives:
      raise ConfigError(
        f"hard_negative_weight {self.hard_negative_weight} applies to "
        f"{', '.join(n for n, found in LOSSES.items() if found.weighs_hard_negatives)} only; loss is "
        f"{self.loss!r}"
      )
    if self.ddp_world_size < 1:
      raise ConfigError(f"ddp_world_size must be at least 1; got {self.ddp_world_size}")
    if self.loss_group_size < 0:
      raise ConfigError(f"loss_group_size must be 0 (the global batch) or positive; got {self.loss_group_size}")
    if self.trainable == "prompt" and any(t.num_masks == 0 for t in self.view_templates):
      raise ConfigError(f"OptiPrompt needs templates with [MASK]; got {[t.text for t in self.view_templates]}")
    if not loss.contrastive and (self.head, self.denoise, self.trainable) != ("none", "none", "all"):
      raise ConfigError(
        f"loss {self.loss!r} trains the whole encoder with its MLM head: it needs head 'none', "
        f"denoise 'none' and trainable 'all'; got {self.head!r}, {self.denoise!r}, {self.trainable!r}"
      )
    if self.word_starts is not None and loss.contrastive:
      raise ConfigError(
        f"whole-word masking applies to loss "
        f"{', '.join(repr(n) for n, found in LOSSES.items() if not found.contrastive)} only; loss is "
        f"{self.loss!r}"
      )
    object.__setattr__(
      self,
      "view_list",
      tuple(
        views.View(
          t,
          pooling=self.pooling,
          denoise=self.denoise,
          head=self.head,
          bias_positions=self.bias_positions,
          prompt_placement=self.prompt_placement,
        )
        for t in self.view_templates
      ),
    )


def init_head_params(objective: Objective, hidden_size: int, rng: jax.Array) -> dict[str, Any]:
  """The parameters the objective adds to the encoder's: the fresh MLP, initialised as HF's `_init_weights` does
  (kernel normal(0, 0.02), bias 0: the authors' `cl_init` calls `init_weights`)."""
  if objective.head != "mlp":
    return {}
  kernel = 0.02 * jax.random.normal(rng, (hidden_size, hidden_size), jnp.float32)
  return {"mlp": {"dense": {"kernel": kernel, "bias": jnp.zeros((hidden_size,), jnp.float32)}}}


def init_prompt_params(template: templates.Template, word_embeddings: jax.Array) -> jax.Array:
  """OptiPrompt's continuous template, initialised from the manual template's static token embeddings:
  one vector per template token (prefix then suffix, [MASK] included; the [MASK] row is never used)."""
  return word_embeddings[jnp.asarray(template.prefix_ids + template.suffix_ids, jnp.int32)]


def split_trainable(objective: Objective, encoder: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """(trained, frozen) parts of the pretrained encoder: all of it trains, or for OptiPrompt only the MLM transform
  when it is the head (the authors' `--mask_embedding_sentence_org_mlp` head stays trainable while
  `requires_grad` is off for the encoder)."""
  if objective.trainable == "all":
    return {"encoder": encoder}, {}
  if objective.head != "mlm_transform":
    return {}, {"encoder": encoder}
  if "mlm_head" not in encoder:
    raise ConfigError("head 'mlm_transform' needs a checkpoint with an MLM head; this one has none")
  head = encoder["mlm_head"]
  transform = {k: head[k] for k in ("dense", "layer_norm")}
  rest = {**encoder, "mlm_head": {k: v for k, v in head.items() if k not in transform}}
  return {"encoder": {"mlm_head": transform}}, {"encoder": rest}


class _TrainingForward:
  """The encoder's forward pass in training mode (dropout on) for one step. Each part of the step runs it through
  `named(part)`, whose dropout rng is the step's folded with the part's name (a loss group, a view by its position,
  a template's bias rows), so the masks do not change when code runs the parts in another order or in one call
  (encoder_calls). Calls of one part each draw a fresh rng."""

  def __init__(self, model: Transformer, params: dict[str, Any], rng: jax.Array):
    self.model, self.params, self._rng, self._calls = model, params, rng, 0

  def named(self, part: str) -> _TrainingForward:
    # crc32, not hash(): str hashes differ between processes, and every host must draw the same masks.
    return _TrainingForward(self.model, self.params, jax.random.fold_in(self._rng, zlib.crc32(part.encode())))

  def next_key(self) -> jax.Array:
    """The dropout rng of this part's next call."""
    self._calls += 1
    return jax.random.fold_in(self._rng, self._calls)

  def __call__(self, input_ids, attention_mask, **kwargs):
    return self.model.apply(
      {"params": self.params["encoder"]},
      input_ids,
      attention_mask,
      deterministic=False,
      rngs={"dropout": self.next_key()},
      **kwargs,
    )


@dataclasses.dataclass
class _GroupPasses:
  """One loss group's encoder passes: `parts` keyed ("view", i) and ("bias", template), in the order they were
  built."""

  parts: dict[tuple[str, Any], encoder_calls.Part]

  def read(self, states: Iterator[jax.Array]) -> dict[tuple[str, Any], jax.Array]:
    """The parts' read states (taken from `states` in the parts' order): each view's h [rows, hidden], each
    template's bias table [max_len + 1, hidden]."""
    return {name: next(states) for name in self.parts}


def _group_passes(
  objective: Objective, model: Transformer, forward: _TrainingForward, batch: dict[str, templates.TemplateBatch]
) -> _GroupPasses:
  """Each view's sentences, and each denoising template's bias rows for every sentence length 0..max_len the batch's
  width holds (one table per template, shared by the views that use it: kongds/Prompt-BERT `get_delta`,
  ZBWpro/CoT-BERT `denoising`; gradients flow through it, as in the reference). Dropout keys by part name: SimCSE's
  two views read the same field and differ in dropout alone, so a view is named by its position."""
  passes = _GroupPasses({})
  prompt = forward.params.get("prompt")
  for i, (field, view) in enumerate(zip(objective.views, objective.view_list)):
    if view.denoise != "none" and ("bias", view.template) not in passes.parts:
      max_len = batch[field].input_ids.shape[1] - view.template.num_tokens  # What data.length_multiple's width holds.
      inputs = views.bias_inputs(view, model.config, jnp.arange(max_len + 1), max_len, prompt)
      key = forward.named(f"bias {view.template.text}").next_key()
      passes.parts["bias", view.template] = encoder_calls.Part(inputs, key)
    key = forward.named(f"view {i}").next_key()
    passes.parts["view", i] = encoder_calls.Part(views.sentence_inputs(view, batch[field], prompt), key)
  return passes


def _group_loss(
  logits_of: Callable[..., jax.Array],
  objective: Objective,
  model: Transformer,
  params: dict[str, Any],
  batch: dict[str, templates.TemplateBatch],
  results: dict[tuple[str, Any], Any],
) -> tuple[jax.Array, jax.Array]:
  """(loss, contrastive accuracy) over one group of rows, from the logits `logits_of` the views' vectors, given the
  group's encoder results (_GroupPasses.read)."""
  vectors = []
  for i, (field, view) in enumerate(zip(objective.views, objective.view_list)):
    bias = None if view.denoise == "none" else results["bias", view.template][batch[field].sentence_lengths]
    vectors.append(views.apply_head(view, model, params, results["view", i], bias))
  weight = {"hard_negative_weight": objective.hard_negative_weight} if objective.hard_negative_weight else {}
  logits = logits_of(*vectors, temperature=objective.temperature, **weight)
  return losses.diagonal_cross_entropy(logits), losses.contrastive_accuracy(logits)


def loss_and_metrics(
  objective: Objective,
  model: Transformer,
  params: dict[str, Any],
  batch: dict[str, templates.TemplateBatch],
  rng: jax.Array,
) -> tuple[jax.Array, dict[str, Any]]:
  """The objective's loss on one global batch (a dict of views) and the step's metrics, with dropout (and MLM's
  masking) from `rng`."""
  return LOSSES[objective.loss].compute(objective, model, _TrainingForward(model, params, rng), batch, rng)


def _contrastive_loss(
  logits_of: Callable[..., jax.Array],
  objective: Objective,
  model: Transformer,
  forward: _TrainingForward,
  batch: dict[str, templates.TemplateBatch],
  rng: jax.Array,
) -> tuple[jax.Array, dict[str, Any]]:
  """The diagonal cross-entropy of the views' logits (`logits_of`, jaxemb.losses): the mean of the losses of the
  batch's groups of `loss_group_size` rows (one group: the global batch), and their contrastive accuracy. Every
  group's encoder passes run together, in as few calls as their shapes allow (encoder_calls)."""
  del rng  # The forward's.
  rows = next(iter(batch.values())).input_ids.shape[0]
  size = objective.loss_group_size or rows
  if rows % size:
    raise ValueError(f"the batch of {rows} rows does not split into loss groups of {size}")
  groups = [jax.tree.map(lambda x: x[i : i + size], batch) for i in range(0, rows, size)]
  passes = [_group_passes(objective, model, forward.named(f"group {g}"), group) for g, group in enumerate(groups)]
  stack = xla.stacks_encoder_calls() if objective.stack_encoder_calls is None else objective.stack_encoder_calls
  parts = [part for p in passes for part in p.parts.values()]
  states = iter(encoder_calls.encode(model, forward.params["encoder"], parts, stack, objective.loop_small_calls))
  results = [
    _group_loss(logits_of, objective, model, forward.params, group, p.read(states)) for group, p in zip(groups, passes)
  ]
  loss = sum(loss for loss, _ in results) / len(results)
  return loss, {"loss": loss, "contrastive_accuracy": sum(accuracy for _, accuracy in results) / len(results)}


def _mlm_loss(
  objective: Objective,
  model: Transformer,
  forward: _TrainingForward,
  batch: dict[str, templates.TemplateBatch],
  rng: jax.Array,
) -> tuple[jax.Array, dict[str, Any]]:
  """MLM's loss on the view's rows, masked with a key of the step's `rng` (jaxemb.training.mlm): the mean over the
  global batch's masked tokens."""
  masking = jax.random.fold_in(rng, zlib.crc32(b"mlm masking"))
  if "mlm_head" not in forward.params["encoder"]:
    raise ConfigError(
      "loss 'mlm' needs a checkpoint with an MLM head (or an architecture, trained from scratch); this one has none"
    )
  (field,), (template,) = objective.views, objective.view_templates
  rows = batch[field]
  input_ids, selected = mlm.mask_tokens(
    masking,
    rows.input_ids,
    mlm.maskable(rows, template),
    template.mask_id,
    model.config.vocab_size,
    objective.word_starts,
  )
  hidden = forward.named("view 0")(input_ids, rows.attention_mask).last_hidden_state
  logits = lambda h: model.apply({"params": forward.params["encoder"]}, h, method=Transformer.mlm_logits)
  loss, accuracy = mlm.masked_lm_loss(logits, hidden, rows.input_ids, selected)
  return loss, {"loss": loss, "mlm_accuracy": accuracy}


@dataclasses.dataclass(frozen=True)
class Loss:
  """A training loss, registered in LOSSES under its name.

  Attributes:
    num_views: the views of each example it reads.
    compute: (objective, model, training forward, global batch, step rng) -> (loss, metrics).
    contrastive: a loss over the views' vectors (a head, denoising and OptiPrompt apply); else MLM's, on the
      encoder's own token predictions (whole-word masking applies).
    weighs_hard_negatives: it takes hard_negative_weight.
    least_group_rows: the rows a loss group needs to train: InfoNCE's negatives are the group's other rows.
  """

  num_views: int
  compute: Callable[..., tuple[jax.Array, dict[str, Any]]]
  contrastive: bool = True
  weighs_hard_negatives: bool = False
  least_group_rows: int = 1


# The papers' losses (jaxemb.losses: SimCSE's and PromptBERT's InfoNCE, supervised SimCSE's with hard negatives,
# CoT-BERT's extended InfoNCE) and masked language modelling on one view (PromptBERT App. A.2's pre-training).
LOSSES = {
  "info_nce": Loss(2, functools.partial(_contrastive_loss, losses.info_nce_logits), least_group_rows=2),
  "info_nce_with_hard_negatives": Loss(
    3, functools.partial(_contrastive_loss, losses.hard_negative_logits), weighs_hard_negatives=True
  ),
  "extended_info_nce": Loss(3, functools.partial(_contrastive_loss, losses.extended_info_nce_logits)),
  "mlm": Loss(1, _mlm_loss, contrastive=False),
}
