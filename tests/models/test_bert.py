"""The Flax encoder against Hugging Face PyTorch on the same checkpoints."""

import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxemb import xla
from jaxemb.models import EncoderConfig, Transformer, bert, default_position_ids, heads, load_pretrained
from jaxemb.testing.checkpoints import hf_tokenizer
from tests.support import EPS32, assert_float32_close, shared_path, transformer_roundings

SENTENCES = ["a man is playing a guitar .", "hello", "the quick brown fox jumps over the lazy dog twice today ."]


@functools.lru_cache(maxsize=None)
def _load(path, scan_layers=False):
  config, params = load_pretrained(path, scan_layers=scan_layers)
  hf = transformers.AutoModelForMaskedLM if "mlm_head" in params else transformers.AutoModel
  torch_model = hf.from_pretrained(path, attn_implementation="eager").eval()
  return config, params, torch_model


def _torch_outputs(torch_model, input_ids, attention_mask, **kwargs):
  kwargs = {k: torch.tensor(np.asarray(v)) for k, v in kwargs.items() if v is not None}
  with torch.no_grad():
    out = torch_model(
      input_ids=torch.tensor(np.asarray(input_ids)),
      attention_mask=torch.tensor(np.asarray(attention_mask)),
      output_hidden_states=True,
      output_attentions=True,
      **kwargs,
    )
  return out


def _assert_matches(config, ours, theirs, attention_mask, mlm: bool):
  """Every hidden state, every layer's attention and the MLM logits, on the attended tokens, within float32's
  rounding of the whole forward over these rows (both sides float32, each with its own kernels; the probabilities'
  scale is 1).

  Padding positions are excluded: their states are never used, and the two frameworks compute them from
  different fill values.
  """
  attended = np.asarray(attention_mask).astype(bool)
  roundings = transformer_roundings(config, attended.shape[1], mlm_head=mlm)
  assert len(ours.hidden_states) == len(theirs.hidden_states)
  for layer, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
    assert_float32_close(np.asarray(a)[attended], b.numpy()[attended], roundings, err_msg=f"hidden {layer}")
  for layer, probs in ours.attentions.items():
    query_rows = np.asarray(probs).transpose(0, 2, 1, 3)[attended]  # [tokens, heads, keys]
    expected = theirs.attentions[layer].numpy().transpose(0, 2, 1, 3)[attended]
    assert_float32_close(query_rows, expected, roundings, scale=1.0, err_msg=f"attention {layer}")
  if mlm:
    assert_float32_close(np.asarray(ours.mlm_logits)[attended], theirs.logits.numpy()[attended], roundings)


def _apply(config, params, input_ids, attention_mask, **kwargs):
  """Every layer's states and attentions, from the model (scanned or not) that reads `params`' layout."""
  model = Transformer(config, scan_layers=bert.is_stacked(params))
  return model.apply(
    {"params": params},
    jnp.asarray(input_ids),
    jnp.asarray(attention_mask),
    output_hidden_states=True,
    output_attentions=tuple(range(config.num_hidden_layers)),
    **kwargs,
  )


def _padded_batch(path):
  tokenizer = hf_tokenizer(path)
  batch = tokenizer(SENTENCES, padding=True, return_tensors="np")
  return batch["input_ids"], batch["attention_mask"]


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_padded_batch_matches_hf(tiny_checkpoint, scan_layers):
  _, path = tiny_checkpoint
  config, params, torch_model = _load(str(path), scan_layers)
  ids, mask = _padded_batch(path)
  assert (mask == 0).any(), "the batch must contain padding"
  ours = _apply(config, params, ids, mask, output_mlm_logits=True)
  _assert_matches(config, ours, _torch_outputs(torch_model, ids, mask), mask, mlm=True)


def test_explicit_position_ids_match_hf(tiny_checkpoint):
  """Position-offset denoising: the tokens after a slot are shifted by n positions."""
  _, path = tiny_checkpoint
  config, params, torch_model = _load(str(path))
  ids, mask = _padded_batch(path)
  base = np.arange(ids.shape[1]) + config.position_offset
  positions = np.stack([base + n * (np.arange(ids.shape[1]) >= 3) for n in (0, 5, 17)]).astype(np.int64)
  ours = _apply(config, params, ids, mask, position_ids=positions, output_mlm_logits=True)
  _assert_matches(config, ours, _torch_outputs(torch_model, ids, mask, position_ids=positions), mask, mlm=True)
  default = _apply(config, params, ids, mask)
  assert not np.allclose(ours.last_hidden_state[1], default.last_hidden_state[1], atol=1e-3)


