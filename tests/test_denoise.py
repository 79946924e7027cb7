"""Tests for jaxemb.denoise against rows built by jaxemb.templates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxemb import denoise
from jaxemb import templates
from jaxemb.testing.checkpoints import hf_tokenizer
from tests.support import assert_float32_close, transformer_roundings

SENTENCE = "A man is playing a guitar."
MAX_LEN = 12
CASES = (
  ("bert_tokenizer", 'This sentence : "[X]" means [MASK] .'),
  ("bert_tokenizer", 'The sentence of "[X]" means [MASK], so it can be summarized as [MASK].'),
  ("roberta_tokenizer", "This sentence : ' [X] ' means [MASK] ."),
  ("roberta_tokenizer", "The sentence of '[X]' means [MASK], so it can be summarized as [MASK]."),
)


@pytest.fixture(params=CASES, ids=lambda case: case[1])
def case(request):
  """The tokenizer, its template and its position offset."""
  name, text = request.param
  tokenizer = request.getfixturevalue(name)
  offset = 0 if name == "bert_tokenizer" else tokenizer.pad_token_id + 1
  return tokenizer, templates.Template.parse(text, tokenizer), offset


def test_position_offset_rows(case):
  _, template, offset = case
  lengths = jnp.arange(MAX_LEN + 1)
  inputs = denoise.position_offset_inputs(template, lengths, offset)
  slot = len(template.prefix_ids) + 1
  columns = np.arange(template.num_tokens)
  for n in range(MAX_LEN + 1):
    np.testing.assert_array_equal(inputs.input_ids[n], template.row(()))
    np.testing.assert_array_equal(inputs.position_ids[n, :slot], offset + columns[:slot])
    np.testing.assert_array_equal(inputs.position_ids[n, slot:], offset + columns[slot:] + n)
  assert np.all(inputs.attention_mask == 1)
  picked = np.take_along_axis(np.asarray(inputs.input_ids), np.asarray(inputs.mask_positions), axis=1)
  assert picked.shape == (MAX_LEN + 1, template.num_masks)
  assert np.all(picked == template.mask_id)


def test_position_offset_matches_a_real_sentence(case):
  tokenizer, template, offset = case
  batch = templates.tokenize_sentences(template, tokenizer, [SENTENCE])
  n = int(batch.sentence_lengths[0])
  slot = len(template.prefix_ids) + 1
  # Natural positions of the real row, less those of the sentence tokens.
  positions = offset + np.arange(template.num_tokens + n)
  expected = np.concatenate([positions[:slot], positions[slot + n :]])
  inputs = denoise.position_offset_inputs(template, batch.sentence_lengths, offset)
  np.testing.assert_array_equal(inputs.position_ids[0], expected)
  np.testing.assert_array_equal(inputs.input_ids[0], np.delete(batch.input_ids[0], np.arange(slot, slot + n)))


def test_pad_rows(case):
  _, template, _ = case
  inputs = denoise.pad_inputs(template, jnp.arange(MAX_LEN + 1), MAX_LEN)
  width = template.num_tokens + MAX_LEN
  assert inputs.position_ids is None
  for n in range(MAX_LEN + 1):
    row = template.row((template.pad_id,) * n)
    padded = row + (template.pad_id,) * (width - len(row))
    np.testing.assert_array_equal(inputs.input_ids[n], padded)
    np.testing.assert_array_equal(inputs.attention_mask[n], np.arange(width) < len(row))
    np.testing.assert_array_equal(inputs.mask_positions[n], template.mask_positions(np.array(n)))
  picked = np.take_along_axis(np.asarray(inputs.input_ids), np.asarray(inputs.mask_positions), axis=1)
  assert np.all(picked == template.mask_id)


def test_pad_row_matches_a_real_sentence(case):
  tokenizer, template, _ = case
  batch = templates.tokenize_sentences(template, tokenizer, [SENTENCE], pad_to=template.num_tokens + MAX_LEN)
  n = int(batch.sentence_lengths[0])
  slot = len(template.prefix_ids) + 1
  inputs = denoise.pad_inputs(template, batch.sentence_lengths, MAX_LEN)
  np.testing.assert_array_equal(inputs.mask_positions, batch.mask_positions)
  np.testing.assert_array_equal(inputs.attention_mask, batch.attention_mask)
  expected = batch.input_ids.copy()
  expected[0, slot : slot + n] = template.pad_id
  np.testing.assert_array_equal(inputs.input_ids, expected)


def test_functions_are_jitted(case):
  _, template, offset = case
  for lengths in (jnp.arange(4), jnp.array([7, 0, 3, 12])):
    offset_inputs = denoise.position_offset_inputs(template, lengths, offset)
    pad_inputs = denoise.pad_inputs(template, lengths, MAX_LEN)
    for array in jax.tree.leaves((offset_inputs, pad_inputs)):
      assert isinstance(array, jax.Array)
      assert array.dtype == jnp.int32
  # Only jitted functions can be lowered; the template is a static argument.
  denoise.position_offset_inputs.lower(template, lengths, offset)
  denoise.pad_inputs.lower(template, lengths, MAX_LEN)


@pytest.mark.parametrize("kind", ["position_offset", "pad"])
def test_denoise_rows_through_the_encoder_match_hf(tiny_checkpoint, kind):
  """Both denoising input kinds give HF PyTorch's [MASK] states on the same rows."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from jaxemb.models import Transformer, load_pretrained  # pylint: disable=g-import-not-at-top

  family, path = tiny_checkpoint
  config, params = load_pretrained(path)
  tokenizer = hf_tokenizer(path)
  text = (
    'The sentence of "[X]" means [MASK], so it can be summarized as [MASK].'
    if family == "bert"
    else "This sentence : ' [X] ' means [MASK] ."
  )
  template = templates.Template.parse(text, tokenizer)
  lengths = jnp.arange(MAX_LEN + 1)
  if kind == "position_offset":
    inputs = denoise.position_offset_inputs(template, lengths, config.position_offset)
  else:
    inputs = denoise.pad_inputs(template, lengths, MAX_LEN)
  positions = inputs.position_ids
  ours = Transformer(config).apply({"params": params}, inputs.input_ids, inputs.attention_mask, position_ids=positions)
  # The [PAD] rows leave positions to the model's defaults: HF computes its own then.
  torch_positions = None if positions is None else torch.tensor(np.asarray(positions), dtype=torch.long)
  torch_model = transformers.AutoModel.from_pretrained(path).eval()
  with torch.no_grad():
    theirs = torch_model(
      input_ids=torch.tensor(np.asarray(inputs.input_ids), dtype=torch.long),
      attention_mask=torch.tensor(np.asarray(inputs.attention_mask)),
      position_ids=torch_positions,
    ).last_hidden_state.numpy()
  rows = np.arange(MAX_LEN + 1)[:, None]
  masks = np.asarray(inputs.mask_positions)
  roundings = transformer_roundings(config, inputs.input_ids.shape[1])  # Both float32, each its own kernels.
  assert_float32_close(np.asarray(ours.last_hidden_state)[rows, masks], theirs[rows, masks], roundings)
  # The bias really depends on n (otherwise one row would do).
  assert not np.allclose(theirs[0, masks[0, -1]], theirs[MAX_LEN, masks[MAX_LEN, -1]], atol=1e-3)
