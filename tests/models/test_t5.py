"""The T5 encoder-decoder against HF PyTorch `T5ForConditionalGeneration` on tiny random checkpoints of both kinds."""

import numpy as np
import pytest

from jaxemb.models import t5
from tests.support import assert_float32_close
from tests.t5_support import VARIANTS, t5_roundings, write_tiny_t5


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny_t5(request, tmp_path_factory):
  return request.param, write_tiny_t5(tmp_path_factory.mktemp(request.param), request.param)


def test_logits_equal_hf_torch(tiny_t5):
  import torch
  import transformers

  variant, path = tiny_t5
  config, params, tokenizer = t5.load(path)
  assert ("lm_head" in params) == (variant == "t5_v1_1") and config.scale_decoder_outputs == (variant == "t5")
  batch = tokenizer(
    ["<extra_id_0> orange <extra_id_1> a large round juicy citrus fruit", "apple"], padding=True, return_tensors="np"
  )
  rng = np.random.default_rng(0)
  # Decoder rows longer than the buckets' exact range reach the logarithmic buckets (max_distance 20).
  decoder_ids = rng.integers(0, config.vocab_size, size=(2, 24))
  ours = np.asarray(t5.logits(params, config, batch["input_ids"], batch["attention_mask"], decoder_ids))
  model = transformers.T5ForConditionalGeneration.from_pretrained(path).eval()
  with torch.no_grad():
    theirs = model(
      input_ids=torch.tensor(batch["input_ids"]),
      attention_mask=torch.tensor(batch["attention_mask"]),
      decoder_input_ids=torch.tensor(decoder_ids),
    ).logits.numpy()
  assert ours.shape == theirs.shape == (2, 24, config.vocab_size)
  assert np.abs(theirs).max() > 1  # Real logits, not a degenerate model.
  assert_float32_close(ours, theirs, t5_roundings(config, batch["input_ids"].shape[1], decoder_ids.shape[1]))


def test_relative_position_bucket_equals_hf():
  import torch
  import transformers

  relative = np.arange(-300, 300)
  for bidirectional in (True, False):
    theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
      torch.tensor(relative), bidirectional=bidirectional, num_buckets=32, max_distance=128
    ).numpy()
    ours = np.asarray(t5.relative_position_bucket(relative, bidirectional, 32, 128))
    np.testing.assert_array_equal(ours, theirs)


def test_missing_weight_is_named(tiny_t5, tmp_path):
  from safetensors.numpy import load_file

  _, path = tiny_t5
  config, _, _ = t5.load(path)
  state = load_file(str(path / "model.safetensors"))
  del state["decoder.block.1.layer.1.EncDecAttention.k.weight"]
  with pytest.raises(t5.CheckpointError, match="decoder.block.1.layer.1.EncDecAttention.k.weight"):
    t5.state_dict_to_params(state, config, "x.safetensors")
