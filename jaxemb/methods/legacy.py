"""The one converter from the flat method block older jaxemb wrote (up to e403436) to today's per-method block.

Older `config.method` blocks were the union of every family's fields side by side, the families' own names
prefixed (`ditto_head`, `whitening_dims`, `flow_seed`, `static_rows`) and a transformed method flattened beside its
transform (`whitened_method: "prompt"`, the prompt's `template` beside `whitening_dims`); the named method read the
fields set away from their defaults. They live on in files: a run directory's eval_method.json, an export's
jaxemb_method.json, a run's fingerprint.json (`method.*` fields), an embedding job's manifest and a fitted state's
record. Those readers pass what they read through `upgrade` (`Method.from_stored`); config blocks are today's only.
"""

from __future__ import annotations

from typing import Any, Mapping

# The flat union at its defaults, as the last jaxemb that wrote it did (e403436's Method.config_fields()).
UNION_DEFAULTS = {
  "tokenization": "in_context",
  "static_rows": "word_embeddings",
  "remove_frequent": True,
  "remove_subwords": True,
  "lowercase": True,
  "remove_punctuation": True,
  "ditto_layer": 0,
  "ditto_head": 9,
  "ditto_variant": "first_last",
  "idf_path": "",
  "template": "[X]",
  "top_k": 200,
  "denoise": "none",
  "head": "none",
  "bias_positions": "from_zero",
  "prompt_placement": "last_occurrence",
  "whitened_method": "first_last_avg",
  "whitening_dims": 0,
  "whitening_corpus": "",
  "flowed_method": "first_last_avg",
  "flow_corpus": "",
  "flow_levels": 3,
  "flow_depth": 3,
  "flow_width": 32,
  "flow_epochs": 1,
  "flow_batch_size": 64,
  "flow_learning_rate": 0.001,
  "flow_seed": 0,
}
# Older field names of a family's own fields -> today's (a transform's own are its prefix's: `TRANSFORMS`).
RENAMED = {
  "static_rows": "token_rows",
  "ditto_layer": "layer",
  "ditto_head": "head",
  "ditto_variant": "variant",
  "flow_width": "coupling_width",  # A method's `width` is its vectors'.
}
# A transform method -> (the older field naming its source method, the prefix of its own older fields).
TRANSFORMS = {"whitening": ("whitened_method", "whitening_"), "flow": ("flowed_method", "flow_")}
# Before 429d0ba the prompt family's denoise was a bool.
_DENOISE = {True: "position_offset", False: "none"}
_NO_DEFAULT = object()  # A field the union did not have (the name) is always set.


def is_flat_union(block: Mapping[str, Any]) -> bool:
  """Whether `block` was written in the older form: a field today's blocks do not have, or a bool denoise."""
  fields = set(block) - {"name"}
  return bool(fields & (RENAMED.keys() | _transform_fields())) or isinstance(block.get("denoise"), bool)


def upgrade(block: Mapping[str, Any]) -> dict[str, Any]:
  """Today's block of the method an older flat block describes, with the fields it set away from the union's
  defaults (the others are today's defaults too); a block in today's form is returned as it is."""
  if not is_flat_union(block):
    return dict(block)
  fields = {key: _DENOISE.get(value, value) if key == "denoise" else value for key, value in block.items()}
  changed = {key: value for key, value in fields.items() if value != UNION_DEFAULTS.get(key, _NO_DEFAULT)}
  return _converted(changed.pop("name"), changed)


def today_name(field: str) -> str | None:
  """The name today's blocks give an older block's field of a family's own (`ditto_head` -> `head`), None for a field
  that kept its name."""
  prefix = next((prefix for _, prefix in TRANSFORMS.values() if field.startswith(prefix)), "")
  return RENAMED.get(field) or (field.removeprefix(prefix) if prefix else None)


def _converted(name: str, changed: dict[str, Any]) -> dict[str, Any]:
  if name not in TRANSFORMS:
    return {"name": name, **{RENAMED.get(key, key): value for key, value in changed.items()}}
  source_field, prefix = TRANSFORMS[name]
  source = changed.pop(source_field, UNION_DEFAULTS[source_field])
  own = {today_name(key): changed.pop(key) for key in list(changed) if key.startswith(prefix)}
  return {"name": name, **own, "source": _converted(source, changed)}


def _transform_fields() -> set[str]:
  return {key for source, prefix in TRANSFORMS.values() for key in UNION_DEFAULTS if key.startswith((source, prefix))}
