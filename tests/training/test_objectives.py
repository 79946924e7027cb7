"""Objectives: CoT-BERT's loss groups and the views' shared path."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxemb import templates
from jaxemb.data import corpus
from jaxemb.models import load_tokenizer
from jaxemb.training import objectives
from jaxemb.testing.checkpoints import write_random_checkpoint
from tests.support import cot_objective, in_float64, scanned_model

SENTENCES = ["a dog runs .", "two cats sleep on a mat", "the sun is hot", "rain falls"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  path = write_random_checkpoint(
    tmp_path_factory.mktemp("objectives"), "bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
  )
  _, params, model = scanned_model(path)
  return load_tokenizer(path), model, params


def _batch(objective, tokenizer, sentences):
  return {
    field: templates.tokenize_sentences(t, tokenizer, sentences, pad_to=t.num_tokens + 8, tokenization="alone")
    for field, t in zip(objective.views, objective.view_templates)
  }


def test_cot_loss_groups_average_the_loss_of_each_group(tiny):
  """ZBWpro/CoT-BERT ran nn.DataParallel on 2 GPUs: each replica's loss over its own rows (own bias tables, its rows
  as the only negatives), averaged by the Trainer. Groups of 2 of a batch of 4 = the mean of the two halves' losses,
  which is not the loss over the global batch.

  In float64: the batch of 4 and the halves of 2 run programs of other shapes, whose float32 sums round otherwise
  (1.2e-6 of the loss apart on the Zen 3, ~20 roundings of 6e-8 amplified by the cosines' 1 / tau = 20); the same
  amplification of float64's 1.1e-16 is ~2e-15, so rtol 1e-12 holds on any CPU and is 1e11 below the contrast (the
  global batch's loss is ~14% off the halves' mean)."""
  tokenizer, model, encoder = tiny
  with jax.enable_x64(True):
    grouped = cot_objective(tokenizer, loss_group_size=2)
    params = {"encoder": encoder, **objectives.init_head_params(grouped, 32, jax.random.key(0))}
    model, params = in_float64(model, params)
    # One compiled loss per objective and batch shape: the two halves share theirs.
    jitted = jax.jit(
      lambda objective, p, b: objectives.loss_and_metrics(objective, model, p, b, jax.random.key(1))[0],
      static_argnums=0,
    )

    def loss(objective, sentences):
      value = jitted(objective, params, _batch(objective, tokenizer, sentences))
      assert value.dtype == np.float64  # No float32 step in between.
      return float(value)

    halves = [
      loss(cot_objective(tokenizer, loss_group_size=0), SENTENCES[:2]),
      loss(cot_objective(tokenizer, loss_group_size=0), SENTENCES[2:]),
    ]
    np.testing.assert_allclose(loss(grouped, SENTENCES), np.mean(halves), rtol=1e-12)
    assert abs(loss(cot_objective(tokenizer, loss_group_size=0), SENTENCES) - np.mean(halves)) > 1e-3
    with pytest.raises(ValueError, match="does not split into loss groups of 3"):
      loss(cot_objective(tokenizer, loss_group_size=3), SENTENCES)


def _promptbert(tokenizer):
  from configs import promptbert  # pylint: disable=g-import-not-at-top

  parsed = tuple(templates.Template.parse(t, tokenizer) for t in promptbert.get_config().objective.templates)
  return objectives.Objective(
    views=("a", "b"),
    view_templates=parsed,
    pooling="mask",
    denoise="position_offset",
    head="mlp",
    loss="info_nce",
    temperature=0.05,
  )


@pytest.mark.parametrize(
  "make", [_promptbert, lambda tokenizer: cot_objective(tokenizer, loss_group_size=0)], ids=["position_offset", "pad"]
)
def test_a_batch_cut_to_its_longest_row_gives_the_full_width_loss_and_gradient(tiny, make):
  """data.length_multiple: rows cut from template + 8 to their batch's longest (and the bias table to the lengths
  that width holds) change neither the loss nor its gradient: the cut tokens are padding, masked out.

  In float64, where the two widths' other roundings are a few of float64's 1.1e-16 of the loss and of the largest
  gradient entry (0 and 2.2e-16 on the Zen 3; float32's ~1e-6): 1e-12 holds on any CPU, and a cut token that leaked
  into the loss would be caught far below float32's noise."""
  tokenizer, model, encoder = tiny
  objective = make(tokenizer)
  full = _batch(objective, tokenizer, SENTENCES)
  cut = {
    field: corpus.gather(rows, np.arange(len(SENTENCES)), int(rows.attention_mask.sum(1).max()))
    for field, rows in full.items()
  }
  assert all(cut[f].input_ids.shape[1] < full[f].input_ids.shape[1] for f in full)
  with jax.enable_x64(True):
    params = {"encoder": encoder, **objectives.init_head_params(objective, 32, jax.random.key(0))}
    model, params = in_float64(model, params)
    grad = jax.jit(
      jax.value_and_grad(lambda p, b: objectives.loss_and_metrics(objective, model, p, b, jax.random.key(1))[0])
    )
    (loss_full, grad_full), (loss_cut, grad_cut) = grad(params, full), grad(params, cut)
  assert loss_full.dtype == np.float64
  np.testing.assert_allclose(loss_cut, loss_full, rtol=1e-12)
  # Relative to the largest gradient entry: some leaves' gradients are zero up to rounding (the key bias shifts
  # every logit of a softmax alike), and rounding has no relative precision.
  scale = max(float(np.abs(a).max()) for a in jax.tree.leaves(grad_full))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grad_full), jax.tree.leaves(grad_cut), strict=True):
    np.testing.assert_allclose(
      np.asarray(b) / scale, np.asarray(a) / scale, rtol=0, atol=1e-12, err_msg=jax.tree_util.keystr(path)
    )


