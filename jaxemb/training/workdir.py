"""A run directory's identity: one process trains in it at a time (its lock: a flock on a disk, a lease in a
bucket), and one command (its fingerprint).

Two processes on one workdir interleave their checkpoints and metrics; a rerun with other fields would silently
resume a run made by another command. `claim_workdir` refuses both when train() starts, before anything is loaded.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pathlib
import socket
from typing import Any, Callable, Iterator

import jax
from jax.experimental import multihost_utils
import numpy as np

from jaxemb import atomic, config_fields, storage
from jaxemb.errors import WorkdirError
from jaxemb.models import run_dir
from jaxemb.training import lease

# Fields left out of the fingerprint, as they do not change what a run computes, so a rerun may change them: where
# things are kept (the workdir itself, so a moved run directory resumes; the caches), what the run evaluates and how
# often (config.evals), what is scored after it (eval.tasks, eval.output_json), how often it logs and saves and how
# many checkpoints it keeps, and how the work is laid out (the mesh and hosts, prefetching, padding of batches,
# evaluation batches, recomputation in the backward pass, the scan's unrolling: the same numbers up to rounding). A
# name covers the fields under it.
NOT_FINGERPRINTED = (
  "workdir",
  "compilation_cache_dir",
  "data.cache_dir",
  "data.length_multiple",
  "model.remat_policy",
  "model.scan_unroll",
  "evals",
  "eval.tasks",
  "eval.output_json",
  "train.save_every",
  "train.log_every",
  "train.keep_checkpoints",
  "train.prefetch",
  "train.steps_per_call",
  "train.mesh_data",
  "train.mesh_fsdp",
  "train.distributed",
  "train.lease_seconds",
  "eval.batch_size",
  "eval.length_multiple",
  "eval.progress",
)
# Fields that name files: compared as absolute paths, so a rerun from another directory is the same run. A model
# path that names no local file is a hub id, compared as given.
PATH_FIELDS = ("model.path", "data.train_file", "data.senteval_dir")
# The file systems that cannot lock (some FUSE mounts) answer flock with one of these.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def fingerprint(config: Any) -> dict[str, Any]:
  """The fields of a training config that define its run, by dotted name, as they read back from JSON."""
  fields = {key: value for key, value in config_fields.leaves(config) if not _excluded(key)}
  for key in PATH_FIELDS:
    if (
      key in fields
      and fields[key]
      and not storage.is_remote(fields[key])
      and pathlib.Path(fields[key]).expanduser().exists()
    ):
      fields[key] = str(pathlib.Path(fields[key]).expanduser().resolve())
  return json.loads(json.dumps(fields))  # Tuples become lists, as they are read back.


def _excluded(key: str) -> bool:
  return any(key == name or key.startswith(name + ".") for name in NOT_FINGERPRINTED)


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
  """{field: (old value, new value)} of the fields that differ; a field one side lacks is None there."""
  return {key: (old.get(key), new.get(key)) for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)}


def _listing(changed: dict[str, tuple[Any, Any]]) -> str:
  return "; ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changed.items())


def check_fingerprint(run: run_dir.RunDir, fields: dict[str, Any], resume_changed: bool, say: Callable[[str], None]):
  """Records `fields` as the run's fingerprint, unless the directory holds a run (a saved step) made with others.

  A directory with no saved step holds no run yet (one stopped by a bad batch size, say): its fingerprint is
  replaced. A run with other fields is refused, or with `resume_changed` continued and the new fields recorded,
  each change kept in the file's "changes".

  Raises:
    WorkdirError: the run directory holds a run with other fields, or an unreadable fingerprint.
  """
  trained = run.has_step()
  recorded = _read_fingerprint(run) if trained else None
  changes = []
  if trained and recorded is None:
    say(f"{run.path} has no fingerprint (a run from an older jaxemb): recording this command's")
  if recorded is not None:
    changed = differences(recorded["fields"], fields)
    if changed and not resume_changed:
      raise WorkdirError(
        f"{run.path} holds a run of another command ({run.fingerprint_file}): {_listing(changed)}. "
        "Rerun with its values, choose another --config.workdir, or pass train.py --resume_changed "
        "to continue it with the new ones"
      )
    changes = recorded.get("changes", [])
    if changed:
      say(f"continuing {run.path} with changed fields: {_listing(changed)}; recorded in {run.fingerprint_file}")
      changes = [*changes, {key: {"from": old, "to": new} for key, (old, new) in changed.items()}]
  atomic.write_json(run.fingerprint_file, {"fields": fields, "changes": changes})


def _read_fingerprint(run: run_dir.RunDir) -> dict[str, Any] | None:
  """The recorded fingerprint, None when there is none."""
  try:
    recorded = json.loads(run.fingerprint_file.read_text())
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise WorkdirError(f"{run.fingerprint_file} cannot be read ({e}): restore or delete it") from None
  if not isinstance(recorded, dict) or not isinstance(recorded.get("fields"), dict):
    raise WorkdirError(f"{run.fingerprint_file} is not a jaxemb fingerprint: restore or delete it")
  return recorded


@contextlib.contextmanager
def lock(
  run: run_dir.RunDir,
  say: Callable[[str], None],
  lease_seconds: float | None = None,
  on_lost: Callable[[str], None] | None = None,
) -> Iterator[Callable[[], None]]:
  """Holds the run directory's lock until the block ends: a flock on <workdir>/lock on a disk, a lease of
  `lease_seconds` (config.train.lease_seconds; needed there) in a bucket (`jaxemb.training.lease`, its `on_lost`
  there), which every write to a bucket passes within the block (`jaxemb.storage.check_writes`). Yields the check
  itself: it raises WorkdirError once a lease is lost (a flock is never lost).

  Raises:
    WorkdirError: another process holds it; the message names its pid and host.
  """
  if storage.is_remote(run.path):
    if lease_seconds is None:
      raise ValueError(f"a lock of {run.path}, in a bucket, is a lease: lease_seconds is needed")
    with _leased(lease.Lease(run.path, run.lock_file, lease_seconds, on_lost), say) as check:
      yield check
  else:
    with _file_lock(run, say):
      yield lambda: None


@contextlib.contextmanager
def _leased(held: lease.Lease, say: Callable[[str], None]) -> Iterator[Callable[[], None]]:
  """Holds (or follows) a lease until the block ends, every write to a bucket passing its check meanwhile."""
  held.acquire(say)
  try:
    with storage.guarding_writes(held):
      yield held.check
  finally:
    held.release()


@contextlib.contextmanager
def _file_lock(run: run_dir.RunDir, say: Callable[[str], None]) -> Iterator[None]:
  """Holds <workdir>/lock, with this process's pid and host written in it, until the block ends.

  flock: the kernel releases it when the process dies, so a lock file whose holder died (a non-empty file nobody
  holds) is taken over. The file is emptied on release and never deleted: deleting it would let a process that
  opened it before the deletion lock a file no later process sees.
  """
  run.path.mkdir(parents=True, exist_ok=True)
  fd = os.open(run.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    _flock(run, fd, say)
    stale = _holder(fd)
    if stale:
      say(f"took over {run.lock_file} from {stale}, which ended without releasing it")
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
    try:
      yield
    finally:
      os.ftruncate(fd, 0)  # An empty lock file is a free one.
  finally:
    os.close(fd)  # Releases the flock.


def refuse_if_busy(run: run_dir.RunDir):
  """Raises WorkdirError at once when another process holds the workdir's lock; creates nothing (a config that
  fails its checks afterwards leaves the workdir as it was). `lock` takes the lock itself later."""
  if storage.is_remote(run.path):
    lease.refuse_if_held(run.path, run.lock_file)
    return
  try:
    fd = os.open(run.lock_file, os.O_RDWR)
  except FileNotFoundError:
    return
  try:
    _flock(run, fd, lambda _: None)
  finally:
    os.close(fd)  # Releases the flock, if taken.


def _flock(run: run_dir.RunDir, fd: int, say: Callable[[str], None]):
  """flock(fd) without waiting; a file system without locks is said once and let through."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    raise lease.busy(run.path, _holder(fd), run.lock_file) from None
  except OSError as e:
    if e.errno not in _NO_LOCKS:
      raise
    say(f"cannot lock {run.lock_file} ({e.strerror}): a second process on this workdir will not be detected")


