"""ELECTRA discriminators (Ditto Table 2): HF checkpoints load, every layer and every method without [MASK] equals
HF PyTorch, the [MASK] and pooler methods are refused, and what jaxemb saves loads in transformers."""

import json

import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from configs import eval_ditto
from jaxemb import tfidf
from jaxemb.encode import Encoder, Method
from jaxemb.evaluation import run
from jaxemb.models import CheckpointError, EncoderConfig, Transformer, load_pretrained, save_pretrained
from jaxemb.testing.checkpoints import hf_tokenizer, write_random_checkpoint
from jaxemb.spec import EvaluationRun
from tests.support import assert_float32_close, assert_same_params, shared_path, short_senteval, transformer_roundings
from tests.encode_support import PROMPT, SENTENCES, torch_reference

HIDDEN = 32  # conftest's tiny hidden_size.


@pytest.fixture(scope="module", params=[HIDDEN, 16], ids=["embedding32", "embedding16_projected"])
def electra(request, tmp_path_factory):
  """A tiny random `ElectraForPreTraining` directory: embeddings as wide as the hidden states, or 16 wide and
  projected to 32 (`embeddings_project`, as in the small ELECTRAs)."""
  out = tmp_path_factory.mktemp(f"electra-{request.param}")
  return write_random_checkpoint(out, "electra", embedding_size=request.param)


def _hf_outputs(path, texts):
  """(tokenizer batch, ElectraModel outputs with every hidden state and attention, eager attention)."""
  tokenizer = hf_tokenizer(path)
  batch = tokenizer(texts, padding=True, return_tensors="np")
  model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
  assert isinstance(model, transformers.ElectraModel)
  with torch.no_grad():
    out = model(**{k: torch.tensor(v) for k, v in batch.items()}, output_hidden_states=True, output_attentions=True)
  return batch, out


def test_discriminator_and_base_layouts_load_alike(electra, tmp_path, caplog):
  """ElectraForPreTraining's encoder under "electra.", its replaced-token head ignored without a warning, gives
  the params an ElectraModel (no prefix) does; the projection is there exactly when the widths differ."""
  config, params = load_pretrained(electra)
  assert "not used" not in caplog.text
  assert config.model_type == "electra" and config.projects_embeddings == (config.embedding_size != HIDDEN)
  assert set(params) == {"embeddings", *(f"layer_{i}" for i in range(3))}  # No pooler, no MLM head.
  assert ("project" in params["embeddings"]) == config.projects_embeddings
  assert params["embeddings"]["word"]["embedding"].shape == (30522, config.embedding_size)
  transformers.AutoModel.from_pretrained(electra).save_pretrained(tmp_path)
  base_config, base_params = load_pretrained(tmp_path)
  assert base_config == config
  assert_same_params(params, base_params)


def test_projection_weights_are_required_and_embedding_size_is_electras(tmp_path):
  write_random_checkpoint(tmp_path, "electra", embedding_size=16)
  weights = tmp_path / "model.safetensors"
  state = safetensors.numpy.load_file(str(weights))
  del state["electra.embeddings_project.weight"]
  safetensors.numpy.save_file(state, str(weights))
  with pytest.raises(CheckpointError, match=r"model.safetensors: missing encoder weights.*embeddings_project"):
    load_pretrained(tmp_path)
  with pytest.raises(ValueError, match="embedding_size applies to ELECTRA only"):
    EncoderConfig("bert", 30522, 32, 3, 4, 64, 128, embedding_size=16)


def test_hidden_states_and_attentions_match_hf(electra):
  """Every hidden state (h0 after embeddings_project, as HF's hidden_states[0]) and every layer's attention."""
  config, params = load_pretrained(electra)
  batch, theirs = _hf_outputs(electra, SENTENCES)
  ours = Transformer(config).apply(
    {"params": params},
    batch["input_ids"],
    batch["attention_mask"],
    output_hidden_states=True,
    output_attentions=range(3),
  )
  assert len(ours.hidden_states) == len(theirs.hidden_states) == 4
  assert theirs.hidden_states[0].shape[-1] == HIDDEN  # HF's h0 is the projected embedding output.
  roundings = _roundings(config, batch["input_ids"].shape[1])
  for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
    assert_float32_close(np.asarray(a), b.numpy(), roundings, err_msg=f"hidden state {i}")
  for i in range(3):  # Probabilities: scale 1.
    assert_float32_close(
      np.asarray(ours.attentions[i]), theirs.attentions[i].numpy(), roundings, scale=1.0, err_msg=f"attention {i}"
    )


