"""The optimizer as the authors' HF Trainer ran it, the fresh head's init, and the embedding rows HF never updates."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import torch

from jaxemb import templates
from jaxemb.models import load_tokenizer
from jaxemb.training import objectives
from jaxemb.training import state as train_state
from jaxemb.testing.checkpoints import write_random_checkpoint
from tests.support import EPS32, TOY_SCALE, in_float64, scanned_model

LR, STEPS = 1e-3, 10


def optimizer_config(**changes):
  fields = dict(
    optimizer="hf_adamw",
    learning_rate=LR,
    adam_b1=0.9,
    adam_b2=0.999,
    adam_eps=1e-8,
    weight_decay=0.0,
    max_grad_norm=1.0,
  )
  return ml_collections.ConfigDict({**fields, **changes})


def hf_adamw_updates(params, grads_per_step, weight_decay, max_norm):
  """transformers 4.2.1 `optimization.py` AdamW after torch's clip_grad_norm_, in float64, one update per step:
  denom = sqrt(v) + eps; p -= lr sqrt(1 - b2^t) / (1 - b1^t) m / denom; p -= lr wd p (not on biases); the
  learning rate decays linearly from LR over STEPS steps, the first step at LR."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  updates = []
  for t, grads in enumerate(grads_per_step, start=1):
    g = {k: np.asarray(x, np.float64) for k, x in grads.items()}
    norm = np.sqrt(sum(np.sum(x**2) for x in g.values()))
    coef = min(1.0, max_norm / (norm + 1e-6)) if max_norm else 1.0
    lr = LR * (STEPS - (t - 1)) / STEPS
    before = {k: x.copy() for k, x in p.items()}
    for k in p:
      gk = g[k] * coef
      m[k] = 0.9 * m[k] + 0.1 * gk
      v[k] = 0.999 * v[k] + 0.001 * gk**2
      p[k] = p[k] - lr * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m[k] / (np.sqrt(v[k]) + 1e-8)
      if k != "bias":
        p[k] = p[k] - lr * weight_decay * p[k]
    updates.append({k: p[k] - before[k] for k in p})
  return updates


@pytest.mark.parametrize("weight_decay, max_norm", [(0.0, 1.0), (0.01, 1.0), (0.0, 0.0)])
def test_hf_adamw_updates_equal_transformers_4_2(weight_decay, max_norm):
  rng = np.random.default_rng(0)
  params = {"kernel": rng.normal(size=(3, 4)).astype(np.float32), "bias": rng.normal(size=4).astype(np.float32)}
  # Gradients over four orders of magnitude, some tiny: eps's placement matters most for those.
  grads = [
    {
      k: (rng.normal(size=x.shape) * 10.0 ** rng.integers(-7, 1, size=x.shape)).astype(np.float32)
      for k, x in params.items()
    }
    for _ in range(5)
  ]
  tx = train_state.make_optimizer(optimizer_config(weight_decay=weight_decay, max_grad_norm=max_norm), STEPS)
  state, current = tx.init(params), params
  for step_grads, expected in zip(grads, hf_adamw_updates(params, grads, weight_decay, max_norm)):
    updates, state = tx.update(step_grads, state, current)
    current = optax.apply_updates(current, updates)
    for k in params:
      np.testing.assert_allclose(updates[k], expected[k], rtol=2e-5, atol=1e-12)


def test_optax_adamw_is_the_named_alternative_and_differs_on_small_gradients():
  """optax adds eps after the bias correction: at step 1 a gradient of 1e-8 moves a param by lr / 2 there and by
  lr / (1 + 3.2e-7 / ...) ~ lr / 33 with transformers' placement."""
  params, grads = {"kernel": np.zeros(1, np.float32)}, {"kernel": np.full(1, 1e-8, np.float32)}
  moves = {}
  for name in train_state.OPTIMIZERS:
    tx = train_state.make_optimizer(optimizer_config(optimizer=name), STEPS)
    moves[name] = float(tx.update(grads, tx.init(params), params)[0]["kernel"][0])
  expected_hf = -LR * np.sqrt(1 - 0.999) / 0.1 * 1e-9 / (np.sqrt(0.001) * 1e-8 + 1e-8)
  np.testing.assert_allclose(moves["hf_adamw"], expected_hf, rtol=1e-5)
  np.testing.assert_allclose(moves["optax_adamw"], -LR * 1e-8 / (1e-8 + 1e-8), rtol=1e-5)
  with pytest.raises(ValueError, match="is not one of"):
    train_state.make_optimizer(optimizer_config(optimizer="adam"), STEPS)


