"""The tiny run of tests/training/checkpoint_kill.py as tests drive it: in a subprocess (here or as a new VM),
and compared with another run to the bit."""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxemb.models import run_dir
from tests.support import REPO, compiling_as_tests, short_senteval


def kill_driver(
  tiny_bert, workdir, train_file, xla_cache, stage, senteval_dir=None, vm=None
) -> subprocess.CompletedProcess:
  """The driver (checkpoint_kill) in the repository, or on a `vm`: a folder of its own, as its working directory and
  HOME (`driver_env`). STS-B dev from `senteval_dir`, or the short one this process's runs score."""
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "tests.training.checkpoint_kill",
      str(tiny_bert),
      str(workdir),
      str(train_file),
      str(xla_cache),
      stage,
      str(senteval_dir or short_senteval()),
    ],
    cwd=vm or REPO,
    env=driver_env(vm),
    capture_output=True,
    text=True,
    check=False,
  )


def vm_env(vm: pathlib.Path) -> dict[str, str]:
  """A new VM's environment: `vm` its working directory and HOME (so an empty download cache), the repository on
  the Python path."""
  (vm / "home").mkdir(parents=True, exist_ok=True)
  return {**os.environ, "HOME": str(vm / "home"), "PYTHONPATH": str(REPO)}


def driver_env(vm: pathlib.Path | None = None) -> dict[str, str]:
  """The environment of a driver of the tiny run (here, or on a new `vm`): XLA's optimizations mostly off and its
  flags as in this process (tests/conftest.py), so that its runs and this process's agree to the bit."""
  return compiling_as_tests({**os.environ, "PYTHONPATH": str(REPO)} if vm is None else vm_env(vm))


def restore(directory: pathlib.Path, step: int | None, items=("state", "meta")):
  """The saved items of `step` (None: the newest) in a checkpoint folder, as saved (no target tree)."""
  manager = ocp.CheckpointManager(directory)
  step = manager.latest_step() if step is None else step
  args = {item: ocp.args.JsonRestore() if item == "meta" else ocp.args.StandardRestore() for item in items}
  restored = manager.restore(step, args=ocp.args.Composite(**args))
  manager.close()
  return step, restored


def saved(workdir: pathlib.Path) -> dict:
  """Every array and meta of the newest periodic checkpoint and of the best step, as saved; but the copies of the
  run's files a periodic meta keeps, its fingerprint's naming the run's paths (a run in a bucket is the same run)."""
  step, restored = restore(workdir / "checkpoints", None)
  meta = {key: value for key, value in restored["meta"].items() if key not in run_dir.COPIES}
  return {
    "checkpoints": (step, {**restored, "meta": meta}),
    "best": restore(workdir / "best", None, ("params", "meta")),
  }


def assert_same_run(a: pathlib.Path, b: pathlib.Path):
  saved_a, saved_b = saved(a), saved(b)
  for folder, (step, restored) in saved_a.items():
    assert saved_b[folder][0] == step, folder
    leaves_a = jax.tree_util.tree_leaves_with_path(dict(restored))
    leaves_b = jax.tree_util.tree_leaves_with_path(dict(saved_b[folder][1]))
    assert [p for p, _ in leaves_a] == [p for p, _ in leaves_b]
    for (path, x), (_, y) in zip(leaves_a, leaves_b):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f"{folder} {jax.tree_util.keystr(path)}")