ELECTRA_METHODS = [
  Method("cls_before_pooler"),
  Method("last_avg"),
  Method("first_last_avg"),
  Method("first_layer_last_avg"),
  Method("top2_avg"),
  Method("static_avg"),
  Method("static_remove_biases"),
  *(Method("ditto", layer=1, head=2, variant=v) for v in ("first_last", "last", "static", "embedding_output")),
]


def _roundings(config, length=None):
  """float32's rounding of the forward (tests/support.py), with ELECTRA's embedding projection (a dot of
  embedding_size terms and a bias)."""
  return transformer_roundings(config, length, extra=(config.embedding_size or config.hidden_size) + 1)


def _encode_against_hf(path, method):
  """jaxemb's vectors (one compiled shape), the HF PyTorch transcription of the method and the forward's roundings
  (both float32, each with its own kernels)."""
  encoder = Encoder.from_pretrained(path, method, length_multiple=32)
  ours = encoder.encode(SENTENCES, batch_size=8)
  assert encoder.compilations == 1 and ours.shape == (len(SENTENCES), method.width(encoder.config))
  return ours, torch_reference(str(path), method, SENTENCES), _roundings(encoder.config, 32)


@pytest.mark.parametrize(
  "method", ELECTRA_METHODS, ids=lambda m: m.name + (f"-{m.variant}" if m.name == "ditto" else "")
)
def test_methods_match_hf(electra, method):
  """Static vectors are the raw word rows, embedding_size wide (16 for the projected model); the rest hidden_size."""
  ours, theirs, roundings = _encode_against_hf(electra, method)
  assert_float32_close(ours, theirs, roundings)
  np.testing.assert_array_equal(ours[0], ours[3])


def test_tfidf_first_last_matches_hf(electra, tmp_path):
  idf_path = tmp_path / "idf.json"
  corpus = shared_path("data", "wiki", "wiki1m_sample.txt").read_text().splitlines()[:500]
  tfidf.save_idf(idf_path, tfidf.fit_idf(corpus, hf_tokenizer(electra)))
  ours, theirs, roundings = _encode_against_hf(electra, Method("tfidf_first_last", idf_path=str(idf_path)))
  assert_float32_close(ours, theirs, roundings)


def test_empty_input_has_the_methods_width(electra):
  config, _ = load_pretrained(electra)
  widths = {
    Method("static_avg"): config.embedding_size,
    Method("last_avg"): HIDDEN,
    Method("ditto_all_heads", head=0, variant="static"): config.embedding_size,
  }
  for method, width in widths.items():
    assert Encoder.from_pretrained(electra, method).encode([]).shape[-1] == width


@pytest.mark.parametrize(
  "method, message",
  [
    (Method("prompt", template=PROMPT), r"trained without \[MASK\] tokens.*Ditto §4"),
    (Method("prompt_mlm_top_k", template=PROMPT), r"reads the state at \[MASK\].*no MLM head"),
    (Method("prompt", template=PROMPT, denoise="position_offset", head="mlm_transform"), r"trained without \[MASK\]"),
    (Method("cls"), r"needs the pretrained pooler, which ELECTRA does not have.*cls_before_pooler"),
  ],
)
def test_mask_and_pooler_methods_are_refused(electra, method, message):
  with pytest.raises(ValueError, match=message):
    Encoder.from_pretrained(electra, method)


def test_save_round_trip_loads_in_hf(electra, tmp_path):
  """save_pretrained writes the ElectraModel layout: transformers loads every weight, jaxemb reloads it exactly."""
  config, params = load_pretrained(electra)
  save_pretrained(tmp_path, config, params, hf_tokenizer(electra))
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["ElectraModel"]
  model, info = transformers.AutoModel.from_pretrained(tmp_path, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
  assert model.config.embedding_size == config.embedding_size
  config2, params2 = load_pretrained(tmp_path)
  assert config2 == config
  assert_same_params(params, params2)
  _, theirs = _hf_outputs(electra, SENTENCES)
  _, saved = _hf_outputs(tmp_path, SENTENCES)
  np.testing.assert_array_equal(saved.last_hidden_state.numpy(), theirs.last_hidden_state.numpy())


def test_eval_ditto_config_runs_sts(electra):
  """configs/eval_ditto.py on an ELECTRA checkpoint (google/electra-base-discriminator uses layer 0, head 10; the
  tiny model has 4 heads)."""
  config = eval_ditto.get_config()
  config.model.path = str(electra)
  config.method.head = 3
  config.data.senteval_dir = str(short_senteval())  # STS-B's first 40 test pairs: the job runs, not a good score.
  config.eval.tasks = "STSBenchmark"
  config.eval.length_multiple = 32
  summary = run.run_sts(EvaluationRun.from_config(config))
  assert summary["tasks"]["STSBenchmark"]["pairs"] == 40 and -100 <= summary["average"] <= 100
