"""The converter of the flat method block older jaxemb wrote, on files e403436's code wrote (tests/methods/legacy/)."""

import importlib
import json
import pathlib

import numpy as np
import pytest

from jaxemb import bias_removal, cli, spec
from jaxemb.methods import Method, base, legacy
from jaxemb.models import run_dir
from jaxemb.training import workdir

WRITTEN = pathlib.Path(__file__).parent / "legacy"
PROMPT = 'This sentence : "[X]" means [MASK] .'
# Each eval_method.json block of eval_method_blocks.json, and the method it recorded (its repr then, in today's names).
RECORDED = {
  "last_avg": Method("last_avg"),
  "cls_alone": Method("cls", tokenization="alone"),
  "static_avg_decoder": Method("static_avg", token_rows="mlm_decoder"),
  "static_remove_biases": Method(
    "static_remove_biases", bias_filter=bias_removal.BiasFilter(remove_subwords=False, remove_punctuation=False)
  ),
  "ditto": Method("ditto", layer=2, head=3, variant="last"),
  "tfidf": Method("tfidf_first_last", idf_path="runs/idf.npz"),
  "prompt": Method(
    "prompt", template=PROMPT, denoise="position_offset", head="mlm_transform", bias_positions="from_one"
  ),
  "prompt_mlm_top_k": Method("prompt_mlm_top_k", template="[X] means [MASK] .", top_k=50),
  "whitening_prompt": Method(
    "whitening", source=Method("prompt", template="[X] is [MASK] ."), dims=256, corpus="nli.txt"
  ),
  "whitening": Method("whitening"),
  "flow_last_avg": Method(
    "flow", source=Method("last_avg", tokenization="alone"), levels=2, learning_rate=0.01, seed=3
  ),
  # Before 074fb8f: 7 fields, denoise a bool.
  "prompt_seven_fields": Method(
    "prompt", template="[X] means [MASK] .", denoise="position_offset", tokenization="alone"
  ),
}


def _written(name: str) -> dict:
  return json.loads((WRITTEN / name).read_text())


def test_the_fixtures_are_the_flat_union_and_every_one_is_converted():
  blocks = _written("eval_method_blocks.json")
  assert set(blocks) == set(RECORDED)
  assert set(blocks["last_avg"]) == {"name", *legacy.UNION_DEFAULTS}  # Every family's field, side by side.
  assert all(legacy.is_flat_union(block) for block in blocks.values())
  assert not any(legacy.is_flat_union(method.to_block()) for method in RECORDED.values())


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_an_older_eval_method_json_loads_as_the_method_it_recorded(tmp_path, key):
  run_dir.save_eval_method(tmp_path, _written("eval_method_blocks.json")[key])
  assert Method.from_stored(run_dir.load_eval_method(tmp_path)) == RECORDED[key]


def test_an_older_block_sets_only_the_fields_away_from_the_unions_defaults():
  block = _written("eval_method_blocks.json")["whitening_prompt"]
  assert legacy.upgrade(block) == {
    "name": "whitening",
    "corpus": "nli.txt",
    "dims": 256,
    "source": {"name": "prompt", "template": "[X] is [MASK] ."},
  }
  # A config block is today's only: the flat union's names are refused there, each with its name today.
  with pytest.raises(ValueError, match=r"takes no whitening_dims \('dims' in today's blocks\)"):
    Method.from_block({"name": "whitening", "whitening_dims": 256})


def test_fitted_state_recorded_for_the_flat_block_still_serves_its_method():
  """A fitted state's record names its method as the older block did; `check_fitted` reads it as today's."""
  for key, recorded in _written("fitted_for.json").items():
    fitted = {base.FITTED_FOR: np.array(json.dumps({"method": recorded, "model": "m"})), "mean": np.zeros(2)}
    assert set(base.check_fitted(fitted, RECORDED[key], None, None)) == {"mean"}
    other = Method(RECORDED[key].name, source="cls")
    with pytest.raises(base.FittedForAnother, match="fitted for method"):
      base.check_fitted(fitted, other, None, None)


@pytest.mark.parametrize("config_name", ["promptbert", "cotbert", "simcse", "promptbert_sup"])
def test_a_run_fingerprinted_with_the_flat_block_resumes_unchanged(tmp_path, config_name):
  """The method.* fields an older run recorded compare equal to today's block of the same config."""
  config = importlib.import_module(f"configs.{config_name}").get_config()
  cli.complete(config)
  fields = workdir.fingerprint(spec.TrainingRun.from_config(config))
  older = {key: value for key, value in fields.items() if not key.startswith("method.")}
  older.update(_written("fingerprint_method_fields.json")[config_name])
  run = run_dir.RunDir(tmp_path)
  run.fingerprint_file.parent.mkdir(parents=True, exist_ok=True)
  run.fingerprint_file.write_text(json.dumps({"fields": older, "changes": []}))
  (run.checkpoints_dir / "1").mkdir(parents=True)  # A saved step: the run exists.
  pending = workdir.check_fingerprint(run, fields, resume_changed=False)
  assert pending.record["fields"] == fields and pending.record["changes"] == [] and not pending.notes


# An eval_method.json (moved from test_whitening.py) as jaxemb wrote it when the Python argument was still `whitened`
# (the block always said whitened_method), for whitening_dims=16 of the denoised prompt.
WRITTEN_BEFORE_THE_RENAME = {
  "bias_positions": "from_zero",
  "denoise": "position_offset",
  "ditto_head": 9,
  "ditto_layer": 0,
  "ditto_variant": "first_last",
  "flow_batch_size": 64,
  "flow_corpus": "",
  "flow_depth": 3,
  "flow_epochs": 1,
  "flow_learning_rate": 0.001,
  "flow_levels": 3,
  "flow_seed": 0,
  "flow_width": 32,
  "flowed_method": "first_last_avg",
  "head": "none",
  "idf_path": "",
  "lowercase": True,
  "name": "whitening",
  "prompt_placement": "last_occurrence",
  "remove_frequent": True,
  "remove_punctuation": True,
  "remove_subwords": True,
  "static_rows": "word_embeddings",
  "template": PROMPT,
  "tokenization": "in_context",
  "top_k": 200,
  "whitened_method": "prompt",
  "whitening_corpus": "",
  "whitening_dims": 16,
}


def test_an_eval_method_json_written_before_the_whitening_rename_loads(tmp_path):
  run_dir.save_eval_method(tmp_path, WRITTEN_BEFORE_THE_RENAME)
  method = Method.from_stored(run_dir.load_eval_method(tmp_path))
  assert method == Method("whitening", source=Method("prompt", template=PROMPT, denoise="position_offset"), dims=16)
