"""The prompt methods (PromptBERT, CoT-BERT): the state at a template's last [MASK] as `views.View` computes it for
training, model selection and evaluation alike, or the MLM head's top-k tokens there (PromptBERT Eq. 3).

sentence-transformers can put a prompt before a sentence but not after it, and pools no [MASK] position, so `prompt`
exports as a custom module: jaxemb/st_prompt_module.py copied into the folder, which
`SentenceTransformer(out, trust_remote_code=True)` loads.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from jaxemb import denoise, pooling, templates, views
from jaxemb.errors import ConfigError
from jaxemb.methods import base, pooled
from jaxemb.models import EncoderConfig, Transformer, hf

# What a prompt vector goes through after denoising (supervised PromptBERT; kongds/Prompt-BERT `evaluation.py`):
# nothing, the checkpoint's MLM head transform (BERT, --mask_embedding_sentence_org_mlp; applied to h and the bias
# apart), or its pooler (RoBERTa, --mask_embedding_sentence_use_pooler, whose run directory holds the trained MLP
# there): views.HEADS but the training MLP.
METHOD_HEADS = tuple(head for head in views.HEADS if head != "mlp")
PROMPT_MODULE = "jaxemb_prompt"  # The custom module's file (.py) and config (.json) in an exported folder.
_HEAD_WEIGHTS = {"mlm_transform": "mlm_head", "pooler": "pooler"}  # The params group each head reads.


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Prompt(base.Tokenized):
  """A template's last [MASK] state, denoised or not, through a head (`prompt`), or the static embeddings of the MLM
  head's top-k tokens there (`prompt_mlm_top_k`).

  Attributes:
    template: a prompt with [X] and [MASK].
    top_k: prompt_mlm_top_k: tokens averaged (PromptBERT Table 9 uses 200).
    denoise: the template bias subtracted, one of denoise.KINDS as training's objective.denoise names them:
      "position_offset" (supervised PromptBERT's evaluation; PromptBERT Table 9 denoises the top-k representation
      too), "pad" (CoT-BERT's training denoising; its evaluation subtracts none) or "none".
    head: prompt: one of METHOD_HEADS, applied to the (denoised) [MASK] vector.
    bias_positions: denoise: the position-offset rows' positions (views.BIAS_POSITIONS).
    prompt_placement: a continuous template's placement (optiprompt.PLACEMENTS).
  """

  NAMES = ("prompt", "prompt_mlm_top_k")
  FIELD_OWNERS = {"head": ("prompt",), "top_k": ("prompt_mlm_top_k",)}

  template: str = templates.SLOT
  top_k: int = 200
  denoise: str = "none"
  head: str = "none"
  bias_positions: str = "from_zero"
  prompt_placement: str = "last_occurrence"

  def __post_init__(self):
    super().__post_init__()
    if self.head not in METHOD_HEADS:
      raise ConfigError(f"head {self.head!r} is not one of {METHOD_HEADS}")
    if self.denoise not in denoise.KINDS:
      raise ConfigError(f"denoise {self.denoise!r} is not one of {denoise.KINDS}")
    if problem := templates.slot_problem(self.template):
      raise ConfigError(f"method {self.name!r}: template {self.template!r} {problem}")

  def validate(self, config: EncoderConfig, num_masks: int):
    if not config.is_masked_lm:
      raise ConfigError(
        f"method {self.name!r} reads the state at [MASK], which an ELECTRA discriminator was not trained to "
        "represent ('the ELECTRA discriminator is trained without [MASK] tokens', Ditto §4), and it has no MLM "
        "head; use a method without [MASK], e.g. ditto (Ditto Table 2) or first_last_avg"
      )
    if num_masks == 0:
      given = "none was given" if self.template == templates.SLOT else f"got {self.template!r}"
      raise ConfigError(
        f"method {self.name!r} needs a template with [MASK] (Method's template: --config.method.template, "
        f"jaxemb.export's --method.template), e.g. PromptBERT's 'This sentence : \"[X]\" means [MASK] .'; "
        f"{given}"
      )
    if self.name == "prompt_mlm_top_k" and not 0 < self.top_k <= config.vocab_size:
      raise ConfigError(f"top_k {self.top_k} out of range (1..{config.vocab_size})")

  def required_weights(self) -> dict[str, str]:
    if self.name == "prompt_mlm_top_k":  # The MLM head's logits rank the tokens.
      return {"mlm_head": f"method {self.name!r} (the MLM head's top {self.top_k} tokens)"}
    return {_HEAD_WEIGHTS[self.head]: f"head {self.head!r}"} if self.head in _HEAD_WEIGHTS else {}

  def view(self, template: templates.Template) -> views.View:
    """The views.View of this method: `template`'s last [MASK], denoised or not, through its head."""
    return views.View(
      template,
      pooling="mask",
      denoise=self.denoise,
      head=self.head,
      bias_positions=self.bias_positions,
      prompt_placement=self.prompt_placement,
    )

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
    forward = functools.partial(model.apply, {"params": params})
    h = views.vector(self.view(template), model, {"encoder": params}, forward, batch, prompt)
    if self.name == "prompt":
      return h
    return pooling.mlm_top_k(
      forward(h, method=Transformer.mlm_logits), params["embeddings"]["word"]["embedding"], self.top_k
    )

  @property
  def exportable(self) -> bool:
    return self.name == "prompt"

  def check_exportable(self):
    super().check_exportable()
    if self.denoise == "pad":
      raise base.NotExportable(
        "denoise 'pad' has no sentence-transformers form here: the exported module "
        "(jaxemb/st_prompt_module.py) subtracts position-offset biases only"
      )

  def export(self, out: Any, config: EncoderConfig, params: Any, tokenizer: Any, fitted: Any = None):
    """modules.json naming the custom module `jaxemb_prompt.PromptEncoder` (a copy of jaxemb/st_prompt_module.py,
    loaded with trust_remote_code) and its jaxemb_prompt.json: the template's own ids, the last [MASK], denoising,
    the head, all as jaxemb's Template and this method hold them."""
    del fitted  # A prompt method fits nothing.
    self.check_exportable()
    template = templates.Template.parse(self.template, tokenizer)
    base.write_custom_module(
      out,
      "st_prompt_module.py",
      PROMPT_MODULE,
      "PromptEncoder",
      {
        "template": self.template,
        "prefix_text": template.prefix_text,
        "suffix_text": template.suffix_text,
        "prefix_ids": list(template.prefix_ids),
        "suffix_ids": list(template.suffix_ids),
        "cls_id": template.cls_id,
        "sep_id": template.sep_id,
        "pad_id": template.pad_id,
        "mask_index": template.mask_indices[-1],
        "tokenization": self.tokenization,
        "denoise": self.denoise == "position_offset",
        "head": self.head,
        # 0: positions from 0, as the authors count them (RoBERTa included); HF RoBERTa's numbering starts at 2.
        "bias_position_offset": views.bias_position_offset(self.bias_positions, config),
        "max_length": config.max_length,
        # The MLM transform's *ForMaskedLM builds no pooler; a *Model loads the weights as they are.
        "model_kwargs": {} if self.head == "mlm_transform" else hf.model_load_kwargs(config, params),
      },
    )

  @property
  def remote_code(self) -> bool:
    return True

  def card_tags(self) -> tuple[str, ...]:
    return (self.name, "promptbert")

  def card_text(self) -> str:
    tokens = "tokenised in context" if self.tokenization == "in_context" else "its own tokens between the template ids"
    steps = [
      f"the template `{self.template}` is filled with each sentence ({tokens})",
      "the vector is the last hidden state at the template's last [MASK]",
    ]
    if self.denoise == "position_offset":
      steps.append(
        "minus the same state of the template alone, its positions after the slot moved on by the "
        "sentence's length (PromptBERT's template denoising)"
      )
    if self.denoise == "pad":
      steps.append(
        "minus the same state of the template with as many [PAD]s as the sentence has tokens in its "
        "slot (CoT-BERT's denoising)"
      )
    if self.head != "none":
      steps.append(
        {
          "mlm_transform": "through the MLM head's transform (applied to both terms apart)",
          "pooler": "through the pretrained pooler (dense + tanh)",
        }[self.head]
      )
    return (
      "## Method\n\nPromptBERT's prompt-based sentence embedding (Jiang et al., 2022, "
      "https://github.com/kongds/Prompt-BERT): " + "; ".join(steps) + ". The custom module `jaxemb_prompt.py` "
      "in this folder computes it with torch and transformers, so sentence-transformers loads it with "
      "`trust_remote_code=True`.\n"
    )

  @property
  def add_period(self) -> bool:
    return True  # kongds/Prompt-BERT `evaluation.py` appends "." for the prompt methods.


def from_view(view: views.View, head: str, denoised: bool) -> base.Method:
  """The method that embeds a sentence as `view` does in evaluation mode, the sentence's own tokens between the
  template ids (the authors' trainer): the [CLS] state (through the pooler for head "pooler"), or the template's
  last [MASK] state, denoised as the view is if `denoised`, through `head`."""
  if view.pooling == "cls":
    return pooled.Pooled("cls" if head == "pooler" else "cls_before_pooler")
  return Prompt(
    "prompt",
    template=view.template.text,
    head=head,
    tokenization="alone",
    denoise=view.denoise if denoised else "none",
    bias_positions=view.bias_positions,
    prompt_placement=view.prompt_placement,
  )
