"""Writing Orbax checkpoints into a run directory (`jaxemb.models.run_dir` owns its layout and reads them back).

Every start leaves the run resumable: it removes the folders of saves a kill interrupted and sets aside (renames,
never deletes) the checkpoints that cannot be read, so the run resumes from the newest readable one. The run
directory may be in a bucket (gs://): Orbax writes there through TensorStore, and commits a step by writing its
marker last instead of renaming a temporary folder.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxemb import storage
from jaxemb.errors import Diverged, StorageError
from jaxemb.models import checkpoint_files, run_dir

# Orbax writes a step into <step>.orbax-checkpoint-tmp (older versions add -<timestamp>), renamed once committed.
PARTIAL_SAVE = "*.orbax-checkpoint-tmp*"


class RunCheckpoints:
  """Periodic train-state checkpoints plus the best params by STS-B dev.

  Args:
    workdir: the run directory.
    keep: how many periodic checkpoints to keep.
    say: prints a line for the person running the job (what was removed or set aside).
    fingerprint: the run's fingerprint record, a copy of which each periodic checkpoint's meta keeps
      (`run_dir.saved_copy`: a fingerprint.json that no longer reads is checked against it); None: none kept. The
      meta keeps a copy of the run's model/config.json too, once it reads, and the digests of model/'s files.
  """

  def __init__(
    self,
    workdir: storage.PathLike,
    keep: int,
    say: Callable[[str], None] = print,
    fingerprint: dict[str, Any] | None = None,
  ):
    self.run = run_dir.RunDir(workdir)
    self._say = say
    self._copies = {} if fingerprint is None else {run_dir.FINGERPRINT_COPY: fingerprint}
    checkpoint_files.quiet_orbax_failures()
    self._on_first_process(self._tidy)
    failed = threading.Event()  # Both folders are on one disk: its first write failure is the one reported.
    self.periodic = _Saves(self.run.checkpoints_dir, keep, failed)
    self.best = _Saves(self.run.best_dir, 1, failed)
    # The newest best step a run before this one saved, listed once at start: every process of a job then decides
    # alike whether to save a best step (a listing taken at each save could see process 0's newer save on a shared
    # disk, and a process that skipped a save another makes waits forever at Orbax's barrier).
    self._best_before = max(self.best.all_steps(), default=None)

  def latest_step(self) -> int | None:
    return self.periodic.latest_step()

  def save(self, state: Any, meta: dict[str, Any]):
    """Saves the state at its step; refuses a state with a non-finite param so a NaN never replaces a good one."""
    _check_finite(state.params)
    self.wait()  # One save in flight at a time: see save_best.
    self.periodic.save(
      int(state.step),
      ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        meta=ocp.args.JsonSave(checkpoint_files.with_digest({**meta, **self._copies_to_keep()}, state)),
      ),
    )

  def save_best(self, step: int, params: Any, meta: dict[str, Any]):
    """Saves the params of a new best step, unless best/ holds this step or a later one.

    A run killed after its best save and before its next periodic one resumes from an earlier step and replays the
    steps after it bit for bit: it scores `step` again and finds it saved (kept, not saved twice), or finds a later
    best step, which outscored this one in the run before the kill and will again when the replay reaches it.
    """
    _check_finite(params)
    if self._best_before is not None and self._best_before >= step:
      return
    # One save in flight at a time: a job's processes meet at Orbax barriers named by the step alone
    # (`_async_write_complete.<step>`), so best/N and checkpoints/N written at once collide ("Barrier ... is already
    # ongoing") and the job hangs.
    self.wait()
    meta = checkpoint_files.with_digest(meta, params)
    self.best.save(step, ocp.args.Composite(params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)))

  def restore(self, abstract_state: Any) -> tuple[Any, dict[str, Any]] | None:
    """(state, meta) of the newest readable periodic checkpoint, placed with the shardings of `abstract_state`; a
    checkpoint whose files fail to read, or whose arrays differ from the digest saved with them, is set aside (said
    in one line) and the one before it tried. None when none is left: the run starts from its first step."""
    for step in reversed(self.periodic.all_steps()):
      step_dir = self.run.checkpoints_dir / str(step)
      try:
        restored = self.periodic.manager.restore(
          step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())
        )
      except Exception as e:  # pylint: disable=broad-except  # Anything but a read failure of this step is re-raised.
        cause = checkpoint_files.read_failure(e, step_dir)
        if cause is None:
          raise
      else:
        cause = checkpoint_files.digest_problem(restored["state"], restored["meta"])
        if cause is None:
          meta = checkpoint_files.without_digest(restored["meta"])
          return restored["state"], {key: value for key, value in meta.items() if key not in run_dir.COPIES}
      self._on_first_process(functools.partial(self._set_aside, step_dir, cause))
      self.periodic.manager.reload()
    self._say_starting_again()
    return None

  def _copies_to_keep(self) -> dict[str, Any]:
    """The copies each periodic checkpoint's meta keeps: the fingerprint's, and model/config.json's and the digests
    of model/'s files, read at the first save (the run writes them at its start, or mends them)."""
    if run_dir.MODEL_DIGESTS_COPY not in self._copies and jax.process_index() == 0:  # Its meta alone is written.
      self._copies[run_dir.MODEL_DIGESTS_COPY] = run_dir.model_digests(self.run)
      try:
        self._copies[run_dir.MODEL_CONFIG_COPY] = json.loads(self.run.config_file.read_text())
      except (OSError, ValueError):  # A garbled one is written again from an earlier copy at the next start.
        pass
    return self._copies

  def saved_state_shapes(self, step: int) -> Any:
    """The shapes and dtypes of the train state saved at `step`, a tree of dicts read from the checkpoint's
    metadata without its arrays: a resumed run builds its abstract state from them, not from pretrained weights."""
    metadata = ocp.StandardCheckpointHandler().metadata(self.run.checkpoints_dir / str(step) / "state")
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)

  def wait(self):
    self.periodic.wait()
    self.best.wait()

  def close(self):
    self.periodic.close()
    self.best.close()

  def _on_first_process(self, change: Callable[[], None]):
    """Runs a change to the run directory on process 0 alone; the other processes of a job wait until it is done."""
    if jax.process_index() == 0:
      change()
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("jaxemb.training.checkpoints: run directory changed")

  def _tidy(self):
    """Removes the folders of saves a kill interrupted and sets aside the step folders that do not read, before
    Orbax lists the steps: a periodic checkpoint whose small files fail (its arrays are read when it is restored), a
    best step whose arrays fail too. The run relies on its best step (its summary names it, evaluate.py reads it),
    so one set aside is saved again (selection.Evaluation.keep_best)."""
    partial = self._unfinished_saves()
    for path in partial:
      path.rmtree()
    if partial:
      self._say(f"removed the unfinished saves a stopped run left: {', '.join(map(str, partial))}")
    periodic_problem = functools.partial(checkpoint_files.checkpoint_problem, items=run_dir.PERIODIC_ITEMS)
    for directory, problem in (
      (self.run.checkpoints_dir, periodic_problem),
      (self.run.best_dir, run_dir.best_step_problem),
    ):
      steps = [(p, problem(p)) for p in directory.glob("*") if p.name.isdigit()]
      for step_dir, cause in steps:
        if cause is not None:
          self._set_aside(step_dir, cause)
      # A run killed in its first save, or whose checkpoints all fail to read, starts again: said, not silent.
      lost = steps or any(p.parent == directory for p in partial)
      if directory == self.run.checkpoints_dir and lost and all(cause for _, cause in steps):
        self._say_starting_again()

  def _unfinished_saves(self) -> list[storage.Path]:
    """The folders of saves a kill interrupted: Orbax's temporary folders on a disk; in a bucket, where Orbax writes
    a step in place and commits it with its marker, the step folders without one."""
    folders = [p for d in (self.run.checkpoints_dir, self.run.best_dir) for p in d.glob(PARTIAL_SAVE)]
    if storage.is_remote(self.run.path):
      folders += [
        p
        for d in (self.run.checkpoints_dir, self.run.best_dir)
        for p in d.glob("*")
        if p.name.isdigit() and not (p / checkpoint_files.COMMIT_MARKER).exists()
      ]
    return sorted(folders)

  def _say_starting_again(self):
    self._say(f"no readable checkpoint left in {self.run.checkpoints_dir}: starting from the first step")

  def _set_aside(self, step_dir: storage.Path, cause: str):
    """Renames an unreadable step folder to a name Orbax does not list as a step (kept for a look, never deleted)."""
    aside = step_dir.with_name(f"corrupt-{step_dir.name}-{time.strftime('%Y%m%dT%H%M%S')}")
    step_dir.rename(aside)
    self._say(f"checkpoint {step_dir} is unreadable ({cause}); set aside as {aside.name}")


