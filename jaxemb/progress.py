"""Progress of long work on stderr, for the person running it: a live bar on a terminal, removed when the work is
done; where stderr is not a terminal (nohup, CI logs, a remote command) a line every LOG_EVERY seconds and one once
it is done, so that a log gets no carriage-return bar; nothing when quiet. Process 0 alone shows it in a
multi-process run.

  with progress.track("STS12", 6252, "sentence") as advance:
    ...  # advance(n) after each n sentences; in a log: "STS12: 3,100 of 6,252 sentences (508/s, 6 s left)" after
         # LOG_EVERY seconds, then "STS12: 6,252 sentences in 12.3 s (508/s)"
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Iterator

import jax
import tqdm

BAR_LABEL = 24  # The most characters of a label a bar shows.
LOG_EVERY = 30.0  # Seconds between a log's lines while work goes on.


@contextlib.contextmanager
def track(label: str, total: int, unit: str, show: bool | None = True) -> Iterator[Callable[[int], None]]:
  """Shows the work named `label` ("": unnamed), `total` `unit`s, on stderr; yields `advance(n)`, to call as n more
  are done.

  `show`: True draws the bar on a terminal and prints the line (`done_line`) elsewhere; None draws the bar on a
  terminal and shows nothing elsewhere (the default of a library call, and training's evaluations, under the training
  bar); False shows nothing. Work that raises prints no line.
  """
  stream = sys.stderr  # Read at each call: a test or a caller may have replaced it.
  if show is False or jax.process_index() != 0:
    yield lambda n: None
  elif is_terminal(stream):
    # leave=False: the bar is erased when done, so the training bar (and a terminal's scrollback) stays clean.
    with tqdm.tqdm(total=total, desc=bar_label(label), unit=unit, leave=False, dynamic_ncols=True, file=stream) as bar:
      yield bar.update
  elif not show:
    yield lambda n: None
  else:
    log = _Log(label, total, unit, stream)
    yield log.advance
    print(done_line(label, total, unit, time.perf_counter() - log.start), file=stream, flush=True)


class _Log:
  """A log's lines of one piece of work: how far it is every LOG_EVERY seconds."""

  def __init__(self, label: str, total: int, unit: str, stream: Any):
    self.label, self.total, self.unit, self.stream = label, total, unit, stream
    self.start = self.last = time.perf_counter()
    self.done = 0

  def advance(self, n: int):
    self.done += n
    now = time.perf_counter()
    if now - self.last >= LOG_EVERY and self.done < self.total:
      self.last = now
      print(progress_line(self.label, self.done, self.total, self.unit, now - self.start), file=self.stream, flush=True)


def bar_label(label: str) -> str:
  """`label` cut to BAR_LABEL characters: a bar is one line, cut at the terminal's width, and the counts, rate and
  time left after the label must fit in 80 columns (the 7 STS tasks' label alone is 81 characters)."""
  return label if len(label) <= BAR_LABEL else label[: BAR_LABEL - 1] + "…"


def done_line(label: str, total: int, unit: str, seconds: float) -> str:
  """ "STS12: 6,252 sentences in 12.3 s (508/s)"; unnamed ("" label), "6,252 sentences in 12.3 s (508/s)"."""
  rate = f"{total / seconds:,.0f}/s" if seconds > 0 else "instant"
  done = f"{total:,} {unit}{'' if total == 1 else 's'} in {seconds:.1f} s ({rate})"
  return f"{label}: {done}" if label else done


def progress_line(label: str, done: int, total: int, unit: str, seconds: float) -> str:
  """ "STS12: 3,100 of 6,252 sentences (508/s, 6 s left)" after `seconds` with `done` of `total` done."""
  rate = done / seconds
  left = f"{(total - done) / rate:,.0f} s left" if rate > 0 else "time left unknown"
  line = f"{done:,} of {total:,} {unit}s ({rate:,.0f}/s, {left})"
  return f"{label}: {line}" if label else line


def is_terminal(stream: Any) -> bool:
  """Whether `stream` is a terminal (a closed stream, or an object without isatty, is not)."""
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):
    return False
