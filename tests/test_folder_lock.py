"""jaxemb.folder_lock on a disk: one holder at a time, named in the lock file, freed on release or when its holder
dies. In a bucket (a lease): tests/training/test_lease.py; refused jobs: tests/training/test_workdir.py,
tests/embedding/test_job.py, tests/test_sweep.py."""

import json
import os
import socket

import pytest

from jaxemb import folder_lock
from jaxemb.errors import WorkdirBusy


def test_a_second_holder_is_refused_naming_pid_host_and_lock_file_and_release_frees_it(tmp_path):
  lock_file = tmp_path / "lock"
  said = []
  with folder_lock.hold(tmp_path, said.append):
    assert json.loads(lock_file.read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
    with pytest.raises(WorkdirBusy) as refused:
      with folder_lock.hold(tmp_path, said.append):
        pass
  holder = f"pid {os.getpid()} on host {socket.gethostname()} (lock {lock_file})"
  assert refused.value.holder == holder  # What a sweep's note names.
  assert str(refused.value).startswith(f"{tmp_path} is in use by {holder}")
  assert lock_file.read_text() == ""  # Released: emptied, so the next holder takes it without a word.
  with folder_lock.hold(tmp_path, said.append):
    pass
  assert said == []


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_one_line(tmp_path):
  lock_file = tmp_path / "lock"
  lock_file.write_text(json.dumps({"pid": 999999, "host": "old-host"}))
  said = []
  with folder_lock.hold(tmp_path, said.append):
    assert json.loads(lock_file.read_text())["pid"] == os.getpid()
  assert said == [f"took over {lock_file} from pid 999999 on host old-host, which ended without releasing it"]
