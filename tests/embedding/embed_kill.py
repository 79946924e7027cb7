"""embed.py that dies with os._exit halfway through writing the ids of shard 1 (or of the shard $EMBED_KILL_SHARD
names), its vectors written, before its done record: a real kill, which leaves the files of that moment (the ids'
temporary file among them) and runs no `finally` block.

Run in a subprocess, in the repository, as `python -m tests.embedding.embed_kill <embed.py's arguments>`.
"""

import os
import runpy
import sys

from jaxemb import atomic
from jaxemb.embedding import shards
from testing_support.shared import REPO

KILL_SHARD_ENV = "EMBED_KILL_SHARD"
KILL_WRITING = shards.ids_file(int(os.environ.get(KILL_SHARD_ENV, "1")), strings=False)
KILLED = 77  # The exit status of a run that reached its kill point.
_write = atomic.write


def _die_halfway(f):
  f.write(b"\x93NUMPY")
  f.flush()
  os._exit(KILLED)  # pylint: disable=protected-access


def _write_or_die(path, fill):
  _write(path, _die_halfway if str(path).endswith(KILL_WRITING) else fill)


if __name__ == "__main__":
  atomic.write = _write_or_die
  sys.argv = [str(REPO / "embed.py"), *sys.argv[1:]]
  runpy.run_path(sys.argv[0], run_name="__main__")
  sys.exit(f"embed.py ended without writing {KILL_WRITING}")
