"""Objectives: CoT-BERT's loss groups and the views' shared path."""

import jax
import numpy as np
import pytest

from jaxemb import templates
from jaxemb.data import corpus
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
                              projection="mlp", loss="extended_info_nce", temperature=0.05,
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


def _promptbert(tokenizer):
  from configs import promptbert  # pylint: disable=g-import-not-at-top
  parsed = tuple(templates.Template.parse(t, tokenizer) for t in promptbert.get_config().objective.templates)
  return objectives.Objective(views=("a", "b"), view_templates=parsed, pooling="mask", denoising="position_offset",
                              projection="mlp", loss="info_nce", temperature=0.05)


@pytest.mark.parametrize("make", [_promptbert, lambda tokenizer: _cot(tokenizer, 0)], ids=["position_offset", "pad"])
def test_a_batch_cut_to_its_longest_row_gives_the_full_width_loss_and_gradient(tiny, make):
  """data.length_multiple: rows cut from template + 8 to their batch's longest (and the bias table to the lengths
  that width holds) change neither the loss nor its gradient: the cut tokens are padding, masked out."""
  tokenizer, model, encoder = tiny
  objective = make(tokenizer)
  params = {"encoder": encoder, **objectives.init_head_params(objective, 32, jax.random.key(0))}
  full = _batch(objective, tokenizer, SENTENCES)
  cut = {field: corpus.gather(rows, np.arange(len(SENTENCES)), int(rows.attention_mask.sum(1).max()))
         for field, rows in full.items()}
  assert all(cut[f].input_ids.shape[1] < full[f].input_ids.shape[1] for f in full)
  grad = jax.jit(jax.value_and_grad(lambda p, b: objectives.loss_and_metrics(objective, model, p, b,
                                                                             jax.random.key(1))[0]))
  (loss_full, grad_full), (loss_cut, grad_cut) = grad(params, full), grad(params, cut)
  np.testing.assert_allclose(loss_cut, loss_full, rtol=1e-5, atol=1e-5)  # Float noise only: the loss is ~0.02.
  # Relative to the largest gradient entry: some leaves' gradients are zero up to float noise (the key bias shifts
  # every logit of a softmax alike), and noise has no relative precision.
  scale = max(float(np.abs(a).max()) for a in jax.tree.leaves(grad_full))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grad_full), jax.tree.leaves(grad_cut), strict=True):
    np.testing.assert_allclose(np.asarray(b) / scale, np.asarray(a) / scale, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
