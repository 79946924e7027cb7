"""A step's encoder passes in few calls: which parts share a call, and that sharing one changes no part's dropout."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxemb import losses, templates, views
from jaxemb.models import load_tokenizer
from jaxemb.testing.checkpoints import write_random_checkpoint
from jaxemb.training import encoder_calls, objectives
from tests.support import cot_objective, scanned_model

SENTENCES = ["a dog runs .", "two cats sleep on a mat", "the sun is hot", "rain falls"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A random BERT with dropout on (0.1, as bert-base's)."""
  path = write_random_checkpoint(tmp_path_factory.mktemp("encoder_calls"), "bert")
  config, params, model = scanned_model(path)
  assert config.hidden_dropout_prob > 0 and config.attention_probs_dropout_prob > 0
  return load_tokenizer(path), model, params


def _part(rows, width, extra=()):
  ids = jnp.ones((rows, width), jnp.int32)
  read = jnp.arange(rows, dtype=jnp.int32) % width
  return encoder_calls.Part(views.EncoderInputs(ids, ids, {k: ids for k in extra}, read), jax.random.key(0))


def test_parts_of_one_row_count_and_inputs_within_a_quarter_of_the_widest_share_a_call():
  """PromptBERT's two views (widths 42 and 40) share a call, its two position-offset bias tables (33 rows, 12 and 11
  wide) another: padded to the sentences' width they would add 40% more tokens. Other extra inputs, other rows, or
  more than a quarter narrower: a call of its own. Not stacking (the CPU's choice): a call per part."""
  parts = [
    _part(64, 40),
    _part(33, 11, ["position_ids"]),
    _part(64, 42),
    _part(33, 12, ["position_ids"]),
    _part(64, 31),  # 31 < 0.75 x 42.
    _part(64, 42, ["inputs_embeds"]),
    _part(32, 42),
  ]
  assert sorted(encoder_calls.calls(parts, stack=True)) == sorted([[2, 0], [3, 1], [4], [5], [6]])
  assert encoder_calls.calls(parts, stack=False) == [[i] for i in range(len(parts))]


def _one_call_per_part_loss(objective, model, params, batch, rng):
  """The contrastive loss with each view and each template's bias table in a call of its own: the step as it ran
  before encoder_calls, each part drawing its dropout from its own named key."""
  forward = objectives._TrainingForward(model, params, rng).named("group 0")  # pylint: disable=protected-access
  tables, vectors = {}, []
  for i, (field, view) in enumerate(zip(objective.views, objective.view_list)):
    rows = batch[field]
    max_len = rows.input_ids.shape[1] - view.template.num_tokens
    if view.template not in tables:
      bias_forward = forward.named(f"bias {view.template.text}")
      tables[view.template] = views.template_bias(view, model, bias_forward, jnp.arange(max_len + 1), max_len)
    bias = tables[view.template][rows.sentence_lengths]
    vectors.append(views.vector(view, model, params, forward.named(f"view {i}"), rows, None, bias))
  logits = losses.extended_info_nce_logits(*vectors, temperature=objective.temperature)
  return losses.diagonal_cross_entropy(logits)


def test_views_in_one_call_draw_the_dropout_of_their_own_calls(tiny):
  """CoT-BERT's three views (one width) in one call and its three [PAD] bias tables (other row counts: calls of
  their own), dropout on: the loss equals the one of a call per part within float32 rounding, and another step rng
  changes it by far more (the masks are the parts' own, not shared)."""
  tokenizer, model, encoder = tiny
  objective = cot_objective(tokenizer, head="none", stack_encoder_calls=True)
  width = max(t.num_tokens for t in objective.view_templates) + 8
  batch = {
    field: templates.tokenize_sentences(t, tokenizer, SENTENCES, pad_to=width, tokenization="alone")
    for field, t in zip(objective.views, objective.view_templates)
  }
  params = {"encoder": encoder}
  loss = jax.jit(lambda rng: objectives.loss_and_metrics(objective, model, params, batch, rng)[0])
  reference = jax.jit(lambda rng: _one_call_per_part_loss(objective, model, params, batch, rng))
  key = jax.random.key(7)
  # The loss is ~5; float32 rounding of a 2-layer encoder's states moves it by ~1e-6 relative.
  np.testing.assert_allclose(float(loss(key)), float(reference(key)), rtol=2e-5)
  assert abs(float(loss(key)) - float(loss(jax.random.key(8)))) > 1e-2


def test_a_padded_part_gives_the_states_of_its_own_call(tiny):
  """A narrower part padded to its call's width: its states at each row's read position (dropout off) equal the
  full forward's there to float32 rounding."""
  tokenizer, model, encoder = tiny
  quiet = model.clone(
    config=dataclasses.replace(model.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  )
  template = templates.Template.parse("[X]", tokenizer)
  narrow, wide = (templates.tokenize_sentences(template, tokenizer, SENTENCES, pad_to=w) for w in (9, 11))
  read = narrow.sentence_lengths  # Each row's last sentence token: a position of its own in every row.
  parts = [
    encoder_calls.Part(views.EncoderInputs(rows.input_ids, rows.attention_mask, {}, read), jax.random.key(i))
    for i, rows in enumerate((narrow, wide))
  ]
  assert encoder_calls.calls(parts, stack=True) == [[1, 0]]
  states = encoder_calls.encode(quiet, encoder, parts, stack=True)
  alone = quiet.apply({"params": encoder}, narrow.input_ids, narrow.attention_mask).last_hidden_state
  # LayerNorm'd states: O(1), float32 rounding ~1e-6.
  np.testing.assert_allclose(states[0], alone[np.arange(len(read)), read], atol=1e-5)


def _scan_unrolls(fn, *args) -> list[int]:
  """The `unroll` of each scan in fn's jaxpr, in order (the layer scan of each encoder call)."""
  found = []

  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "scan":
        found.append(eqn.params["unroll"])
      for value in eqn.params.values():
        for sub in value if isinstance(value, (list, tuple)) else [value]:
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            visit(sub.jaxpr)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            visit(sub)

  visit(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def test_small_calls_run_the_layer_scans_loop_when_asked(tiny):
  """config.model.loop_small_calls: a call under a quarter of the largest's tokens (a bias table's) runs the scan one
  layer a trip while the large call stays unrolled (its scan covers the layers before the last, which computes the
  read rows alone; the loop runs its last layer whole). Without dropout (the loop draws its masks apart) the states
  are the unrolled call's to float32 rounding."""
  _, model, encoder = tiny
  layers = model.config.num_hidden_layers
  unrolled = model.clone(
    config=dataclasses.replace(model.config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    scan_unroll=layers,
  )
  parts = [_part(4, 40), _part(4, 9, ["position_ids"])]  # 36 tokens against 160.
  parts = [dataclasses.replace(p, dropout_key=jax.random.key(i)) for i, p in enumerate(parts)]
  encode = lambda params, loop_small: encoder_calls.encode(unrolled, params, parts, True, loop_small)
  assert _scan_unrolls(lambda p: encode(p, False), encoder) == [layers - 1, layers - 1]
  assert _scan_unrolls(lambda p: encode(p, True), encoder) == [layers - 1, 1]
  for looped, whole in zip(encode(encoder, True), encode(encoder, False)):
    np.testing.assert_allclose(looped, whole, atol=1e-5)  # LayerNorm'd states: O(1), float32 rounding ~1e-6.
