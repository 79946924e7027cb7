"""The run directory (what train.py writes): its layout, read and written through `RunDir` alone, and the
model sources that encoding and export load (a Hugging Face checkpoint or a run directory's best step).

    <workdir>/model/         the encoder's config.json and tokenizer (Hugging Face format), written at start,
                             and eval_method.json: how the run embeds a sentence at evaluation
    <workdir>/checkpoints/N  the full train state every `save_every` steps (resume restarts from the latest
                             readable one); an unreadable one is set aside as checkpoints/corrupt-N-<time>
    <workdir>/best/N         the params of the best STS-B dev step: {"encoder", "mlp"?, "prompt"?}
    <workdir>/metrics.jsonl  the logged scalars, one JSON object a line; tensorboard/ holds the same as events
    <workdir>/cache/         the tokenised training rows, unless data.cache_dir names another place
    <workdir>/lock           held by the process training in it (flock; in a bucket, a lease its heartbeat
                             renews: jaxemb.training.workdir); names its pid and host
    <workdir>/fingerprint.json  the fields that define the run (jaxemb.training.workdir), written at start
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import pathlib
import re
import sys
from typing import Any, Callable, Coroutine, Sequence

import jax
import orbax.checkpoint as ocp

try:  # Orbax's own: each save and restore runs its coroutine through its run_sync (`quiet_orbax_failures`).
  from orbax.checkpoint._src import asyncio_utils as _orbax_asyncio
except ImportError:  # An Orbax without it: its operations are run as they are.
  _orbax_asyncio = None

from jaxemb import atomic, storage
from jaxemb.errors import DataError
from jaxemb.models import bert, hf
from jaxemb.models.config import EncoderConfig


class RunDir:
  """The paths of a run directory, local (absolute, as Orbax wants them) or in a bucket (gs://)."""

  def __init__(self, path: storage.PathLike):
    path = storage.path(path)
    self.path = path if storage.is_remote(path) else path.absolute()
    self.model_dir = self.path / "model"
    self.config_file = self.model_dir / "config.json"
    self.eval_method_file = self.model_dir / "eval_method.json"
    self.checkpoints_dir = self.path / "checkpoints"
    self.best_dir = self.path / "best"
    self.metrics_file = self.path / "metrics.jsonl"
    self.tensorboard_dir = self.path / "tensorboard"
    self.cache_dir = self.path / "cache"
    self.lock_file = self.path / "lock"
    self.fingerprint_file = self.path / "fingerprint.json"

  def has_step(self) -> bool:
    """Whether a step was saved (a periodic checkpoint or a best step): a directory without one holds no run yet."""
    return any(directory.is_dir() and any(child.name.isdigit() for child in directory.iterdir())
               for directory in (self.checkpoints_dir, self.best_dir))


def is_run_dir(path: storage.PathLike) -> bool:
  """Whether `path` is a run directory with a best step to read: model/config.json and best/."""
  run = RunDir(path)
  return run.config_file.is_file() and run.best_dir.is_dir()


def load_best(workdir: storage.PathLike) -> tuple[EncoderConfig, dict[str, Any], dict[str, Any]]:
  """(encoder config, params tree of the best step {"encoder", ...}, its meta) of a run directory: `read_best` and
  the run's model/config.json."""
  run = RunDir(workdir)
  params, meta = read_best(run)
  return hf.read_config(run.model_dir), params, meta


def read_best(run: RunDir) -> tuple[dict[str, Any], dict[str, Any]]:
  """(params tree of the best step {"encoder", ...}, its meta) of a run directory; the encoder per layer
  (`layer_{i}/...`) as a Hugging Face checkpoint reads, whether or not the run scanned its layers.

  Raises:
    DataError: the best step is unreadable (a missing or truncated file, garbled metadata, no commit marker).
  """
  if not is_run_dir(run.path):
    raise FileNotFoundError(f"{run.path} is not a jaxemb run directory (needs model/config.json and best/)")
  quiet_orbax_failures()
  manager = ocp.CheckpointManager(run.best_dir)
  try:
    step = manager.latest_step()
  finally:
    manager.close()
  if step is None:
    raise FileNotFoundError(f"{run.best_dir} holds no checkpoint yet")
  step_dir = run.best_dir / str(step)
  restored, cause = _read_best_step(step_dir)
  if cause is not None:
    raise DataError(f"best checkpoint {step_dir} is unreadable: {cause}; restore it from a copy or train again")
  params = {**restored["params"], "encoder": bert.unstack_layers(restored["params"]["encoder"])}
  return params, restored["meta"]


def best_step_problem(step_dir: storage.Path) -> str | None:
  """Why the best step folder `step_dir` cannot be restored, its arrays read to find out (a missing or truncated data
  file shows only then, unlike `checkpoint_problem`'s); None when it reads whole."""
  return _read_best_step(step_dir)[1]


def _read_best_step(step_dir: storage.Path) -> tuple[Any, str | None]:
  """({"params", "meta"} of the best step folder `step_dir`, the params on this process's first device, None), or
  (None, why it cannot be read). Anything but a read failure of the step is raised."""
  cause = checkpoint_problem(step_dir, BEST_ITEMS)
  if cause is not None:
    return None, cause
  try:
    target = abstract_on_one_device(step_dir / "params")
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
      return checkpointer.restore(step_dir, args=ocp.args.Composite(params=ocp.args.StandardRestore(target),
                                                                    meta=ocp.args.JsonRestore())), None
  except Exception as e:  # pylint: disable=broad-except  # Anything but a read failure of the step is re-raised.
    cause = read_failure(e, step_dir)
    if cause is None:
      raise
    return None, cause


# What each checkpoint holds (Orbax items, one folder each): the periodic train state and the best step's params,
# each with its JSON meta.
PERIODIC_ITEMS = ("state", "meta")
BEST_ITEMS = ("params", "meta")
# Orbax (0.12, orbax/checkpoint/_src/path/atomicity.py) writes this file last into a step's temporary folder, then
# renames the folder into place: a step folder without it never finished its save.
COMMIT_MARKER = "commit_success.txt"
STEP_METADATA = "_CHECKPOINT_METADATA"  # Orbax's JSON of the step (its time); the step is listed by reading it.


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


def saved_layers_stacked(run: RunDir) -> bool | None:
  """Whether the train state of the run's newest periodic checkpoint holds the encoder's layers stacked (`layers/...`,
  a run with config.model.scan_layers) rather than per layer, read from its metadata; None without a checkpoint
  whose metadata reads (the run starts from its first step)."""
  if not run.checkpoints_dir.is_dir():
    return None
  for step in sorted((int(p.name) for p in run.checkpoints_dir.iterdir() if p.name.isdigit()), reverse=True):
    try:
      metadata = ocp.StandardCheckpointHandler().metadata(run.checkpoints_dir / str(step) / "state")
    except (OSError, ValueError):  # Set aside when the run starts (jaxemb.training.checkpoints).
      continue
    return any(jax.tree_util.DictKey(bert.STACKED) in path for path, _ in jax.tree_util.tree_leaves_with_path(metadata))
  return None


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


def read_best_meta(workdir: storage.PathLike) -> dict[str, Any] | None:
  """The newest best step's meta ({"step", "stsb_dev"}) read without its params (export's model card, the mteb
  model's revision); None when best/ holds no step."""
  run = RunDir(workdir)
  steps = [int(child.name) for child in run.best_dir.iterdir() if child.name.isdigit()] if run.best_dir.is_dir() else []
  if not steps:
    return None
  return json.loads((run.best_dir / str(max(steps)) / "meta" / "metadata").read_text())


def save_eval_method(workdir: storage.PathLike, fields: dict[str, Any]):
  """Records the run's evaluation method, every field of its `jaxemb.methods.Method.config_fields()`, in
  <workdir>/model/eval_method.json."""
  atomic.write_json(RunDir(workdir).eval_method_file, fields)


def load_eval_method(workdir: storage.PathLike) -> dict[str, Any]:
  """The run's evaluation method as `jaxemb.methods.Method.config_fields()` (or, written before those, 7 of
  them)."""
  path = RunDir(workdir).eval_method_file
  if not path.is_file():
    raise FileNotFoundError(f"{path} is missing (a run from an older jaxemb?): pass the method explicitly")
  return json.loads(path.read_text())


def abstract_on_one_device(item_dir: storage.Path) -> Any:
  """The saved tree's shapes and dtypes placed on this process's first device: a checkpoint written on any mesh
  (8 devices, several hosts) restores in one process."""
  metadata = ocp.StandardCheckpointHandler().metadata(item_dir)  # The item's own: no step metadata is looked for.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """A model to encode with or export: a Hugging Face checkpoint (local directory or hub id) or a run directory's
  best step. Its config and tokenizer are read when it is opened, so a method can be checked against them before
  `load_params` reads the weights."""

  run: RunDir | None  # None for a Hugging Face checkpoint.
  # config.json and the tokenizer, on this host: the checkpoint's directory, or the run's model/ (a run in a bucket:
  # its copy in the download cache).
  model_dir: pathlib.Path
  config: EncoderConfig
  tokenizer: Any

  def load_params(self) -> dict[str, Any]:
    """{"encoder"} of a checkpoint; the best step's tree of a run ({"encoder", "mlp"?, "prompt"?})."""
    if self.run is None:
      return {"encoder": hf.load_weights(self.model_dir, self.config)}
    return read_best(self.run)[0]  # The config is this source's, read once when it was opened.


def open_source(name_or_path: storage.PathLike) -> ModelSource:
  """The run directory or Hugging Face checkpoint `name_or_path` names (local, in a bucket or a hub id), its config
  and tokenizer read."""
  run = RunDir(name_or_path) if is_run_dir(name_or_path) else None
  model_dir = hf.resolve_model_dir(name_or_path) if run is None else storage.local_copy(run.model_dir)
  return ModelSource(run, model_dir, hf.read_config(model_dir), hf.load_tokenizer(model_dir))
