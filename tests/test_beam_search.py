"""Beam search against HF PyTorch `generate(num_beams=k)`, token for token, on tiny random T5 checkpoints."""

import numpy as np
import pytest

from jaxemb import beam_search
from jaxemb.models import t5
from tests.support import float32_atol
from tests.t5_support import VARIANTS, t5_roundings, write_tiny_t5

# EOS's output embedding scaled per variant so that some hypotheses end with EOS, others at max_length.
EOS_SCALE = {"t5": 40.0, "t5_v1_1": 3.0}
INPUTS = ["<extra_id_0> orange <extra_id_1> a large round juicy citrus fruit", "apple: fruit", "river <extra_id_0>"]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny_t5(request, tmp_path_factory):
  path = write_tiny_t5(
    tmp_path_factory.mktemp(request.param), request.param, seed=3, boost={"</s>": EOS_SCALE[request.param]}
  )
  return (path, *t5.load(path))


def _hf_generate(path, batch, **kwargs):
  import torch
  import transformers

  model = transformers.T5ForConditionalGeneration.from_pretrained(path).eval()
  with torch.no_grad():
    out = model.generate(
      input_ids=torch.tensor(batch["input_ids"]),
      attention_mask=torch.tensor(batch["attention_mask"]),
      do_sample=False,
      num_return_sequences=kwargs["num_beams"],
      return_dict_in_generate=True,
      output_scores=True,
      **kwargs,
    )
  return out.sequences.numpy(), out.sequences_scores.numpy()


@pytest.mark.parametrize(
  "options",
  [
    dict(num_beams=3, max_length=10),
    pytest.param(dict(num_beams=4, max_length=14, length_penalty=0.5, early_stopping=True), marks=pytest.mark.slow),
    pytest.param(dict(num_beams=3, max_length=9, early_stopping="never", length_penalty=0.8), marks=pytest.mark.slow),
  ],
)
def test_equals_hf_generate(tiny_t5, options):
  path, config, params, tokenizer = tiny_t5
  batch = tokenizer(INPUTS, padding=True, return_tensors="np")
  hf_sequences, hf_scores = _hf_generate(path, batch, **options)
  out = beam_search.t5_beam_search(params, config, batch["input_ids"], batch["attention_mask"], **options)
  num_beams = options["num_beams"]
  sequences, lengths = np.asarray(out.sequences).reshape(-1, options["max_length"]), np.asarray(out.lengths).ravel()
  assert len(hf_sequences) == len(sequences) == len(INPUTS) * num_beams
  for ours, length, theirs in zip(sequences, lengths, hf_sequences):
    np.testing.assert_array_equal(ours[:length], theirs[:length])
    assert length == len(theirs) or theirs[length - 1] == config.eos_token_id  # What follows is HF's filler.
  # A score sums up to max_length log-probabilities, each a float32 log-softmax over the vocabulary of the logits
  # (both sides float32, each its own kernels), and divides by a length penalty >= 1: on the logits' scale (the
  # found sequences' own), max_length times (tests/support.py).
  rows = np.repeat(np.arange(len(INPUTS)), num_beams)
  logits = t5.logits(params, config, batch["input_ids"][rows], batch["attention_mask"][rows], sequences)
  roundings = t5_roundings(config, batch["input_ids"].shape[1], options["max_length"]) + config.vocab_size + 3
  atol = options["max_length"] * float32_atol(np.asarray(logits), roundings)
  np.testing.assert_allclose(np.asarray(out.scores).ravel(), hf_scores, rtol=0, atol=atol)
  # Both ends are exercised: hypotheses closed by EOS, and (early stopping aside) hypotheses cut at max_length.
  ended = sequences[np.arange(len(sequences)), lengths - 1] == config.eos_token_id
  assert ended.any() and (options.get("early_stopping") is True or not ended.all())


def test_rejects_an_unknown_early_stopping():
  with pytest.raises(ValueError, match="early_stopping"):
    beam_search.beam_search(lambda tokens, position: None, 1, 2, 5, 0, 1, 0, early_stopping="sometimes")


