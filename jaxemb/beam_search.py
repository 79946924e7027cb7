"""Beam search over a T5 decoder as one jitted program of fixed shapes (a `lax.while_loop` over steps, no host
loop): Hugging Face's `generate(num_beams=k)`, and LM-BFF's aggregated search, whose beams are scored on the mean
of the logits over many inputs at once (the template generation of PromptBERT §4.2).

Each step runs the decoder over the whole fixed-length buffer of tokens (causal, so later positions change nothing)
and reads the logits at the current position, as LM-BFF's `generate` does; there is no key/value cache, which is
cheap at the lengths templates have (20 tokens).
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from jaxemb.models import t5

# HF's stand-in for an impossible score (transformers generation/utils.py `_beam_search`); the same constant keeps
# the float32 sums, and so the order of beams, equal to theirs.
_NEG = -1.0e9
# Early stopping as HF's `early_stopping`: True stops when num_beams hypotheses are done, False when the best
# running beam at its current length cannot beat them, "never" when it cannot at any length.
EARLY_STOPPING = (True, False, "never")


@flax.struct.dataclass
class BeamOutput:
  """Finished hypotheses, best first: tokens (the start token first, `pad_id` after the end), their length (with
  the start token and the end token) and their length-penalised log-likelihood."""

  sequences: jax.Array  # [batch, num_beams, max_length]
  lengths: jax.Array  # [batch, num_beams]
  scores: jax.Array  # [batch, num_beams]


def _gather(x: jax.Array, index: jax.Array) -> jax.Array:
  """x[b, index[b, j], ...] for every batch row b."""
  return jnp.take_along_axis(x, index.reshape(*index.shape, *([1] * (x.ndim - 2))), axis=1)


def beam_search(
  step_logits: Callable[[jax.Array, jax.Array], jax.Array],
  batch_size: int,
  num_beams: int,
  max_length: int,
  start_id: int,
  eos_id: int,
  pad_id: int,
  length_penalty: float = 1.0,
  early_stopping: bool | str = False,
) -> BeamOutput:
  """HF transformers 5's vectorised beam search (generation/utils.py `_beam_search` and its helpers), for one EOS
  token, a one-token decoder prompt and no logits processors; call it inside jit.

  `step_logits(tokens [batch * num_beams, max_length], position)` gives the next-token logits after `position`
  ([batch * num_beams, vocab]). Each step keeps the top 2 * num_beams continuations of all beams: those ending
  in EOS (or at max_length) among the first num_beams become hypotheses scored by log-likelihood / generated
  length ** length_penalty; the best num_beams others run on.
  """
  if early_stopping not in EARLY_STOPPING:
    raise ValueError(f"early_stopping {early_stopping!r} is not one of {EARLY_STOPPING}")
  keep = 2 * num_beams
  top_mask = jnp.arange(keep) < num_beams
  state = _initial_beams(batch_size, num_beams, max_length, start_id, pad_id)

  def step(s):
    cur_len = s["cur_len"]
    logits = step_logits(s["running"].reshape(batch_size * num_beams, max_length), cur_len - 1)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(batch_size, num_beams, -1)
    vocab = log_probs.shape[-1]
    flat = (log_probs + s["running_scores"][:, :, None]).reshape(batch_size, -1)
    top_scores, top_index = jax.lax.top_k(flat, keep)
    token = top_index % vocab
    candidates = _gather(s["running"], top_index // vocab)
    candidates = jax.vmap(lambda rows, t: rows.at[:, cur_len].set(t))(candidates, token)
    hits = (token == eos_id) | (cur_len + 1 >= max_length)
    # The best num_beams continuations that did not finish run on.
    running_scores = top_scores + hits.astype(jnp.float32) * _NEG
    _, run_index = jax.lax.top_k(running_scores, num_beams)
    new = dict(
      cur_len=cur_len + 1,
      running=_gather(candidates, run_index),
      running_scores=_gather(running_scores, run_index),
      hits=hits,
      **_finish(s, candidates, top_scores, hits & top_mask[None, :], length_penalty, early_stopping),
    )
    new["improvable"] = _improvable(s["improvable"], new, max_length, length_penalty, early_stopping)
    return new

  def running(s):
    open_beam = ~(jnp.all(s["finished"]) & (early_stopping is True))
    return jnp.any(s["improvable"]) & open_beam & ~jnp.all(s["hits"])

  final = jax.lax.while_loop(running, step, state)
  return BeamOutput(sequences=final["sequences"], lengths=final["lengths"], scores=final["scores"])


def _initial_beams(
  batch_size: int, num_beams: int, max_length: int, start_id: int, pad_id: int
) -> dict[str, jax.Array]:
  """The search's state before the first step: every beam the decoder prompt alone, only the first one live."""
  tokens = jnp.full((batch_size, num_beams, max_length), pad_id, jnp.int32).at[:, :, 0].set(start_id)
  beams = (batch_size, num_beams)
  return dict(
    cur_len=jnp.asarray(1),
    running=tokens,
    running_scores=jnp.zeros(beams).at[:, 1:].set(_NEG),
    sequences=tokens,
    scores=jnp.full(beams, _NEG),
    lengths=jnp.ones(beams, jnp.int32),
    finished=jnp.zeros(beams, bool),
    improvable=jnp.ones((batch_size, 1), bool),
    hits=jnp.zeros((batch_size, 2 * num_beams), bool),
  )


