"""T5 encoder-decoder (t5-base/large and v1.1) as pure functions of a plain params pytree, read from Hugging Face
checkpoints; it gives `T5ForConditionalGeneration`'s logits (tests/models/test_t5.py compares them).

The parameter tree (kernels [in, out]; `HF_KEYS` maps each leaf to its Hugging Face key):

    shared                                            [vocab, d_model], the token embedding of both stacks
    encoder/relative_bias, decoder/relative_bias      [buckets, heads], first block's table, used by every block
    encoder/layer_{i}/{self_attention/{query, key, value, out}, self_attention_norm, ffn/{wi | wi_0, wi_1, wo},
                       ffn_norm}
    decoder/layer_{i}/{... the same, cross_attention/{query, key, value, out}, cross_attention_norm}
    encoder/final_norm, decoder/final_norm
    lm_head                                           [d_model, vocab], only when untied from `shared` (v1.1)

Usage: `config, params, tokenizer = load(path)`; `logits(params, config, input_ids, attention_mask, decoder_ids)`,
or `encode` once, then `decode` and `lm_head` at one position per step (what `jaxemb.beam_search` does).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxemb.models import hf
from jaxemb.models.hf_keys import CheckpointError

Params = dict[str, Any]

# Feed-forward activations by HF's `dense_act_fn` name: `gelu_new` is the tanh approximation (v1.1's gated-gelu).
_ACTIVATIONS = {
  "relu": jax.nn.relu,
  "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
  "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


@dataclasses.dataclass(frozen=True)
class T5Config:
  """The architecture of a T5 checkpoint (the fields of HF's T5Config this code reads); hashable, a static jit
  argument."""

  vocab_size: int
  d_model: int
  d_kv: int
  d_ff: int
  num_layers: int
  num_decoder_layers: int
  num_heads: int
  relative_attention_num_buckets: int
  relative_attention_max_distance: int
  layer_norm_epsilon: float
  activation: str  # A key of _ACTIVATIONS.
  is_gated: bool  # v1.1: act(x wi_0) * (x wi_1).
  scale_decoder_outputs: bool  # Tied head (t5-base): the decoder output is scaled by d_model ** -0.5.
  decoder_start_token_id: int
  eos_token_id: int
  pad_token_id: int

  @classmethod
  def from_hf(cls, hf_config: Any) -> T5Config:
    """From a `transformers.T5Config`; transformers 5 names the head's scaling `scale_decoder_outputs` (earlier
    versions read `tie_word_embeddings`)."""
    if hf_config.dense_act_fn not in _ACTIVATIONS:
      raise CheckpointError(
        f"T5 feed_forward_proj {hf_config.feed_forward_proj!r}: activation "
        f"{hf_config.dense_act_fn!r} is not one of {sorted(_ACTIVATIONS)}"
      )
    return cls(
      vocab_size=hf_config.vocab_size,
      d_model=hf_config.d_model,
      d_kv=hf_config.d_kv,
      d_ff=hf_config.d_ff,
      num_layers=hf_config.num_layers,
      num_decoder_layers=hf_config.num_decoder_layers,
      num_heads=hf_config.num_heads,
      relative_attention_num_buckets=hf_config.relative_attention_num_buckets,
      relative_attention_max_distance=hf_config.relative_attention_max_distance,
      layer_norm_epsilon=hf_config.layer_norm_epsilon,
      activation=hf_config.dense_act_fn,
      is_gated=hf_config.is_gated_act,
      scale_decoder_outputs=getattr(hf_config, "scale_decoder_outputs", hf_config.tie_word_embeddings),
      decoder_start_token_id=hf_config.decoder_start_token_id,
      eos_token_id=hf_config.eos_token_id,
      pad_token_id=hf_config.pad_token_id,
    )


def hf_keys(config: T5Config) -> dict[str, str]:
  """HF key -> '/'-joined params path, for every weight but `lm_head` (optional, see `state_dict_to_params`)."""
  keys = {
    "shared.weight": "shared",
    "encoder.final_layer_norm.weight": "encoder/final_norm",
    "decoder.final_layer_norm.weight": "decoder/final_norm",
  }
  ffn = ("wi_0", "wi_1", "wo") if config.is_gated else ("wi", "wo")
  for stack, count in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
    keys[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = f"{stack}/relative_bias"
    attentions = [("SelfAttention", "self_attention")]
    if stack == "decoder":
      attentions.append(("EncDecAttention", "cross_attention"))
    for i in range(count):
      block, layer = f"{stack}.block.{i}.layer", f"{stack}/layer_{i}"
      for j, (hf_name, name) in enumerate(attentions):
        for hf_leaf, leaf in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out")):
          keys[f"{block}.{j}.{hf_name}.{hf_leaf}.weight"] = f"{layer}/{name}/{leaf}"
        keys[f"{block}.{j}.layer_norm.weight"] = f"{layer}/{name}_norm"
      j = len(attentions)
      keys.update({f"{block}.{j}.DenseReluDense.{w}.weight": f"{layer}/ffn/{w}" for w in ffn})
      keys[f"{block}.{j}.layer_norm.weight"] = f"{layer}/ffn_norm"
  return keys


def state_dict_to_params(state: dict[str, np.ndarray], config: T5Config, source: str = "checkpoint") -> Params:
  """A HF `T5ForConditionalGeneration` state dict -> params; `lm_head` is kept only when it differs from `shared`
  (transformers 5 unties a checkpoint's head on the same test). Raises CheckpointError naming missing keys."""
  keys = hf_keys(config)
  missing = [k for k in keys if k not in state]
  if missing:
    raise CheckpointError(f"{source}: missing T5 weights {missing[:8]}{' ...' if len(missing) > 8 else ''}")
  flat = {path: np.asarray(state[key]).T if _is_kernel(path) else np.asarray(state[key]) for key, path in keys.items()}
  head = state.get("lm_head.weight")
  if head is not None and not np.array_equal(head, state["shared.weight"]):
    flat["lm_head"] = np.asarray(head).T
  params: Params = {}
  for path, value in flat.items():
    *parents, leaf = path.split("/")
    node = params
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = value
  return params


def _is_kernel(path: str) -> bool:
  return "/ffn/" in path or "attention/" in path


def load(name_or_path: str | pathlib.Path, param_dtype=jnp.float32) -> tuple[T5Config, Params, Any]:
  """(config, params, tokenizer) of a Hugging Face T5 checkpoint: a local directory, under $JAXEMB_MODELS, or a hub
  id (`jaxemb.models.hf` finds and reads it)."""
  import transformers  # pylint: disable=g-import-not-at-top

  model_dir = hf.resolve_model_dir(name_or_path)
  try:
    hf_config = transformers.T5Config.from_pretrained(str(model_dir))
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{model_dir}: not a T5 config.json ({e})") from None
  config = T5Config.from_hf(hf_config)
  state, source = hf.read_state_dict(model_dir)
  params = jax.tree.map(lambda a: jnp.asarray(a, param_dtype), state_dict_to_params(state, config, source))
  return config, params, hf.load_tokenizer(model_dir)


def relative_position_bucket(
  relative_position: jax.Array, bidirectional: bool, num_buckets: int, max_distance: int
) -> jax.Array:
  """Mesh TensorFlow's bucket of each relative position (key - query): exact below num_buckets / 2 (of each sign
  when bidirectional), then logarithmic up to max_distance, as HF's `T5Attention._relative_position_bucket`."""
  buckets = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    buckets += (relative_position > 0).astype(relative_position.dtype) * num_buckets
    distance = jnp.abs(relative_position)
  else:
    distance = -jnp.minimum(relative_position, 0)
  max_exact = num_buckets // 2
  # The float division is clamped to 1 where it is unused (distance < max_exact) so the log stays finite.
  scaled = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
  large = jnp.minimum(max_exact + (scaled * (num_buckets - max_exact)).astype(distance.dtype), num_buckets - 1)
  return buckets + jnp.where(distance < max_exact, distance, large)


def position_bias(
  table: jax.Array, query_length: int, key_length: int, bidirectional: bool, config: T5Config
) -> jax.Array:
  """[1, heads, query, key]: the learned bias of each query/key distance."""
  relative = jnp.arange(key_length)[None, :] - jnp.arange(query_length)[:, None]
  bucket = relative_position_bucket(
    relative, bidirectional, config.relative_attention_num_buckets, config.relative_attention_max_distance
  )
  return jnp.transpose(table[bucket], (2, 0, 1))[None]


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """T5's LayerNorm: scale only, no mean subtracted, the variance in float32."""
  variance = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
  return scale * (x * jax.lax.rsqrt(variance + eps)).astype(x.dtype)


def _attention(p: Params, x: jax.Array, memory: jax.Array, bias: jax.Array, config: T5Config) -> jax.Array:
  """Multi-head attention of x over memory; T5 does not scale q.k, and `bias` holds positions and masking."""
  split = lambda h: h.reshape(*h.shape[:-1], config.num_heads, config.d_kv)
  q, k, v = split(x @ p["query"]), split(memory @ p["key"]), split(memory @ p["value"])
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) + bias
  weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
  return out.reshape(*out.shape[:-2], -1) @ p["out"]