def test_attended_middle_pads_match_hf(tiny_checkpoint):
  """[PAD] denoising: pad tokens inside the row, attended, followed by template tokens and tail padding."""
  _, path = tiny_checkpoint
  config, params, torch_model = _load(str(path))
  tokenizer = hf_tokenizer(path)
  pad, cls, sep = tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id
  prefix, suffix = [1000, 2000, 3000], [4000, tokenizer.mask_token_id, 5000]
  rows = [[cls, *prefix, *[pad] * n, *suffix, sep] for n in (0, 2, 6)]
  width = max(map(len, rows)) + 2
  ids = np.array([row + [pad] * (width - len(row)) for row in rows])
  mask = np.array([[1] * len(row) + [0] * (width - len(row)) for row in rows])
  ours = _apply(config, params, ids, mask, output_mlm_logits=True)
  _assert_matches(config, ours, _torch_outputs(torch_model, ids, mask), mask, mlm=True)


def test_inputs_embeds_replace_chosen_positions(tiny_checkpoint):
  """OptiPrompt: continuous vectors in place of the word embeddings at some positions."""
  _, path = tiny_checkpoint
  config, params, torch_model = _load(str(path))
  ids, mask = _padded_batch(path)
  vectors = np.random.default_rng(0).normal(size=(*ids.shape, config.hidden_size)).astype(np.float32)
  chosen = np.zeros(ids.shape, bool)
  chosen[:, 1:3] = True
  ours = _apply(config, params, ids, mask, inputs_embeds=vectors, inputs_embeds_mask=chosen)
  words = np.asarray(params["embeddings"]["word"]["embedding"])[ids]
  full = np.where(chosen[..., None], vectors, words)
  # HF derives RoBERTa positions from input_ids, which it does not get here: pass them explicitly.
  positions = np.asarray(default_position_ids(config, jnp.asarray(ids)))
  with torch.no_grad():
    theirs = torch_model(
      inputs_embeds=torch.tensor(full),
      attention_mask=torch.tensor(mask),
      position_ids=torch.tensor(positions.astype(np.int64)),
      output_hidden_states=True,
      output_attentions=True,
    )
  _assert_matches(config, ours, theirs, mask, mlm=False)


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_attention_only_for_requested_layers(tiny_checkpoint, scan_layers):
  _, path = tiny_checkpoint
  config, params, _ = _load(str(path), scan_layers)
  ids, mask = _padded_batch(path)
  model = Transformer(config, scan_layers=scan_layers)
  out = model.apply({"params": params}, ids, mask, output_attentions=(1,))
  assert set(out.attentions) == {1}
  assert out.attentions[1].shape == (len(SENTENCES), config.num_attention_heads, ids.shape[1], ids.shape[1])
  np.testing.assert_allclose(np.asarray(out.attentions[1]).sum(-1), 1.0, atol=1e-5)
  assert model.apply({"params": params}, ids, mask).attentions is None
  with pytest.raises(ValueError, match="out of range"):
    model.apply({"params": params}, ids, mask, output_attentions=(config.num_hidden_layers,))


def test_mlm_logits_on_gathered_positions(tiny_checkpoint):
  _, path = tiny_checkpoint
  config, params, _ = _load(str(path))
  ids, mask = _padded_batch(path)
  model = Transformer(config)
  out = model.apply({"params": params}, ids, mask, output_mlm_logits=True)
  gathered = out.last_hidden_state[:, 1]
  logits = model.apply({"params": params}, gathered, method=Transformer.mlm_logits)
  # The same head on the same states, in another shape: its dot, activation, LayerNorm and decoder dot apart.
  assert_float32_close(
    logits, out.mlm_logits[:, 1], transformer_roundings(config, mlm_head=True) - transformer_roundings(config)
  )


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_dropout_uses_the_given_rng(tiny_checkpoint, scan_layers):
  _, path = tiny_checkpoint
  config, params, _ = _load(str(path), scan_layers)
  ids, mask = _padded_batch(path)
  model = Transformer(config, scan_layers=scan_layers)
  run = jax.jit(
    lambda seed: (
      model.apply(
        {"params": params}, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(seed)}
      ).last_hidden_state
    )
  )
  np.testing.assert_array_equal(run(0), run(0))
  assert not np.allclose(run(0), run(1), atol=1e-3)
  clean = model.apply({"params": params}, ids, mask).last_hidden_state
  assert not np.allclose(run(0), clean, atol=1e-3)