def _finish(
  s: dict[str, jax.Array],
  candidates: jax.Array,
  top_scores: jax.Array,
  just_finished: jax.Array,
  length_penalty: float,
  early_stopping: bool | str,
) -> dict[str, jax.Array]:
  """HF's `_update_finished_beams`: the candidates that just finished join the hypotheses when they beat them,
  scored by log-likelihood / generated length ** length_penalty."""
  num_beams = s["scores"].shape[1]
  cur_len = s["cur_len"]
  # Generated length: cur_len + 1 tokens less the one-token decoder prompt.
  scored = top_scores / cur_len.astype(jnp.float32) ** length_penalty
  if early_stopping is True:
    scored += jnp.all(s["finished"], axis=-1, keepdims=True).astype(jnp.float32) * _NEG
  scored += (~s["improvable"]).astype(jnp.float32) * _NEG
  scored += (~just_finished).astype(jnp.float32) * _NEG
  merged_scores = jnp.concatenate([s["scores"], scored], axis=1)
  _, best = jax.lax.top_k(merged_scores, num_beams)
  lengths = jnp.broadcast_to(cur_len + 1, just_finished.shape).astype(jnp.int32)
  merged = lambda old, new: _gather(jnp.concatenate([old, new], axis=1), best)
  return dict(
    sequences=merged(s["sequences"], candidates),
    scores=_gather(merged_scores, best),
    lengths=merged(s["lengths"], lengths),
    finished=merged(s["finished"], just_finished),
  )


def _improvable(
  improvable: jax.Array, s: dict[str, jax.Array], max_length: int, length_penalty: float, early_stopping: bool | str
) -> jax.Array:
  """HF's `_check_early_stop_heuristic`: whether the best running beam could still beat a finished hypothesis."""
  if early_stopping == "never" and length_penalty > 0.0:
    best_length = jnp.asarray(max_length - 1, jnp.float32)
  else:
    best_length = (s["cur_len"] - 1).astype(jnp.float32)
  best_running = s["running_scores"][:, :1] / best_length**length_penalty
  worst_finished = jnp.where(s["finished"], jnp.min(s["scores"], axis=1, keepdims=True), _NEG)
  return improvable & jnp.any(best_running > worst_finished, axis=-1, keepdims=True)