class _Saves:
  """One Orbax checkpoint manager's saves: a failed write (a full disk, an I/O error), synchronous or found when
  its background thread is waited on, is raised as a StorageError naming the step folder, once: after it (set in
  `failed`), waiting and closing raise nothing, so the loop's `finally` closes what it opened."""

  def __init__(self, directory: storage.Path, keep: int, failed: threading.Event):
    self.directory = directory
    self.manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))
    self._writing = directory  # The step folder of the save in flight.
    self._failed = failed

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> Sequence[int]:
    return self.manager.all_steps()

  def save(self, step: int, args: ocp.args.Composite):
    self.wait()
    storage.check_writes()  # A run whose lease is lost starts no save (one in flight dies with the process).
    self._writing = self.directory / str(step)
    with self._storage_errors(waiting=False):
      self.manager.save(step, args=args, force=True)

  def wait(self):
    with self._storage_errors(waiting=True):
      self.manager.wait_until_finished()

  def close(self):
    with self._storage_errors(waiting=True):  # Closing waits on the save in flight too.
      self.manager.close()

  @contextlib.contextmanager
  def _storage_errors(self, waiting: bool) -> Iterator[None]:
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except  # Anything but a write failure is re-raised.
      if not _is_write_failure(e):
        raise
      if waiting and self._failed.is_set():  # Orbax raises a failed save again at every wait: reported once.
        return
      self._failed.set()
      raise StorageError(f"cannot write checkpoint {self._writing}: {checkpoint_files.short_cause(e)}") from e


def _is_write_failure(error: BaseException) -> bool:
  """Whether `error` (or one it was raised from) is the file system refusing a write: an OSError, or TensorStore's
  error for one (a ValueError whose message carries the OS error code or a RESOURCE_EXHAUSTED / PERMISSION_DENIED
  status)."""
  return any(
    isinstance(e, OSError) or any(s in str(e) for s in ("os_error_code=", "RESOURCE_EXHAUSTED", "PERMISSION_DENIED"))
    for e in checkpoint_files.error_chain(error)
  )


@jax.jit
def _finite_leaves(tree: Any) -> jax.Array:
  """[number of leaves] bools, each whether that leaf is all finite: computed where the leaves are (sharded across
  hosts or not) and reduced to a small replicated vector, so no param is copied to the host."""
  return jnp.stack([jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)])


def _check_finite(params: Any):
  finite = np.asarray(_finite_leaves(params))
  bad = [
    jax.tree_util.keystr(path) for (path, _), ok in zip(jax.tree_util.tree_leaves_with_path(params), finite) if not ok
  ]
  if bad:
    raise Diverged(f"not saving a checkpoint with non-finite params: {bad[:5]}")