def test_bfloat16_compute_keeps_float32_params(tiny_checkpoint):
  _, path = tiny_checkpoint
  config, params, _ = _load(str(path))
  ids, mask = _padded_batch(path)
  full = Transformer(config).apply({"params": params}, ids, mask).last_hidden_state
  half = Transformer(config, dtype=jnp.bfloat16).apply({"params": params}, ids, mask).last_hidden_state
  assert half.dtype == jnp.bfloat16 and params["layer_0"]["query"]["kernel"].dtype == jnp.float32
  attended = np.asarray(mask).astype(bool)
  np.testing.assert_allclose(np.asarray(half, np.float32)[attended], np.asarray(full)[attended], atol=0.15)


def _dot_output_dtypes(jaxpr) -> list:
  """The output dtype of every dot_general in `jaxpr`, nested jaxprs (jit, scan, remat) included."""
  dtypes = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      dtypes.append(eqn.outvars[0].aval.dtype)
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", param)
      if hasattr(inner, "eqns"):
        dtypes += _dot_output_dtypes(inner)
  return dtypes


@pytest.mark.parametrize("deterministic", [True, False], ids=["forward", "dropout"])
def test_float32_dot_outputs_give_the_bfloat16_values(tiny_checkpoint, deterministic):
  """dot_output_dtype=float32 (bfloat16 compute on the CPU) changes which kernels run, not the values: each layer
  dot (6 projections, query, key and value one dot in training, and 2 attention products) returns float32 and is
  rounded to bfloat16, as a bfloat16 dot's float32 sums are; the pooler's and heads' dots are left as they are."""
  _, path = tiny_checkpoint
  config, params, _ = _load(str(path))
  ids, mask = _padded_batch(path)
  outputs = {}
  for dot_output_dtype in (None, jnp.float32):
    model = Transformer(config, dtype=jnp.bfloat16, dot_output_dtype=dot_output_dtype)
    run = lambda p: (
      model.apply(
        {"params": p}, ids, mask, deterministic=deterministic, rngs={"dropout": jax.random.key(0)}
      ).last_hidden_state
    )
    dtypes = _dot_output_dtypes(jax.make_jaxpr(run)(params).jaxpr)
    assert len(dtypes) == (8 if deterministic else 6) * config.num_hidden_layers
    # Without it the dots return bfloat16, but for jax.nn.dot_product_attention's scores (forward only).
    per_layer = 0 if dot_output_dtype else (7 if deterministic else 6)
    assert dtypes.count(jnp.bfloat16) == per_layer * config.num_hidden_layers
    outputs[dot_output_dtype] = np.asarray(jax.jit(run)(params), np.float32)
  attended = np.asarray(mask).astype(bool)
  # Within a bfloat16 step at these magnitudes (identical here with dropout, both taking the unfused attention).
  np.testing.assert_allclose(outputs[jnp.float32][attended], outputs[None][attended], atol=0.02)


def test_the_default_dots_are_the_backends_choice_for_the_dtype(tiny_checkpoint):
  """The Encoder's and the train step's model take no dot setting: the Transformer's default is
  jaxemb.xla.dot_output_dtype's for its dtype (float32 dot outputs for bfloat16 on the CPU, the dtype's for
  float32)."""
  _, path = tiny_checkpoint
  config, params, _ = _load(str(path))
  ids, mask = _padded_batch(path)
  for dtype in (jnp.bfloat16, jnp.float32):
    dots = lambda model: _dot_output_dtypes(
      jax.make_jaxpr(lambda p: model.apply({"params": p}, ids, mask).last_hidden_state)(params).jaxpr
    )
    chosen = Transformer(config, dtype=dtype, dot_output_dtype=xla.dot_output_dtype(dtype))
    assert dots(Transformer(config, dtype=dtype)) == dots(chosen)
  assert xla.dot_output_dtype(jnp.bfloat16) == jnp.float32  # On this CPU: the default is not the dtype's dots.


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_minilm_hidden_states_match_hf(scan_layers):
  path = str(shared_path("models", "all-MiniLM-L6-v2"))
  config, params, torch_model = _load(path, scan_layers)
  assert config.num_hidden_layers == 6 and "pooler" in params and "mlm_head" not in params
  ids, mask = _padded_batch(path)
  ours = _apply(config, params, ids, mask)
  _assert_matches(config, ours, _torch_outputs(torch_model, ids, mask), mask, mlm=False)
  assert len(ours.hidden_states) == 7