@functools.partial(jax.jit, static_argnames=("config", "num_beams", "max_length", "length_penalty", "early_stopping"))
def t5_beam_search(
  params: t5.Params,
  config: t5.T5Config,
  input_ids: jax.Array,
  attention_mask: jax.Array,
  num_beams: int,
  max_length: int,
  length_penalty: float = 1.0,
  early_stopping: bool | str = False,
) -> BeamOutput:
  """`T5ForConditionalGeneration.generate(input_ids, attention_mask, num_beams=num_beams, max_length=max_length,
  length_penalty=..., early_stopping=..., num_return_sequences=num_beams)`: each row's num_beams hypotheses."""
  batch_size = input_ids.shape[0]
  hidden = jnp.repeat(t5.encode(params, config, input_ids, attention_mask), num_beams, axis=0)
  mask = jnp.repeat(attention_mask, num_beams, axis=0)
  step_logits = lambda tokens, position: t5.lm_head(
    params,
    config,
    jax.lax.dynamic_index_in_dim(t5.decode(params, config, tokens, hidden, mask), position, axis=1, keepdims=False),
  )
  return beam_search(
    step_logits,
    batch_size,
    num_beams,
    max_length,
    config.decoder_start_token_id,
    config.eos_token_id,
    config.pad_token_id,
    length_penalty,
    early_stopping,
  )


@flax.struct.dataclass
class AggregatedOutput:
  """LM-BFF's beams, best first: tokens (the start token, then `lengths` generated ones), their summed
  log-likelihood under the mean logits, and how many spans each completed (`parts` > num_parts: all)."""

  tokens: jax.Array  # [num_beams, max_length]
  lengths: jax.Array  # [num_beams]
  scores: jax.Array  # [num_beams]; -inf for a slot no candidate filled
  parts: jax.Array  # [num_beams]


def aggregated_search(
  mean_logits: Callable[[jax.Array, jax.Array], jax.Array],
  num_beams: int,
  max_length: int,
  start_id: int,
  pad_id: int,
  part_ends: jax.Array,
  eos_id: int,
  allowed: jax.Array,
  repeat_id: int,
) -> AggregatedOutput:
  """LM-BFF's template search (princeton-nlp/LM-BFF tools/generate_template.py, `generate`); call it inside jit.

  `mean_logits(tokens [num_beams, max_length], position)` gives [num_beams, vocab]: each beam's next-token logits
  after `position`, averaged over all inputs. At each of max_length - 2 steps every unfinished beam proposes its
  num_beams + 3 most likely tokens under the log-softmax of those mean logits; a proposal that is not `allowed`, or
  a second `repeat_id` in a row, is dropped. The token `part_ends[p]` (the sentinel after span p) or EOS closes
  span p; a beam that closed len(part_ends) - 1 spans is finished and competes on as it is. The num_beams best
  (summed log-likelihood, no length penalty) go on; when no proposal is left the search stops, as theirs does.
  """
  num_parts = part_ends.shape[0] - 1
  expand = num_beams + 3
  state = _initial_search(num_beams, max_length, start_id, pad_id)

  def step(s):
    i = s["step"]
    log_probs = jax.nn.log_softmax(mean_logits(s["tokens"], i).astype(jnp.float32), axis=-1)
    top, ids = jax.lax.top_k(log_probs, expand)
    valid = s["scores"] > -jnp.inf
    alive = valid & (s["parts"] <= num_parts)
    closes = (ids == part_ends[jnp.minimum(s["parts"], num_parts)][:, None]) | (ids == eos_id)
    repeated = (i > 0) & (s["tokens"][:, i][:, None] == repeat_id) & (ids == repeat_id)
    proposed = jnp.where(alive[:, None] & allowed[ids] & ~repeated, s["scores"][:, None] + top, -jnp.inf)
    kept = jnp.where(valid & ~alive, s["scores"], -jnp.inf)
    # Each beam's slot 0 is the beam carried over, slots 1.. its proposals: the order LM-BFF pools them in.
    pool = jnp.concatenate([kept[:, None], proposed], axis=1)
    scores, index = jax.lax.top_k(pool.reshape(-1), num_beams)
    source, slot = index // (expand + 1), index % (expand + 1)
    grown = slot > 0
    token = ids[source, jnp.maximum(slot - 1, 0)]
    rows = s["tokens"][source]
    new = dict(
      step=i + 1,
      stopped=jnp.all(scores == -jnp.inf),
      tokens=rows.at[:, i + 1].set(jnp.where(grown, token, rows[:, i + 1])),
      scores=scores,
      parts=s["parts"][source] + (grown & closes[source, jnp.maximum(slot - 1, 0)]),
      lengths=s["lengths"][source] + grown,
    )
    return {k: jnp.where(new["stopped"], s[k], v) if k not in ("step", "stopped") else v for k, v in new.items()}

  def running(s):
    return (s["step"] < max_length - 2) & ~s["stopped"] & jnp.any((s["scores"] > -jnp.inf) & (s["parts"] <= num_parts))

  final = jax.lax.while_loop(running, step, state)
  return AggregatedOutput(**{k: final[k] for k in ("tokens", "lengths", "scores", "parts")})


