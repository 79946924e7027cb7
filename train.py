r"""Trains a sentence encoder with one of the papers' contrastive objectives (configs/*.py).

  python train.py --config configs/promptbert.py --config.model.path=bert-base-uncased \
      --config.data.train_file=data/wiki1m_for_simcse.txt --config.workdir=runs/promptbert

Rerunning the same command resumes from the last checkpoint in the workdir. On SIGTERM (preemption) the run
finishes its step, saves a checkpoint and exits with status 143 (128 + SIGTERM, the status of a job the signal
ended); the same command then resumes. A rerun whose fields differ from those the workdir's run was made with
(<workdir>/fingerprint.json) is refused, listing them; --resume_changed continues it with the new ones. A second
process on a workdir in use is refused at once.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from jaxemb import xla
from jaxemb.training import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py).",
                                          lock_config=True)
_RESUME_CHANGED = flags.DEFINE_bool(
    "resume_changed", False, "Continue the workdir's run although fields of its fingerprint (model, data, objective, "
    "optimizer, batch, schedule, seed, method) changed; the new fields are recorded.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  xla.use_compilation_cache(_CONFIG.value.compilation_cache_dir)
  try:
    loop.train(_CONFIG.value, _RESUME_CHANGED.value)
  except loop.Preempted:  # The loop saved its state and said so; the status tells the scheduler.
    return loop.Preempted.exit_code
  return 0


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
