"""Fields shared by every experiment file (configs/experiments/*.py): what `sweep.py` runs and tabulates."""

import ml_collections

PAPER_SEEDS = tuple(range(42, 52))  # 10 seeds, as PromptBERT Tables 6, 8 and 10 (run.sh's seed 42 and the next 9).


def check_model(experiment: str, model: str, models) -> str:
  """`model`, the argument after `experiment.py:`, if it names one of `models` (the columns the file has)."""
  if model not in models:
    raise ValueError(f"{experiment}: model {model!r} is not one of {sorted(models)}")
  return model


def get_config():
  config = ml_collections.ConfigDict()
  config.name = ""  # The experiment's name: the table's title.
  config.description = ""  # What the table is (the paper's table and its setting), printed above it.
  config.workdir = ""  # Root of the experiment's run directories and its table; set by each file.
  config.base = ""  # The config every row starts from (configs/<base>.py) unless the row names its own.
  config.seeds = PAPER_SEEDS  # Training rows run once per seed (config.train.seed); evaluation rows once.
  # Overrides of every row's config, "field=value; field=value" (Python literals), applied after the row's own:
  # e.g. "model.path='../shared/models/all-MiniLM-L6-v2'; train.num_steps=30; train.batch_size=32".
  config.overrides = ""
  # The rows: dicts with "name", "paper" (the paper's number, as printed), optionally "base" and "set" (the fields
  # the row changes, {"objective.denoise": "none"}).
  config.rows = ()
  return config