def test_clipping_equals_torch_clip_grad_norm():
  rng = np.random.default_rng(1)
  grads = {"a": rng.normal(size=(4, 5)).astype(np.float32), "b": rng.normal(size=7).astype(np.float32)}
  tensors = [torch.tensor(g).requires_grad_() for g in grads.values()]
  for t, g in zip(tensors, grads.values()):
    t.grad = torch.tensor(g)
  torch.nn.utils.clip_grad_norm_(tensors, 1.0)
  clipped, _ = train_state.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
  # Each side scales every entry by one factor: the global norm's sum of n squares within n eps32 / 2 of itself,
  # its root half that, then 1 / (norm + eps) and the product, so entries within (n / 2 + 4) eps32 / 2 of
  # themselves, relative (no cancellation), in any summation order.
  n = sum(g.size for g in grads.values())
  for t, name in zip(tensors, grads):
    np.testing.assert_allclose(clipped[name], t.grad.numpy(), rtol=(n / 2 + 4) * EPS32, atol=0)
  small = {k: v * 1e-3 for k, v in grads.items()}  # Under the bound: unchanged.
  unclipped, _ = train_state.clip_by_global_norm(1.0).update(small, optax.EmptyState())
  for name in small:
    np.testing.assert_array_equal(unclipped[name], small[name])


def test_global_norm_is_optax_tree_norm_bit_for_bit():
  rng = np.random.default_rng(2)
  tree = {"a": rng.normal(size=(64, 33)), "b": [rng.normal(size=7) * 1e3, rng.normal(size=(2, 3, 5)) * 1e-3]}
  tree = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)
  ours, theirs = jax.jit(train_state.global_norm)(tree), jax.jit(optax.tree.norm)(tree)
  assert ours.dtype == theirs.dtype == jnp.float32
  np.testing.assert_array_equal(ours, theirs)
  # Half of optax's traced operations: a square, a sum and an add per leaf (optax: the imaginary part's too).
  ours, theirs = (len(jax.make_jaxpr(norm)(tree).eqns) for norm in (train_state.global_norm, optax.tree.norm))
  assert ours < theirs / 1.5, (ours, theirs)


def _objective(tokenizer, template_text, denoise, head="mlp"):
  """Two views of one template; their encoder passes (and the denoising rows) one call, as the toy runs' are
  (TOY_SCALE): one encoder to compile per step, not one per part."""
  template = templates.Template.parse(template_text, tokenizer)
  return objectives.Objective(
    views=("a", "b"),
    view_templates=(template, template),
    pooling="mask",
    denoise=denoise,
    head=head,
    loss="info_nce",
    temperature=0.05,
    stack_encoder_calls=TOY_SCALE["model.stack_encoder_calls"],
  )


