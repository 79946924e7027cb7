r"""Evaluates sentence embeddings: the STS and transfer tasks, analyses and searches, and fits the IDF table of
the TF-IDF method (config.job picks which).

  python evaluate.py --config configs/eval_prompt.py --config.model.path=bert-base-uncased \
      --config.data.senteval_dir=../shared/data/senteval
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from jaxemb import xla
from jaxemb.evaluation import analysis
from jaxemb.evaluation import ditto_analysis
from jaxemb.evaluation import run
from jaxemb.evaluation import search

JOBS = {"sts": run.run_sts, "analysis": analysis.run_analysis, "template_search": search.run_template_search,
        "ditto_search": search.run_ditto_search, "ditto_analysis": ditto_analysis.run_ditto_analysis,
        "transfer": run.run_transfer, "sts+transfer": run.run_sts_transfer, "fit_idf": run.run_fit_idf}

_CONFIG = config_flags.DEFINE_config_file("config", None, "Evaluation config file (configs/eval_*.py).",
                                          lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config.job not in JOBS:
    raise app.UsageError(f"config.job {config.job!r} is not one of {sorted(JOBS)}")
  xla.use_compilation_cache(config.compilation_cache_dir)
  JOBS[config.job](config)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
