r"""Embeds a corpus with a trained run or a Hugging Face checkpoint: one vector a record, written in shards with a
manifest that `jaxemb.embedding.load` reads back (docs/embedding.md).

  python embed.py --config configs/embed.py --config.model.path=runs/promptbert \
      --config.embed.corpus=data/wiki1m_for_simcse.txt --config.embed.output=runs/promptbert/wiki1m

Every host of a multi-host job (a TPU pod slice, a SLURM job step) runs the same command and embeds its share of
the shards. Rerunning the same command continues a killed job from the shards it wrote; an output folder of another
corpus, model or method is refused, naming what changed. An error a user can act on is one line and exit status 1
(see jaxemb/cli.py).
"""

from jaxemb import cli, spec, xla
from jaxemb.embedding import job

_CONFIG = cli.define_config("Embedding config file (configs/embed.py).")


def main(config):
  run = spec.EmbedRun.from_config(config)
  xla.use_compilation_cache(run.compilation_cache_dir)
  job.embed_corpus(run)


if __name__ == "__main__":
  cli.run(main, _CONFIG, takes=[cli.EMBEDDING])