def _loss(config, ids, mask, deterministic, scan_layers, remat_policy, scan_unroll):
  """A loss of the params on the last states and layer 1's attention, dropout drawn from key 0 unless
  `deterministic`: what the gradient tests differentiate."""

  def loss(params):
    out = Transformer(config, scan_layers=scan_layers, remat_policy=remat_policy, scan_unroll=scan_unroll).apply(
      {"params": params},
      ids,
      mask,
      deterministic=deterministic,
      rngs={"dropout": jax.random.key(0)},
      output_attentions=(1,),
    )
    return jnp.sum(out.last_hidden_state**2) + jnp.sum(out.attentions[1])

  return loss


@functools.lru_cache(maxsize=None)
def _loss_and_grads(path, deterministic, scan_layers=False, remat_policy="none", scan_unroll=1):
  """The value and gradients (per layer, whatever the layout) of `_loss`; cached, as several tests compare against
  the same baseline."""
  config, params, _ = _load(path, scan_layers)
  ids, mask = _padded_batch(path)
  loss = _loss(config, ids, mask, deterministic, scan_layers, remat_policy, scan_unroll)
  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  return value, bert.unstack_layers(grads)


def _assert_close(path, a, b):
  """Two evaluations of `_loss` and its gradients on `path` (one function in two layouts or schedules) within
  float32's rounding: the loss sums ids.size x hidden squares after the forward (its scale: the loss, a sum of
  positive terms); the gradients run the forward back (its roundings again) and sum over the ids.size tokens, each
  leaf on the scale of its module's largest entry (a bias's terms are its kernel's over inputs of scale 1, and may
  cancel: the key bias's gradient is zero up to rounding)."""
  config, _, _ = _load(path)
  ids, _ = _padded_batch(path)
  forward = transformer_roundings(config, ids.shape[1])
  assert_float32_close(a[0], b[0], forward + ids.size * config.hidden_size)
  scales = collections.defaultdict(float)
  for key, leaf in jax.tree_util.tree_leaves_with_path(b[1]):
    scales[key[:-1]] = max(scales[key[:-1]], float(np.abs(leaf).max()))
  jax.tree_util.tree_map_with_path(
    lambda key, x, y: assert_float32_close(
      x, y, 2 * forward + ids.size, scale=scales[key[:-1]], err_msg=jax.tree_util.keystr(key)
    ),
    a[1],
    b[1],
  )


# Rematerialisation wraps the layers, which BERT and RoBERTa share (their embeddings differ): its tests take BERT's.
LAYERS_ONLY = pytest.mark.parametrize("tiny_checkpoint", ["bert"], indirect=True)


@LAYERS_ONLY
@pytest.mark.parametrize("scan_layers,remat_policy", [(False, "full"), (True, "full"), (True, "dots_saveable")])
def test_remat_gives_the_same_outputs_and_gradients(tiny_checkpoint, scan_layers, remat_policy):
  """Per-layer rematerialisation changes memory, not math: same params tree, outputs and gradients (dropout on)."""
  _, path = tiny_checkpoint
  config, _, _ = _load(str(path))
  remat = _loss_and_grads(str(path), False, scan_layers, remat_policy)
  _assert_close(str(path), remat, _loss_and_grads(str(path), False, scan_layers))
  ids, mask = _padded_batch(path)
  init = lambda policy: jax.eval_shape(
    lambda: Transformer(config, scan_layers=scan_layers, remat_policy=policy).init(
      jax.random.key(0), ids, mask, method="init_all"
    )["params"]
  )
  assert jax.tree.structure(init(remat_policy)) == jax.tree.structure(init("none"))
  with pytest.raises(ValueError, match="remat_policy 'some'"):
    init("some")


