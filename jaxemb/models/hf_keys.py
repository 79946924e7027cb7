"""Hugging Face state dicts <-> jaxemb params, in memory: the key map of BERT/RoBERTa/ELECTRA weights.

Reads the `BertModel`, `BertForMaskedLM`, `BertForPreTraining`, `RobertaModel`, `RobertaForMaskedLM`, `ElectraModel`
and `ElectraForPreTraining` (the discriminator, its replaced-token head ignored) key layouts, and writes the
`*ForMaskedLM` / `*Model` layout back. Checkpoints hold one tensor per layer; the scanned model's stacked
`layers/...` params are unstacked on the way out (`jaxemb.models.hf` reads and writes the files, stacks on load).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from typing import Any, Callable, Collection, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from jaxemb.errors import DataError
from jaxemb.models import bert
from jaxemb.models.config import EncoderConfig

Params = dict[str, Any]

# Keys of pretraining-only parts that no method here uses: BERT's next-sentence head, the decoder bias HF ties to
# the MLM head's, ELECTRA's replaced-token-detection head (ElectraForPreTraining).
_IGNORED = re.compile(
  r"(embeddings\.position_ids|cls\.seq_relationship\..*|.*\.decoder\.(weight|bias)"
  r"|discriminator_predictions\..*)$"
)
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
_ARCHITECTURE_HAS = {
  "embeddings/project": lambda config: config.projects_embeddings,
  "pooler/dense": lambda config: config.has_pooler,
}
# The MLM head's modules are named differently in the two families (and sit outside the encoder prefix); ELECTRA's
# discriminator has no MLM head.
_MLM_MODULES = {
  "bert": {
    "cls.predictions.transform.dense": "mlm_head/dense",
    "cls.predictions.transform.LayerNorm": "mlm_head/layer_norm",
    "cls.predictions.decoder": "mlm_head/decoder",
  },
  "roberta": {
    "lm_head.dense": "mlm_head/dense",
    "lm_head.layer_norm": "mlm_head/layer_norm",
    "lm_head.decoder": "mlm_head/decoder",
  },
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
    return [
      _Rule(f"{hf_module}.weight", (*path_, "scale"), keep, keep),
      _Rule(f"{hf_module}.bias", (*path_, "bias"), keep, keep),
    ]
  if kind == "decoder":  # Untied decoder: a bare [hidden, vocab] param.
    return [_Rule(f"{hf_module}.weight", path_, np.transpose, np.transpose)]
  return [
    _Rule(f"{hf_module}.weight", (*path_, "kernel"), np.transpose, np.transpose),
    _Rule(f"{hf_module}.bias", (*path_, "bias"), keep, keep),
  ]


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


def key_groups(keys: Iterable[str], config: EncoderConfig, source: str = "checkpoint") -> set[str]:
  """The top-level param groups ("embeddings", "layer_0", ..., "pooler", "mlm_head") a checkpoint of these tensor
  `keys` loads into, from the names alone (a safetensors header: hf.weight_groups); CheckpointError as
  `state_dict_to_params` for a missing encoder weight."""
  return {rule.path[0] for _, rule in _found({_normalise_key(k) for k in keys}, config, source)}


def _found(keys: Collection[str], config: EncoderConfig, source: str) -> list[tuple[str, _Rule]]:
  """(HF key, rule) of each tensor of `keys` (normalised) that a jaxemb param takes: every encoder weight (raises
  CheckpointError naming `source` and the missing keys), and the pooler and the MLM head where they are whole."""
  # *Model checkpoints have no prefix; *ForMaskedLM/*ForPreTraining put the encoder under "bert."/"roberta."/"electra.".
  prefix = _encoder_prefix(config)
  if not any(k.startswith(prefix) for k in keys):
    prefix = ""
  encoder_rules, mlm_rules = _rules(config)
  pooler = [r for r in encoder_rules if r.hf_key.startswith("pooler.")]
  required = [r for r in encoder_rules if r not in pooler]
  missing = [prefix + r.hf_key for r in required if prefix + r.hf_key not in keys]
  if missing:
    raise CheckpointError(f"{source}: missing encoder weights {missing[:8]}{' ...' if len(missing) > 8 else ''}")
  found = [(prefix + r.hf_key, r) for r in required]
  for optional, key_prefix in ((pooler, prefix), (mlm_rules, "")):  # A pooler or head is taken whole or not at all.
    if all(key_prefix + r.hf_key in keys for r in optional):
      found += [(key_prefix + r.hf_key, r) for r in optional]
  return found


def state_dict_to_params(state: dict[str, np.ndarray], config: EncoderConfig, source: str = "checkpoint") -> Params:
  """Converts a Hugging Face state dict (any of the supported layouts) to a jaxemb params tree of numpy arrays.

  Raises CheckpointError naming `source` and the missing keys when an encoder weight is absent; a missing
  pooler or MLM head is allowed (the tree has no `pooler` / `mlm_head`). Keys nothing here uses are logged.
  """
  state = {_normalise_key(k): v for k, v in state.items()}
  found = _found(state.keys(), config, source)
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
  flat_expected = _expected_shapes(config)
  for path, value in _flatten(params):
    want = flat_expected[path]
    if value.shape != want:
      raise CheckpointError(f"{source}: {'/'.join(path)} has shape {value.shape}, the config needs {want}")


@functools.lru_cache(maxsize=8)
def _expected_shapes(config: EncoderConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """Each param's shape under `config`, by path, traced once per config: tracing the model's init for its shapes took
  0.2-0.4 s a checkpoint read (2026-11-29, AMD EPYC Zen 3), about a fifth of the test suite's tracing and lowering."""
  ids = jnp.zeros((1, 1), jnp.int32)
  expected = jax.eval_shape(lambda: bert.Transformer(config).init(jax.random.key(0), ids, ids, method="init_all"))
  return {path: leaf.shape for path, leaf in _flatten(flax_to_plain(expected["params"]))}


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
  return state, architecture(config, masked_lm=has_head)


def architecture(config: EncoderConfig, masked_lm: bool) -> str:
  """The transformers class name of a checkpoint of `config`'s family with or without its MLM head."""
  family = _FAMILY_NAMES[config.model_type]
  return f"{family}ForMaskedLM" if masked_lm else f"{family}Model"


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
