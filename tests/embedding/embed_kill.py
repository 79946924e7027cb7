"""embed.py that dies with os._exit once the vectors of shard 1 are written, before its ids and done record: a real
kill, which leaves the files of that moment and runs no `finally` block.

Run in a subprocess, in the repository, as `python -m tests.embedding.embed_kill <embed.py's arguments>`.
"""

import os
import runpy
import sys

from jaxemb import atomic
from jaxemb.embedding import shards
from testing_support.shared import REPO

KILL_AFTER = shards.vectors_file(1)
KILLED = 77  # The exit status of a run that reached its kill point.
_write = atomic.write


def _write_then_die(path, fill):
  _write(path, fill)
  if str(path).endswith(KILL_AFTER):
    os._exit(KILLED)  # pylint: disable=protected-access


if __name__ == "__main__":
  atomic.write = _write_then_die
  sys.argv = [str(REPO / "embed.py"), *sys.argv[1:]]
  runpy.run_path(sys.argv[0], run_name="__main__")
  sys.exit(f"embed.py ended without writing {KILL_AFTER}")