def test_scanned_layers_give_the_unrolled_outputs_and_gradients(tiny_checkpoint):
  """Without dropout a scan over the stacked layers is the same function as the unrolled layers: outputs and
  gradients agree to float32 rounding. With dropout they need not: the scan splits the rng per layer, the unrolled
  layers fold in their names."""
  path = str(tiny_checkpoint[1])
  _assert_close(path, _loss_and_grads(path, True, True), _loss_and_grads(path, True, False))
  assert not np.allclose(_loss_and_grads(path, False, True)[0], _loss_and_grads(path, False, False)[0], rtol=1e-3)


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_read_positions_are_the_full_forward_read_there_at_less_compute(tiny_checkpoint, scan_layers):
  """The last layer computing only each row's read position (a [MASK], the [CLS]) is the full forward read there:
  the states and every gradient within float32 rounding (no dropout), the layers unrolled or their scan (unrolled:
  a loop runs its last layer whole); and the program computes at least half a layer fewer FLOPs (the last layer's
  queries, attention and feed-forward of the other rows)."""
  path = str(tiny_checkpoint[1])
  config, params, _ = _load(path, scan_layers)
  ids, mask = _padded_batch(path)
  read = jnp.asarray(mask.sum(1) - 2)  # The last word of each row: a position of its own in every row.
  model = Transformer(config, scan_layers=scan_layers, scan_unroll=config.num_hidden_layers)
  full = lambda p: model.apply({"params": p}, ids, mask).last_hidden_state[jnp.arange(len(read)), read]
  alone = lambda p: model.apply({"params": p}, ids, mask, read_positions=read).last_hidden_state[:, 0]
  value_and_grads = lambda f: jax.jit(jax.value_and_grad(lambda p: jnp.sum(f(p) ** 2)))(params)
  (full_value, full_grads), (value, grads) = value_and_grads(full), value_and_grads(alone)
  _assert_close(path, (value, bert.unstack_layers(grads)), (full_value, bert.unstack_layers(full_grads)))
  flops = lambda f: jax.jit(f).lower(params).cost_analysis()["flops"]  # The program's own, before any backend rewrite.
  assert flops(alone) < (1 - 0.5 / config.num_hidden_layers) * flops(full)
  with pytest.raises(ValueError, match="read_positions"):
    model.apply({"params": params}, ids, mask, read_positions=read, output_hidden_states=True)


def test_unrolled_scan_is_the_scanned_model(tiny_checkpoint):
  """scan_unroll (the CPU's choice, jaxemb.xla.scan_unroll) changes the compiled loop only: with dropout on, the
  loss and gradients of the scan unrolled into one trip equal the looping scan's (the same dropout streams), and
  the compiled program has no loop left."""
  _, path = tiny_checkpoint
  config, params, _ = _load(str(path), scan_layers=True)
  unrolled = _loss_and_grads(str(path), False, True, scan_unroll=config.num_hidden_layers)
  _assert_close(str(path), unrolled, _loss_and_grads(str(path), False, True))
  ids, mask = _padded_batch(path)
  hlo = lambda unroll: (
    jax.jit(
      lambda p: (
        Transformer(config, scan_layers=True, scan_unroll=unroll).apply({"params": p}, ids, mask).last_hidden_state
      )
    )
    .lower(params)
    .compile()
    .as_text()
  )
  assert " while(" in hlo(1) and " while(" not in hlo(config.num_hidden_layers)


def test_dropout_keeps_each_element_with_probability_one_minus_rate():
  x = jnp.ones((999, 1001))  # An odd size: the last word's second half is left over.
  dropout = bert.Dropout(0.1)
  y = np.asarray(dropout.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)}))
  kept = (y != 0).reshape(-1)
  assert abs(kept.mean() - 0.9) < 0.0015  # 5 standard deviations of the mean of 999,999 draws.
  np.testing.assert_allclose(np.unique(y), [0.0, 65536 / round(65536 * 0.9)], rtol=1e-6)
  assert abs(y.mean() - 1.0) < 0.002  # Kept elements are scaled so that the expectation is x.
  assert abs(np.corrcoef(kept[:-1:2], kept[1::2])[0, 1]) < 0.01  # The two halves of a word are independent.
  other = dropout.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert (np.asarray(other) != y).any()
  np.testing.assert_array_equal(dropout.apply({}, x, deterministic=True), x)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu"])
