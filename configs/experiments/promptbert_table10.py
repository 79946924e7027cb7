"""PromptBERT Table 10: stability of unsupervised contrastive learning, SimCSE and PromptBERT over 10 seeds (the
paper's mean ± std, max, min).

  python sweep.py --config configs/experiments/promptbert_table10.py
"""

from configs.experiments import common


def get_config():
  config = common.get_config()
  config.name = "PromptBERT Table 10"
  config.description = "Results in unsupervised contrastive learning, bert-base-uncased (10 random runs each)."
  config.workdir = "runs/experiments/promptbert_table10"
  config.base = "promptbert"
  config.rows = (
    {"name": "SimCSE-BERT base", "base": "simcse", "paper": "75.42 ± 0.86 (max 76.64, min 73.50)"},
    {"name": "PromptBERT base", "paper": "78.54 ± 0.15 (max 78.86, min 78.33)"},
  )
  return config