def test_fresh_mlp_is_initialised_as_hf_init_weights(bert_tokenizer):
  """normal(0, 0.02) kernel and a zero bias (HF `_init_weights`, which the authors' `cl_init` calls)."""
  head = objectives.init_head_params(_objective(bert_tokenizer, "[X] is [MASK] .", "none"), 768, jax.random.key(0))
  kernel, bias = np.asarray(head["mlp"]["dense"]["kernel"]), np.asarray(head["mlp"]["dense"]["bias"])
  assert kernel.shape == (768, 768) and abs(kernel.mean()) < 1e-3 and abs(kernel.std() - 0.02) < 2e-4
  np.testing.assert_array_equal(bias, 0)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
  return {
    family: write_random_checkpoint(
      tmp_path_factory.mktemp(f"rows-{family}"), family, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    for family in ("bert", "roberta")
  }


@pytest.mark.parametrize("family, denoise", [("bert", "pad"), ("roberta", "pad"), ("roberta", "position_offset")])
def test_padding_embedding_rows_get_no_update(tiny_models, family, denoise):
  """[PAD] denoising rows attend [PAD]s, and RoBERTa's position-offset rows (positions from 0) use position row 1 =
  padding_idx: their gradients are non-zero, but HF's `padding_idx` gives those rows none, so a step leaves them."""
  path = tiny_models[family]
  tokenizer = load_tokenizer(path)
  config, pretrained, model = scanned_model(path)
  text = 'The sentence of "[X]" means [MASK] .' if family == "bert" else "The sentence : ' [X] ' means[MASK]."
  objective = _objective(tokenizer, text, denoise)
  batch = templates.tokenize_sentences(
    objective.view_templates[0], tokenizer, ["a dog runs .", "two cats sleep"], tokenization="alone"
  )
  batch = {"a": batch, "b": batch}
  params = {"encoder": pretrained, **objectives.init_head_params(objective, config.hidden_size, jax.random.key(0))}
  rows = {"word": config.pad_token_id} if denoise == "pad" else {"position": config.pad_token_id}
  tx = train_state.make_optimizer(optimizer_config(), STEPS)
  step = jax.jit(lambda s, b: train_state.train_step(objective, model, tx, s, b))
  state, _ = step(train_state.init_state(params, {}, tx, 0), batch)
  used = {"word": objective.view_templates[0].mask_id, "position": 0}  # Rows the batch uses that may move.
  for table, row in rows.items():
    before = pretrained["embeddings"][table]["embedding"]
    after = state.params["encoder"]["embeddings"][table]["embedding"]
    np.testing.assert_array_equal(after[row], before[row])
    assert not np.allclose(after[used[table]], before[used[table]])
  # Without the rule the same step moves them: their gradients are not zero.
  unfrozen = dataclasses.replace(objective, freeze_padding_rows=False)
  tx_state = train_state.init_state(params, {}, tx, 0)
  moved, _ = jax.jit(lambda s, b: train_state.train_step(unfrozen, model, tx, s, b))(tx_state, batch)
  table, row = next(iter(rows.items()))
  assert not np.allclose(
    moved.params["encoder"]["embeddings"][table]["embedding"][row], pretrained["embeddings"][table]["embedding"][row]
  )


def test_merge_params_joins_a_trained_subtree_into_the_frozen_tree():
  frozen = {"encoder": {"layer_0": 1, "mlm_head": {"bias": 2}}}
  trained = {"encoder": {"mlm_head": {"dense": 3}}, "prompt": 4}
  assert train_state.merge_params(frozen, trained) == {
    "encoder": {"layer_0": 1, "mlm_head": {"bias": 2, "dense": 3}},
    "prompt": 4,
  }


def test_ddp_world_size_divides_the_gradient_not_the_loss(tiny_models):
  """The authors' supervised DDP runs: every rank's loss is the global one, back-propagated through its own rows,
  and DDP averages the ranks' gradients: the global gradient / world size, which clipping and Adam's eps then see.

  In float64: the two worlds' steps are programs of their own, which round apart (float32's rtol here was 1e-6 and
  1e-5, one CPU's noise); float64's few roundings of 1.1e-16 keep to 1e-12 on any CPU. The metrics are read back
  inside x64: a jax.Array divided outside it is computed in float32."""
  path = tiny_models["bert"]
  tokenizer = load_tokenizer(path)
  config, pretrained, model = scanned_model(path)
  objective = _objective(tokenizer, 'This sentence of "[X]" means[MASK].', "position_offset")
  rows = templates.tokenize_sentences(objective.view_templates[0], tokenizer, ["a dog runs .", "two cats sleep"])
  batch = {"a": rows, "b": rows}
  tx = train_state.make_optimizer(optimizer_config(max_grad_norm=0.0), STEPS)
  metrics = {}
  with jax.enable_x64(True):
    params = {"encoder": pretrained, **objectives.init_head_params(objective, config.hidden_size, jax.random.key(0))}
    model, params = in_float64(model, params)
    for world in (1, 4):
      ddp = dataclasses.replace(objective, ddp_world_size=world)
      step = jax.jit(functools.partial(train_state.train_step, ddp, model, tx))  # Compiled: faster than op by op.
      _, metrics[world] = jax.device_get(step(train_state.init_state(params, {}, tx, 0), batch))
  assert metrics[1]["loss"].dtype == metrics[1]["grad_norm"].dtype == np.float64
  np.testing.assert_allclose(metrics[4]["loss"], metrics[1]["loss"], rtol=1e-12)
  np.testing.assert_allclose(metrics[4]["grad_norm"], metrics[1]["grad_norm"] / 4, rtol=1e-12)
