"""The digest of a checkpoint's arrays: it tells arrays that read back other than saved, whatever holds them.

A step folder's other problems (files missing, truncated, garbled): tests/training/test_checkpoints.py."""

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxemb.models import checkpoint_files

CHANGED = "its arrays differ from the digest saved with them: a file was changed after the save"


@flax.struct.dataclass
class _State:
  step: jax.Array
  params: dict
  rng: jax.Array


def _state() -> _State:
  weights = jnp.asarray(np.random.default_rng(0).normal(size=(6, 5)), jnp.float32)
  return _State(
    jnp.int32(7), {"w": weights, "half": weights.astype(jnp.bfloat16)}, jax.random.key_data(jax.random.key(3))
  )


def test_the_arrays_as_saved_pass_in_any_container_and_leaf_order():
  state = _state()
  meta = checkpoint_files.with_digest({"best_step": 2}, state)
  assert checkpoint_files.without_digest(meta) == {"best_step": 2}
  assert checkpoint_files.digest_problem(state, meta) is None
  # A checkpoint restored without a target is a tree of dicts, its keys sorted: the leaves in another order.
  as_dicts = {"step": state.step, "rng": state.rng, "params": {"half": state.params["half"], "w": state.params["w"]}}
  assert [leaf.dtype for leaf in jax.tree.leaves(as_dicts)] != [leaf.dtype for leaf in jax.tree.leaves(state)]
  assert checkpoint_files.digest_problem(as_dicts, meta) is None
  assert checkpoint_files.digest_problem(jax.tree.map(np.asarray, state), meta) is None  # On the host, the same.


def _with_bit_flipped(array: jax.Array, flat_index: int, bit: int) -> jax.Array:
  bits = np.asarray(array).copy().view(f"uint{array.dtype.itemsize * 8}")
  bits.reshape(-1)[flat_index] ^= 1 << bit
  return jnp.asarray(bits.view(np.asarray(array).dtype))


def test_one_flipped_bit_anywhere_or_two_swapped_elements_differ():
  state = _state()
  meta = checkpoint_files.with_digest({}, state)
  w, half = state.params["w"], state.params["half"]
  for flat_index, bit in [(0, 0), (17, 31), (29, 12)]:
    flipped = state.replace(params={"w": _with_bit_flipped(w, flat_index, bit), "half": half})
    assert checkpoint_files.digest_problem(flipped, meta) == CHANGED, (flat_index, bit)
  flipped = state.replace(params={"w": w, "half": _with_bit_flipped(half, 11, 15)})
  assert checkpoint_files.digest_problem(flipped, meta) == CHANGED
  assert checkpoint_files.digest_problem(state.replace(step=jnp.int32(8)), meta) == CHANGED
  swapped = w.at[0, 0].set(w[2, 3]).at[2, 3].set(w[0, 0])  # The plain sum of the words is unchanged.
  assert checkpoint_files.digest_problem(state.replace(params={"w": swapped, "half": half}), meta) == CHANGED


def test_arrays_restored_into_other_dtypes_or_no_digest_are_not_checked():
  """A run continued with other fields restores converted values: there is nothing saved to compare them with."""
  state = _state()
  meta = checkpoint_files.with_digest({}, state)
  as_float32 = state.replace(params={"w": state.params["w"], "half": state.params["half"].astype(jnp.float32)})
  assert checkpoint_files.digest_problem(as_float32, meta) is None
  assert checkpoint_files.digest_problem(state.replace(step=jnp.int32(8)), {"best_step": 2}) is None
