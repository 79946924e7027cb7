"""Progress of long work on stderr, for the person running it: a live bar on a terminal, removed when the work is
done; one line once it is done where stderr is not a terminal (nohup, CI logs, a remote command), so that a log
gets no carriage-return bar; nothing when quiet. Process 0 alone shows it in a multi-process run.

  with progress.track("STS12", 6252, "sentence") as advance:
    ...  # advance(n) after each n sentences; in a log, then: "STS12: 6,252 sentences in 12.3 s (508/s)"
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Iterator

import jax
import tqdm

BAR_LABEL = 24  # The most characters of a label a bar shows.


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
    with tqdm.tqdm(total=total, desc=bar_label(label), unit=unit, leave=False, dynamic_ncols=True,
                   file=stream) as bar:
      yield bar.update
  else:
    start = time.perf_counter()
    yield lambda n: None
    if show:
      print(done_line(label, total, unit, time.perf_counter() - start), file=stream, flush=True)


def bar_label(label: str) -> str:
  """`label` cut to BAR_LABEL characters: a bar is one line, cut at the terminal's width, and the counts, rate and
  time left after the label must fit in 80 columns (the 7 STS tasks' label alone is 81 characters)."""
  return label if len(label) <= BAR_LABEL else label[:BAR_LABEL - 1] + "…"


def done_line(label: str, total: int, unit: str, seconds: float) -> str:
  """"STS12: 6,252 sentences in 12.3 s (508/s)"; unnamed ("" label), "6,252 sentences in 12.3 s (508/s)"."""
  rate = f"{total / seconds:,.0f}/s" if seconds > 0 else "instant"
  done = f"{total:,} {unit}{'' if total == 1 else 's'} in {seconds:.1f} s ({rate})"
  return f"{label}: {done}" if label else done


def is_terminal(stream: Any) -> bool:
  """Whether `stream` is a terminal (a closed stream, or an object without isatty, is not)."""
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):
    return False
