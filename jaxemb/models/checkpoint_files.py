"""Orbax checkpoint folders as files: whether a step folder can be restored (`checkpoint_problem`), whether its arrays
read back as saved (`with_digest`, `digest_problem`), the one line a failed read or write says (`read_failure`,
`short_cause`), and Orbax kept quiet about its failures beyond that line (`quiet_orbax_failures`). The run directory
(run_dir.py) reads its best step through these, the training checkpoints (jaxemb.training.checkpoints) their
periodic steps."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
import re
import sys
from typing import Any, Callable, Coroutine, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

try:  # Orbax's own: each save and restore runs its coroutine through its run_sync (`quiet_orbax_failures`).
  from orbax.checkpoint._src import asyncio_utils as _orbax_asyncio
except ImportError:  # An Orbax without it: its operations are run as they are.
  _orbax_asyncio = None

from jaxemb import storage

# Orbax (0.12, orbax/checkpoint/_src/path/atomicity.py) writes this file last into a step's temporary folder, then
# renames the folder into place: a step folder without it never finished its save.
COMMIT_MARKER = "commit_success.txt"
STEP_METADATA = "_CHECKPOINT_METADATA"  # Orbax's JSON of the step (its time); the step is listed by reading it.
# The key of a step's meta that holds the digest of the arrays saved with it (`with_digest`).
DIGEST = "arrays_digest"


def checkpoint_problem(step_dir: storage.Path, items: Sequence[str]) -> str | None:
  """Why the step folder `step_dir` cannot be restored, found from its small files (commit marker, JSON meta, the
  arrays' metadata); None when they read. A missing or truncated array file shows only when the arrays are read
  (`read_failure`)."""
  if not (step_dir / COMMIT_MARKER).is_file():
    return f"no {COMMIT_MARKER}: its save never finished"
  for path in [step_dir / STEP_METADATA] + [step_dir / item for item in items]:
    try:
      if path.name == "meta":
        json.loads((path / "metadata").read_text())
      elif path.name == STEP_METADATA:
        json.loads(path.read_text())
      else:
        ocp.StandardCheckpointHandler().metadata(path)
    except (OSError, ValueError) as e:
      return f"{path}: {short_cause(e)}"
  return None


def with_digest(meta: dict[str, Any], tree: Any) -> dict[str, Any]:
  """`meta` and, under DIGEST, the digest of the arrays of `tree` it is saved with: OCDBT's files keep no checksums,
  so a byte garbled on disk reads back as another value, silently (a resumed run that diverges on every rerun, or
  params a little off); `digest_problem` tells such a step on restore."""
  return {**meta, DIGEST: _arrays_digest(tree)}


def digest_problem(tree: Any, meta: dict[str, Any]) -> str | None:
  """Why the restored arrays `tree` are not the ones saved with `meta` (their digest differs); None when they are,
  when `meta` holds no digest (a step an older jaxemb saved) or when the arrays were restored into other shapes or
  dtypes (a run continued with other fields: the values are converted, not the saved ones)."""
  saved = meta.get(DIGEST)
  if saved is None:
    return None
  restored = _arrays_digest(tree)
  if restored["layout"] != saved["layout"] or restored["values"] == saved["values"]:
    return None
  return "its arrays differ from the digest saved with them: a file was changed after the save"


def without_digest(meta: dict[str, Any]) -> dict[str, Any]:
  """A step's meta as its saver gave it."""
  return {key: value for key, value in meta.items() if key != DIGEST}


def _arrays_digest(tree: Any) -> dict[str, str]:
  """{"layout": a hash of the shapes and dtypes of `tree`'s arrays, "values": a hash of their values}, each
  independent of the tree's container types and leaf order (a checkpoint restored without a target is a tree of
  dicts) and of how each array is sharded: two integer sums per array (`_word_sums`), computed where its shards are,
  so no array is copied to the host."""
  leaves = jax.tree.leaves(tree)
  # One program per array, compiled per shape and dtype (a train state's Adam moments share the params'), each
  # finished before the next starts: programs with collectives in flight together deadlocked the CPU backend on 8
  # simulated devices (tests/training/test_sharding.py). One program for the whole tree took 5 s to compile for
  # bert-base's 549 arrays on 2 CPU cores, these 1.6 s; either sums them in 0.8-1.1 s.
  sums = [np.asarray(_word_sums(leaf)) for leaf in leaves]
  entries = sorted((f"{tuple(leaf.shape)} {leaf.dtype}", s.tobytes()) for leaf, s in zip(leaves, sums))
  hash_of = lambda parts: hashlib.sha256(b"\n".join(parts)).hexdigest()[:32]
  return {
    "layout": hash_of([e[0].encode() for e in entries]),
    "values": hash_of([e[0].encode() + e[1] for e in entries]),
  }


@jax.jit
def _word_sums(array: jax.Array) -> jax.Array:
  """[2] uint32: the sum of `array`'s elements read as unsigned words (their bits), and their sum each weighted by
  2i + 1 (i its index in the flat array), modulo 2**32. A changed element changes both (an odd weight is invertible
  modulo 2**32), two swapped elements the second; integer sums are exact in any order, so no sharding changes them."""
  if jnp.issubdtype(array.dtype, jax.dtypes.prng_key):
    array = jax.random.key_data(array)
  if array.dtype == jnp.bool_:
    array = array.astype(jnp.uint8)
  bits = array.dtype.itemsize * 8
  words = jax.lax.bitcast_convert_type(array, jnp.uint32 if bits >= 32 else jnp.dtype(f"uint{bits}"))
  words = words.astype(jnp.uint32)
  index = jnp.zeros(words.shape, jnp.uint32)
  for axis, size in enumerate(words.shape):
    index = index * jnp.uint32(size) + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis)
  return jnp.stack([words.sum(dtype=jnp.uint32), (words * (2 * index + 1)).sum(dtype=jnp.uint32)])


