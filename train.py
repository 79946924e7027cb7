r"""Trains a sentence encoder with one of the papers' contrastive objectives (configs/*.py).

  python train.py --config configs/promptbert.py --config.model.path=bert-base-uncased \
      --config.data.train_file=data/wiki1m_for_simcse.txt --config.workdir=runs/promptbert

Rerunning the same command resumes from the last checkpoint in the workdir.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from jaxemb import xla
from jaxemb.training import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py).",
                                          lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  xla.use_compilation_cache(_CONFIG.value.compilation_cache_dir)
  loop.train(_CONFIG.value)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
