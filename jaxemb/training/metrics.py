"""A run's logged scalars: <workdir>/metrics.jsonl and TensorBoard event files in <workdir>/tensorboard, on a disk or
in a bucket, written by a background thread so that no step waits for a write (a request, in a bucket); and each
step's metrics as the training loop records them (`StepRecorder`: checked, shown, timed, logged)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import pathlib
import queue
import shutil
import tempfile
import threading
import time
from typing import Any, Iterator

import jax
import numpy as np

from jaxemb import atomic, progress, storage
from jaxemb.errors import Diverged
from jaxemb.models import run_dir
from jaxemb.spec import TrainingRun
from jaxemb.training import event_file


class MetricsWriter:
  """Scalars to <workdir>/metrics.jsonl and TensorBoard. `flush` returns once every record so far is written (the loop
  flushes before each checkpoint, so the records of a saved step outlive a kill).

  metrics.jsonl is rewritten whole at each write (jaxemb.atomic: a bucket cannot append, and a kill leaves the previous
  whole file). A run that starts at `start_step` (resumed from its checkpoint of that step, or 0) writes each later step
  again: the records an earlier process wrote past that step (before it was killed) are dropped first, so each step's
  scalars are there once; a run from step 0 drops them all, its score before training (step 0) included. TensorBoard
  discards the same events from the files already there (a SessionLog.START at the first step written again); this
  attempt's event file (event_file.py) opens at its first record and is written and flushed with each, in this thread
  (tensorboardX's SummaryWriter queued events for a thread of its own, which its `flush` did not wait for: a kill after
  a save could lose the saved steps' events), so a killed attempt leaves neither an empty event file nor events only
  in memory. In a bucket the event file is written locally and uploaded whole after each flush (tensorboardX's own
  gs:// writer uploaded again when garbage-collected, retrying for minutes when the bucket was out of reach)."""

  def __init__(self, workdir: run_dir.RunDir, start_step: int):
    # A run from its start scores its params before training again, as step 0: nothing earlier is kept.
    self._workdir, self._purge_step = workdir, start_step + 1 if start_step else 0
    self._lines = _records_before(workdir.metrics_file, self._purge_step)
    self._tensorboard = None
    self._local_events: pathlib.Path | None = None  # A bucket's run: the local folder of this attempt's event file.
    self._queue: queue.Queue = queue.Queue()
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._write_queued, name="jaxemb-metrics", daemon=True)
    self._thread.start()

  def write(self, step: int, scalars: dict[str, float]):
    self._raise_error()
    self._queue.put((step, scalars))

  def flush(self):
    self._queue.join()
    self._raise_error()

  def close(self):
    self._queue.put(None)
    self._thread.join()
    if self._tensorboard is not None:
      self._tensorboard.close()
    if self._local_events is not None:
      shutil.rmtree(self._local_events, ignore_errors=True)
    self._raise_error()

  def _raise_error(self):
    if self._error is not None:
      error, self._error = self._error, None
      raise error

  def _write_queued(self):
    """The thread: each batch of queued records written at once, until close's None."""
    while True:
      records = [self._queue.get()]
      while not self._queue.empty():
        records.append(self._queue.get())
      try:
        if self._error is None:
          self._write([r for r in records if r is not None])
      except BaseException as e:  # pylint: disable=broad-except  # Raised in the loop's thread.
        self._error = e
      finally:
        for _ in records:
          self._queue.task_done()
      if records[-1] is None:
        return

  def _write(self, records: list[tuple[int, dict[str, float]]]):
    if not records:
      return
    self._lines += [json.dumps({"step": step, **scalars}) + "\n" for step, scalars in records]
    atomic.write_text(self._workdir.metrics_file, "".join(self._lines))
    tensorboard = self._open_tensorboard()
    for step, scalars in records:
      for name, value in scalars.items():
        tensorboard.write(event_file.scalar_event(step, name, value, time.time()))
    tensorboard.flush()
    if self._local_events is not None:
      storage.upload(self._local_events, self._workdir.tensorboard_dir)

  def _open_tensorboard(self) -> event_file.EventFile:
    """This attempt's event file, opened with the event that hides the steps from `purge_step` on in earlier ones."""
    if self._tensorboard is None:
      folder = self._workdir.tensorboard_dir
      if storage.is_remote(folder):
        self._local_events = folder = local_events_folder(folder)
      else:
        folder.mkdir(parents=True, exist_ok=True)
      self._tensorboard = event_file.EventFile(folder)
      self._tensorboard.write(event_file.start_event(self._purge_step, time.time()))
    return self._tensorboard


def local_events_folder(tensorboard_dir: storage.PathLike) -> pathlib.Path:
  """A new empty local folder for the event file of a run whose `tensorboard_dir` is in a bucket: one per run
  directory, so an attempt killed before its close (whose events were uploaded at each flush) leaves no more than
  that folder behind, and the next attempt's clears it."""
  digest = hashlib.sha256(str(tensorboard_dir).encode()).hexdigest()[:16]
  folder = pathlib.Path(tempfile.gettempdir()) / f"jaxemb-tensorboard-{digest}"
  shutil.rmtree(folder, ignore_errors=True)
  folder.mkdir(parents=True, exist_ok=True)
  return folder


def _records_before(path: storage.Path, step: int) -> list[str]:
  """The lines of the metrics file `path` of the steps before `step`, without a last line cut short (a kill while an
  older jaxemb appended to the file) or any other line that is no record (garbled on disk: dropped, said in one
  line), so that a rerun continues."""
  if not path.is_file():
    return []
  kept, unreadable = [], []
  lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
  for number, line in enumerate(lines, 1):
    try:
      record = json.loads(line)
      before = record["step"] < step
    except (ValueError, TypeError, KeyError):
      if number < len(lines):
        unreadable.append(number)
      continue
    if before:
      kept.append(line + "\n")
  if unreadable:
    progress.say(f"{path}: dropped {len(unreadable)} unreadable line(s) (line {', '.join(map(str, unreadable[:5]))})")
  return kept


class StepRecorder:
  """Each step's metrics: read a call at a time (a host sync), checked finite, shown on the progress bar, and every
  log_every steps written with the learning rate and the training throughput (the evaluations' time left out).

  The throughput runs on a training clock that gives each step of a call an equal share of the call's time: a call's
  steps are read at one instant, so a record within a call (log_every not a multiple of the CPU's four steps a call)
  would otherwise be stamped with its whole call, and the next one in the same call with none of its time."""

  def __init__(
    self, config: TrainingRun, workdir: run_dir.RunDir, schedule: Any, start_step: int, total_steps: int, started: float
  ):
    self.config, self.workdir, self.schedule, self.total_steps = config, workdir, schedule, total_steps
    self.started = started  # train's call: the first record's time after it is the run's time to its first step.
    self.first_step_seconds = None
    self.writer = MetricsWriter(workdir, start_step) if jax.process_index() == 0 else None
    self.progress = progress.Steps(total_steps, start_step)
    self.start_time = time.perf_counter()
    self.last_call = self.start_time  # When the last call was read.
    self.paused = 0.0  # Seconds evaluating since the last call was read.
    self.clock = 0.0  # Training seconds to the end of the last reported step.
    self.since = (start_step, self.clock)  # The last written record's step and clock.

  def record(self, first_done: int, count: int, metrics: dict[str, jax.Array]):
    """Reads one call's metrics at once (each a [steps_per_call] array) and reports its `count` steps, the first of
    which ends at step `first_done`; stops on a non-finite loss."""
    values = jax.device_get(metrics)
    now = time.perf_counter()
    step_seconds = (now - self.last_call - self.paused) / count
    self.last_call, self.paused = now, 0.0
    for i in range(count):
      self.clock += step_seconds
      self._report(first_done + i, {name: float(value[i]) for name, value in values.items()})

  def _report(self, done: int, metrics: dict[str, float]):
    if not np.isfinite(metrics["loss"]):
      raise Diverged(
        f"loss is {metrics['loss']} at step {done}; stopped without saving; the checkpoints saved before it "
        f"(in {self.workdir.checkpoints_dir}, if any) are kept"
      )
    if self.first_step_seconds is None:
      self.first_step_seconds = time.perf_counter() - self.started
    self.progress.advance(metrics["loss"])
    if self.writer and (done % self.config.train.log_every == 0 or done == self.total_steps):
      rate = (done - self.since[0]) * self.config.train.batch_size / (self.clock - self.since[1])
      self.since = (done, self.clock)
      self.write(done, {**metrics, "learning_rate": float(self.schedule(done - 1)), "examples_per_second": rate})

  def write(self, done: int, scalars: dict[str, float]):
    if self.writer:
      self.writer.write(done, scalars)

  def flush(self):
    """Returns once the records so far are written."""
    if self.writer:
      self.writer.flush()

  @contextlib.contextmanager
  def pause(self) -> Iterator[None]:
    """Time in the block is not training time."""
    start = time.perf_counter()
    try:
      yield
    finally:
      self.paused += time.perf_counter() - start

  def close(self):
    self.progress.close()
    if self.writer:
      self.writer.close()
