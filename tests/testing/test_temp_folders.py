"""Temporary folders of test processes (jaxemb/testing/temp_folders.py): a killed process's go at the next session's
start, a live process's stay."""

import os
import pathlib
import subprocess
import sys
import tempfile

from jaxemb.testing import temp_folders
from testing_support.shared import REPO

# A process that makes a folder, prints it and runs until its stdin closes: another test session, still running.
_MAKER = "from jaxemb.testing import temp_folders; print(temp_folders.make('xla'), flush=True); input()"


def test_a_gone_process_folders_are_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  makers = [
    subprocess.Popen(
      [sys.executable, "-c", _MAKER],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
      cwd=REPO,
      env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    for _ in range(2)
  ]
  killed, live = makers
  killed_folder, live_folder = (pathlib.Path(maker.stdout.readline().strip()) for maker in makers)
  ours = temp_folders.make("senteval")
  unnamed = tmp_path / "jaxemb-tests-xla-abc123_x"  # mkdtemp's name without a process id: not known to be gone.
  unnamed.mkdir()
  assert sorted(tmp_path.iterdir()) == sorted([killed_folder, live_folder, ours, unnamed])
  killed.kill()
  killed.wait()
  temp_folders.remove_orphans()
  assert sorted(tmp_path.iterdir()) == sorted([live_folder, ours, unnamed])
  live.communicate("")  # It exits without removing its folder, as if killed.
  temp_folders.remove_orphans()
  assert sorted(tmp_path.iterdir()) == sorted([ours, unnamed])
