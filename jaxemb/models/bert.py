"""BERT, RoBERTa and ELECTRA encoders as one Flax module, applied functionally to a plain params pytree.

The parameter tree (names say what each weight is; `jaxemb.models.hf_keys` maps it to Hugging Face keys):

    embeddings/{word, position, token_type, layer_norm}
    embeddings/project                    (ELECTRA whose embedding_size differs from hidden_size)
    layer_{i}/{query, key, value, attention_out, attention_norm, ffn_in, ffn_out, ffn_norm}
    layers/{query, ...}                   (scanned: the same leaves stacked, a leading [num_hidden_layers] axis)
    pooler/dense                          (when the checkpoint has one)
    mlm_head/{dense, layer_norm, bias}    (when the checkpoint has one)

Usage: `Transformer(config).apply({"params": params}, input_ids, attention_mask, ...)`; for dropout pass
`deterministic=False, rngs={"dropout": key}`. `stack_layers` / `unstack_layers` convert between the two layouts
(Hugging Face checkpoints are read and written per layer).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxemb import xla
from jaxemb.models import heads, linears
from jaxemb.models.config import EncoderConfig, at_least_float32

Dtype = Any

STACKED = "layers"  # The scanned layers' params: every layer's leaves stacked on a leading axis.


def _is_policy(f: Any) -> bool:
  """Whether a jax.checkpoint_policies attribute is a policy (called with a primitive and its **params), not a
  factory of policies (save_only_these_names, ...), which needs arguments this config does not have."""
  return callable(f) and any(p.kind is p.VAR_KEYWORD for p in inspect.signature(f).parameters.values())


# config.model.remat_policy: "none" keeps every layer's activations for the backward pass; "full" recomputes each
# layer whole (nn.remat's default, nothing saved); the others name jax.checkpoint_policies, as maxtext's
# `remat_policy` does (AI-Hypercomputer/maxtext MaxText/layers/decoders.py, `Decoder.set_remat_policy`; e.g.
# "dots_saveable": keep the matmul outputs, recompute the rest).
REMAT_POLICIES = (
  "none",
  "full",
  *sorted(n for n, f in vars(jax.checkpoint_policies).items() if not n.startswith("_") and _is_policy(f)),
)


def checkpoint_policy(name: str) -> Callable[..., bool] | None:
  """The jax.checkpoint policy `name` (one of REMAT_POLICIES but "none") names; None for "full"."""
  if name not in REMAT_POLICIES:
    raise ValueError(f"remat_policy {name!r} is not one of {REMAT_POLICIES}")
  return None if name in ("none", "full") else getattr(jax.checkpoint_policies, name)


def is_stacked(params: Any) -> bool:
  """Whether an encoder params tree has the scanned layout (`layers/...`, stacked) rather than `layer_{i}/...`."""
  return STACKED in params


def stack_layers(params: dict[str, Any], num_layers: int) -> dict[str, Any]:
  """The scanned layout of an encoder tree (unchanged when it already is): `layer_{i}/...` -> `layers/...` with a
  leading [num_layers] axis."""
  if is_stacked(params):
    return params
  layers = [params[f"layer_{i}"] for i in range(num_layers)]
  rest = {k: v for k, v in params.items() if not k.startswith("layer_")}
  return {**rest, STACKED: jax.tree.map(lambda *leaves: jnp.stack(leaves), *layers)}


def unstack_layers(params: dict[str, Any]) -> dict[str, Any]:
  """The per-layer layout of an encoder tree (unchanged when it already is): `layers/...` -> `layer_{i}/...`."""
  if not is_stacked(params):
    return params
  stacked = params[STACKED]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  rest = {k: v for k, v in params.items() if k != STACKED}
  return {**rest, **{f"layer_{i}": jax.tree.map(lambda a: a[i], stacked) for i in range(num_layers)}}


@flax.struct.dataclass
class EncoderOutput:
  """What one forward pass returns; the optional fields are None unless asked for."""

  last_hidden_state: jax.Array  # [batch, length, hidden]
  hidden_states: tuple[jax.Array, ...] | None = None  # Embedding output h0, then every layer: L + 1 arrays.
  attentions: dict[int, jax.Array] | None = None  # Layer -> post-softmax probs [batch, heads, query, key].
  mlm_logits: jax.Array | None = None  # [batch, length, vocab]


class Dropout(nn.Module):
  """Inverted dropout that draws 16 random bits per element, two from each 32-bit word of the PRNG.

  `nn.Dropout` draws a full word per element; on the CPU threefry's bits were most of the cost of dropout (about
  a fifth of a MiniLM SimCSE step), and half as many words cut it by 40%. An element is kept with probability
  q = round(65536 (1 - rate)) / 65536 (|q - (1 - rate)| < 8e-6) and scaled by 1 / q, so expectations are exact.
  """

  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    if deterministic or self.rate == 0:
      return x
    threshold = round(65536 * (1 - self.rate))
    words = jax.random.bits(self.make_rng("dropout"), ((x.size + 1) // 2,), jnp.uint32)
    bits = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)[: x.size].reshape(x.shape)
    return jnp.where(bits < threshold, x * (65536 / threshold), 0).astype(x.dtype)


def default_position_ids(config: EncoderConfig, input_ids: jax.Array) -> jax.Array:
  """Hugging Face's default positions: 0.. for BERT; for RoBERTa padding_idx + 1.. over non-pad tokens,
  with pad tokens at padding_idx (so [PAD]s in the middle of a row do not advance the positions)."""
  if config.model_type == "roberta":
    not_pad = (input_ids != config.pad_token_id).astype(jnp.int32)
    return jnp.cumsum(not_pad, axis=-1) * not_pad + config.pad_token_id
  return jnp.broadcast_to(jnp.arange(input_ids.shape[-1], dtype=jnp.int32), input_ids.shape)


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, LayerNorm, dropout: h0.

  ELECTRA's embeddings are `embedding_size` wide; when that is not hidden_size a dense layer projects them after
  the dropout (HF `ElectraModel.embeddings_project`), and h0 is the projected output, as HF's hidden_states[0].
  """

  config: EncoderConfig
  dtype: Dtype
  param_dtype: Dtype

  def setup(self):
    c = self.config
    embed = lambda n, name: linears.Embed(
      n,
      c.embedding_width,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      embedding_init=nn.initializers.normal(0.02),
      name=name,
    )
    self.word = embed(c.vocab_size, "word")
    self.position = embed(c.max_position_embeddings, "position")
    self.token_type = embed(c.type_vocab_size, "token_type")
    self.layer_norm = nn.LayerNorm(c.layer_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype)
    self.dropout = Dropout(c.hidden_dropout_prob)
    if c.projects_embeddings:
      self.project = linears.Dense(
        c.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype, kernel_init=nn.initializers.normal(0.02)
      )

  def __call__(self, input_ids, token_type_ids, position_ids, inputs_embeds, inputs_embeds_mask, deterministic):
    words = self.word(input_ids)
    if inputs_embeds is not None:
      replace = jnp.ones(input_ids.shape, bool) if inputs_embeds_mask is None else inputs_embeds_mask
      words = jnp.where(replace[..., None], inputs_embeds.astype(words.dtype), words)
    x = words + self.position(position_ids) + self.token_type(token_type_ids)
    x = self.dropout(self.layer_norm(x), deterministic=deterministic)
    return self.project(x) if self.config.projects_embeddings else x


