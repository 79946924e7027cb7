"""Writing Orbax checkpoints into a run directory (`jaxemb.models.run_dir` owns its layout and reads them back)."""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxemb.models import run_dir


class RunCheckpoints:
  """Periodic train-state checkpoints plus the best params by STS-B dev."""

  def __init__(self, workdir: str | pathlib.Path, keep: int):
    self.run = run_dir.RunDir(workdir)
    options = lambda n: ocp.CheckpointManagerOptions(max_to_keep=n, create=True)
    self.periodic = ocp.CheckpointManager(self.run.checkpoints_dir, options=options(keep))
    self.best = ocp.CheckpointManager(self.run.best_dir, options=options(1))

  def latest_step(self) -> int | None:
    return self.periodic.latest_step()

  def save(self, state: Any, meta: dict[str, Any]):
    """Saves the state at its step; refuses a state with a non-finite param so a NaN never replaces a good one."""
    _check_finite(state.params)
    step = int(state.step)
    self.periodic.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)), force=True)

  def save_best(self, step: int, params: Any, meta: dict[str, Any]):
    _check_finite(params)
    self.best.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                 meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """(state, meta) of the latest periodic checkpoint, placed with the shardings of `abstract_state`."""
    restored = self.periodic.restore(self.latest_step(), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored["state"], restored["meta"]

  def saved_state_shapes(self, step: int) -> Any:
    """The shapes and dtypes of the train state saved at `step`, a tree of dicts read from the checkpoint's
    metadata without its arrays: a resumed run builds its abstract state from them, not from pretrained weights."""
    metadata = ocp.StandardCheckpointHandler().metadata(self.run.checkpoints_dir / str(step) / "state")
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)

  def wait(self):
    self.periodic.wait_until_finished()
    self.best.wait_until_finished()

  def close(self):
    self.periodic.close()
    self.best.close()


@jax.jit
def _finite_leaves(tree: Any) -> jax.Array:
  """[number of leaves] bools, each whether that leaf is all finite: computed where the leaves are (sharded across
  hosts or not) and reduced to a small replicated vector, so no param is copied to the host."""
  return jnp.stack([jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)])


def _check_finite(params: Any):
  finite = np.asarray(_finite_leaves(params))
  bad = [jax.tree_util.keystr(path) for (path, _), ok in zip(jax.tree_util.tree_leaves_with_path(params), finite)
         if not ok]
  if bad:
    raise FloatingPointError(f"not saving a checkpoint with non-finite params: {bad[:5]}")
