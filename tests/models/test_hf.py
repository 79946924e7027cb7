"""Hugging Face checkpoint layouts in, Hugging Face checkpoints out."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
import transformers

from jaxemb.models import CheckpointError, Transformer, load_pretrained, save_pretrained
from jaxemb.models import bert, hf, hf_keys
from tests.support import shared_path, write_random_checkpoint


def _leaves(params):
  return dict(hf_keys._flatten(hf_keys.flax_to_plain(params)))  # pylint: disable=protected-access


def _assert_same_params(a, b):
  a, b = _leaves(a), _leaves(b)
  assert a.keys() == b.keys()
  for path in a:
    np.testing.assert_array_equal(np.asarray(a[path]), np.asarray(b[path]), err_msg="/".join(path))


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("head", [True, False], ids=["ForMaskedLM", "Model"])
def test_layouts_load_with_or_without_head(tmp_path, family, head):
  write_random_checkpoint(tmp_path, family, head=head)
  config, params = load_pretrained(tmp_path)
  assert config.model_type == family
  assert ("mlm_head" in params) == head
  assert ("pooler" in params) == (not head)  # HF's *ForMaskedLM has no pooler; *Model has one.
  state = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
  prefix = f"{family}." if head else ""
  np.testing.assert_array_equal(params["layer_1"]["ffn_in"]["kernel"],
                                state[f"{prefix}encoder.layer.1.intermediate.dense.weight"].T)


def test_pytorch_bin_and_legacy_layernorm_names(tmp_path, tiny_checkpoint):
  """pytorch_model.bin (torch installed) and TF-era gamma/beta names, as in the original bert-base-uncased."""
  family, path = tiny_checkpoint
  _, expected = load_pretrained(path)
  state = safetensors.numpy.load_file(str(path / "model.safetensors"))
  renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in state.items()}
  renamed["cls.seq_relationship.weight"] = np.zeros((2, 32), np.float32)  # BertForPreTraining's NSP head.
  torch.save({k: torch.from_numpy(v) for k, v in renamed.items()}, tmp_path / "pytorch_model.bin")
  (tmp_path / "config.json").write_text((path / "config.json").read_text())
  _, params = load_pretrained(tmp_path)
  _assert_same_params(params, expected)


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_save_loads_in_hf_with_same_outputs(tmp_path, tiny_checkpoint, scan_layers):
  family, path = tiny_checkpoint
  config, params = load_pretrained(path, scan_layers=scan_layers)
  tokenizer = transformers.AutoTokenizer.from_pretrained(path)
  save_pretrained(tmp_path / "saved", config, params, tokenizer)
  torch_model, info = transformers.AutoModelForMaskedLM.from_pretrained(
      tmp_path / "saved", output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
  batch = tokenizer(["a sentence to check", "another one"], padding=True, return_tensors="np")
  with torch.no_grad():
    theirs = torch_model.eval()(**{k: torch.tensor(v) for k, v in batch.items()}).logits.numpy()
  ours = Transformer(config, scan_layers=scan_layers).apply({"params": params}, batch["input_ids"],
                                                            batch["attention_mask"], output_mlm_logits=True).mlm_logits
  attended = batch["attention_mask"].astype(bool)
  np.testing.assert_allclose(np.asarray(ours)[attended], theirs[attended], atol=1e-4)
  assert transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")("hi")["input_ids"] == tokenizer("hi")[
      "input_ids"]


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_minilm_round_trip_is_exact(tmp_path, scan_layers):
  """load -> save -> load gives identical params; the saved BertModel (with pooler) loads in HF."""
  path = shared_path("models", "all-MiniLM-L6-v2")
  config, params = load_pretrained(path, scan_layers=scan_layers)
  save_pretrained(tmp_path, config, params)
  config2, params2 = load_pretrained(tmp_path, scan_layers=scan_layers)
  assert config2 == config
  _assert_same_params(params, params2)
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertModel"]
  _, info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]


def test_scanned_layout_stacks_the_layers_in_order():
  """load_pretrained(scan_layers=True): `layers/...` holds layer i's weights at index i, in the shapes the scanned
  model initialises; unstacking gives the per-layer tree back exactly."""
  path = shared_path("models", "all-MiniLM-L6-v2")
  config, params = load_pretrained(path)
  _, stacked = load_pretrained(path, scan_layers=True)
  assert not any(k.startswith("layer_") for k in stacked)
  np.testing.assert_array_equal(stacked["layers"]["ffn_in"]["kernel"][4], params["layer_4"]["ffn_in"]["kernel"])
  ids = jnp.zeros((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(config, scan_layers=True).init(jax.random.key(0), ids, ids,
                                                                              method="init_all"))["params"]
  shape_of = lambda tree: jax.tree.map(lambda a: a.shape, hf_keys.flax_to_plain(tree))
  assert shape_of(shapes["layers"]) == shape_of(stacked["layers"])  # (init also makes the MLM head MiniLM lacks.)
  _assert_same_params(bert.unstack_layers(stacked), params)


def test_bfloat16_weights_load_as_param_dtype(tmp_path, tiny_checkpoint):
  _, path = tiny_checkpoint
  _, expected = load_pretrained(path)
  state = safetensors.numpy.load_file(str(path / "model.safetensors"))
  torch_state = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in state.items()}
  safetensors.torch.save_file(torch_state, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text((path / "config.json").read_text())
  _, params = load_pretrained(tmp_path)
  leaves = _leaves(params)
  assert all(v.dtype == jnp.float32 for v in leaves.values())
  for key, value in _leaves(expected).items():
    np.testing.assert_allclose(leaves[key], value, rtol=1e-2, atol=1e-2)


def test_missing_model_names_what_was_looked_for(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
  with pytest.raises(FileNotFoundError, match=r"no-such-org/no-such-model.*not a local directory.*--local-dir"):
    load_pretrained("no-such-org/no-such-model")


@pytest.mark.parametrize("damage, message", [
    ("no_config", r"config.json not found"),
    ("no_weights", r"no weights found \(looked for model.safetensors"),
    ("drop_key", r"model.safetensors: missing encoder weights .*layer.2.output.dense.weight"),
    ("bad_shape", r"layer_0/query/kernel has shape"),
    ("bad_type", r"model_type 'gpt2' is not supported"),
    ("bad_json", r"not valid JSON"),
])
def test_broken_checkpoints_name_the_file(tmp_path, damage, message):
  write_random_checkpoint(tmp_path, "bert")
  weights, config_file = tmp_path / "model.safetensors", tmp_path / "config.json"
  state = safetensors.numpy.load_file(str(weights))
  config = json.loads(config_file.read_text())
  if damage == "no_config":
    config_file.unlink()
  elif damage == "no_weights":
    weights.unlink()
  elif damage == "drop_key":
    del state["bert.encoder.layer.2.output.dense.weight"]
    safetensors.numpy.save_file(state, str(weights))
  elif damage == "bad_shape":
    state["bert.encoder.layer.0.attention.self.query.weight"] = np.zeros((32, 16), np.float32)
    safetensors.numpy.save_file(state, str(weights))
  elif damage == "bad_type":
    config_file.write_text(json.dumps({**config, "model_type": "gpt2"}))
  elif damage == "bad_json":
    config_file.write_text("{not json")
  with pytest.raises((CheckpointError, ValueError), match=message):
    load_pretrained(tmp_path)


def test_unused_weights_are_reported(tmp_path, caplog):
  write_random_checkpoint(tmp_path, "bert")
  state = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
  state["classifier.weight"] = np.zeros((2, 32), np.float32)
  safetensors.numpy.save_file(state, str(tmp_path / "model.safetensors"))
  load_pretrained(tmp_path)
  assert "classifier.weight" in caplog.text


def test_params_are_a_plain_pytree(tiny_checkpoint):
  _, path = tiny_checkpoint
  _, params = load_pretrained(path)
  assert type(params) is dict and type(params["embeddings"]) is dict  # pylint: disable=unidiomatic-typecheck
  assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(params))


def test_hub_ids_are_looked_for_under_jaxemb_models_first(tmp_path, monkeypatch):
  for name in ("org/model", "other"):
    (tmp_path / name).mkdir(parents=True)
  monkeypatch.setenv("JAXEMB_MODELS", str(tmp_path))
  assert hf.resolve_model_dir("org/model") == tmp_path / "org" / "model"
  assert hf.resolve_model_dir("some-org/other") == tmp_path / "other"  # The name without its organisation.
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
  with pytest.raises(FileNotFoundError, match=r"not a local directory, nor under \$JAXEMB_MODELS \(.*/org/missing, "
                                              r".*/missing\).*--local-dir"):
    hf.resolve_model_dir("org/missing")