def _lm_bff_search(model, batch, num_beams, max_length, part_ends, eos_id, allowed, repeat_id):
  """princeton-nlp/LM-BFF tools/generate_template.py's `generate` loop, written out in torch as the reference:
  one forward of all inputs per beam and step, mean logits, the best num_beams + 3 tokens of each beam."""
  import torch

  num_parts = len(part_ends) - 1
  inputs = dict(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["attention_mask"]))
  beams = [dict(tokens=[0] * max_length, score=0.0, part=1, output=[])]
  for i in range(max_length - 2):
    pool = []
    for beam in beams:
      if beam["part"] > num_parts:
        pool.append(beam)
        continue
      decoder_ids = torch.tensor([beam["tokens"]] * len(batch["input_ids"]))
      with torch.no_grad():
        logits = model(**inputs, decoder_input_ids=decoder_ids).logits.mean(0)[i]
      log_probs = logits - torch.logsumexp(logits, -1)
      for token in torch.argsort(log_probs, descending=True, stable=True)[: num_beams + 3].tolist():
        output = beam["output"] + [token]
        if allowed[token] and not output[-2:] == [repeat_id, repeat_id]:
          tokens = list(beam["tokens"])
          tokens[i + 1] = token
          closes = token in (part_ends[beam["part"]], eos_id)
          pool.append(
            dict(
              tokens=tokens, score=beam["score"] + log_probs[token].item(), part=beam["part"] + closes, output=output
            )
          )
    if not pool:
      break
    beams = sorted(pool, key=lambda b: -b["score"])[:num_beams]
  return beams


def test_aggregated_search_equals_lm_bff(tmp_path):
  import jax.numpy as jnp
  import transformers

  path = write_tiny_t5(tmp_path, "t5_v1_1", seed=3, boost={"</s>": EOS_SCALE["t5_v1_1"]})
  config, params, tokenizer = t5.load(path)
  batch = tokenizer(INPUTS, padding=True, return_tensors="np")
  allowed = np.ones(config.vocab_size, bool)
  allowed[tokenizer.convert_tokens_to_ids(["▁", ","])] = False
  options = dict(
    num_beams=3, max_length=7, eos_id=config.eos_token_id, repeat_id=tokenizer.convert_tokens_to_ids("."), batch_size=2
  )
  search = lambda ends: beam_search.t5_aggregated_search(
    params, config, batch["input_ids"], batch["attention_mask"], jnp.asarray(ends), jnp.asarray(allowed), **options
  )
  # This random model rarely emits sentinels: spans are closed by EOS, or by the tokens its best beam emits second
  # and fourth (found by a first search), so that beams finish and compete with running ones.
  sentinel = tokenizer.convert_tokens_to_ids("<extra_id_0>")
  probe = np.asarray(search([sentinel] * 3).tokens[0])
  part_ends = [sentinel, int(probe[2]), int(probe[4])]
  ours = search(part_ends)
  del options["batch_size"]
  model = transformers.T5ForConditionalGeneration.from_pretrained(path).eval()
  theirs = _lm_bff_search(model, batch, part_ends=part_ends, allowed=allowed, **options)
  assert len(theirs) == options["num_beams"]
  # A score sums the log-probabilities of up to max_length tokens over the inputs, each a float32 log-softmax over
  # the vocabulary (both sides float32, each its own kernels): on the logits' scale (the found beams' own), that
  # many times (tests/support.py).
  tokens = np.asarray(ours.tokens)
  logits = [
    t5.logits(params, config, batch["input_ids"], batch["attention_mask"], np.repeat(row[None], len(INPUTS), 0))
    for row in tokens
  ]
  roundings = t5_roundings(config, batch["input_ids"].shape[1], tokens.shape[1]) + config.vocab_size + 3
  atol = len(INPUTS) * options["max_length"] * float32_atol(np.abs(np.asarray(logits)).max(), roundings)
  for i, beam in enumerate(theirs):
    length = int(ours.lengths[i])
    assert np.asarray(ours.tokens[i, 1 : 1 + length]).tolist() == beam["output"]
    assert int(ours.parts[i]) == beam["part"]
    np.testing.assert_allclose(float(ours.scores[i]), beam["score"], rtol=0, atol=atol)
  assert 3 in {b["part"] for b in theirs}  # Beams that closed both spans.
