"""PromptBERT Table 8: the unsupervised objective's positive pairs, 10 seeds each, evaluated with the same template.

  python sweep.py --config configs/experiments/promptbert_table8.py            # BERT column
  python sweep.py --config configs/experiments/promptbert_table8.py:roberta    # RoBERTa column

Rows, as the paper's: the same template twice (dropout the only noise, no denoising), the two templates without
denoising, and the two templates with position-offset denoising (the default, configs/promptbert.py).
"""

from configs import train_common
from configs.experiments import common

PAPER = {
  "bert": ("78.16 ± 0.17", "78.19 ± 0.29", "78.54 ± 0.15"),
  "roberta": ("78.16 ± 0.44", "78.17 ± 0.44", "79.15 ± 0.25"),
}
BASE = {"bert": "promptbert", "roberta": "promptroberta"}
VIEW_1 = {"bert": train_common.PROMPTBERT_OF, "roberta": train_common.PROMPTROBERTA_THIS}  # Also the evaluation's.


def get_config(model: str = "bert"):
  common.check_model("promptbert_table8", model, BASE)
  same, different, denoised = PAPER[model]
  config = common.get_config()
  config.name = f"PromptBERT Table 8 ({model})"
  config.description = "Unsupervised training objectives: how the positive pair is made (10 random runs each)."
  config.workdir = f"runs/experiments/promptbert_table8_{model}"
  config.base = BASE[model]
  config.rows = (
    {
      "name": "same template (dropout)",
      "paper": same,
      "set": {"objective.templates": (VIEW_1[model],) * 2, "objective.denoise": "none"},
    },
    {"name": "different templates", "paper": different, "set": {"objective.denoise": "none"}},
    {"name": "different templates with denoising", "paper": denoised},
  )
  return config
