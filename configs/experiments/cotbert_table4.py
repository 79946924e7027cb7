"""CoT-BERT Table 4: the extended InfoNCE with and without the positive-negative term a_{i+j-}.

  python sweep.py --config configs/experiments/cotbert_table4.py            # BERT column
  python sweep.py --config configs/experiments/cotbert_table4.py:roberta    # RoBERTa column

Without a_{i+j-} the denominator keeps the anchor's positives and hard negatives: SimCSE's supervised loss
(`info_nce_with_hard_negatives`, no extra weight).
"""

from configs.experiments import common

PAPER = {"bert": ("79.11", "79.40"), "roberta": ("80.30", "80.62")}
BASE = {"bert": "cotbert", "roberta": "cotroberta"}


def get_config(model: str = "bert"):
  common.check_model("cotbert_table4", model, BASE)
  without, with_term = PAPER[model]
  config = common.get_config()
  config.name = f"CoT-BERT Table 4 ({model})"
  config.description = "Ablation of the extended InfoNCE loss."
  config.workdir = f"runs/experiments/cotbert_table4_{model}"
  config.base = BASE[model]
  config.seeds = (0,)  # The configs' seed (the authors' train.py).
  config.rows = (
    {"name": "without a_{i+j-}", "paper": without, "set": {"objective.loss": "info_nce_with_hard_negatives"}},
    {"name": "with a_{i+j-}", "paper": with_term},
  )
  return config
