"""Any config over seeds: `configs/experiments/seeds.py:<config name>`, e.g. PromptBERT Table 6's unsupervised runs
(10 seeds: 78.54 ± 0.15 with bert-base-uncased) or SimCSE's.

  python sweep.py --config configs/experiments/seeds.py:promptbert --config.seeds='(42, 43, 44)'
"""

from configs.experiments import common

# The papers' mean ± std over 10 seeds, where they report one (PromptBERT Tables 6, 8 and 10).
PAPER = {"promptbert": "78.54 ± 0.15", "promptroberta": "79.15 ± 0.25", "simcse": "75.42 ± 0.86"}


def get_config(base: str = "promptbert"):
  config = common.get_config()
  config.name = f"{base} over seeds"
  config.description = f"configs/{base}.py, one run per seed; the 7 STS tasks of each run's best STS-B dev step."
  config.workdir = f"runs/experiments/seeds_{base}"
  config.base = base
  config.rows = ({"name": base, "paper": PAPER.get(base, "")},)
  return config
