import json
from types import SimpleNamespace

import numpy as np
import pytest

from jaxemb.models import run_dir
from jaxemb.training import metrics


@pytest.mark.parametrize("log_every", [2, 3, 4, 8])
def test_the_logged_throughput_gives_each_step_of_a_call_its_share_of_the_calls_time(tmp_path, monkeypatch, log_every):
  """Calls of four steps (the CPU's) read at one instant, each taking 2 s, with a 10 s evaluation between two calls:
  every record's rate is the steps' own, 4 steps / 2 s x batch 8 = 16 examples/s, whatever log_every is. Stamped at
  the call's end, a record in the middle of a call got 2 s for its steps and the next one in it none (log_every 2:
  8 then infinity examples/s; the benchmarks' and TensorBoard's throughput)."""
  clock = [100.0]
  monkeypatch.setattr(metrics.time, "perf_counter", lambda: clock[0])
  config = SimpleNamespace(train=SimpleNamespace(log_every=log_every, batch_size=8))
  recorder = metrics.StepRecorder(config, run_dir.RunDir(tmp_path), lambda step: 0.1, 0, 16, started=clock[0])
  for call in range(4):
    clock[0] += 2.0
    recorder.record(4 * call + 1, 4, {"loss": np.full(4, 1.5, np.float32)})
    if call == 1:
      with recorder.pause():
        clock[0] += 10.0
  recorder.close()
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == sorted({*range(log_every, 17, log_every), 16})  # And the last step.
  assert [r["examples_per_second"] for r in records] == [pytest.approx(16.0)] * len(records)