def _holder(fd: int) -> str:
  """ "pid P on host H" of the process a lock file names; "" for an empty (free) one."""
  text = os.pread(fd, 4096, 0).decode(errors="replace")
  try:
    holder = json.loads(text)
    return f"pid {holder['pid']} on host {holder['host']}"
  except (ValueError, KeyError, TypeError):
    return f"a process that wrote {text!r}" if text else ""


@contextlib.contextmanager
def claim_workdir(
  config: Any, resume_changed: bool = False, say: Callable[[str], None] = print
) -> Iterator[run_dir.RunDir]:
  """Holds config.workdir for one training run: its lock, and its fingerprint checked (`check_fingerprint`).
  Yields the run directory; in a bucket, every write to it passes the lock's check (`lock`).

  In a multi-host job the workdir is shared, so process 0 claims it for the job and tells the other processes
  whether it could, and they all stop together; in a bucket they follow its lease (`lease.Following`), so each
  stops writing when process 0 loses it. Released when the block ends (a sweep trains its runs one after
  another in one process).

  Raises:
    WorkdirError: another process holds the workdir, or it holds a run of another command.
  """
  run = run_dir.RunDir(config.workdir)
  with contextlib.ExitStack() as held:
    refused = None
    if jax.process_index() == 0:
      try:
        held.enter_context(lock(run, say, config.train.lease_seconds))
        check_fingerprint(run, fingerprint(config), resume_changed, say)
      except Exception as e:  # pylint: disable=broad-except  # Raised once the other processes are told.
        refused = e
    if jax.process_count() > 1 and bool(multihost_utils.broadcast_one_to_all(np.int32(refused is not None))):
      refused = refused or WorkdirError(f"process 0 refused {run.path}; its output says why")
    if refused:
      raise refused
    if jax.process_index() != 0 and storage.is_remote(run.path):  # This host writes its shards of each checkpoint.
      held.enter_context(_leased(lease.Following(run.path, run.lock_file, config.train.lease_seconds), say))
    yield run