def _feed_forward(p: Params, x: jax.Array, config: T5Config) -> jax.Array:
  act = _ACTIVATIONS[config.activation]
  hidden = act(x @ p["wi_0"]) * (x @ p["wi_1"]) if config.is_gated else act(x @ p["wi"])
  return hidden @ p["wo"]


def _mask_bias(allowed: jax.Array, dtype) -> jax.Array:
  """0 where attention is allowed, the dtype's minimum elsewhere (HF's additive mask)."""
  return jnp.where(allowed, 0, jnp.finfo(dtype).min).astype(dtype)


def encode(params: Params, config: T5Config, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """The encoder's last hidden state [batch, length, d_model] (after its final norm)."""
  x = params["shared"][input_ids]
  length = input_ids.shape[1]
  bias = position_bias(params["encoder"]["relative_bias"], length, length, True, config) + _mask_bias(
    attention_mask[:, None, None, :] > 0, x.dtype
  )
  eps = config.layer_norm_epsilon
  for i in range(config.num_layers):
    p = params["encoder"][f"layer_{i}"]
    h = rms_norm(x, p["self_attention_norm"], eps)
    x = x + _attention(p["self_attention"], h, h, bias, config)
    x = x + _feed_forward(p["ffn"], rms_norm(x, p["ffn_norm"], eps), config)
  return rms_norm(x, params["encoder"]["final_norm"], eps)


def decode(
  params: Params, config: T5Config, decoder_ids: jax.Array, encoder_hidden: jax.Array, attention_mask: jax.Array
) -> jax.Array:
  """The decoder's last hidden state [batch, decoder length, d_model] (causal: a position sees those before)."""
  x = params["shared"][decoder_ids]
  length = decoder_ids.shape[1]
  causal = jnp.tril(jnp.ones((length, length), bool))
  self_bias = (
    position_bias(params["decoder"]["relative_bias"], length, length, False, config)
    + _mask_bias(causal, x.dtype)[None, None]
  )
  cross_bias = _mask_bias(attention_mask[:, None, None, :] > 0, x.dtype)
  eps = config.layer_norm_epsilon
  for i in range(config.num_decoder_layers):
    p = params["decoder"][f"layer_{i}"]
    h = rms_norm(x, p["self_attention_norm"], eps)
    x = x + _attention(p["self_attention"], h, h, self_bias, config)
    h = rms_norm(x, p["cross_attention_norm"], eps)
    x = x + _attention(p["cross_attention"], h, encoder_hidden, cross_bias, config)
    x = x + _feed_forward(p["ffn"], rms_norm(x, p["ffn_norm"], eps), config)
  return rms_norm(x, params["decoder"]["final_norm"], eps)


def lm_head(params: Params, config: T5Config, decoder_hidden: jax.Array) -> jax.Array:
  """Vocabulary logits of decoder states: the untied head, or else the embedding transposed."""
  if config.scale_decoder_outputs:
    decoder_hidden = decoder_hidden * config.d_model**-0.5
  return decoder_hidden @ (params["lm_head"] if "lm_head" in params else params["shared"].T)


def logits(
  params: Params, config: T5Config, input_ids: jax.Array, attention_mask: jax.Array, decoder_ids: jax.Array
) -> jax.Array:
  """`T5ForConditionalGeneration(input_ids, attention_mask, decoder_input_ids).logits`."""
  hidden = decode(params, config, decoder_ids, encode(params, config, input_ids, attention_mask), attention_mask)
  return lm_head(params, config, hidden)