def _initial_search(num_beams: int, max_length: int, start_id: int, pad_id: int) -> dict[str, jax.Array]:
  """LM-BFF's search before the first step: one live beam, the decoder prompt alone, in its first span."""
  return dict(
    step=jnp.asarray(0),
    stopped=jnp.asarray(False),
    tokens=jnp.full((num_beams, max_length), pad_id, jnp.int32).at[:, 0].set(start_id),
    scores=jnp.full((num_beams,), -jnp.inf).at[0].set(0.0),
    parts=jnp.ones((num_beams,), jnp.int32),
    lengths=jnp.zeros((num_beams,), jnp.int32),
  )


@functools.partial(jax.jit, static_argnames=("config", "num_beams", "max_length", "eos_id", "repeat_id", "batch_size"))
def t5_aggregated_search(
  params: t5.Params,
  config: t5.T5Config,
  input_ids: jax.Array,
  attention_mask: jax.Array,
  part_ends: jax.Array,
  allowed: jax.Array,
  num_beams: int,
  max_length: int,
  eos_id: int,
  repeat_id: int,
  batch_size: int = 32,
) -> AggregatedOutput:
  """`aggregated_search` over a T5 model and all rows of `input_ids` at once: the encoder runs once, the decoder on
  `batch_size` inputs x num_beams rows at a time (LM-BFF's batches of 32), the logits summed over inputs."""
  count = input_ids.shape[0]
  chunks = -(-count // batch_size)
  pad = chunks * batch_size - count
  hidden = t5.encode(params, config, input_ids, attention_mask)
  hidden = jnp.pad(hidden, ((0, pad), (0, 0), (0, 0))).reshape(chunks, batch_size, *hidden.shape[1:])
  mask = jnp.pad(attention_mask, ((0, pad), (0, 0))).reshape(chunks, batch_size, -1)
  weight = (jnp.arange(chunks * batch_size) < count).astype(jnp.float32).reshape(chunks, batch_size)

  def mean_logits(tokens, position):
    def chunk_sum(chunk):
      h, m, w = chunk  # [batch_size, length, d_model], [batch_size, length], [batch_size]
      rows = jnp.broadcast_to(tokens[None], (batch_size, *tokens.shape)).reshape(-1, max_length)
      states = t5.decode(params, config, rows, jnp.repeat(h, num_beams, axis=0), jnp.repeat(m, num_beams, axis=0))
      logits = t5.lm_head(params, config, jax.lax.dynamic_index_in_dim(states, position, axis=1, keepdims=False))
      return jnp.einsum("b,bkv->kv", w, logits.reshape(batch_size, num_beams, -1).astype(jnp.float32))

    return jnp.sum(jax.lax.map(chunk_sum, (hidden, mask, weight)), axis=0) / count

  return aggregated_search(
    mean_logits,
    num_beams,
    max_length,
    config.decoder_start_token_id,
    config.pad_token_id,
    part_ends,
    eos_id,
    allowed,
    repeat_id,
  )
