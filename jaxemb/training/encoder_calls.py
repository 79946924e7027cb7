"""A training step's encoder passes in as few calls as their shapes allow.

A step encodes several parts: each view of each loss group, and each denoising template's bias rows. Each part has
its own dropout key (objectives._TrainingForward names them). Parts of one row count and the same extra inputs whose
widths are close are padded to the widest, stacked on a new leading axis and encoded by one call vmapped over the
parts and their keys: one program for PromptBERT's two views, another for its two bias tables, and one for all six
views of CoT-BERT's two loss groups, where each part was its own call before (jaxemb.xla.stacks_encoder_calls says
where: on accelerators, not on the CPU). Under vmap each part draws its dropout
masks from its own key exactly as its own call would, so a part that needs no padding gets the same bits; a padded
part draws masks of its padded width. Stacking on a new axis keeps each part's rows where they were: a batch split
over the mesh's devices stays split, with no rows moving between devices.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxemb import views
from jaxemb.models import Transformer

# The most padding a part takes to join a wider call, as a fraction of the call's width. Templates differ by a few
# tokens, so a step's views join one call; position-offset bias rows, only a template wide, stay out of the
# sentences' call (padded to it they would add 40% to the tokens of a MiniLM PromptBERT step at batch 64).
MAX_PADDING = 0.25
# With config.model.loop_small_calls, a call of fewer tokens than this fraction of the step's largest call runs the
# layer scan's loop, one layer a trip, whatever model.scan_unroll: unrolled, its layers cost as much compiling as the
# largest call's (PromptBERT's bias rows, unrolled, doubled its step's compile on an H200: 47.7 s against SimCSE's
# 21.3), while its run is a small part of the step. The loop computes the same function (float32 rounding apart;
# its last layer runs whole, so its dropout masks are drawn apart; tests/training/test_encoder_calls.py).
SMALL_CALL = 0.25


@dataclasses.dataclass(frozen=True)
class Part:
  """One encoder pass of a step: its inputs and its dropout key."""

  inputs: views.EncoderInputs
  dropout_key: jax.Array

  @property
  def shape(self) -> tuple[int, int]:
    return self.inputs.input_ids.shape

  @property
  def signature(self) -> tuple[Any, ...]:
    """What parts of one call share: the row count and the extra inputs."""
    return self.shape[0], tuple(sorted(self.inputs.extra))


def calls(parts: list[Part], stack: bool) -> list[list[int]]:
  """The indices of `parts` grouped into calls: parts of one signature, each within MAX_PADDING of the widest (or,
  not `stack`, each part alone)."""
  if not stack:
    return [[i] for i in range(len(parts))]
  grouped: list[list[int]] = []
  order = sorted(range(len(parts)), key=lambda i: (parts[i].signature, -parts[i].shape[1], i))
  for i in order:
    last = grouped[-1] if grouped else None
    if (
      last is not None
      and parts[last[0]].signature == parts[i].signature
      and parts[i].shape[1] >= (1 - MAX_PADDING) * parts[last[0]].shape[1]
    ):
      last.append(i)
    else:
      grouped.append([i])
  return grouped


def _run(encoder_params: dict[str, Any], model: Transformer, key: jax.Array, inputs: views.EncoderInputs) -> jax.Array:
  """One part's (or, under vmap, each stacked part's) read states in training mode."""
  forward = functools.partial(model.apply, {"params": encoder_params}, deterministic=False, rngs={"dropout": key})
  return views.read_state(forward, inputs)


def _padded(inputs: views.EncoderInputs, width: int, pad_id: int) -> views.EncoderInputs:
  """The inputs right-padded to `width` columns: [PAD] tokens, unattended (the position ids and continuous
  template vectors of padding are never read)."""
  pad = lambda x, value=0: jnp.pad(
    x, [(0, 0), (0, width - x.shape[1])] + [(0, 0)] * (x.ndim - 2), constant_values=value
  )
  return inputs._replace(
    input_ids=pad(inputs.input_ids, pad_id),
    attention_mask=pad(inputs.attention_mask),
    extra={k: pad(v) for k, v in inputs.extra.items()},
  )  # The read positions stay: padding on the right moves no row's.


def encode(
  model: Transformer, encoder_params: dict[str, Any], parts: list[Part], stack: bool, loop_small: bool = False
) -> list[jax.Array]:
  """Each part's read states ([rows, hidden]), in training mode (dropout from each part's key), in the calls
  `calls(parts, stack)` groups them into; with `loop_small`, a call under SMALL_CALL of the largest's tokens
  runs the layer scan's loop, one layer a trip."""
  states: list[jax.Array | None] = [None] * len(parts)
  grouped = calls(parts, stack)
  tokens = [len(call) * parts[call[0]].shape[0] * parts[call[0]].shape[1] for call in grouped]
  for call, call_tokens in zip(grouped, tokens):
    small = loop_small and call_tokens < SMALL_CALL * max(tokens)
    run = functools.partial(_run, encoder_params, model.clone(scan_unroll=1) if small else model)
    if len(call) == 1:  # The plain call: no stacking axis for XLA to carry.
      states[call[0]] = run(parts[call[0]].dropout_key, parts[call[0]].inputs)
      continue
    width = parts[call[0]].shape[1]
    stacked = jax.tree.map(
      lambda *xs: jnp.stack(xs), *(_padded(parts[i].inputs, width, model.config.pad_token_id) for i in call)
    )
    out = jax.vmap(run)(jnp.stack([parts[i].dropout_key for i in call]), stacked)
    for j, i in enumerate(call):
      states[i] = out[j]
  return states
