r"""Trains a sentence encoder with one of the papers' contrastive objectives (configs/*.py).

  python train.py --config configs/promptbert.py --config.model.path=bert-base-uncased \
      --config.data.train_file=data/wiki1m_for_simcse.txt --config.workdir=runs/promptbert

Rerunning the same command resumes from the last checkpoint in the workdir. On SIGTERM (preemption) the run
finishes its step, saves a checkpoint and exits with status 143 (128 + SIGTERM, the status of a job the signal
ended); on Ctrl-C likewise, with status 130 (128 + SIGINT), and a second Ctrl-C stops it at once; the same command
then resumes. A rerun whose fields differ from those the workdir's run was made with, or whose corpus or evaluation
files differ from those it started on (<workdir>/fingerprint.json), is refused, listing them; --resume_changed
continues it with the new ones. A second process on a workdir in use is refused at once. An error a user can act
on is one line and exit status 1 (see jaxemb/cli.py).
"""

from absl import flags

from jaxemb import cli, spec, xla
from jaxemb.training import loop, stopping

_CONFIG = cli.define_config("Training config file (configs/*.py).")
_RESUME_CHANGED = flags.DEFINE_bool(
  "resume_changed",
  False,
  "Continue the workdir's run although fields of its fingerprint (model, data, objective, "
  "optimizer, batch, schedule, seed, method) or its data (the corpus, the evaluators' files) changed; "
  "the new ones are recorded.",
)


def main(config) -> int:
  run = spec.TrainingRun.from_config(config)
  xla.use_compilation_cache(run.compilation_cache_dir)
  try:
    loop.train(run, _RESUME_CHANGED.value)
  except stopping.Preempted as stopped:  # The loop saved its state and said so; the status tells the scheduler.
    return stopped.exit_code
  return 0


if __name__ == "__main__":
  cli.run(main, _CONFIG, takes=[cli.TRAINING])
