r"""Fetches and checks everything a config reads: SentEval's data, the training corpus and the model.

  python prepare.py --config configs/promptbert.py                   # wiki1m, STS-B dev, bert-base-uncased
  python prepare.py --config configs/eval_prompt.py --source ../shared/data \
      --config.model.path=../shared/models/all-MiniLM-L6-v2        # offline: copies from a local folder
  JAXEMB_DATA=gs://bucket/data python prepare.py --config configs/promptbert.py   # into a bucket, uploaded whole

Paths are the config's (default: under $JAXEMB_DATA, itself "data" by default); a second run re-verifies what
the first fetched and fetches nothing. See jaxemb/data/prepare.py.
"""

from absl import flags

from jaxemb import cli, spec
from jaxemb.data import prepare
from jaxemb.errors import ConfigError

_CONFIG = cli.define_config("Training or evaluation config file (configs/*.py).")
_SOURCE = flags.DEFINE_string(
  "source",
  None,
  "Local folder to copy the data from (offline), laid out as ../shared/data; default: download from the public URLs.",
)


def main(config):
  typed = spec.spec_class(config)
  if typed is None or typed is spec.EmbedRun:
    raise ConfigError(
      f"prepare.py takes a training config or an evaluation config with one of the jobs {sorted(spec.EVALUATION_JOBS)}"
    )
  for path, done in prepare.prepare(typed.from_config(config), source=_SOURCE.value).items():
    print(f"{path}: {done}")


if __name__ == "__main__":
  cli.run(main, _CONFIG, takes=[cli.TRAINING, cli.EVALUATION])
