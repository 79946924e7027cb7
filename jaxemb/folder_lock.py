"""The lock of a folder that one job writes at a time: a training run's directory (jaxemb.training.workdir) and an
embedding's output (jaxemb.embedding.job). Two jobs writing one folder interleave their files: a run's checkpoints
and metrics, an embedding's shards of two models under one manifest.

On a disk it is a flock on <folder>/lock, which names its holder (pid and host); the kernel frees it when the holder
dies. In a bucket, where nothing can be locked, it is a lease its holder fences itself off by (jaxemb.lease), and
every write to the bucket passes the lease's check meanwhile (`jaxemb.storage.guarding_writes`). A multi-host job
holds it once, in process 0, for all its processes (`hold_for_job`).
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

from jaxemb import lease, storage
from jaxemb.errors import WorkdirBusy, WorkdirError

LOCK_FILE = "lock"
WORKDIR_FLAG = "--config.workdir"  # The flag a refusal names as the way to another folder, unless told another.
# The file systems that cannot lock (some FUSE mounts) answer flock with one of these: said once, the job let through.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def lock_file(folder: storage.PathLike) -> storage.Path:
  return storage.path(folder) / LOCK_FILE


@contextlib.contextmanager
def hold(
  folder: storage.PathLike,
  say: Callable[[str], None],
  lease_seconds: float | None = None,
  on_lost: Callable[[str], None] | None = None,
  flag: str = WORKDIR_FLAG,
) -> Iterator[Callable[[], None]]:
  """Holds `folder`'s lock until the block ends: the flock on a disk, a lease of `lease_seconds` (needed there) in a
  bucket, its `on_lost` there (`jaxemb.lease.Lease`). Yields the check itself: it raises WorkdirError once a lease is
  lost (a flock is never lost).

  Raises:
    WorkdirBusy: another process holds it; the message names its pid and host, and `flag`, which names another
      folder.
  """
  folder = storage.path(folder)
  if storage.is_remote(folder) and lease_seconds is None:
    raise ValueError(f"a lock of {folder}, in a bucket, is a lease: lease_seconds is needed")
  with contextlib.ExitStack() as held:
    with _naming(flag):
      if storage.is_remote(folder):
        check = held.enter_context(_leased(lease.Lease(folder, lock_file(folder), lease_seconds, on_lost), say))
      else:
        check = held.enter_context(_file_lock(pathlib.Path(folder), say)) or (lambda: None)
    yield check


@contextlib.contextmanager
def _naming(flag: str) -> Iterator[None]:
  """A WorkdirBusy raised in the block as the one line that refuses the folder: what to do, `flag` naming another."""
  try:
    yield
  except WorkdirBusy as e:
    raise WorkdirBusy(f"{e}: wait for it to end or stop it, or choose another {flag}", e.holder) from None


@contextlib.contextmanager
def hold_for_job(
  folder: storage.PathLike,
  say: Callable[[str], None],
  lease_seconds: float,
  then: Callable[[], Any] = lambda: None,
  flag: str = WORKDIR_FLAG,
) -> Iterator[Any]:
  """`hold` for every process of a job that writes the shared `folder`: process 0 takes the lock and runs `then`
  under it (the job's own checks of the folder), and tells the other processes whether both went through, so that
  they all stop together, each raising process 0's error (another process's: a WorkdirBusy or WorkdirError saying
  so; `flag` as in `hold`). In a bucket the other processes then follow process 0's lease (`lease.Following`), each
  stopping its writes when process 0 loses it. Yields what `then` returned (None in the other processes)."""
  folder = storage.path(folder)
  with contextlib.ExitStack() as held:
    refused = result = None
    if jax.process_index() == 0:
      try:
        held.enter_context(hold(folder, say, lease_seconds, flag=flag))
        result = then()
      except Exception as e:  # pylint: disable=broad-except  # Raised once the other processes are told.
        refused = e
    if jax.process_count() > 1:  # 1: refused, 2: busy (a sweep goes on past a busy run on every process).
      kind = int(multihost_utils.broadcast_one_to_all(np.int32(_refusal_kind(refused))))
      why = f"process 0 refused {folder}; its output says why"
      refused = refused or (WorkdirBusy(why, "another process") if kind == 2 else WorkdirError(why) if kind else None)
    if refused:
      raise refused
    if jax.process_index() != 0 and storage.is_remote(folder):  # This host writes into the folder too.
      held.enter_context(_leased(lease.Following(folder, lock_file(folder), lease_seconds), say))
    yield result


def _refusal_kind(refused: Exception | None) -> int:
  return 0 if refused is None else 2 if isinstance(refused, WorkdirBusy) else 1


def refuse_if_held(folder: storage.PathLike, flag: str = WORKDIR_FLAG):
  """Raises WorkdirBusy (`flag` as in `hold`) at once when another process holds `folder`'s lock; creates nothing (a
  job that fails its checks afterwards leaves the folder as it was). `hold` takes the lock itself later."""
  folder = storage.path(folder)
  with _naming(flag):
    if storage.is_remote(folder):
      lease.refuse_if_held(folder, lock_file(folder))
      return
    try:
      fd = os.open(lock_file(folder), os.O_RDWR)
    except FileNotFoundError:
      return
    try:
      _flock(pathlib.Path(folder), fd, lambda _: None)
    finally:
      os.close(fd)  # Releases the flock, if taken.


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
def _file_lock(folder: pathlib.Path, say: Callable[[str], None]) -> Iterator[None]:
  """Holds <folder>/lock, with this process's pid and host written in it, until the block ends.

  flock: the kernel releases it when the process dies, so a lock file whose holder died (a non-empty file nobody
  holds) is taken over. The file is emptied on release and never deleted: deleting it would let a process that
  opened it before the deletion lock a file no later process sees.
  """
  folder.mkdir(parents=True, exist_ok=True)
  fd = os.open(lock_file(folder), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    _flock(folder, fd, say)
    stale = _holder(fd)
    if stale:
      say(f"took over {lock_file(folder)} from {stale}, which ended without releasing it")
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
    try:
      yield
    finally:
      os.ftruncate(fd, 0)  # An empty lock file is a free one.
  finally:
    os.close(fd)  # Releases the flock.


def _flock(folder: pathlib.Path, fd: int, say: Callable[[str], None]):
  """flock(fd) without waiting; a file system without locks is said once and let through."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    raise lease.busy(folder, _holder(fd), lock_file(folder)) from None
  except OSError as e:
    if e.errno not in _NO_LOCKS:
      raise
    say(f"cannot lock {lock_file(folder)} ({e.strerror}): a second process on {folder} will not be detected")


def _holder(fd: int) -> str:
  """ "pid P on host H" of the process a lock file names; "" for an empty (free) one."""
  text = os.pread(fd, 4096, 0).decode(errors="replace")
  try:
    holder = json.loads(text)
    return f"pid {holder['pid']} on host {holder['host']}"
  except (ValueError, KeyError, TypeError):
    return f"a process that wrote {text!r}" if text else ""
