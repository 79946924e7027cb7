r"""Export for the PyTorch world: a sentence-transformers directory, or an HF checkpoint with its torch code.

`last_avg`, `cls_before_pooler` and `cls` become sentence-transformers directories (Transformer, Pooling and,
for `cls`, a Dense+tanh module holding the pretrained pooler). sentence-transformers can put a prompt before a
sentence but not after it, and pools no [MASK] position, so `prompt` becomes a Hugging Face checkpoint whose
README.md carries the few lines of torch code that embed a sentence (denoising and heads included). Either way
the vectors equal `Encoder.encode`'s with the same method.

  python -m jaxemb.export --model ../shared/models/all-MiniLM-L6-v2 --method last_avg --out exported/minilm
  python -m jaxemb.export --model runs/promptbert --out exported/promptbert   # the run's own method
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

import numpy as np

from jaxemb import templates, views
from jaxemb.encode import METHOD_HEADS, Method, open_model
from jaxemb.errors import ConfigError
from jaxemb.models import hf

# sentence-transformers' pooling mode of each method, in the legacy config keys that every release since 2.0 reads.
_POOLING = {"last_avg": "mean_tokens", "cls_before_pooler": "cls_token", "cls": "cls_token"}
_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
EXPORTABLE = (*_POOLING, "prompt")


def export_model(source: str | pathlib.Path, out_dir: str | pathlib.Path, method: Method | str | None = None
                 ) -> pathlib.Path:
  """Writes `source` (an HF checkpoint directory or hub id, or a jaxemb run directory's best step) with `method`
  to the new directory `out_dir`; returns it.

  `method` is a Method, a method name, or None for a run directory's own evaluation method. Raises
  NotImplementedError for methods sentence-transformers cannot express (those outside EXPORTABLE, and
  OptiPrompt's continuous templates), ValueError for a method the checkpoint lacks weights for.
  """
  out = pathlib.Path(out_dir)
  if out.exists() and any(out.iterdir()):
    raise FileExistsError(f"{out} is not empty; export into a new directory")
  config, params, tokenizer, method = _load(source, method)
  hf.save_pretrained(out, config, params if method.head == "mlm_transform" else
                     {k: v for k, v in params.items() if k != "mlm_head"}, tokenizer)
  roberta = config.model_type == "roberta"
  if method.name == "prompt":
    code = _prompt_code(out, config, templates.Template.parse(method.template, tokenizer), method)
    usage = (f"Method `prompt` (template `{method.template}`, denoise={method.denoise}, head={method.head!r}). "
             "sentence-transformers cannot put text after a sentence nor pool a [MASK] position, so this is a "
             "Hugging Face checkpoint; these lines embed sentences with torch and transformers:")
    caveat = (" (jaxemb tokenises a sentence apart when its edge merges into one token with the template text next "
              "to the slot, e.g. `.'`; these lines do not)") if roberta else ""
  else:
    _write_sentence_transformers(out, config, params, method)
    code = (f'from sentence_transformers import SentenceTransformer\n\nmodel = SentenceTransformer("{out.resolve()}")\n'
            'vectors = model.encode(["A man is playing a guitar.", "A woman slices an onion."])\n')
    usage = f"Method `{method.name}` as a sentence-transformers model:"
    caveat = (" for stripped sentences (jaxemb strips them, sentence-transformers does not, and a leading space "
              "changes RoBERTa's tokens)") if roberta else ""
  (out / "README.md").write_text(
      f"# {out.name}\n\nExported by jaxemb from `{source}`. {usage}\n\n```python\n{code}```\n\nThe vectors equal "
      f"jaxemb's `Encoder.from_pretrained(..., method).encode(sentences)` within float32 rounding{caveat}.\n")
  return out


def _load(source: str | pathlib.Path, method: Method | str | None) -> tuple[Any, dict[str, Any], Any, Method]:
  """(config, encoder params, tokenizer, method) of the source, the method checked before the weights load."""
  model, method = open_model(source, method, EXPORTABLE)
  if method.name not in EXPORTABLE:
    raise NotImplementedError(f"method {method.name!r} has no sentence-transformers or plain-transformers form "
                              f"here; exportable methods: {EXPORTABLE}")
  if method.tokenization != "in_context":
    raise NotImplementedError(f"tokenization {method.tokenization!r}: the exported code tokenises the filled-in "
                              "template (tokenization 'in_context', as evaluation.py does)")
  params = model.load_params()
  if "prompt" in params:
    raise NotImplementedError(f"{source} trained a continuous (OptiPrompt) template, which has no text form "
                              "for a tokenizer; only runs of manual templates export")
  params = params["encoder"]
  needed = ("pooler" if method.name == "cls" or method.head == "pooler" else
            "mlm_head" if method.head == "mlm_transform" else None)
  if needed and needed not in params:
    raise ConfigError(f"method {method.name!r} (head {method.head!r}) needs the checkpoint's {needed} weights; "
                     f"{source} has none")
  return model.config, params, model.tokenizer, method


def _write_json(path: pathlib.Path, value: Any):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(value, indent=2) + "\n")


def _write_sentence_transformers(out: pathlib.Path, config: Any, params: dict[str, Any], method: Method):
  """modules.json and the module folders around the Hugging Face checkpoint already in `out`."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  modules = [("", "Transformer"), ("1_Pooling", "Pooling")] + ([("2_Dense", "Dense")] if method.name == "cls" else [])
  _write_json(out / "modules.json", [
      {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
      for i, (path, kind) in enumerate(modules)])
  _write_json(out / "sentence_bert_config.json", {"max_seq_length": config.max_length, "do_lower_case": False})
  mode = _POOLING[method.name]
  _write_json(out / "1_Pooling" / "config.json", {
      "word_embedding_dimension": config.hidden_size,
      **{f"pooling_mode_{m}": m == mode for m in _POOLING_MODES}})
  if method.name == "cls":  # The pretrained pooler: [CLS] state -> dense -> tanh.
    dense = params["pooler"]["dense"]
    _write_json(out / "2_Dense" / "config.json", {
        "in_features": config.hidden_size, "out_features": config.hidden_size, "bias": True,
        "activation_function": "torch.nn.modules.activation.Tanh"})
    save_file({"linear.weight": np.ascontiguousarray(np.asarray(dense["kernel"], np.float32).T),
               "linear.bias": np.asarray(dense["bias"], np.float32)},
              str(out / "2_Dense" / "model.safetensors"), metadata={"format": "pt"})


def _prompt_code(out: pathlib.Path, config: Any, template: templates.Template, method: Method) -> str:
  """Torch code that embeds sentences as `method` does: the state at the template's last [MASK], minus the
  template-only bias when denoising, through the head. Each row is the tokenised filled-in template, as in
  jaxemb (RoBERTa rows differ only where a sentence merges into one token with the template text next to it)."""
  last = template.mask_indices[-1]
  num_prefix = len(template.prefix_ids)
  if last < num_prefix:
    position, where = f"{1 + last}", f"column {1 + last}"
  else:
    back = 1 + len(template.suffix_ids) - (last - num_prefix)
    position, where = f"lengths - {back}", f"{back} tokens before the end of each row"
  mlm = method.head == "mlm_transform"
  lines = [
      "import torch",
      "import transformers",
      "",
      f'path = "{out.resolve()}"',
      "tokenizer = transformers.AutoTokenizer.from_pretrained(path)",
      *(["mlm = transformers.AutoModelForMaskedLM.from_pretrained(path).eval()", "model = mlm.base_model"] if mlm
        else ["model = transformers.AutoModel.from_pretrained(path).eval()"]),
      f"prefix, suffix = {template.prefix_text!r}, {template.suffix_text!r}  # The template around the sentence.",
      "",
      "",
      "@torch.no_grad()",
      "def encode(sentences):",
      '  batch = tokenizer([prefix + s.strip() + suffix for s in sentences], padding=True, return_tensors="pt")',
      *(['  lengths = batch["attention_mask"].sum(1)'] if last >= num_prefix or method.denoise else []),
      f"  # The template's last [MASK]: {where}.",
      f"  h = model(**batch).last_hidden_state[torch.arange(len(sentences)), {position}]",
  ]
  vector = "h"
  if method.denoise:
    row = template.row(())
    mask_column = 1 + last if last < num_prefix else len(row) - back
    first = views.bias_position_offset(method.bias_positions, config)  # 0: as the authors count; HF RoBERTa's 2.
    offset = f"{first} + " if first else ""
    lines += [
        "  # Denoising: minus the same state of the template alone, its positions after the slot moved on by the",
        "  # sentence's length, as if the sentence were there.",
        f"  template = torch.tensor({list(row)})",
        "  columns = torch.arange(len(template))",
        "  sentence_lengths = lengths - len(template)",
        f"  position_ids = {offset}columns + sentence_lengths[:, None] * (columns > {num_prefix})",
        "  bias = model(input_ids=template.expand(len(sentences), -1), position_ids=position_ids).last_hidden_state"
        f"[:, {mask_column}]",
    ]
    vector = "h - bias"
  if method.head == "pooler":
    lines.append(f"  return torch.tanh(model.pooler.dense({vector}))  # The pretrained pooler.")
  elif mlm:
    transform = ("mlm.cls.predictions.transform" if config.model_type == "bert" else
                 "lambda x: mlm.lm_head.layer_norm(torch.nn.functional.gelu(mlm.lm_head.dense(x)))")
    lines += [f"  transform = {transform}  # The MLM head's dense + activation + LayerNorm.",
              "  return transform(h)" + (" - transform(bias)" if method.denoise else "")]
  else:
    lines.append(f"  return {vector}")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None):
  parser = argparse.ArgumentParser(prog="python -m jaxemb.export", description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", required=True, help="HF checkpoint directory or hub id, or a jaxemb run directory")
  parser.add_argument("--out", required=True, help="the new directory to write")
  parser.add_argument("--method", help=f"one of {EXPORTABLE}; default: a run directory's own method")
  parser.add_argument("--template", default=templates.SLOT, help="the prompt method's template, with [X] and [MASK]")
  parser.add_argument("--denoise", action="store_true", help="prompt: subtract the position-offset template bias")
  parser.add_argument("--head", default="none", choices=METHOD_HEADS, help="prompt: applied to the [MASK] vector")
  args = parser.parse_args(argv)
  if args.method is None and (args.template != templates.SLOT or args.denoise or args.head != "none"):
    parser.error("--template, --denoise and --head need --method")
  method = None if args.method is None else Method(args.method, template=args.template, denoise=args.denoise,
                                                    head=args.head)
  print(export_model(args.model, args.out, method))


if __name__ == "__main__":
  main()