def test_contrastive_accuracy_counts_rows_whose_positive_has_the_largest_logit(tiny):
  """Without dropout, SimCSE's two views of a sentence are the same vector: every row's positive wins (accuracy 1).
  With the second view's rows shuffled, no row's positive is its own sentence: accuracy 0."""
  tokenizer, model, encoder = tiny
  template = templates.Template.parse("[X]", tokenizer)
  objective = objectives.Objective(
    views=("a", "b"),
    view_templates=(template, template),
    pooling="cls",
    denoise="none",
    head="mlp",
    loss="info_nce",
    temperature=0.05,
  )
  params = {"encoder": encoder, **objectives.init_head_params(objective, 32, jax.random.key(0))}
  batch = _batch(objective, tokenizer, SENTENCES)
  metrics = lambda b: objectives.loss_and_metrics(objective, model, params, b, jax.random.key(1))[1]
  assert float(metrics(batch)["contrastive_accuracy"]) == 1.0
  shuffled = {**batch, "b": corpus.gather(batch["b"], np.array([1, 2, 3, 0]))}
  assert float(metrics(shuffled)["contrastive_accuracy"]) == 0.0


def test_dropout_masks_follow_the_parts_name_not_the_call_order(tiny):
  """A part's dropout (a view, a bias table) is the same whatever other parts encoded before it; other names and the
  same part's second call draw other masks."""
  tokenizer, model, encoder = tiny
  dropping = model.clone(
    config=dataclasses.replace(model.config, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  )
  rows = templates.tokenize_sentences(templates.Template.parse("[X]", tokenizer), tokenizer, SENTENCES)
  run = lambda forward: np.asarray(forward(rows.input_ids, rows.attention_mask).last_hidden_state)
  step = lambda: objectives._TrainingForward(  # pylint: disable=protected-access
    dropping, {"encoder": encoder}, jax.random.key(3)
  )
  first = run(step().named("view 1"))
  forward = step()
  run(forward.named("view 0"))
  run(forward.named("bias t"))
  view_1 = forward.named("view 1")
  np.testing.assert_array_equal(run(view_1), first)
  assert not np.allclose(run(view_1), first)  # Its second call.
  assert not np.allclose(run(step().named("view 0")), first)


def test_hard_negative_weight_weighs_each_rows_own_hard_negative(tiny):
  """objective.hard_negative_weight (SimCSE's --hard_negative_weight) reaches the loss: the loss equals
  losses.info_nce_with_hard_negatives with that weight on the same vectors, and differs from weight 0."""
  from jaxemb import losses, views  # pylint: disable=g-import-not-at-top

  tokenizer, model, encoder = tiny
  parsed = (templates.Template.parse("[X]", tokenizer),) * 3
  objective = lambda weight: objectives.Objective(
    views=("a", "p", "n"),
    view_templates=parsed,
    pooling="cls",
    denoise="none",
    head="none",
    loss="info_nce_with_hard_negatives",
    temperature=0.05,
    hard_negative_weight=weight,
  )
  batch = {
    field: templates.tokenize_sentences(parsed[0], tokenizer, SENTENCES[i:] + SENTENCES[:i], pad_to=12)
    for i, field in enumerate(("a", "p", "n"))
  }
  params = {"encoder": encoder}
  key = jax.random.key(0)
  loss = lambda weight: float(objectives.loss_and_metrics(objective(weight), model, params, batch, key)[0])
  forward = lambda ids, mask, **kw: model.apply({"params": encoder}, ids, mask, **kw)
  vectors = [views.vector(objective(0.0).view_list[0], model, params, forward, batch[f]) for f in ("a", "p", "n")]
  np.testing.assert_allclose(
    loss(2.0), losses.info_nce_with_hard_negatives(*vectors, hard_negative_weight=2.0), rtol=1e-5
  )
  assert abs(loss(2.0) - loss(0.0)) > 1e-3
  with pytest.raises(ValueError, match="applies to info_nce_with_hard_negatives only"):
    dataclasses.replace(_promptbert(tokenizer), hard_negative_weight=1.0)
