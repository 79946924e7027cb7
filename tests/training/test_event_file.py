"""jaxemb's TensorBoard event files are the bytes tensorboardX's EventsWriter writes for the same events."""

import math
import os
import time

import numpy as np
import pytest

from jaxemb.training import event_file
from tests.support import tensorboard_events

tensorboardX = pytest.importorskip("tensorboardX")
from tensorboardX import event_file_writer, summary  # noqa: E402  # pylint: disable=wrong-import-position
from tensorboardX.proto import event_pb2  # noqa: E402  # pylint: disable=wrong-import-position

# (step, tag, value): step 0 (a field proto3 leaves out), float32 rounding, a step past 2^32, a tag outside ASCII (one
# tensorboardX keeps: it replaces what is not a word character, . / or -), a float32 subnormal, a value float32 cannot
# hold, NaN.
SCALARS = [
  (0, "stsb_dev/STSBenchmark", 0.7312),
  (7, "loss", 1.0 / 3.0),
  (2**40 + 5, "learning_rate", 3e-5),
  (12, "aniso/anisotropé", -2.5e-41),
  (13, "loss", 1e39),
  (14, "loss", math.nan),
]


def test_crc32c_is_castagnolis():
  assert event_file.crc32c(b"123456789") == 0xE3069283  # The CRC-32C check value (RFC 3720, B.4).
  google_crc32c = pytest.importorskip("google_crc32c")
  data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes()
  for end in (0, 1, 7, 1000):
    assert event_file.crc32c(data[:end]) == google_crc32c.value(data[:end])


def test_an_event_file_is_tensorboardx_s_bytes(tmp_path, monkeypatch):
  monkeypatch.setattr(time, "time", lambda: 1764400000.625)
  ours, theirs = tmp_path / "ours", tmp_path / "theirs"
  ours.mkdir(), theirs.mkdir()
  written = event_file.EventFile(ours)
  written.write(event_file.start_event(5, time.time()))
  for step, tag, value in SCALARS:
    written.write(event_file.scalar_event(step, tag, value, time.time()))
  written.flush()
  written.close()
  reference = event_file_writer.EventsWriter(os.path.join(theirs, "events"))
  start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
  reference.write_event(event_pb2.Event(wall_time=time.time(), step=5, session_log=start))
  for step, tag, value in SCALARS:
    reference.write_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary.scalar(tag, value)))
  reference.close()
  [ours_file], [theirs_file] = os.listdir(ours), os.listdir(theirs)
  assert ours_file == theirs_file
  assert (ours / ours_file).read_bytes() == (theirs / theirs_file).read_bytes()
  events = tensorboard_events(ours)
  assert [e.step for e in events] == [0, 5] + [step for step, _, _ in SCALARS]
  assert [v.tag for e in events[2:] for v in e.summary.value] == [tag for _, tag, _ in SCALARS]
