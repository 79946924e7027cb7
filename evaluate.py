r"""Evaluates sentence embeddings: the STS and transfer tasks, analyses and searches, and fits the IDF table of
the TF-IDF method (config.job picks which).

  python evaluate.py --config configs/eval_prompt.py --config.model.path=bert-base-uncased \
      --config.data.senteval_dir=../shared/data/senteval
"""

from jaxemb import cli, spec, xla
from jaxemb.errors import ConfigError
from jaxemb.evaluation import analysis
from jaxemb.evaluation import ditto_analysis
from jaxemb.evaluation import run
from jaxemb.evaluation import search
from jaxemb.evaluation import template_generation
from jaxemb.evaluation import token_embeddings

# What runs each job, given the spec its config builds (jaxemb.spec.EVALUATION_JOBS).
JOBS = {
  "sts": run.run_sts,
  "analysis": analysis.run_analysis,
  "template_search": search.run_template_search,
  "ditto_search": search.run_ditto_search,
  "ditto_analysis": ditto_analysis.run_ditto_analysis,
  "transfer": run.run_transfer,
  "sts+transfer": run.run_sts_transfer,
  "fit_idf": run.run_fit_idf,
  "generate_templates": template_generation.run_template_generation,
  "token_embeddings": token_embeddings.run_token_embeddings,
}

_CONFIG = cli.define_config("Evaluation config file (configs/eval_*.py).")


def main(config):
  if config.job not in JOBS:
    raise ConfigError(f"config.job {config.job!r} is not one of {sorted(JOBS)}")
  evaluation = spec.EVALUATION_JOBS[config.job].from_config(config)
  xla.use_compilation_cache(evaluation.compilation_cache_dir)
  JOBS[config.job](evaluation)


if __name__ == "__main__":
  cli.run(main, _CONFIG, takes=[cli.EVALUATION])
