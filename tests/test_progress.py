"""Progress on stderr (jaxemb/progress.py): a bar on a terminal, lines in a log (every LOG_EVERY seconds and once
done), nothing when quiet."""

import io
import re
import sys

import jax
import pytest

from jaxemb import progress


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def _work(show, stream, monkeypatch, total=300):
  monkeypatch.setattr(sys, "stderr", stream)
  with progress.track("STS12, STSBenchmark dev", total, "sentence", show) as advance:
    for _ in range(total // 100):
      advance(100)
  return stream.getvalue()


def test_done_line_names_the_work_its_size_time_and_rate():
  assert progress.done_line("STS12", 6252, "sentence", 12.3) == "STS12: 6,252 sentences in 12.3 s (508/s)"
  assert progress.done_line("x", 1, "sentence", 0.0) == "x: 1 sentence in 0.0 s (instant)"
  assert progress.done_line("", 2, "sentence", 1.0) == "2 sentences in 1.0 s (2/s)"  # Unnamed.
  assert progress.done_line("heads", 6, "layer", 61.9) == "heads: 6 layers in 61.9 s (0.097/s)"  # Two digits under 10.


def test_a_log_gets_one_line_once_done(monkeypatch):
  text = _work(True, io.StringIO(), monkeypatch)
  assert re.fullmatch(r"STS12, STSBenchmark dev: 300 sentences in \d+\.\d s \(([\d,]+/s|instant)\)\n", text)


def test_a_log_gets_a_line_every_log_every_seconds_while_the_work_goes_on(monkeypatch):
  clock = iter(range(0, 1000, 20))  # Each reading of the clock 20 s after the last.
  monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
  lines = _work(True, io.StringIO(), monkeypatch, total=500).splitlines()
  # Read at the start, then after 100 (20 s), 200 (40 s: a line), 300 (60 s), 400 (80 s: a line), 500; the end.
  assert lines == [
    "STS12, STSBenchmark dev: 200 of 500 sentences (5/s, 60 s left)",
    "STS12, STSBenchmark dev: 400 of 500 sentences (5/s, 20 s left)",
    "STS12, STSBenchmark dev: 500 sentences in 120.0 s (4.2/s)",
  ]


@pytest.mark.parametrize("show", [None, False])
def test_a_log_gets_nothing_by_default_or_when_quiet(show, monkeypatch):
  assert _work(show, io.StringIO(), monkeypatch) == ""


@pytest.mark.parametrize("show", [True, None])
def test_a_terminal_gets_a_bar_and_no_line(show, monkeypatch):
  text = _work(show, _Terminal(), monkeypatch)
  assert "STS12, STSBenchmark dev" in text and "/300" in text and "sentence/s" in text
  assert "sentences in" not in text and text.endswith("\r")  # leave=False: erased once done.


def test_a_long_label_is_cut_on_the_bar_and_whole_in_the_line(monkeypatch):
  label = "STS12, STS13, STS14, STS15, STS16, STSBenchmark, SICKRelatedness, STSBenchmark dev"
  assert progress.bar_label(label) == "STS12, STS13, STS14, ST…" and progress.bar_label("STS12") == "STS12"
  monkeypatch.setattr(sys, "stderr", _Terminal())
  with progress.track(label, 10, "sentence"):
    pass
  assert "STS12, STS13, STS14, ST…:" in sys.stderr.getvalue()
  assert progress.done_line(label, 10, "sentence", 1.0).startswith(label + ": 10 sentences")


def test_quiet_on_a_terminal_and_on_processes_other_than_0(monkeypatch):
  assert _work(False, _Terminal(), monkeypatch) == ""
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  assert _work(True, _Terminal(), monkeypatch) == "" and _work(True, io.StringIO(), monkeypatch) == ""


def test_work_that_raises_prints_no_line(monkeypatch):
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  with pytest.raises(KeyError):
    with progress.track("STS12", 10, "sentence") as advance:
      advance(5)
      raise KeyError("x")
  assert sys.stderr.getvalue() == ""


def test_training_steps_get_a_line_with_the_loss_every_log_every_seconds_in_a_log(monkeypatch):
  """Off a terminal the training bar's frames would fill a log: a line every LOG_EVERY seconds instead, its rate from
  the steps this process ran (a resumed run starts at its checkpoint's step)."""
  clock = iter(range(0, 10000, 20))
  monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  steps = progress.Steps(total=3906, initial=100)
  for loss in (2.5, 2.25, 2.125, 2.0):
    steps.advance(loss)
  steps.close()
  assert sys.stderr.getvalue().splitlines() == [
    "102 of 3,906 steps (0.05/s, 1,268 min left), loss 2.2500",
    "104 of 3,906 steps (0.05/s, 1,267 min left), loss 2.0000",
  ]


def test_training_steps_get_a_bar_with_the_loss_on_a_terminal_and_nothing_on_other_processes(monkeypatch):
  monkeypatch.setattr(sys, "stderr", _Terminal())
  steps = progress.Steps(total=20, initial=0)
  steps.advance(2.1818)
  steps.close()
  assert "1/20" in sys.stderr.getvalue() and "loss=2.1818" in sys.stderr.getvalue()
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  monkeypatch.setattr(sys, "stderr", io.StringIO())
  steps = progress.Steps(total=20, initial=0)
  steps.advance(2.0)
  steps.close()
  assert sys.stderr.getvalue() == ""
