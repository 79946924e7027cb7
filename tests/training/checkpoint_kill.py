"""A tiny PromptBERT run that dies with os._exit at one stage of one of its saves: a real kill, which leaves the
files of that moment on disk and runs no `finally` block (no save is finished for it).

Run in a subprocess, as `python -m tests.training.checkpoint_kill MODEL_DIR WORKDIR TRAIN_FILE XLA_CACHE STAGE
SENTEVAL_DIR`, STAGE one of STAGES or "none" (the run ends as usual: a reference, or the rerun that resumes):
"during" stops Orbax as it commits the step (its files written into the temporary folder, the commit marker and the
rename not yet done), "after" once the save is committed.
"""

import os
import pathlib
import sys

from orbax.checkpoint._src.path import atomicity

from jaxemb import xla
from jaxemb.training import checkpoints, loop
from jaxemb.spec import TrainingRun
from tests.support import tiny_config

STAGES = tuple(f"{when} {save}" for save in ("best", "periodic") for when in ("before", "during", "after"))
KILL_STEP = 2  # The first evaluated step: its best save always happens, after the periodic save of step 1.
KILLED = 77  # The exit status of a run that reached its kill point.


def kill_config(model_dir, workdir, train_file, xla_cache, senteval_dir=None):
  """3 steps, saved every step and scored at steps 2 and 3: a kill at step 2 resumes from step 1 and replays it."""
  config = tiny_config(
    "promptbert", model_dir, workdir, train_file, senteval_dir, num_steps=3, save_every=1, eval_every=2
  )
  config.compilation_cache_dir = str(xla_cache)
  return config


def _die(*_):
  os._exit(KILLED)  # pylint: disable=protected-access


def _wrap(method, stage: str, step_of):
  """`method` of RunCheckpoints, dying before it runs or after its save is committed when it saves KILL_STEP."""

  def wrapped(self, *args):
    if step_of(*args) != KILL_STEP:
      return method(self, *args)
    if stage.startswith("before"):
      _die()
    method(self, *args)
    self.wait()
    _die()

  return wrapped


def _die_while_committing(folder: str):
  """Orbax's commit (orbax/checkpoint/_src/path/atomicity.py: commit marker, then rename) dies for KILL_STEP."""
  commit = atomicity.AtomicRenameTemporaryPath.finalize

  async def finalize(self):
    final = pathlib.Path(self._final_path)  # pylint: disable=protected-access
    if final.name == str(KILL_STEP) and final.parent.name == folder:
      _die()
    await commit(self)

  atomicity.AtomicRenameTemporaryPath.finalize = finalize


def main(model_dir: str, workdir: str, train_file: str, xla_cache: str, stage: str, senteval_dir: str):
  when, save = stage.split() if stage != "none" else ("none", "none")
  if when == "none":
    pass
  elif when == "during":
    _die_while_committing("best" if save == "best" else "checkpoints")
  elif save == "best":
    checkpoints.RunCheckpoints.save_best = _wrap(checkpoints.RunCheckpoints.save_best, when, lambda step, *_: step)
  else:
    checkpoints.RunCheckpoints.save = _wrap(checkpoints.RunCheckpoints.save, when, lambda state, _: int(state.step))
  config = kill_config(model_dir, workdir, train_file, xla_cache, senteval_dir)
  xla.use_compilation_cache(config.compilation_cache_dir)
  loop.train(TrainingRun.from_config(config))
  if stage != "none":
    sys.exit(f"the run ended without reaching {stage} at step {KILL_STEP}")


if __name__ == "__main__":
  main(*sys.argv[1:])
