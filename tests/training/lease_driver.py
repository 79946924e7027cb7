"""One VM of an end-to-end lease test (tests/training/test_lease.py): the tiny run of checkpoint_kill.kill_config
with its run directory in a bucket, as `python -m tests.training.lease_driver MODEL_DIR WORKDIR TRAIN_FILE XLA_CACHE
SENTEVAL_DIR HOST LEASE_SECONDS [PAUSE_DIR]`.

HOST is the host name its lease records (another VM's, though the processes share a machine). With PAUSE_DIR, once
the save of step 1 is committed it creates PAUSE_DIR/paused and waits until PAUSE_DIR/go exists: the test cuts its
network, takes its bucket down or stops it there. A request that waits says so after a second, not ten.
"""

import pathlib
import socket
import sys
import time

from jaxemb import storage, xla
from jaxemb.training import checkpoints, loop
from jaxemb.spec import TrainingRun
from tests.training.checkpoint_kill import kill_config


def _pausing_after_step_1(save, pause_dir: pathlib.Path):
  def save_then_pause(self, state, meta):
    save(self, state, meta)
    if int(state.step) == 1:
      self.wait()
      (pause_dir / "paused").touch()
      while not (pause_dir / "go").exists():
        time.sleep(0.02)

  return save_then_pause


def main(model_dir, workdir, train_file, xla_cache, senteval_dir, host, lease_seconds, pause_dir=None):
  socket.gethostname = lambda: host
  storage.WAIT_NOTICE_SECONDS = 1.0
  if pause_dir:
    checkpoints.RunCheckpoints.save = _pausing_after_step_1(checkpoints.RunCheckpoints.save, pathlib.Path(pause_dir))
  config = kill_config(model_dir, workdir, train_file, xla_cache, senteval_dir)
  config.train.lease_seconds = float(lease_seconds)
  xla.use_compilation_cache(config.compilation_cache_dir)
  loop.train(TrainingRun.from_config(config))


if __name__ == "__main__":
  main(*sys.argv[1:])
