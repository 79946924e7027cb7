"""Fixtures of the training tests: the uninterrupted tiny run that killed, stopped and fenced runs end as."""

import pytest

from tests.training.run_support import kill_driver


@pytest.fixture(scope="session")
def whole_run(tmp_path_factory, tiny_bert, wiki_head):
  """(run directory of the uninterrupted kill_config run, its XLA cache, shared by the runs of a test process)."""
  root = tmp_path_factory.mktemp("whole")
  done = kill_driver(tiny_bert, root / "run", wiki_head, root / "xla", "none")
  assert done.returncode == 0, done.stderr
  return root / "run", root / "xla"
