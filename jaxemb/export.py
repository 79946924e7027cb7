r"""Export for the PyTorch world: every exportable method as a sentence-transformers folder with its model card.

`last_avg`, `cls_before_pooler` and `cls` become the stock modules (Transformer, Pooling and, for `cls`, a Dense+tanh
module holding the pretrained pooler). sentence-transformers can put a prompt before a sentence but not after it,
and pools no [MASK] position, so `prompt` (the manual template, position-offset denoising, the MLM-transform and
pooler heads; BERT and RoBERTa) becomes a custom module: jaxemb/st_prompt_module.py copied into the folder, which
`SentenceTransformer(out, trust_remote_code=True)` loads. Either way the vectors equal `Encoder.encode`'s with the
same method. Every export writes README.md, the model card (jaxemb/model_card.py); `--push_to_hub REPO` then
uploads the folder. The source and the folder may be in a bucket (gs://), each file written there in one upload.

  python -m jaxemb.export --model ../shared/models/all-MiniLM-L6-v2 --method last_avg --out exported/minilm
  python -m jaxemb.export --model runs/promptbert --out exported/promptbert   # the run's own method
  python -m jaxemb.export --model gs://bucket/runs/promptbert --out gs://bucket/exported/promptbert
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

import numpy as np

from jaxemb import atomic, cli, model_card, storage, templates, views
from jaxemb.encode import METHOD_HEADS, Method, open_model
from jaxemb.errors import ConfigError, StorageError
from jaxemb.models import hf

# sentence-transformers' pooling mode of each method, in the legacy config keys that every release since 2.0 reads.
_POOLING = {"last_avg": "mean_tokens", "cls_before_pooler": "cls_token", "cls": "cls_token"}
_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
EXPORTABLE = (*_POOLING, "prompt")
PROMPT_MODULE = "jaxemb_prompt"  # The custom module's file (.py) and config (.json) in an exported folder.


class NotExportable(ConfigError, NotImplementedError):
  """A method (or a run's continuous template) that the exported modules cannot compute."""


def export_model(source: storage.PathLike, out_dir: storage.PathLike, method: Method | str | None = None,
                 hub_repo: str | None = None) -> storage.Path:
  """Writes `source` (an HF checkpoint directory or hub id, or a jaxemb run directory's best step; local or gs://)
  with `method` to the new directory `out_dir` (local or gs://) as a sentence-transformers model with its model
  card; returns it.

  `method` is a Method, a method name, or None for a run directory's own evaluation method; `hub_repo`, the Hub
  repository it is meant for, is what the model card's code loads (default: the folder, by its path). Raises
  NotExportable for methods outside EXPORTABLE and OptiPrompt's continuous templates, ConfigError for a method
  the checkpoint lacks weights for, FileExistsError for a non-empty `out_dir`.
  """
  out = storage.path(out_dir)
  if out.exists() and any(out.iterdir()):
    raise FileExistsError(f"{out} is not empty; export into a new directory")
  config, params, tokenizer, method = _load(source, method)
  card_facts = model_card.facts(source)
  hf.save_pretrained(out, config, params if _keeps_mlm_head(method, card_facts) else
                     {k: v for k, v in params.items() if k != "mlm_head"}, tokenizer)
  if method.name == "prompt":
    _write_prompt_module(out, config, templates.Template.parse(method.template, tokenizer), method)
  else:
    _write_sentence_transformers(out, config, params, method)
  model_card.write(out, source, method, card_facts, hub_repo)
  return out


def push_to_hub(out: storage.PathLike, repo: str) -> str:
  """Uploads the exported folder `out` (in a bucket: its copy in the download cache) to the Hub model repository
  `repo` (created if needed); returns its URL.

  Raises:
    StorageError: the upload failed (offline, no token, no access), naming the repository and the cause.
  """
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  # The hub's failures: OSError (HTTP errors, offline mode), its HTTP client's transport errors (the bases of
  # HfHubHTTPError besides OSError: no connection, a timeout), ValueError (HFValidationError: a bad repository id).
  failures = (OSError, ValueError, *huggingface_hub.errors.HfHubHTTPError.__bases__)
  api = huggingface_hub.HfApi()
  try:
    api.create_repo(repo, repo_type="model", exist_ok=True)
    commit = api.upload_folder(folder_path=str(storage.local_copy(out)), repo_id=repo, repo_type="model",
                               commit_message="Upload a jaxemb export")
  except failures as e:
    cause = " ".join(str(e).split()) or type(e).__name__
    raise StorageError(f"--push_to_hub {repo}: upload of {out} failed ({type(e).__name__}: {cause[:300]}); the "
                       "export is kept there: check the network and `huggingface-cli login`, then upload it") from e
  return str(commit.repo_url)


def _load(source: storage.PathLike, method: Method | str | None) -> tuple[Any, dict[str, Any], Any, Method]:
  """(config, encoder params, tokenizer, method) of the source, the method checked before the weights load."""
  model, method = open_model(source, method, EXPORTABLE)
  if method.name not in EXPORTABLE:
    raise NotExportable(f"method {method.name!r} has no sentence-transformers form here; exportable methods: "
                        f"{EXPORTABLE}")
  params = model.load_params()
  if "prompt" in params:
    raise NotExportable(f"{source} trained a continuous (OptiPrompt) template, which has no text form for a "
                        "tokenizer; only runs of manual templates export")
  params = params["encoder"]
  needed = ("pooler" if method.name == "cls" or method.head == "pooler" else
            "mlm_head" if method.head == "mlm_transform" else None)
  if needed and needed not in params:
    raise ConfigError(f"method {method.name!r} (head {method.head!r}) needs the checkpoint's {needed} weights; "
                     f"{source} has none")
  return model.config, params, model.tokenizer, method


def _keeps_mlm_head(method: Method, card_facts: dict[str, Any]) -> bool:
  """Whether the export keeps the MLM head: when the method reads it, or when the run trained it (loss "mlm":
  pre-training continues from the export, as preflight tells a user who names a run directory as model.path)."""
  training = card_facts["training"] or {}
  return method.head == "mlm_transform" or training.get("fields", {}).get("objective.loss") == "mlm"


def _write_sentence_transformers(out: storage.Path, config: Any, params: dict[str, Any], method: Method):
  """modules.json and the module folders around the Hugging Face checkpoint already in `out`."""
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
  modules = [("", "Transformer"), ("1_Pooling", "Pooling")] + ([("2_Dense", "Dense")] if method.name == "cls" else [])
  atomic.write_json(out / "modules.json", [
      {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
      for i, (path, kind) in enumerate(modules)])
  atomic.write_json(out / "sentence_bert_config.json", {"max_seq_length": config.max_length, "do_lower_case": False})
  mode = _POOLING[method.name]
  atomic.write_json(out / "1_Pooling" / "config.json", {
      "word_embedding_dimension": config.hidden_size,
      **{f"pooling_mode_{m}": m == mode for m in _POOLING_MODES}})
  if method.name == "cls":  # The pretrained pooler: [CLS] state -> dense -> tanh.
    dense = params["pooler"]["dense"]
    atomic.write_json(out / "2_Dense" / "config.json", {
        "in_features": config.hidden_size, "out_features": config.hidden_size, "bias": True,
        "activation_function": "torch.nn.modules.activation.Tanh"})
    weights = save({"linear.weight": np.ascontiguousarray(np.asarray(dense["kernel"], np.float32).T),
                    "linear.bias": np.asarray(dense["bias"], np.float32)}, metadata={"format": "pt"})
    atomic.write(out / "2_Dense" / "model.safetensors", lambda f: f.write(weights))


def _write_prompt_module(out: storage.Path, config: Any, template: templates.Template, method: Method):
  """modules.json naming the custom module `jaxemb_prompt.PromptEncoder` (a copy of jaxemb/st_prompt_module.py,
  loaded with trust_remote_code) and its jaxemb_prompt.json: the template's own ids, the last [MASK], denoising,
  the head, all as jaxemb's Template and Method hold them."""
  atomic.write_text(out / f"{PROMPT_MODULE}.py", pathlib.Path(__file__).with_name("st_prompt_module.py").read_text())
  atomic.write_json(out / "modules.json", [{"idx": 0, "name": "0", "path": "",
                                            "type": f"{PROMPT_MODULE}.PromptEncoder"}])
  atomic.write_json(out / f"{PROMPT_MODULE}.json", {
      "template": method.template, "prefix_text": template.prefix_text, "suffix_text": template.suffix_text,
      "prefix_ids": list(template.prefix_ids), "suffix_ids": list(template.suffix_ids), "cls_id": template.cls_id,
      "sep_id": template.sep_id, "pad_id": template.pad_id, "mask_index": template.mask_indices[-1],
      "tokenization": method.tokenization, "denoise": method.denoise, "head": method.head,
      # 0: positions from 0, as the authors count them (RoBERTa included); HF RoBERTa's numbering starts at 2.
      "bias_position_offset": views.bias_position_offset(method.bias_positions, config),
      "max_length": config.max_length})


def main(argv: list[str] | None = None) -> int:
  """The command: prints the exported folder (and the Hub URL); an error a user can act on is one line, status 1."""
  parser = argparse.ArgumentParser(prog="python -m jaxemb.export", description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", required=True, help="HF checkpoint directory or hub id, or a jaxemb run directory "
                      "(local or gs://)")
  parser.add_argument("--out", required=True, help="the new directory to write (local or gs://)")
  parser.add_argument("--method", help=f"one of {EXPORTABLE}; default: a run directory's own method")
  parser.add_argument("--template", default=templates.SLOT, help="the prompt method's template, with [X] and [MASK]")
  parser.add_argument("--denoise", action="store_true", help="prompt: subtract the position-offset template bias")
  parser.add_argument("--head", default="none", choices=METHOD_HEADS, help="prompt: applied to the [MASK] vector")
  parser.add_argument("--push_to_hub", metavar="REPO", help="then upload the folder to this Hub model repository")
  args = parser.parse_args(argv)
  if args.method is None and (args.template != templates.SLOT or args.denoise or args.head != "none"):
    parser.error("--template, --denoise and --head need --method")
  method = None if args.method is None else Method(args.method, template=args.template, denoise=args.denoise,
                                                    head=args.head)
  try:
    storage.check([args.model], writes=[args.out])
    out = export_model(args.model, args.out, method, hub_repo=args.push_to_hub)
    print(out)
    if args.push_to_hub:
      print(push_to_hub(out, args.push_to_hub))
  except Exception as e:  # pylint: disable=broad-except  # Bugs are raised again.
    message = cli.user_message(e)
    if message is None:
      raise
    print(f"error: {message}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
