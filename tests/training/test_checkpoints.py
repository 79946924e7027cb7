"""RunCheckpoints refuses non-finite params, found on device without copying them to the host."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxemb.training import checkpoints


def test_a_nan_param_is_named_and_nothing_is_written(tmp_path):
  ckpt = checkpoints.RunCheckpoints(tmp_path, keep=2)
  params = {"encoder": {"bias": jnp.zeros(3), "kernel": jnp.ones((2, 2)).at[1, 0].set(jnp.nan)}, "mlp": jnp.ones(2)}
  with pytest.raises(FloatingPointError, match=r"non-finite params: \[\"\['encoder'\]\['kernel'\]\"\]"):
    ckpt.save_best(1, params, {"step": 1})
  params["encoder"]["kernel"] = jnp.ones((2, 2))
  params["mlp"] = jnp.array([1.0, np.inf])
  with pytest.raises(FloatingPointError, match=r"\['mlp'\]"):
    ckpt.save_best(1, params, {"step": 1})
  ckpt.wait()
  assert ckpt.best.latest_step() is None
  params["mlp"] = jnp.ones(2)
  ckpt.save_best(2, params, {"step": 2})
  ckpt.wait()
  assert ckpt.best.latest_step() == 2
  ckpt.close()


def test_finiteness_is_one_small_replicated_vector():
  flags = checkpoints._finite_leaves({"a": jnp.ones((4, 4)), "b": jnp.array([0.0, -jnp.inf])})  # pylint: disable=protected-access
  assert isinstance(flags, jax.Array) and flags.shape == (2,)
  np.testing.assert_array_equal(np.asarray(flags), [True, False])