def test_activation_and_its_gradient_match_torch(hidden_act):
  config = EncoderConfig.from_hf(transformers.BertConfig(hidden_act=hidden_act).to_dict())
  x = np.linspace(-12, 12, 2001, dtype=np.float32)
  y = heads.activation(config, jnp.asarray(x))
  grad = jax.grad(lambda x: heads.activation(config, x).sum())(jnp.asarray(x))
  tx = torch.tensor(x, requires_grad=True)
  ty = transformers.activations.ACT2FN[hidden_act](tx)
  ty.sum().backward()
  # 0.5 x (1 + erf(x / sqrt 2)) and its derivative Phi(x) + x phi(x) (the tanh form alike) round x's scaling, the
  # erf (a few ulps of its value, at most 1: XLA's and torch's polynomials differ) and 1 + erf to a few eps32 of 1,
  # then multiply by x: a few eps32 (1 + |x|) each side, as the tanh form's gradient below (measured: 1.5 and 1.2
  # eps32 (1 + |x|) for the erf form's value and gradient, 1.1 for the tanh form's value). The erf form's tail,
  # x < -4.9, is 0 where torch gives down to -3e-6: 1 + erf rounds to 0 or to an ulp of 1. 16 eps32 (1 + |x|)
  # is the tanh form's gradient's bound; it fails the tanh form for the erf one by a factor of 68 (4.7e-4 at x = -2.7).
  bound = 16 * EPS32 * (1 + np.abs(x))
  np.testing.assert_array_less(np.abs(np.asarray(y) - ty.detach().numpy()), bound)
  if hidden_act != "gelu_new":
    np.testing.assert_array_less(np.abs(np.asarray(grad) - tx.grad.numpy()), bound)
  else:
    # d/dx 0.5 x (1 + tanh(u)) has the term 0.5 x u'(x) (1 - tanh(u)^2), whose float32 value near saturation is a
    # difference of numbers near 1: XLA's tanh, up to ~4 ulps off there, gives errors of a few eps32 times
    # s = 0.5 |x u'(x)| (24 at x = -7.3), and how many ulps depends on the CPU (without FMA, as under
    # --xla_cpu_max_isa=AVX or SSE4_2: 9.3e-6 at x = -7.3, against 3.8e-6 with it). Measured on every ISA, on this
    # grid and one 100 times finer: at most 5.5 eps32 (1 + s). 16 leaves a margin of 3, is below 5e-6 for
    # |x| < 2.3, and still fails a wrong coefficient (0.0447 for 0.044715) by a factor of 3, the erf form by 200.
    x64 = x.astype(np.float64)
    s = 0.5 * np.abs(x64) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x64**2)
    np.testing.assert_array_less(np.abs(np.asarray(grad) - tx.grad.numpy()), 16 * EPS32 * (1 + s))


@LAYERS_ONLY
def test_remat_saves_memory_at_the_cpus_scan_unroll(tiny_checkpoint):
  """remat_policy's point is a smaller train step: at the per-backend unroll (jaxemb.xla.scan_unroll) the compiled
  gradient of a remat'd encoder needs less temporary memory than without. Unrolled into one trip, XLA computed the
  recomputed forward as early as the original and the saving was gone (bert-base's SimCSE step: 4.30 GB of
  temporaries with and without "full", 1.43 GB at batch 16 either way, 0.91 GB with the loop kept)."""
  _, path = tiny_checkpoint
  config, params, _ = _load(str(path), scan_layers=True)
  ids, mask = _padded_batch(path)
  ids, mask = np.tile(ids, (8, 4)), np.tile(mask, (8, 4))  # Activations that outweigh the weights' gradients.

  def temp_bytes(remat_policy, scan_unroll):
    loss = _loss(config, ids, mask, False, True, remat_policy, scan_unroll)
    return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

  layers = config.num_hidden_layers
  unroll = {policy: xla.scan_unroll(layers, remat=policy != "none") for policy in ("none", "full")}
  assert temp_bytes("full", unroll["full"]) < 0.7 * temp_bytes("none", unroll["none"])
