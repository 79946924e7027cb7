"""The lock of a run directory in a bucket (gs://), where nothing can be locked: a lease.

A process claims the run with an object created only if absent (a generation precondition), naming its holder,
and keeps it by renewing it (replacing it only if unchanged) from a heartbeat thread. A holder that died (its VM
preempted, a SIGKILL) stops renewing: once its lease is LEASE_SECONDS old, the next process replaces it and takes
the run over; on the holder's own host (a run killed there, a VM recreated under its name) at once, as its pid is
not running. A live lease is refused with one line naming its host and age. A holder whose renewal finds the
object replaced has lost the run to another process (it could not renew for LEASE_SECONDS: a stalled VM, a long
network outage) and must stop writing: `check` says so.

The age of a lease is the local clock minus the time Cloud Storage stamped on the object: Google Cloud VMs keep
their clocks synchronised, far within a lease.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any, Callable

from jaxemb import storage
from jaxemb.errors import WorkdirError

# A lease not renewed for this long is taken over: long enough to ride out a slow network for a few renewals,
# short enough that a preempted spot VM's run is free by the time its replacement has booted.
LEASE_SECONDS = 120.0
RENEWALS_PER_LEASE = 4  # Renewals a lease gets before it expires: three may fail and the holder keeps it.


def busy(workdir: storage.Path, holder: str, lock: storage.Path, detail: str = "") -> WorkdirError:
  """The one line that refuses a run directory another process holds (a lock file or a lease)."""
  return WorkdirError(
    f"{workdir} is in use by {holder or 'another process'} (lock {lock}{detail}): wait for it to end "
    "or stop it, or choose another --config.workdir"
  )


class Lease:
  """A held lease on the object `url` (a run directory's lock): `acquire` takes it, `release` frees it."""

  def __init__(self, workdir: storage.Path, url: storage.Path):
    self.workdir, self.url = workdir, url
    self._generation = 0
    self._stop = threading.Event()
    self._lost = threading.Event()
    self._heartbeat = threading.Thread(target=self._renew, name="jaxemb-lease", daemon=True)
    self._record = json.dumps(
      {"pid": os.getpid(), "host": socket.gethostname(), "lease_seconds": LEASE_SECONDS}
    ).encode()

  def acquire(self, say: Callable[[str], None]):
    """Takes the lease: creates it, or replaces a released or expired one (said in one line), then renews it.

    Raises:
      WorkdirError: another process holds a live lease (or won a race for it); the message names its host and age.
    """
    found = storage.read_object(str(self.url))
    if _live_holder(found):
      raise _refused(self.workdir, self.url, found)
    try:
      self._generation = (
        storage.create(str(self.url), self._record)
        if found is None
        else storage.replace(str(self.url), self._record, found[1])
      )
    except storage.Conflict:  # Another process created or replaced it between our read and our write.
      raise _refused(self.workdir, self.url, storage.read_object(str(self.url))) from None
    if found is not None and _holder(found[0]):
      say(
        f"took over {self.url} from {_name(_holder(found[0]))}, which ended without releasing it (its lease was "
        f"last renewed {found[2]:.0f} s ago)"
      )
    self._heartbeat.start()

  def _renew(self):
    while not self._stop.wait(LEASE_SECONDS / RENEWALS_PER_LEASE):
      try:
        self._generation = storage.replace(str(self.url), self._record, self._generation)
      except storage.Conflict:
        self._lost.set()
        return
      except Exception:  # pylint: disable=broad-except  # The clients retried; the next renewal tries again.
        continue

  def check(self):
    """Raises WorkdirError when another process took the lease over: this one must not write to the run."""
    if self._lost.is_set():
      raise WorkdirError(
        f"lost {self.workdir} to another process: {self.url} was not renewed for "
        f"{LEASE_SECONDS:.0f} s (a stalled VM or network) and was taken over; stopping without "
        "saving"
      )

  def release(self):
    """Stops renewing and frees the lease (emptied, if it is still ours), so the next process takes it at once."""
    self._stop.set()
    if self._heartbeat.is_alive():
      self._heartbeat.join()
    if not self._lost.is_set():
      try:
        storage.replace(str(self.url), b"", self._generation)
      except storage.Conflict:
        pass


def refuse_if_held(workdir: storage.Path, url: storage.Path):
  """Raises WorkdirError when a live lease holds the run directory; creates nothing."""
  found = storage.read_object(str(url))
  if _live_holder(found):
    raise _refused(workdir, url, found)


def _live_holder(found: tuple[bytes, int, float] | None) -> dict | None:
  """The holder a lease names while it is live: renewed within its lease, by a process that is still running when
  it ran on this host (a run killed here, or on a VM that came back under its name, is taken over at once). None
  for none, a released, an expired or a dead holder's lease."""
  holder = _holder(found[0]) if found else None
  if not holder or found[2] >= holder.get("lease_seconds", LEASE_SECONDS):
    return None
  return holder if holder.get("host") != socket.gethostname() or _running(holder.get("pid")) else None


def _running(pid: Any) -> bool:
  """Whether a process `pid` runs on this host."""
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, TypeError, ValueError, OverflowError):
    return True  # Another user's process, or a lease not written by jaxemb: taken as running.
  return True


def _refused(workdir: storage.Path, url: storage.Path, found: tuple[bytes, int, float] | None) -> WorkdirError:
  data, _, age = found or (b"", 0, 0.0)
  holder = _holder(data) or {}
  left = holder.get("lease_seconds", LEASE_SECONDS) - age
  return busy(
    workdir,
    _name(holder or None),
    url,
    f", a lease renewed {age:.0f} s ago: if its holder is gone, it can be taken over in {max(left, 0):.0f} s",
  )


def _holder(data: bytes) -> dict | None:
  """The holder a lease names; None for a released (empty) or unreadable one."""
  try:
    holder = json.loads(data.decode())
  except (ValueError, UnicodeDecodeError):
    return None
  return holder if isinstance(holder, dict) else None


def _name(holder: dict | None) -> str:
  return f"pid {holder.get('pid')} on host {holder.get('host')}" if holder else ""
