"""Hugging Face checkpoints <-> jaxemb params: find, read, convert and write BERT/RoBERTa/ELECTRA weights.

Reads `BertModel`, `BertForMaskedLM`, `BertForPreTraining`, `RobertaModel`, `RobertaForMaskedLM`, `ElectraModel`
and `ElectraForPreTraining` (the discriminator, its replaced-token head ignored) layouts from a local directory
(config.json + model.safetensors, sharded safetensors, or pytorch_model.bin when torch is installed) or a hub id,
and writes the `*ForMaskedLM` / `*Model` layout back so that transformers loads it. Checkpoints hold one tensor per
layer: the scanned model's stacked `layers/...` params are stacked on load (`load_pretrained(scan_layers=True)`) and
unstacked on save.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxemb.errors import DataError
from jaxemb.models import bert
from jaxemb.models.config import EncoderConfig

Params = dict[str, Any]

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
# Environment variable naming a local folder of models, searched for hub ids before the hub.
MODELS_ENV = "JAXEMB_MODELS"
# Files a model directory may hold besides weights (tokenizer files included), fetched from the hub.
_HUB_PATTERNS = ["*.json", "*.txt", "*.model", SAFETENSORS, "model-*.safetensors"]

# Keys of pretraining-only parts that no method here uses: BERT's next-sentence head, the decoder bias HF ties to
# the MLM head's, ELECTRA's replaced-token-detection head (ElectraForPreTraining).
_IGNORED = re.compile(r"(embeddings\.position_ids|cls\.seq_relationship\..*|.*\.decoder\.(weight|bias)"
                      r"|discriminator_predictions\..*)$")
# model_type -> the HF class-name prefix of its family (`BertModel`, `ElectraModel`, ...).
_FAMILY_NAMES = {"bert": "Bert", "roberta": "Roberta", "electra": "Electra"}

# HF key (after the "bert."/"roberta."/"electra." prefix is removed) -> jaxemb param path. `{i}` is a layer index.
_MODULES = {
    "embeddings.word_embeddings": "embeddings/word",
    "embeddings.position_embeddings": "embeddings/position",
    "embeddings.token_type_embeddings": "embeddings/token_type",
    "embeddings.LayerNorm": "embeddings/layer_norm",
    "embeddings_project": "embeddings/project",
    "encoder.layer.{i}.attention.self.query": "layer_{i}/query",
    "encoder.layer.{i}.attention.self.key": "layer_{i}/key",
    "encoder.layer.{i}.attention.self.value": "layer_{i}/value",
    "encoder.layer.{i}.attention.output.dense": "layer_{i}/attention_out",
    "encoder.layer.{i}.attention.output.LayerNorm": "layer_{i}/attention_norm",
    "encoder.layer.{i}.intermediate.dense": "layer_{i}/ffn_in",
    "encoder.layer.{i}.output.dense": "layer_{i}/ffn_out",
    "encoder.layer.{i}.output.LayerNorm": "layer_{i}/ffn_norm",
    "pooler.dense": "pooler/dense",
}
# The modules of _MODULES that only some architectures have: ELECTRA's projection (when embedding_size differs from
# hidden_size), and the pooler, which ElectraModel lacks.
_ARCHITECTURE_HAS = {"embeddings/project": lambda config: config.projects_embeddings,
                     "pooler/dense": lambda config: config.has_pooler}
# The MLM head's modules are named differently in the two families (and sit outside the encoder prefix); ELECTRA's
# discriminator has no MLM head.
_MLM_MODULES = {
    "bert": {"cls.predictions.transform.dense": "mlm_head/dense",
             "cls.predictions.transform.LayerNorm": "mlm_head/layer_norm",
             "cls.predictions.decoder": "mlm_head/decoder"},
    "roberta": {"lm_head.dense": "mlm_head/dense",
                "lm_head.layer_norm": "mlm_head/layer_norm",
                "lm_head.decoder": "mlm_head/decoder"},
}
_MLM_BIAS = {"bert": "cls.predictions.bias", "roberta": "lm_head.bias"}
# Old TensorFlow-converted checkpoints (the original bert-base-uncased) name LayerNorm weights gamma/beta.
_LEGACY_NAMES = {"gamma": "weight", "beta": "bias"}


class CheckpointError(DataError):
  """A checkpoint that cannot be found, read or converted; the message names the file."""


@dataclasses.dataclass(frozen=True)
class _Rule:
  """One HF tensor <-> one jaxemb leaf."""
  hf_key: str
  path: tuple[str, ...]
  to_jax: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _module_rules(hf_module: str, path: str, kind: str) -> list[_Rule]:
  keep = lambda a: a
  path_ = tuple(path.split("/"))
  if kind == "embedding":
    return [_Rule(f"{hf_module}.weight", (*path_, "embedding"), keep, keep)]
  if kind == "layer_norm":
    return [_Rule(f"{hf_module}.weight", (*path_, "scale"), keep, keep),
            _Rule(f"{hf_module}.bias", (*path_, "bias"), keep, keep)]
  if kind == "decoder":  # Untied decoder: a bare [hidden, vocab] param.
    return [_Rule(f"{hf_module}.weight", path_, np.transpose, np.transpose)]
  return [_Rule(f"{hf_module}.weight", (*path_, "kernel"), np.transpose, np.transpose),
          _Rule(f"{hf_module}.bias", (*path_, "bias"), keep, keep)]


def _kind(path: str) -> str:
  leaf = path.rsplit("/", 1)[-1]
  if path.startswith("embeddings/") and leaf not in ("layer_norm", "project"):
    return "embedding"
  return {"decoder": "decoder"}.get(leaf, "layer_norm" if leaf.endswith("norm") else "dense")


def _rules(config: EncoderConfig) -> tuple[list[_Rule], list[_Rule]]:
  """(encoder rules with keys relative to the encoder prefix, MLM-head rules with absolute keys)."""
  encoder = []
  for hf_module, path in _MODULES.items():
    if not _ARCHITECTURE_HAS.get(path, lambda _: True)(config):
      continue
    layers = range(config.num_hidden_layers) if "{i}" in hf_module else [None]
    for i in layers:
      module, leaf_path = hf_module.format(i=i), path.format(i=i)
      encoder += _module_rules(module, leaf_path, _kind(leaf_path))
  mlm = []
  if not config.is_masked_lm:
    return encoder, mlm
  for hf_module, path in _MLM_MODULES[config.model_type].items():
    if path == "mlm_head/decoder" and config.tie_word_embeddings:
      continue
    mlm += _module_rules(hf_module, path, _kind(path))
  keep = lambda a: a
  mlm.append(_Rule(_MLM_BIAS[config.model_type], ("mlm_head", "bias"), keep, keep))
  return encoder, mlm


def _encoder_prefix(config: EncoderConfig) -> str:
  return f"{config.model_type}."


def _normalise_key(key: str) -> str:
  head, _, leaf = key.rpartition(".")
  return f"{head}.{_LEGACY_NAMES.get(leaf, leaf)}" if "LayerNorm" in head or "layer_norm" in head else key


def state_dict_to_params(state: dict[str, np.ndarray], config: EncoderConfig, source: str = "checkpoint") -> Params:
  """Converts a Hugging Face state dict (any of the supported layouts) to a jaxemb params tree of numpy arrays.

  Raises CheckpointError naming `source` and the missing keys when an encoder weight is absent; a missing
  pooler or MLM head is allowed (the tree has no `pooler` / `mlm_head`). Keys nothing here uses are logged.
  """
  state = {_normalise_key(k): v for k, v in state.items()}
  # *Model checkpoints have no prefix; *ForMaskedLM/*ForPreTraining put the encoder under "bert."/"roberta."/"electra.".
  prefix = _encoder_prefix(config)
  if not any(k.startswith(prefix) for k in state):
    prefix = ""
  encoder_rules, mlm_rules = _rules(config)
  pooler = [r for r in encoder_rules if r.hf_key.startswith("pooler.")]
  required = [r for r in encoder_rules if r not in pooler]
  missing = [prefix + r.hf_key for r in required if prefix + r.hf_key not in state]
  if missing:
    raise CheckpointError(f"{source}: missing encoder weights {missing[:8]}{' ...' if len(missing) > 8 else ''}")
  found = [(prefix + r.hf_key, r) for r in required]
  for optional, key_prefix in ((pooler, prefix), (mlm_rules, "")):  # A pooler or head is taken whole or not at all.
    if all(key_prefix + r.hf_key in state for r in optional):
      found += [(key_prefix + r.hf_key, r) for r in optional]
  params: Params = {}
  for key, rule in found:
    node = params
    for name in rule.path[:-1]:
      node = node.setdefault(name, {})
    node[rule.path[-1]] = rule.to_jax(np.asarray(state[key]))
  used = {key for key, _ in found}
  unused = sorted(k for k in state if k not in used and not _IGNORED.match(k))
  if unused:
    logging.warning("%s: %d weights not used by jaxemb: %s", source, len(unused), unused[:10])
  _check_shapes(params, config, source)
  return params


def _check_shapes(params: Params, config: EncoderConfig, source: str):
  ids = jnp.zeros((1, 1), jnp.int32)
  expected = jax.eval_shape(lambda: bert.Transformer(config).init(jax.random.key(0), ids, ids, method="init_all"))
  expected = flax_to_plain(expected["params"])
  flat_expected = dict(_flatten(expected))
  for path, value in _flatten(params):
    want = flat_expected[path].shape
    if value.shape != want:
      raise CheckpointError(f"{source}: {'/'.join(path)} has shape {value.shape}, the config needs {want}")


def params_to_state_dict(params: Params, config: EncoderConfig) -> tuple[dict[str, np.ndarray], str]:
  """Converts jaxemb params (per-layer or stacked) to a Hugging Face state dict and the architecture name it matches.

  With an MLM head the layout is `*ForMaskedLM` (encoder under the "bert."/"roberta." prefix; a pooler, when
  present, is kept there as in the original BERT checkpoints); without one, `BertModel`/`RobertaModel`.
  """
  params = bert.unstack_layers(params)
  encoder_rules, mlm_rules = _rules(config)
  has_head = "mlm_head" in params
  prefix = _encoder_prefix(config) if has_head else ""
  state = {}
  for rule in encoder_rules + (mlm_rules if has_head else []):
    node = params
    try:
      for name in rule.path:
        node = node[name]
    except KeyError:
      if rule.path[0] == "pooler":
        continue
      raise
    key = rule.hf_key if rule in mlm_rules else prefix + rule.hf_key
    state[key] = np.ascontiguousarray(rule.to_hf(np.asarray(node, np.float32)))
  if has_head:  # transformers ties decoder.bias to the head's bias; write it so no loader reports it missing.
    bias_key = _MLM_BIAS[config.model_type]
    state[bias_key.replace(".bias", ".decoder.bias")] = state[bias_key]
  family = _FAMILY_NAMES[config.model_type]
  return state, f"{family}ForMaskedLM" if has_head else f"{family}Model"


def flax_to_plain(tree) -> Params:
  """A params tree as plain nested dicts (Flax may hand back FrozenDicts)."""
  if hasattr(tree, "items"):
    return {k: flax_to_plain(v) for k, v in tree.items()}
  return tree


def _flatten(tree, prefix=()):
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _flatten(v, (*prefix, k))
    else:
      yield (*prefix, k), v


# ----------------------------------------------------------------------------------------------------------
# Files.


def resolve_model_dir(name_or_path: str | pathlib.Path) -> pathlib.Path:
  """A local directory holding the model: the path itself, a copy under $JAXEMB_MODELS, or a hub snapshot.

  A name that is not a local directory is looked for under the folder $JAXEMB_MODELS names (when set), as
  `<folder>/<name>` and then `<folder>/<last part of the name>` (`org/model` -> `<folder>/model`), and only then
  fetched from (or found in the cache of) the Hugging Face hub. Raises FileNotFoundError naming what was looked
  for, and how to supply a local copy, when none works.
  """
  path = pathlib.Path(name_or_path).expanduser()
  if path.is_dir():
    return path
  if path.exists():
    raise FileNotFoundError(f"{path} is a file; a model is a directory with config.json and weights")
  candidates = _local_candidates(path)
  for candidate in candidates:
    if candidate.is_dir():
      return candidate
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top
    local = pathlib.Path(huggingface_hub.snapshot_download(str(name_or_path), allow_patterns=_HUB_PATTERNS))
    if not any(local.glob("*.safetensors")):  # Older repos have only pytorch_model.bin.
      huggingface_hub.hf_hub_download(str(name_or_path), TORCH_BIN)
    return local
  except Exception as e:  # pylint: disable=broad-except  (hub errors have many types; all mean "not there")
    searched = f", nor under ${MODELS_ENV} ({', '.join(map(str, candidates))})" if candidates else ""
    raise FileNotFoundError(
        f"Model {str(name_or_path)!r} not found: {path.resolve()} is not a local directory{searched}, and the "
        f"Hugging Face hub gave {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Offline, download "
        f"it where the hub is reachable (`huggingface-cli download {name_or_path} --local-dir DIR`) and pass DIR "
        f"as the model path (e.g. --config.model.path=DIR), or put it under ${MODELS_ENV}.") from None


def _local_candidates(path: pathlib.Path) -> list[pathlib.Path]:
  """Where a relative model name may sit under $JAXEMB_MODELS: the whole name, then its last part."""
  root = os.environ.get(MODELS_ENV)
  if not root or path.is_absolute():
    return []
  root = pathlib.Path(root).expanduser()
  return list(dict.fromkeys([root / path, root / path.name]))


def read_config(model_dir: pathlib.Path) -> EncoderConfig:
  path = model_dir / "config.json"
  if not path.is_file():
    raise CheckpointError(f"{path} not found: a Hugging Face model directory needs config.json")
  try:
    return EncoderConfig.from_hf(json.loads(path.read_text()), source=str(path))
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def read_state_dict(model_dir: pathlib.Path) -> tuple[dict[str, np.ndarray], str]:
  """(state dict, the file it came from) from model.safetensors, its sharded index, or pytorch_model.bin."""
  from safetensors.flax import load_file  # pylint: disable=g-import-not-at-top  (numpy lacks bfloat16)
  if (model_dir / SAFETENSORS).is_file():
    files = [model_dir / SAFETENSORS]
  elif (model_dir / SAFETENSORS_INDEX).is_file():
    index = json.loads((model_dir / SAFETENSORS_INDEX).read_text())
    files = [model_dir / name for name in sorted(set(index["weight_map"].values()))]
  elif (model_dir / TORCH_BIN).is_file():
    return _read_torch_bin(model_dir / TORCH_BIN), str(model_dir / TORCH_BIN)
  else:
    raise CheckpointError(f"{model_dir}: no weights found (looked for {SAFETENSORS}, {SAFETENSORS_INDEX}, "
                          f"{TORCH_BIN})")
  state = {}
  for file in files:
    try:
      state.update({k: np.asarray(v) for k, v in load_file(str(file)).items()})
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"{file}: cannot read safetensors ({type(e).__name__}: {e})") from None
  return state, str(files[0])


def _read_torch_bin(path: pathlib.Path) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise CheckpointError(f"{path}: reading pytorch_model.bin needs torch (`pip install torch`), or convert the "
                          "checkpoint to model.safetensors") from None
  state = torch.load(path, map_location="cpu", weights_only=True)
  return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def load_pretrained(name_or_path: str | pathlib.Path, param_dtype=jnp.float32,
                    scan_layers: bool = False) -> tuple[EncoderConfig, Params]:
  """(config, params) of a Hugging Face BERT/RoBERTa/ELECTRA checkpoint, a local directory or a hub id; the layers
  stacked for `Transformer(config, scan_layers=True)` when `scan_layers`."""
  model_dir = resolve_model_dir(name_or_path)
  config = read_config(model_dir)
  state, source = read_state_dict(model_dir)
  params = jax.tree.map(lambda a: jnp.asarray(a, param_dtype), state_dict_to_params(state, config, source))
  return config, bert.stack_layers(params, config.num_hidden_layers) if scan_layers else params


def load_tokenizer(name_or_path: str | pathlib.Path):
  """The Hugging Face tokenizer saved with a model (local directory or hub id)."""
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.AutoTokenizer.from_pretrained(str(resolve_model_dir(name_or_path)))


def write_model_files(out_dir: str | pathlib.Path, config: EncoderConfig, tokenizer):
  """config.json (as `*Model`) and the tokenizer files: everything of a Hugging Face model but its weights."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  family = _FAMILY_NAMES[config.model_type]
  (out / "config.json").write_text(json.dumps(config.to_hf(f"{family}Model"), indent=2) + "\n")
  tokenizer.save_pretrained(str(out))


def save_pretrained(out_dir: str | pathlib.Path, config: EncoderConfig, params: Params, tokenizer=None):
  """Writes config.json, model.safetensors (float32) and, when given, the tokenizer files, in Hugging Face
  format: `transformers.AutoModel(ForMaskedLM).from_pretrained(out_dir)` loads them."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  state, architecture = params_to_state_dict(jax.device_get(flax_to_plain(params)), config)
  save_file(state, str(out / SAFETENSORS), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(config.to_hf(architecture), indent=2) + "\n")
  if tokenizer is not None:
    tokenizer.save_pretrained(str(out))