BACKEND_DOTS = "backend"  # Transformer.dot_output_dtype: this backend's choice for the compute dtype.


def rounded_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, output_dtype):
  """`lax.dot_general` returning `output_dtype`, rounded to the operands' dtype: a Dense's dot through the kernels
  that return `output_dtype` (`Transformer.dot_output_dtype`)."""
  del preferred_element_type  # Flax's Dense passes none.
  return jax.lax.dot_general(
    lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=output_dtype
  ).astype(lhs.dtype)


class Layer(nn.Module):
  """One post-LayerNorm transformer layer (`dot_output_dtype`: Transformer's)."""

  config: EncoderConfig
  dtype: Dtype
  param_dtype: Dtype
  dot_output_dtype: Dtype | None = None

  @nn.compact
  def __call__(self, x, attention_mask, deterministic: bool, return_attention: bool, read_positions=None):
    """(the layer's output, the attention probs if `return_attention`). With `read_positions` ([batch] int) only
    those rows go past the keys and values (their query, attention, feed-forward): the output is [batch, 1, hidden],
    each row's read state as the full layer computes it."""
    c = self.config
    dot_general = (
      jax.lax.dot_general
      if self.dot_output_dtype is None
      else functools.partial(rounded_dot_general, output_dtype=self.dot_output_dtype)
    )
    dense = lambda n, name: linears.Dense(
      n,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      dot_general=dot_general,
      kernel_init=nn.initializers.normal(0.02),
      name=name,
    )
    norm = lambda name: nn.LayerNorm(c.layer_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, name=name)
    dropout = Dropout(c.hidden_dropout_prob)
    queries = x if read_positions is None else jnp.take_along_axis(x, read_positions[:, None, None], axis=1)
    q, k, v = self._projections(x, queries, deterministic, dot_general)
    split_heads = lambda a: a.reshape(*a.shape[:-1], c.num_attention_heads, c.head_dim)
    context, probs = self._attention(
      split_heads(q), split_heads(k), split_heads(v), attention_mask, deterministic, return_attention
    )
    x = queries
    attended = dense(c.hidden_size, "attention_out")(context.reshape(x.shape))
    x = norm("attention_norm")(x + dropout(attended, deterministic=deterministic))
    hidden = heads.activation(c, dense(c.intermediate_size, "ffn_in")(x))
    x = norm("ffn_norm")(x + dropout(dense(c.hidden_size, "ffn_out")(hidden), deterministic=deterministic))
    return x, probs

  def _projections(self, x, queries, deterministic, dot_general) -> list[jax.Array]:
    """Query (of `queries`: x, or its read rows), key and value (of x). In training (dropout on) as one dot over the
    kernels of one input (linears.dense_split): the backward copies x transposed once instead of three times (7% of
    a MiniLM PromptBERT step on an Intel Xeon); a forward pass alone takes three dots, as concatenating the kernels
    cost it more than one dot gains (MiniLM, 1 x 16 tokens: 4.5 ms against 3.5 ms; 64 x 32: 6%)."""
    query, key, value = (
      linears.Weights(x.shape[-1], self.config.hidden_size, self.param_dtype, nn.initializers.normal(0.02), name=name)()
      for name in ("query", "key", "value")
    )
    split = lambda inputs, weights: linears.dense_split(inputs, weights, self.dtype, dot_general)
    if deterministic:
      return [split(queries, [query])[0], split(x, [key])[0], split(x, [value])[0]]
    if queries is x:
      return split(x, [query, key, value])
    return [split(queries, [query])[0], *split(x, [key, value])]

  def _attention(self, q, k, v, attention_mask, deterministic, return_attention):
    """Scaled dot-product attention over [batch, length, heads, head_dim].

    `jax.nn.dot_product_attention` (XLA's attention on every backend: JAX takes cuDNN's fused kernel only when
    asked, docs/accelerators.md) is used unless the probabilities are needed (to return them, as Ditto reads one
    layer, or to apply attention dropout in training: the op has no dropout) or the dots must return
    `dot_output_dtype` (the op takes no output dtype), or the model runs in float64 (the op's softmax is float32: a
    float64 reference would hold float32's rounding).
    """
    key_mask = attention_mask[:, None, None, :].astype(bool)  # [batch, 1, 1, key]
    rate = self.config.attention_probs_dropout_prob
    explicit = return_attention or (rate > 0 and not deterministic) or self.dot_output_dtype is not None
    if not (explicit or self.dtype == jnp.float64):
      return jax.nn.dot_product_attention(q, k, v, mask=key_mask), None
    einsum = functools.partial(jnp.einsum, preferred_element_type=self.dot_output_dtype)
    scores = einsum("bqhd,bkhd->bhqk", q, k).astype(self.dtype) / math.sqrt(self.config.head_dim)
    scores = at_least_float32(scores)
    scores = jnp.where(key_mask, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    dropped = Dropout(rate)(probs, deterministic=deterministic)
    return einsum("bhqk,bkhd->bqhd", dropped, v).astype(self.dtype), (probs if return_attention else None)


class Transformer(nn.Module):
  """A BERT, RoBERTa or ELECTRA encoder with its optional pooler and MLM head (ELECTRA has neither).

  Attributes:
    config: the architecture.
    dtype: compute dtype (bfloat16 on accelerators); params stay in `param_dtype`.
    param_dtype: dtype of the parameters.
    scan_layers: run the layers as one `nn.scan` over params stacked on a leading axis (`layers/...`), as maxtext's
      decoder does: XLA compiles one layer instead of num_hidden_layers copies. Deterministic outputs equal the
      unrolled model's (`layer_{i}/...`) to float32 rounding; dropout masks differ, the per-layer rngs being split
      by the scan rather than folded in by layer name. False by default: the layout `load_pretrained` returns
      unless asked (training's config.model.scan_layers is True).
    scan_unroll: how many layers each trip of the scan's loop runs (`nn.scan`'s `unroll`; num_hidden_layers: no
      loop at all). A compile-time choice: the params, dropout streams and outputs are the scanned model's (but
      with `read_positions`, whose last layer unrolled computes the read rows alone, drawing its own masks)
      (the train step's is jaxemb.xla.scan_unroll's, per backend; a forward pass alone, which stacks nothing, gained
      4% from unrolling on the CPU, less than its compile time in a training run's evaluations).
    remat_policy: one of REMAT_POLICIES: what each layer keeps for the backward pass ("none": everything; "full":
      nothing, recomputed: about one more forward pass of compute for less memory); the same params and outputs.
    dot_output_dtype: the dtype the layers' dots return before they are rounded to `dtype`: BACKEND_DOTS (the
      default), this backend's for `dtype` (jaxemb.xla.dot_output_dtype: float32 for bfloat16 on the CPU, whose
      kernels multiply in bfloat16 only then; else `dtype`), the one place every encoder (the Encoder's, the train
      step's) takes it from; None for `dtype`; or a dtype. The same values either way, up to the order of the
      float32 sums; with a dtype attention runs unfused.
  """

  config: EncoderConfig
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  scan_layers: bool = False
  scan_unroll: int = 1
  remat_policy: str = "none"
  dot_output_dtype: Dtype | None | str = BACKEND_DOTS

  def setup(self):
    kwargs = dict(config=self.config, dtype=self.dtype, param_dtype=self.param_dtype)
    self.embeddings = Embeddings(**kwargs)
    policy = checkpoint_policy(self.remat_policy)
    # Layer(x, mask, deterministic, return_attention): the two flags are static (argument 0 is the module). A scan
    # body is not merged with its neighbours by CSE, so only unrolled layers need remat's CSE barrier (maxtext).
    layer = (
      Layer
      if self.remat_policy == "none"
      else nn.remat(Layer, policy=policy, prevent_cse=not self.scan_layers, static_argnums=(3, 4))
    )
    dot_output_dtype = (
      xla.dot_output_dtype(self.dtype) if isinstance(self.dot_output_dtype, str) else self.dot_output_dtype
    )
    layer_kwargs = dict(kwargs, dot_output_dtype=dot_output_dtype)
    if self.scan_layers:
      self.layers = layer(**layer_kwargs, name=STACKED)
    else:
      self.layers = [layer(**layer_kwargs, name=f"layer_{i}") for i in range(self.config.num_hidden_layers)]
    self.pooler = heads.DenseTanh(self.config.hidden_size, dtype=self.dtype, param_dtype=self.param_dtype)
    self.mlm_head = heads.MLMHead(**kwargs)

  def __call__(
    self,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    token_type_ids: jax.Array | None = None,
    position_ids: jax.Array | None = None,
    inputs_embeds: jax.Array | None = None,
    inputs_embeds_mask: jax.Array | None = None,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    output_attentions: Sequence[int] = (),
    output_mlm_logits: bool = False,
    read_positions: jax.Array | None = None,
  ) -> EncoderOutput:
    """Encodes a batch.

    Args:
      input_ids: [batch, length] token ids.
      attention_mask: [batch, length], 1 for tokens to attend to.
      token_type_ids: [batch, length]; zeros by default.
      position_ids: [batch, length]; Hugging Face's defaults when None (position-offset denoising shifts them).
      inputs_embeds: [batch, length, embedding width] vectors that replace the word embeddings where
        `inputs_embeds_mask` is true (everywhere when it is None): OptiPrompt's continuous template tokens.
      inputs_embeds_mask: [batch, length] bool.
      deterministic: False applies dropout (needs a "dropout" rng).
      output_hidden_states: return h0 (the embedding output, projected for ELECTRA) and every layer's output.
      output_attentions: layers (0-based) whose attention probabilities to return; only these layers' are kept
        (unrolled, only these layers materialise them; scanned, every layer computes them unfused).
      output_mlm_logits: return MLM logits at every position (needs an MLM head; to score a few positions
        gather them first and call `mlm_logits`).
      read_positions: [batch] int, the one position of each row whose last-layer state is read (a [MASK], [CLS]):
        `last_hidden_state` is [batch, 1, hidden]. Unless the scan loops, the last layer computes only these rows
        past their keys and values (a sixth of MiniLM's FLOPs, a twelfth of bert-base's, saved). Not with the
        outputs of every layer.
    """
    num_layers = self.config.num_hidden_layers
    bad_layers = [i for i in output_attentions if not 0 <= i < num_layers]
    if bad_layers:
      raise ValueError(f"output_attentions layers {bad_layers} out of range [0, {num_layers})")
    if read_positions is not None and (output_hidden_states or output_attentions):
      raise ValueError("read_positions computes the last layer's read rows alone: no hidden states or attentions")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if position_ids is None:
      position_ids = default_position_ids(self.config, input_ids)
    x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, inputs_embeds_mask, deterministic)
    attention_layers = tuple(dict.fromkeys(output_attentions))  # Each layer once, in the order asked.
    layer_outputs, attentions = self._layers(
      x, attention_mask, deterministic, attention_layers, output_hidden_states, read_positions
    )
    last = layer_outputs[-1]
    return EncoderOutput(
      last_hidden_state=last,
      hidden_states=(x, *layer_outputs) if output_hidden_states else None,
      attentions=attentions or None,
      mlm_logits=self.mlm_logits(last) if output_mlm_logits else None,
    )

  def _unrolled(self, x, attention_mask, deterministic, attention_layers, _):
    """(every layer's output, {layer: probs} of `attention_layers`) of the layers called one by one."""
    outputs, attentions = [], {}
    for i, layer in enumerate(self.layers):
      x, probs = layer(x, attention_mask, deterministic, i in attention_layers)
      outputs.append(x)
      if probs is not None:
        attentions[i] = probs
    return outputs, attentions

  def _layers(self, x, attention_mask, deterministic, attention_layers, output_hidden_states, read_positions):
    """(the layers' outputs, {layer: probs}); with `read_positions` the last output is the read rows'."""
    # The scan's loop runs one layer's program for every layer (what it is chosen for): its last layer runs whole.
    looped = self.scan_layers and self.scan_unroll < self.config.num_hidden_layers
    if read_positions is not None and not looped:
      return [self._read(x, attention_mask, deterministic, read_positions)], {}
    run = self._scanned if self.scan_layers else self._unrolled
    outputs, attentions = run(x, attention_mask, deterministic, attention_layers, output_hidden_states)
    if read_positions is not None:
      outputs = [jnp.take_along_axis(outputs[-1], read_positions[:, None, None], axis=1)]
    return outputs, attentions

  def _read(self, x, attention_mask, deterministic, read_positions):
    """The last layer's states at `read_positions` ([batch, 1, hidden]) after the layers before it, run in full
    (scanned: unrolled)."""
    if not self.scan_layers:
      for layer in self.layers[:-1]:
        x, _ = layer(x, attention_mask, deterministic, False)
      return self.layers[-1](x, attention_mask, deterministic, False, read_positions)[0]
    num_layers = self.config.num_hidden_layers
    if num_layers > 1:
      x = self._scanned(x, attention_mask, deterministic, (), False, num_layers - 1)[0][-1]
    last = lambda layer, *args: layer(*args)[0]
    last = nn.map_variables(last, "params", trans_in_fn=lambda v: jax.tree.map(lambda a: a[-1], v))
    return last(self.layers, x, attention_mask, deterministic, False, read_positions)

  def _scanned(self, x, attention_mask, deterministic, attention_layers, output_hidden_states, num_layers=None):
    """`_unrolled`'s results from one scan over the stacked layers, as maxtext's decoder scans its layers
    (AI-Hypercomputer/maxtext MaxText/layers/decoders.py, `Decoder.scan_decoder_layers`: `nn.scan` with the params
    split on axis 0 and a params and dropout rng per layer). Only the last output is kept unless
    `output_hidden_states`; the requested layers' probs go to slots of a buffer carried through the scan (a last
    slot takes the other layers'), so it holds len(attention_layers) maps however many layers there are.
    `num_layers` < num_hidden_layers runs the first layers alone."""
    num_layers = self.config.num_hidden_layers if num_layers is None else num_layers
    slots = jnp.asarray(
      [attention_layers.index(i) if i in attention_layers else len(attention_layers) for i in range(num_layers)]
    )
    heads_shape = (x.shape[0], self.config.num_attention_heads, x.shape[1], x.shape[1])
    buffer = jnp.zeros((len(attention_layers) + 1, *heads_shape), self.dtype) if attention_layers else None

    def body(layer, carry, slot):
      x, buffer = carry
      x, probs = layer(x, attention_mask, deterministic, bool(attention_layers))
      if buffer is not None:
        buffer = jax.lax.dynamic_update_index_in_dim(buffer, probs, slot, 0)
      return (x, buffer), (x if output_hidden_states else None)

    scan = nn.scan(
      body,
      variable_axes={"params": 0},
      split_rngs={"params": True, "dropout": True},
      length=num_layers,
      unroll=min(self.scan_unroll, num_layers),
    )
    if num_layers < self.config.num_hidden_layers:
      scan = nn.map_variables(scan, "params", trans_in_fn=lambda v: jax.tree.map(lambda a: a[:num_layers], v))
    (x, buffer), outputs = scan(self.layers, (x, buffer), slots)
    attentions = {layer: buffer[slot] for slot, layer in enumerate(attention_layers)}
    return (list(outputs) if output_hidden_states else [x]), attentions

  def mlm_logits(self, hidden: jax.Array) -> jax.Array:
    """MLM-head vocabulary logits for hidden states of any leading shape."""
    return self.mlm_head(hidden, self.embeddings.word.embedding)

  def mlm_transform(self, hidden: jax.Array) -> jax.Array:
    """The MLM head's dense + activation + LayerNorm (supervised PromptBERT's `--org_mlp`)."""
    return self.mlm_head(hidden, self.embeddings.word.embedding, transform_only=True)

  def pool(self, cls_hidden: jax.Array) -> jax.Array:
    """The pretrained pooler (dense + tanh) on [CLS] hidden states."""
    return self.pooler(cls_hidden)

  def init_all(self, input_ids: jax.Array, attention_mask: jax.Array) -> EncoderOutput:
    """Touches every submodule the architecture has, so that `init(..., method="init_all")` creates the full
    tree (ELECTRA's has no pooler and no MLM head)."""
    out = self(input_ids, attention_mask, output_mlm_logits=self.config.is_masked_lm)
    if self.config.has_pooler:
      self.pool(out.last_hidden_state[:, 0])
    return out
