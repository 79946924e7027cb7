"""The key map alone: a params tree <-> a Hugging Face state dict, in memory (files: tests/models/test_hf.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxemb.models import CheckpointError, EncoderConfig, Transformer, bert, hf_keys


def _params(config: EncoderConfig, scan_layers: bool = False):
  ids = jnp.zeros((1, 4), jnp.int32)
  params = Transformer(config, scan_layers=scan_layers).init(jax.random.key(0), ids, ids, method="init_all")["params"]
  return jax.tree.map(np.asarray, hf_keys.flax_to_plain(params))


def _config(model_type: str) -> EncoderConfig:
  return EncoderConfig(
    model_type=model_type,
    vocab_size=40,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=24,
  )


@pytest.mark.parametrize(
  "model_type, query_key, head_key, architecture",
  [
    ("bert", "bert.encoder.layer.1.attention.self.query.weight", "cls.predictions.bias", "BertForMaskedLM"),
    ("roberta", "roberta.encoder.layer.1.attention.self.query.weight", "lm_head.bias", "RobertaForMaskedLM"),
    ("electra", "encoder.layer.1.attention.self.query.weight", None, "ElectraModel"),
  ],
)
def test_params_round_trip_through_hf_keys(model_type, query_key, head_key, architecture):
  config = _config(model_type)
  params = _params(config)
  state, name = hf_keys.params_to_state_dict(params, config)
  assert name == architecture
  # torch's Linear keeps [out, in]: the kernel is transposed.
  np.testing.assert_array_equal(state[query_key], params["layer_1"]["query"]["kernel"].T)
  if head_key:
    assert head_key.replace(".bias", ".decoder.bias") in state  # transformers' tied copy of the head's bias.
  back = hf_keys.state_dict_to_params(state, config)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, back, params)


def test_stacked_params_give_the_per_layer_keys():
  config = _config("bert")
  stacked = _params(config, scan_layers=True)
  state, _ = hf_keys.params_to_state_dict(stacked, config)
  per_layer, _ = hf_keys.params_to_state_dict(bert.unstack_layers(stacked), config)
  assert state.keys() == per_layer.keys()
  jax.tree.map(np.testing.assert_array_equal, state, per_layer)


def test_legacy_names_and_a_missing_weight():
  config = _config("bert")
  state, _ = hf_keys.params_to_state_dict(_params(config), config)
  legacy = {
    k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
    for k, v in state.items()
  }
  assert any(k.endswith(".gamma") for k in legacy)
  jax.tree.map(
    np.testing.assert_array_equal,
    hf_keys.state_dict_to_params(legacy, config),
    hf_keys.state_dict_to_params(state, config),
  )
  del state["bert.encoder.layer.0.output.dense.weight"]
  with pytest.raises(CheckpointError, match=r"memory: missing encoder weights .*layer.0.output.dense.weight"):
    hf_keys.state_dict_to_params(state, config, source="memory")
