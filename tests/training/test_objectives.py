"""Objectives: CoT-BERT's loss groups and the views' shared path."""

import jax
import numpy as np
import pytest

from jaxemb import templates
from jaxemb.models import Transformer, load_pretrained, load_tokenizer
from jaxemb.training import objectives
from tests.conftest import write_random_checkpoint

SENTENCES = ["a dog runs .", "two cats sleep on a mat", "the sun is hot", "rain falls"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  path = write_random_checkpoint(tmp_path_factory.mktemp("objectives"), "bert", hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
  config, params = load_pretrained(path)
  return load_tokenizer(path), Transformer(config), params


def _cot(tokenizer, group_size):
  from configs import cotbert  # pylint: disable=g-import-not-at-top
  parsed = tuple(templates.Template.parse(t, tokenizer) for t in (cotbert.ANCHOR, cotbert.POSITIVE, cotbert.NEGATIVE))
  return objectives.Objective(views=("a", "p", "n"), view_templates=parsed, pooling="mask", denoising="pad",
                              projection="mlp", loss="extended_info_nce", temperature=0.05, max_sentence_tokens=8,
                              loss_group_size=group_size)


def _batch(objective, tokenizer, sentences):
  return {field: templates.encode_sentences(t, tokenizer, sentences, pad_to=t.num_tokens + 8, tokenization="alone")
          for field, t in zip(objective.views, objective.view_templates)}


def test_cot_loss_groups_average_the_loss_of_each_group(tiny):
  """ZBWpro/CoT-BERT ran nn.DataParallel on 2 GPUs: each replica's loss over its own rows (own bias tables, its rows
  as the only negatives), averaged by the Trainer. Groups of 2 of a batch of 4 = the mean of the two halves' losses,
  which is not the loss over the global batch."""
  tokenizer, model, encoder = tiny
  grouped = _cot(tokenizer, 2)
  params = {"encoder": encoder, **objectives.init_head_params(grouped, 32, jax.random.key(0))}
  loss = lambda objective, sentences: float(jax.jit(lambda p, b: objectives.loss_and_metrics(
      objective, model, p, b, jax.random.key(1))[0])(params, _batch(objective, tokenizer, sentences)))
  halves = [loss(_cot(tokenizer, 0), SENTENCES[:2]), loss(_cot(tokenizer, 0), SENTENCES[2:])]
  np.testing.assert_allclose(loss(grouped, SENTENCES), np.mean(halves), rtol=1e-6)
  assert abs(loss(_cot(tokenizer, 0), SENTENCES) - np.mean(halves)) > 1e-3
  with pytest.raises(ValueError, match="does not split into loss groups of 3"):
    loss(_cot(tokenizer, 3), SENTENCES)