def read_failure(error: BaseException, step_dir: storage.Path) -> str | None:
  """`error`'s short cause when it is a failure to read the files of `step_dir` (a missing or truncated file); None
  for anything else (a bug, a tree that does not match), which is no reason to set the checkpoint aside."""
  if any(isinstance(e, (OSError, json.JSONDecodeError)) or str(step_dir) in str(e) for e in error_chain(error)):
    return short_cause(error)
  return None


def error_chain(error: BaseException) -> list[BaseException]:
  """`error` and the errors it was raised from, outermost first: Orbax wraps TensorStore's, which names the file
  and what went wrong."""
  chain = [error]
  while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None and cause not in chain:
    chain.append(cause)
  return chain


def short_cause(error: BaseException) -> str:
  """One short line for a file error: "No space left on device (errno 28)", or TensorStore's status code, the
  file it names and its last clause instead of the several hundred characters of its message."""
  chain = error_chain(error)
  for e in chain:
    found = re.search(r"os_error_code='(\d+)'", str(e))
    code = e.errno if isinstance(e, OSError) and e.errno else int(found.group(1)) if found else None
    if code is not None:
      return f"{os.strerror(code)} (errno {code})"
  statuses = [e for e in chain if re.match(r"[A-Z_]+: ", str(e))]
  text = str(statuses[-1] if statuses else error)
  text = re.sub(r"\s*\[(tensorstore_spec|source locations|os_error_code)=.*", "", text, flags=re.S)
  status = re.match(r"([A-Z_]+): ", text)
  if not status:
    return " ".join(text.split()) or type(error).__name__
  files = re.findall(r'(?:local )?file "([^"]+)"', text)
  return f"{status.group(1)} reading {files[-1] if files else '?'}: {text.rsplit(': ', 1)[-1]}"


class _OrbaxBackgroundErrors(logging.Filter):
  """Drops the error records Orbax's background threads log, each with its traceback (a full disk logs one per
  thread): the same error is raised again where the caller waits, and reported there as one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname


_QUIET = _OrbaxBackgroundErrors()


def quiet_orbax_failures():
  """Keeps a failed checkpoint read or write to the one line its caller reports: Orbax's logged duplicates are
  dropped, the other reads or writes of the failed operation are cancelled and awaited before Orbax closes their
  event loop (`_drained`), and "Event loop is closed", raised by TensorStore callbacks that complete after a loop
  closed (Python prints each as an unraisable exception), is dropped."""
  logger = logging.getLogger("absl")
  if _QUIET not in logger.filters:
    logger.addFilter(_QUIET)
  if _orbax_asyncio is not None and not getattr(_orbax_asyncio.run_sync, "drained", False):
    _orbax_asyncio.run_sync = _drained(_orbax_asyncio.run_sync)
  previous = sys.unraisablehook
  if getattr(previous, "quiet_orbax", False):
    return

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"):
      previous(unraisable)

  hook.quiet_orbax = True
  sys.unraisablehook = hook


def _drained(run_sync: Callable[[Coroutine], Any]) -> Callable[[Coroutine], Any]:
  """Orbax's asyncio_utils.run_sync, whose operation, when it fails, cancels and awaits the tasks it leaves.

  run_sync runs an operation (a restore reads each array in a task of its own) on an event loop of its own and
  closes the loop once the operation's coroutine ends, without asyncio.run's cancelling of the tasks still there
  (`_run_sync_via_new_loop`). After a failed read the other reads stayed on the closed loop: asyncio logged each
  exception nobody retrieved, and each read still pending, closed when collected, raised from Orbax's `except
  BaseException` around it: Python printed hundreds of tracebacks after one damaged checkpoint. Those reads are
  cancelled and awaited here, while their loop runs."""

  @functools.wraps(run_sync)
  def run(coroutine: Coroutine) -> Any:
    return run_sync(_cancelling_the_rest_on_failure(coroutine))

  run.drained = True
  return run


async def _cancelling_the_rest_on_failure(coroutine: Coroutine) -> Any:
  try:
    return await coroutine
  except BaseException:
    this = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not this]  # The loop is the operation's own.
    for task in rest:
      task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
    raise
