"""jaxemb.training.lease: the lock of a run directory in a bucket, against a real GCS emulator (fake-gcs-server)."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from jaxemb import storage
from jaxemb.errors import WorkdirError
from jaxemb.models import run_dir
from jaxemb.training import lease, workdir
from tests.support import REPO, short_senteval


def _holder(run):
  return json.loads(storage.read_object(str(run.lock_file))[0])


def test_a_second_holder_is_refused_naming_pid_host_and_age_and_release_frees_it(bucket):
  run = run_dir.RunDir(f"{bucket}/runs/r1")
  said = []
  with workdir.lock(run, said.append) as check:
    check()
    assert _holder(run) == {"pid": os.getpid(), "host": socket.gethostname(), "lease_seconds": lease.LEASE_SECONDS}
    with pytest.raises(WorkdirError) as refused:
      with workdir.lock(run, said.append):
        pass
    with pytest.raises(WorkdirError):
      workdir.refuse_if_busy(run)
  assert str(refused.value) == (
    f"{bucket}/runs/r1 is in use by pid {os.getpid()} on host {socket.gethostname()} "
    f"(lock {bucket}/runs/r1/lock, a lease renewed 0 s ago: if its holder is gone, it can "
    "be taken over in 120 s): wait for it to end or stop it, or choose another "
    "--config.workdir"
  )
  assert storage.read_object(str(run.lock_file))[0] == b""  # Released: emptied, the next holder takes it silently.
  workdir.refuse_if_busy(run)
  with workdir.lock(run, said.append):
    pass
  assert said == []


def test_the_heartbeat_renews_the_lease(bucket, monkeypatch):
  monkeypatch.setattr(lease, "LEASE_SECONDS", 0.4)  # Renewed every 0.1 s.
  run = run_dir.RunDir(f"{bucket}/runs/r1")
  with workdir.lock(run, print):
    first = storage.read_object(str(run.lock_file))[1]
    time.sleep(0.5)
    _, generation, age = storage.read_object(str(run.lock_file))
    assert generation != first and age < 0.4


def _dead_holder(run, host, age_seconds, lease_seconds=lease.LEASE_SECONDS):
  """A lease as a process that died `age_seconds` ago left it."""
  storage.create(str(run.lock_file), json.dumps({"pid": 999999, "host": host, "lease_seconds": lease_seconds}).encode())
  time.sleep(age_seconds)


def test_an_expired_lease_of_another_host_is_taken_over_and_a_live_one_refused(bucket):
  run = run_dir.RunDir(f"{bucket}/runs/r1")
  _dead_holder(run, "preempted-vm", 1.2, lease_seconds=1.0)
  said = []
  with workdir.lock(run, said.append):
    assert _holder(run)["pid"] == os.getpid()
  assert said == [
    f"took over {run.lock_file} from pid 999999 on host preempted-vm, which ended without releasing it "
    "(its lease was last renewed 1 s ago)"
  ]

  run = run_dir.RunDir(f"{bucket}/runs/r2")
  _dead_holder(run, "other-vm", 0)  # Renewed just now, by all we can tell from here.
  with pytest.raises(WorkdirError, match="is in use by pid 999999 on host other-vm"):
    with workdir.lock(run, print):
      pass


def test_a_dead_holder_on_this_host_is_taken_over_at_once(bucket):
  """A run SIGKILLed here (or a VM recreated under its name): its pid no longer runs."""
  run = run_dir.RunDir(f"{bucket}/runs/r1")
  gone = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
  )
  storage.create(
    str(run.lock_file),
    json.dumps({"pid": int(gone.stdout), "host": socket.gethostname(), "lease_seconds": lease.LEASE_SECONDS}).encode(),
  )
  said = []
  with workdir.lock(run, said.append):
    pass
  assert said and said[0].startswith(
    f"took over {run.lock_file} from pid {int(gone.stdout)} on host "
    f"{socket.gethostname()}, which ended without releasing it"
  )


def test_a_holder_whose_lease_was_taken_over_stops_writing(bucket, monkeypatch):
  monkeypatch.setattr(lease, "LEASE_SECONDS", 0.4)
  run = run_dir.RunDir(f"{bucket}/runs/r1")
  with workdir.lock(run, print) as check:
    _, generation, _ = storage.read_object(str(run.lock_file))
    storage.replace(str(run.lock_file), b'{"pid": 1, "host": "other-vm", "lease_seconds": 120}', generation)
    time.sleep(0.3)  # The next renewal finds the lease replaced.
    with pytest.raises(
      WorkdirError,
      match=rf"^lost {bucket}/runs/r1 to another process: {bucket}/runs/r1/lock was "
      r"not renewed for 0 s \(a stalled VM or network\) and was taken over; stopping without saving$",
    ):
      check()
  assert _holder(run)["host"] == "other-vm"  # Not released by the loser.


@pytest.mark.e2e
def test_two_train_py_started_at_once_on_one_bucket_workdir_one_trains(bucket, tiny_bert, wiki_head, tmp_path):
  """Two VMs started on one gs:// workdir at the same moment: exactly one trains; the other exits with one line
  naming the holder (refused when it claims the run, or at once if the lease is already taken)."""
  workdir = f"{bucket}/runs/race"
  command = [
    sys.executable,
    str(REPO / "train.py"),
    "--config",
    str(REPO / "configs" / "simcse.py"),
    f"--config.model.path={tiny_bert}",
    f"--config.workdir={workdir}",
    f"--config.data.train_file={wiki_head}",
    f"--config.data.senteval_dir={short_senteval()}",
    "--config.data.max_sentence_tokens=16",
    "--config.eval.length_multiple=64",
    "--config.eval.batch_size=512",
    "--config.train.batch_size=4",
    "--config.train.num_steps=1",
    "--config.model.scan_unroll=1",
    f"--config.compilation_cache_dir={tmp_path / 'xla'}",
  ]
  racers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
  outputs = [racer.communicate(timeout=600) for racer in racers]
  assert sorted(racer.returncode for racer in racers) == [0, 1], [stderr[-2000:] for _, stderr in outputs]
  (winner, (stdout, _)), (_, (_, stderr)) = sorted(zip(racers, outputs), key=lambda pair: pair[0].returncode)
  assert "done: best" in stdout
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and errors[0].startswith(
    f"error: {workdir} is in use by pid {winner.pid} on host {socket.gethostname()} (lock {workdir}/lock, a lease "
    "renewed"
  ), stderr[-2000:]
  assert storage.read_object(f"{workdir}/lock")[0] == b""  # The winner released it.
